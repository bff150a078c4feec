"""The remote tier on a shared directory: ``file:///mnt/replica/prefix``.

For operators with an NFS export or a mounted volume instead of a bucket.
The objects are files under the directory, with the keys of an ``s3://``
remote as relative paths, and :class:`DirectoryClient` gives them the two
conditional writes the remote tier relies on:

- **create only if absent** (a shipped object, the first MANIFEST): the
  bytes go to a temporary file (fsync), which is then hard-linked to the
  key's name; ``link`` fails if the name exists, so an object is never
  overwritten. Then the directory is fsynced.
- **replace only if unchanged** (every later MANIFEST, the fence): under an
  exclusive ``flock`` of ``<key>.lock``, the current file's SHA-256 (its
  ETag here) is compared with the one read; then temp file, fsync, rename,
  fsync of the directory.

Limits, as the remote docs state them: the lock is advisory and needs a
file system whose locks work across the hosts that share it (NFSv4, or a
volume mounted by one host at a time); a writer on a host that ignores
the lock file is not fenced. The directory is as untrusted as a bucket:
every read is bounded and verified as the ``s3://`` client's are, and a key
that would leave the directory is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TypeVar, cast

from obstore.store import S3Store

from statelog.errors import RemoteError
from statelog.remote.client import (
    GET_LIMIT,
    SHA256_ATTR,
    Fetched,
    RemoteClient,
    RetryPolicy,
    use_directory_client,
)
from statelog.remote.errors import (
    ConditionFailedError,
    ObjectExistsError,
    RemoteIntegrityError,
    RemoteNotFoundError,
)

__all__ = ["DirectoryClient"]

T = TypeVar("T")
_CHUNK = 4 << 20
_TEMP = ".tmp-"
_LOCK = ".lock"


class DirectoryClient(RemoteClient):
    """:class:`RemoteClient`'s operations on files under ``root`` (module docstring)."""

    def __init__(
        self, root: str | Path, *, where: str, retry: RetryPolicy | None = None,
        key: bytes | None = None,
    ) -> None:  # fmt: skip
        # No object store behind it: every operation below is overridden.
        super().__init__(cast(S3Store, None), where=where, retry=retry, key=key)
        self.root = Path(root)

    # -- paths ----------------------------------------------------------
    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise RemoteIntegrityError(key, "not a key of this remote (it would leave its root)")
        return self.root.joinpath(*parts)

    def _io(self, op: str, key: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except FileNotFoundError as exc:
            raise RemoteNotFoundError(f"{self.where}: {key} not found") from exc
        except RemoteError:
            raise
        except OSError as exc:
            raise RemoteError(f"{op} {key}: {exc.strerror or exc}") from exc

    # -- writes -----------------------------------------------------------
    def _write_temp(self, dest: Path, data: bytes) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{_TEMP}{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return tmp

    def _sync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put_new(self, key: str, data: bytes, *, metadata: dict[str, str] | None = None) -> str:
        """Create ``key`` only if absent: temp file, fsync, ``link`` to the name, fsync dir.

        :raises ObjectExistsError: the key exists (it is never overwritten).
        """
        dest = self._path(key)

        def create() -> str:
            tmp = self._write_temp(dest, data)
            try:
                os.link(tmp, dest)
            except FileExistsError:
                raise ObjectExistsError(key, "already exists") from None
            finally:
                tmp.unlink(missing_ok=True)
            self._sync_dir(dest.parent)
            return hashlib.sha256(data).hexdigest()

        return self._io("put_new", key, create)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace ``key`` only if its SHA-256 is still ``etag``, under ``<key>.lock``.

        :raises ConditionFailedError: the file changed (or is gone) since ``etag`` was read.
        """
        dest = self._path(key)

        def replace() -> str:
            dest.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(dest.with_name(dest.name + _LOCK), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    current = _sha256_of(dest)
                except FileNotFoundError:
                    current = None
                if current != etag:
                    raise ConditionFailedError(key, "precondition failed (changed since read)")
                tmp = self._write_temp(dest, data)
                os.rename(tmp, dest)
                self._sync_dir(dest.parent)
            finally:
                os.close(lock)  # releases the flock
            return hashlib.sha256(data).hexdigest()

        return self._io("put_if_match", key, replace)

    def delete(self, key: str) -> None:
        """Delete ``key``; an absent key is not an error."""
        path = self._path(key)

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            with contextlib.suppress(FileNotFoundError):
                path.with_name(path.name + _LOCK).unlink()

        self._io("delete", key, remove)

    # -- reads ------------------------------------------------------------
    def get(self, key: str, *, limit: int = GET_LIMIT) -> Fetched:
        """Read ``key`` whole if it holds at most ``limit`` bytes (checked before reading).

        :raises RemoteNotFoundError: no such object.
        :raises RemoteIntegrityError: larger than ``limit``, or empty.
        """
        path = self._path(key)

        def read() -> Fetched:
            with _open(path) as f:
                size = os.fstat(f.fileno()).st_size
                _check_size(key, size, limit)
                data = f.read(limit + 1)
            _check_size(key, len(data), limit)
            sha = hashlib.sha256(data).hexdigest()
            return Fetched(data, sha, {SHA256_ATTR: sha})

        return self._io("get", key, read)

    def get_into(self, key: str, out: IO[bytes], *, size: int) -> tuple[str, dict[str, str]]:
        """Copy ``key`` into ``out`` if it holds exactly ``size`` bytes; its SHA-256.

        :raises RemoteIntegrityError: the file's size is not ``size``, or it changed
            while read.
        """
        path = self._path(key)

        def copy() -> tuple[str, dict[str, str]]:
            out.seek(0)
            out.truncate()
            h = hashlib.sha256()
            with _open(path) as f:
                have = os.fstat(f.fileno()).st_size
                if have != size:
                    raise RemoteIntegrityError(
                        key, f"the object holds {have} bytes, the manifest says {size}"
                    )
                written = 0
                while chunk := f.read(min(_CHUNK, size + 1 - written)):
                    if written + len(chunk) > size:
                        raise RemoteIntegrityError(key, f"the object runs past {size} bytes")
                    h.update(chunk)
                    out.write(chunk)
                    written += len(chunk)
            if written != size:
                raise RemoteIntegrityError(key, f"the object ended at {written} of {size} bytes")
            sha = h.hexdigest()
            return sha, {SHA256_ATTR: sha}

        return self._io("get", key, copy)

    def head_sha256(self, key: str) -> str | None:
        """The SHA-256 of ``key``'s bytes (read whole: a local file has no metadata)."""
        path = self._path(key)
        return self._io("get", key, lambda: _sha256_of(path))

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """``(key, size)`` of every object whose key starts with ``prefix``."""
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._path(base) if base else self.root

        def walk() -> list[tuple[str, int]]:
            out: list[tuple[str, int]] = []
            if not start.is_dir():
                return out
            for dirpath, dirs, names in os.walk(start):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if name.startswith(".") or name.endswith(_LOCK):
                        continue
                    full = Path(dirpath, name)
                    key = full.relative_to(self.root).as_posix()
                    if key.startswith(prefix):
                        out.append((key, full.stat().st_size))
            return out

        return iter(self._io("list", prefix, walk))

    def list_dirs(self, prefix: str | None = None) -> list[str]:
        """The directories directly under ``prefix`` (the root when None)."""
        start = self._path(prefix.rstrip("/")) if prefix else self.root

        def listing() -> list[str]:
            if not start.is_dir():
                return []
            return sorted(p.name for p in start.iterdir() if p.is_dir() and p.name[0] != ".")

        return self._io("list_dirs", prefix or "", listing)


def _check_size(key: str, size: int, limit: int) -> None:
    if size == 0:
        raise RemoteIntegrityError(key, "the object is empty")
    if size > limit:
        raise RemoteIntegrityError(
            key,
            f"{size} bytes, over the limit of {limit} for this object",
            hint="no statelog store writes an object this large there: whoever wrote the "
            "directory is not this store's shipper; nothing was read whole or written",
        )


def _open(path: Path) -> IO[bytes]:
    """Open a regular file for reading, refusing a symlink or anything else planted in its
    place. Opened without blocking: an open of a FIFO would wait for a writer forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RemoteIntegrityError(path.name, "not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with _open(path) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _factory(root: str, url: str, retry: RetryPolicy | None, key: bytes | None) -> RemoteClient:
    return DirectoryClient(root, where=url, retry=retry, key=key)


use_directory_client(_factory)
