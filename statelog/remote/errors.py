"""Typed errors of the remote tier, all under :class:`statelog.errors.RemoteError`.

:class:`~statelog.errors.FencedError` (a newer writer generation owns the
store) is raised as is; it lives in :mod:`statelog.errors` with the others.
"""

from __future__ import annotations

from statelog.errors import RemoteError

__all__ = [
    "ConditionFailedError",
    "ObjectExistsError",
    "RemoteConfigError",
    "RemoteIntegrityError",
    "RemoteNotFoundError",
    "RemoteUnavailableError",
]


class RemoteConfigError(RemoteError):
    """The remote URL or the AWS_* environment is unusable; nothing was contacted."""

    hint = (
        "use s3://bucket[/prefix]; set AWS_ENDPOINT_URL (and AWS_ALLOW_HTTP=true for http://), "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION; nothing was changed"
    )


class RemoteUnavailableError(RemoteError):
    """A transient failure (connection, timeout, 5xx) outlasted every retry."""

    hint = (
        "the object store did not answer in time; check the endpoint and the network, "
        "then run the command again: every remote step is safe to repeat"
    )


class RemoteNotFoundError(RemoteError):
    """An object the caller needs (a manifest, a listed segment) is absent."""

    hint = "check the URL and the store id; `statelog restore` lists the stores under a prefix"


class ConditionFailedError(RemoteError):
    """A conditional write was refused: the object changed (If-Match) or exists (If-None-Match)."""

    hint = "another writer changed the object first; read it again before deciding anything"

    def __init__(self, key: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{key}: {message}", hint=hint)
        self.key = key


class ObjectExistsError(ConditionFailedError):
    """A create (If-None-Match) found the key taken: shipped objects are never overwritten."""

    hint = "shipped objects are immutable; a different object under the same key is a conflict"


class RemoteIntegrityError(RemoteError):
    """Downloaded bytes do not verify (content hash, snapshot footer, segment chain)."""

    hint = (
        "the remote copy is damaged; restore walks back past it where the ladder allows, "
        "and the object is left in place as evidence"
    )

    def __init__(self, key: str, reason: str, *, hint: str | None = None) -> None:
        super().__init__(f"{key}: {reason}", hint=hint)
        self.key = key
        self.reason = reason
