"""The object-store client: obstore's S3 store behind retries, typed errors and hashes.

Every request goes through :meth:`RemoteClient._call`, which retries only
what may succeed on a second try (connection errors, timeouts, HTTP 5xx and
429) with exponential backoff and jitter, up to a number of attempts and a
deadline, logging each retry. A refusal (404, 403, a failed precondition,
a bad request) is never retried: it is turned into its typed error at once.
obstore's own retry loop is switched off so that this is the only one.

Retrying a conditional write is safe and needs one thought: if the first
attempt landed but its answer was lost, the retry is refused as if someone
else had written. Callers resolve that by reading back what is there
(:mod:`.ship` compares the content hash, :mod:`.manifest` its write id).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import IO, TYPE_CHECKING, TypeVar

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    InvalidPathError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
    UnknownConfigurationKeyError,
)
from obstore.store import S3Store

from statelog.errors import RemoteError
from statelog.remote.errors import (
    ConditionFailedError,
    ObjectExistsError,
    RemoteConfigError,
    RemoteIntegrityError,
    RemoteNotFoundError,
    RemoteUnavailableError,
)
from statelog.remote.signing import key_from_env
from statelog.remote.url import RemoteConfig, parse_remote_url

if TYPE_CHECKING:
    from obstore import Attributes, GetOptions

__all__ = [
    "GET_LIMIT",
    "SHA256_ATTR",
    "DirectoryFactory",
    "Fetched",
    "RemoteClient",
    "RetryPolicy",
    "is_transient",
    "use_directory_client",
]

log = logging.getLogger("statelog.remote")

SHA256_ATTR = "sha256"
"""User metadata key (``x-amz-meta-sha256``) holding the hex SHA-256 of an object's bytes."""

GET_LIMIT = 64 << 20
"""The most :meth:`RemoteClient.get` reads into memory unless told otherwise."""

T = TypeVar("T")
_STATUS = re.compile(r"status code: (\d{3})")
_PERMANENT = (
    AlreadyExistsError,
    PreconditionError,
    FileNotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    InvalidPathError,
    NotSupportedError,
    UnknownConfigurationKeyError,
    NotImplementedError,
    ValueError,
    TypeError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter: wait ``initial * 2**n`` (at most ``maximum``),
    scaled by a random factor in [0.5, 1], for up to ``attempts`` tries within ``deadline``."""

    attempts: int = 8
    initial: timedelta = timedelta(milliseconds=100)
    maximum: timedelta = timedelta(seconds=5)
    deadline: timedelta = timedelta(seconds=60)

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first retry)."""
        base = min(self.maximum.total_seconds(), self.initial.total_seconds() * 2.0**retry)
        return float(base) * random.uniform(0.5, 1.0)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` from obstore may succeed if the request is repeated.

    Refusals (missing object, failed precondition, permissions, bad input)
    and HTTP 4xx other than 408 and 429 are permanent; connection errors,
    timeouts, HTTP 5xx, 408 and 429 are transient.
    """
    if isinstance(exc, _PERMANENT) or not isinstance(exc, obstore.exceptions.BaseError):
        return False
    m = _STATUS.search(str(exc))
    if m is None:
        return True  # no HTTP answer at all: connect, reset, timeout
    status = int(m.group(1))
    return status >= 500 or status in (408, 429)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


@dataclass(frozen=True)
class Fetched:
    """An object read whole: its bytes, ETag and attributes (user metadata included)."""

    data: bytes
    etag: str | None
    attributes: dict[str, str]


DirectoryFactory = Callable[[str, str, "RetryPolicy | None", "bytes | None"], "RemoteClient"]
_directory_client: DirectoryFactory | None = None


def use_directory_client(factory: DirectoryFactory) -> None:
    """Register the client of ``file://`` URLs (:mod:`statelog.remote.directory` does, when
    the package is imported): ``factory(path, url, retry, key)``."""
    global _directory_client
    _directory_client = factory


class RemoteClient:
    """Synchronous access to one bucket and prefix. Thread-safe (obstore stores are).

    ``key`` is the shipping key (:mod:`.signing`): with one, every MANIFEST
    written is signed and every MANIFEST read must verify. Reads are bounded:
    :meth:`get` and :meth:`get_into` ask for at most one byte more than the
    caller allows and refuse an object the store says is larger before
    reading its body.
    """

    def __init__(
        self,
        store: S3Store,
        *,
        where: str,
        retry: RetryPolicy | None = None,
        key: bytes | None = None,
    ) -> None:
        self.store = store
        self.where = where
        self.retry = retry or RetryPolicy()
        self.key = key

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        env: dict[str, str] | None = None,
        retry: RetryPolicy | None = None,
        timeout: timedelta = timedelta(seconds=30),
    ) -> RemoteClient:
        """A client for ``url`` configured from ``env`` (default: the process environment),
        shipping key (``STATELOG_REMOTE_KEY``) included.

        :raises RemoteConfigError: see :func:`.url.parse_remote_url` and
            :func:`.signing.parse_key`; or obstore refused the configuration.
        """
        cfg = parse_remote_url(url, env)
        key = key_from_env(os.environ if env is None else env)
        if cfg.directory is not None:
            if _directory_client is None:
                raise RemoteConfigError(f"{url}: no client for file:// URLs is registered")
            return _directory_client(cfg.directory, url, retry, key)
        return cls(_s3_store(cfg, timeout), where=url, retry=retry, key=key)

    # -- the retry loop ---------------------------------------------------
    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        policy = self.retry
        for attempt in range(policy.attempts):
            try:
                return fn()
            except AlreadyExistsError as exc:
                raise ObjectExistsError(key, "already exists") from exc
            except PreconditionError as exc:
                raise ConditionFailedError(key, "precondition failed (changed since read)") from exc
            except FileNotFoundError as exc:
                raise RemoteNotFoundError(f"{self.where}: {key} not found") from exc
            except (PermissionDeniedError, UnauthenticatedError) as exc:
                raise RemoteError(
                    f"{op} {key}: access refused: {_first_line(exc)}",
                    hint="check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the bucket policy",
                ) from exc
            except RemoteError:
                raise  # a check of the answer refused it: already typed, never retried
            except Exception as exc:
                status = _STATUS.search(str(exc))
                if status is not None and status.group(1) == "416":  # a range of an empty object
                    raise RemoteIntegrityError(key, "the object is empty") from exc
                if not is_transient(exc):
                    raise RemoteError(f"{op} {key}: {_first_line(exc)}") from exc
                elapsed = time.monotonic() - started
                wait = policy.delay(attempt)
                last = attempt + 1 >= policy.attempts
                if last or elapsed + wait > policy.deadline.total_seconds():
                    raise RemoteUnavailableError(
                        f"{op} {key} failed {attempt + 1} times in {elapsed:.1f}s: "
                        f"{_first_line(exc)}"
                    ) from exc
                log.warning(
                    "event=remote_retry op=%s key=%s attempt=%d wait_s=%.3f reason=%r",
                    op, key, attempt + 1, wait, _first_line(exc),
                )  # fmt: skip
                time.sleep(wait)
        raise AssertionError("unreachable: the loop returns or raises")

    # -- operations ---------------------------------------------------------
    def put_new(self, key: str, data: bytes, *, metadata: dict[str, str] | None = None) -> str:
        """Create ``key`` only if absent (If-None-Match: *); the object carries its SHA-256.

        :returns: the new object's ETag.
        :raises ObjectExistsError: the key exists (it is never overwritten).
        :raises RemoteError: any other refusal; RemoteUnavailableError after the retries.
        """
        attrs: Attributes = {SHA256_ATTR: hashlib.sha256(data).hexdigest()}
        attrs.update(metadata or {})
        res = self._call(
            "put_new",
            key,
            lambda: obstore.put(self.store, key, data, mode="create", attributes=attrs),
        )
        return res["e_tag"] or ""

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace ``key`` only if its ETag is still ``etag`` (If-Match).

        :returns: the new ETag.
        :raises ConditionFailedError: the object changed since ``etag`` was read.
        """
        attrs: Attributes = {SHA256_ATTR: hashlib.sha256(data).hexdigest()}
        res = self._call(
            "put_if_match",
            key,
            lambda: obstore.put(
                self.store, key, data, mode={"e_tag": etag}, attributes=attrs,
                use_multipart=False,
            ),
        )  # fmt: skip
        return res["e_tag"] or ""

    def get(self, key: str, *, limit: int = GET_LIMIT) -> Fetched:
        """Read ``key`` whole, if it holds at most ``limit`` bytes (default :data:`GET_LIMIT`).

        One ranged request for the first ``limit + 1`` bytes: an object the
        store says is larger is refused before its body is read, and no more
        than ``limit + 1`` bytes are ever transferred.

        :raises RemoteNotFoundError: no such object.
        :raises RemoteIntegrityError: the object is larger than ``limit``, or empty.
        """

        def fetch() -> Fetched:
            res = obstore.get(self.store, key, options={"range": (0, limit + 1)})
            _refuse_over(key, res.meta["size"], limit)
            data = bytes(res.bytes())
            _refuse_over(key, len(data), limit)
            return Fetched(data, res.meta["e_tag"], dict(res.attributes))

        return self._call("get", key, fetch)

    def get_into(self, key: str, out: IO[bytes], *, size: int) -> tuple[str, dict[str, str]]:
        """Stream ``key`` into ``out`` (truncated first, and again on each retry), if the
        object holds exactly ``size`` bytes.

        At most ``size + 1`` bytes are requested and at most ``size`` written:
        an object the store says has another size is refused before its body
        is read, and a body that runs past ``size`` is refused at its first
        extra byte.

        :returns: the hex SHA-256 of the ``size`` bytes written, and the attributes.
        :raises RemoteNotFoundError: no such object.
        :raises RemoteIntegrityError: the object's size is not ``size``.
        """

        def fetch() -> tuple[str, dict[str, str]]:
            out.seek(0)
            out.truncate()
            h = hashlib.sha256()
            ranged: GetOptions = {"range": (0, size + 1)} if size else {}
            res = obstore.get(self.store, key, options=ranged)
            if res.meta["size"] != size:
                raise RemoteIntegrityError(
                    key, f"the object holds {res.meta['size']} bytes, the manifest says {size}"
                )
            written = 0
            for chunk in res.stream(min_chunk_size=4 << 20):
                view = memoryview(chunk)[: size + 1 - written]
                if written + len(view) > size:
                    raise RemoteIntegrityError(key, f"the object runs past {size} bytes")
                h.update(view)
                out.write(view)
                written += len(view)
            if written != size:
                raise RemoteIntegrityError(key, f"the object ended at {written} of {size} bytes")
            return h.hexdigest(), dict(res.attributes)

        return self._call("get", key, fetch)

    def head_sha256(self, key: str) -> str | None:
        """The SHA-256 attribute of ``key`` (attributes come with GET, not HEAD, in obstore:
        one ranged GET of a single byte).

        :raises RemoteNotFoundError: no such object.
        """
        got = self._call(
            "get", key, lambda: obstore.get(self.store, key, options={"range": (0, 1)})
        )
        return dict(got.attributes).get(SHA256_ATTR)

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """``(key, size)`` of every object under ``prefix``, listing retried as a whole."""

        def listing() -> list[tuple[str, int]]:
            out: list[tuple[str, int]] = []
            for chunk in obstore.list(self.store, prefix, chunk_size=1000):
                out.extend((m["path"], m["size"]) for m in chunk)
            return out

        return iter(self._call("list", prefix, listing))

    def list_dirs(self, prefix: str | None = None) -> list[str]:
        """The "directories" directly under ``prefix`` (common prefixes, without the slash)."""

        def listing() -> list[str]:
            res = obstore.list_with_delimiter(self.store, prefix)
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in res["common_prefixes"]]

        return self._call("list_dirs", prefix or "", listing)

    def delete(self, key: str) -> None:
        """Delete ``key``; deleting an absent key is not an error (S3 semantics)."""
        self._call("delete", key, lambda: obstore.delete(self.store, key))


def _refuse_over(key: str, size: int, limit: int) -> None:
    if size > limit:
        raise RemoteIntegrityError(
            key,
            f"{size} bytes, over the limit of {limit} for this object",
            hint="no statelog store writes an object this large there: whoever wrote the "
            "bucket is not this store's shipper; nothing was read whole or written",
        )


def _s3_store(cfg: RemoteConfig, timeout: timedelta) -> S3Store:
    kwargs: dict[str, str] = {"region": cfg.region}
    if cfg.endpoint is not None:
        kwargs["endpoint"] = cfg.endpoint
    if cfg.access_key_id is not None and cfg.secret_access_key is not None:
        kwargs["access_key_id"] = cfg.access_key_id
        kwargs["secret_access_key"] = cfg.secret_access_key
    if cfg.session_token is not None:
        kwargs["session_token"] = cfg.session_token
    try:
        return S3Store(
            cfg.bucket,
            prefix=cfg.prefix or None,
            config=kwargs,  # type: ignore[arg-type]  # keys are S3Config's
            client_options={
                "allow_http": cfg.allow_http,
                "timeout": timeout,
                "connect_timeout": min(timeout, timedelta(seconds=5)),
            },
            # Our own loop retries (and logs); obstore's would hide the attempts.
            retry_config={"max_retries": 0},
        )
    except Exception as exc:
        raise RemoteConfigError(f"{cfg.url}: obstore refused the configuration: {exc}") from exc
