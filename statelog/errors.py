"""Typed errors raised by statelog.

Every error derives from :class:`StatelogError` and carries a one-line
``hint`` telling the caller what to do next. ``str(error)`` includes the
hint, so a log line or a traceback is actionable on its own.

Bad input (:class:`InvalidCommitError` and its kin) is always detected before
anything reaches the disk: a refused commit changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "AuditError",
    "ChangesUnavailableError",
    "CompactorLockedError",
    "CorruptionError",
    "EpochUnavailableError",
    "FencedError",
    "FormatVersionError",
    "IntegrationError",
    "InvalidCommitError",
    "InvalidOptionError",
    "NotAStoreError",
    "PromotionLostError",
    "PromotionRefusedError",
    "ReadOnlyStoreError",
    "RemoteError",
    "ResnapshotRequired",
    "SinkError",
    "StandbyCopyError",
    "StatelogError",
    "StorageError",
    "StoreClosedError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StorePromotedError",
    "WriteStallError",
]


class StatelogError(Exception):
    """Base class of every error statelog raises."""

    hint: str = "see the statelog documentation"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})"


class CorruptionError(StatelogError):
    """Stored bytes failed verification: a checksum mismatch, a chain break or a foreign file."""

    hint = (
        "open without strict=True to recover to the last good commit; "
        "the damaged bytes are then kept aside as .corrupt files"
    )

    def __init__(self, path: Path, offset: int, reason: str, *, hint: str | None = None) -> None:
        super().__init__(f"{path} at offset {offset}: {reason}", hint=hint)
        self.path = path
        self.offset = offset
        self.reason = reason


class ResnapshotRequired(StatelogError):
    """No verified snapshot and no complete log remain: the state cannot be rebuilt safely."""

    hint = (
        "restore the store from a backup or rebuild the state from the source "
        "(a full re-snapshot); statelog refuses to guess"
    )

    def __init__(
        self, message: str, tried: Sequence[tuple[Path, str]] = (), *, hint: str | None = None
    ) -> None:
        detail = "; ".join(f"{p}: {why}" for p, why in tried)
        super().__init__(f"{message}: {detail}" if detail else message, hint=hint)
        self.tried = list(tried)


class StoreLockedError(StatelogError):
    """Another writer holds the store's lock."""

    hint = "stop the other writer first, or open with readonly=True to read without taking the lock"

    def __init__(self, path: Path, pid: int | None, *, hint: str | None = None) -> None:
        who = f"process {pid}" if pid is not None else "another process"
        super().__init__(f"store {path} is locked by {who}", hint=hint)
        self.path = path
        self.pid = pid


class CompactorLockedError(StatelogError):
    """Another compactor holds the store's ``COMPACTOR.LOCK``: one compactor per store."""

    hint = (
        "one compactor per store: stop the other compactor (its pid is named) or let it "
        "do the work; a compactor that died released its lock with its process"
    )

    def __init__(self, path: Path, pid: int | None, *, hint: str | None = None) -> None:
        who = f"process {pid}" if pid is not None else "another process"
        super().__init__(f"store {path} is being compacted by {who}", hint=hint)
        self.path = path
        self.pid = pid


class FormatVersionError(StatelogError):
    """A file was written in a format version this statelog does not read."""

    hint = "upgrade statelog to a version that reads this format; nothing was changed"

    def __init__(self, path: Path, found: int, supported: int, *, hint: str | None = None) -> None:
        super().__init__(
            f"{path}: format version {found}, this statelog reads version {supported}",
            hint=hint,
        )
        self.path = path
        self.found = found
        self.supported = supported


class InvalidCommitError(StatelogError, ValueError):
    """A commit was refused before anything was written: bad key, value, offset or size."""

    hint = "fix the commit's arguments; nothing was written"


class InvalidOptionError(StatelogError, ValueError):
    """An option passed to ``statelog.open`` is unknown or out of range."""

    hint = "see the options of statelog.open in the README; nothing was changed"


class NotAStoreError(StatelogError):
    """The path exists and holds something that is not a statelog store."""

    hint = "choose an empty or new directory for a new store; nothing was changed"


class StoreClosedError(InvalidCommitError):
    """The store was used after ``close()``."""

    hint = "open the store again with statelog.open()"


class ReadOnlyStoreError(InvalidCommitError):
    """A write was attempted through a store opened with ``readonly=True``."""

    hint = "open the store without readonly=True (one writer per store) to commit"


class StoreNotFoundError(StatelogError, FileNotFoundError):
    """A read-only open named a directory that holds no statelog store."""

    hint = "check the path; a writer creates the store on its first open"


class StorageError(StatelogError, OSError):
    """The operating system refused a write or a sync (ENOSPC, EIO, ...).

    The failed commit is neither visible nor replayed. It is not corruption:
    nothing was truncated or moved aside because of it.
    """

    hint = "free disk space or fix the device, then retry the commit"

    def __init__(self, message: str, *, errno: int | None = None, hint: str | None = None) -> None:
        StatelogError.__init__(self, message, hint=hint)
        self.errno = errno


class WriteStallError(StatelogError):
    """The overlay of commits no snapshot has folded yet reached ``max_overlay_bytes``,
    and no compactor pass brought it back under within ``overlay_wait``.

    Nothing was written: the commit may be retried as it is.
    """

    hint = (
        "a compactor must fold the log: run `statelog-compactor STORE` (or open with "
        'compactor="process"), check its log for failed passes, or raise max_overlay_bytes '
        "or overlay_wait"
    )


class AuditError(StatelogError):
    """The audit trail could not be read or written, or is not an audit trail."""

    hint = "run `statelog audit STORE --verify` to see which entry is at fault"


class SinkError(StatelogError):
    """An idempotent sink refused an output or could not reach its target."""

    hint = "check the sink's target (database file or server); the state was not committed"


class RemoteError(StatelogError):
    """The object store refused a request or returned bytes that do not verify."""

    hint = (
        "check the remote URL and the AWS_* environment; nothing local was changed "
        "because of this error"
    )


class FencedError(StatelogError):
    """A newer writer generation owns the store: this writer was fenced off after a takeover."""

    hint = (
        "another host took this store over; stop this writer and reopen the store "
        "(or restore it) on the host that owns it now"
    )

    def __init__(self, message: str, *, ours: int, current: int, hint: str | None = None) -> None:
        super().__init__(f"{message} (our generation {ours}, current {current})", hint=hint)
        self.ours = ours
        self.current = current


class ChangesUnavailableError(StatelogError):
    """The changes asked for are no longer in the retained log: compaction folded them away."""

    hint = (
        "load the state from a snapshot (statelog.open or `statelog restore`) and read "
        "changes after its epoch, or keep more log with the compactor's --retain"
    )

    def __init__(self, path: Path, since: int, earliest: int, *, hint: str | None = None) -> None:
        super().__init__(
            f"{path}: the changes after epoch {since} are gone from the log; the oldest "
            f"change still held is epoch {earliest} (read with since >= {earliest - 1})",
            hint=hint,
        )
        self.path = path
        self.since = since
        self.earliest = earliest
        """The oldest epoch whose change the retained log still holds."""


class EpochUnavailableError(StatelogError):
    """The state as of that epoch (or time) cannot be rebuilt from what the store retains."""

    hint = (
        "pick an epoch in the range the message names; keep more history with the "
        "compactor's --retain or --retain-for"
    )

    def __init__(
        self, message: str, *, epoch: int | None, oldest: int | None, newest: int | None,
        hint: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message, hint=hint)
        self.epoch = epoch
        """The epoch asked for (None: a time that matched no epoch)."""
        self.oldest = oldest
        """The oldest epoch the store can still rebuild (None: not known)."""
        self.newest = newest
        """The newest epoch the store holds (None: not known)."""


class PromotionRefusedError(StatelogError):
    """A standby cannot be promoted safely: its source could not be read one last time."""

    hint = (
        "if the source's writer is certainly dead (its host down or fenced), promote with "
        "force=True (`statelog promote --force`): the copy's state is promoted as it is, "
        "without the commits after its last look; nothing was changed"
    )


class PromotionLostError(PromotionRefusedError):
    """Another standby was promoted first: it claimed the writer generation this one saw."""

    hint = (
        "another standby of the same store became its writer first; this one changed "
        "nothing and goes on following: point the reconciler at the writer that won"
    )


class StandbyCopyError(StatelogError):
    """This directory is a standby's copy of another store, not promoted: it has no writer."""

    hint = (
        "open it with follow=SOURCE to keep it following (or readonly=True to read it as it "
        "stands); to make it the writer, promote it (store.promote(), `statelog promote "
        "COPY --source SOURCE`), which fences the source's writer first"
    )


class StorePromotedError(StatelogError):
    """A standby of this store was promoted: its copy, not this directory, has the writer."""

    hint = (
        "open the promoted copy named in this store's PROMOTED file; if this directory is "
        "the one to keep after all, move PROMOTED aside deliberately (the copy's writer "
        "must then stop: two writers would continue the same log)"
    )


class IntegrationError(StatelogError, ValueError):
    """A stream processor's store could not be set up: an unsupported engine version or option."""

    hint = (
        "install the engine in the version range of statelog's extra (`pip install "
        "statelog[quix]` or `statelog[faust]`) and check the store's options; nothing was "
        "written"
    )
