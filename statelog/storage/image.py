"""The base level: the full state as a read-only, memory-mapped LMDB image.

The base level sits beneath the in-memory overlay (``docs/architecture.md``).
It is the LMDB file carried, zstd-compressed, in the body of a snapshot
(``docs/format.md``, "Snapshots"). Grammar of the image::

    image    := LMDB environment, one file (subdir=False)
    main db  := { table name (UTF-8) -> named sub-database }, nothing else
    table db := { encode_key(key) -> value }
    key      := 0x00 raw-bytes          -- a bytes key
              | 0x01 utf-8-bytes        -- a str key
    value    := the msgpack bytes the commit record carried, stored as-is

The tag byte keeps ``b"k"`` and ``"k"`` distinct and makes LMDB's bytewise
order the overlay's order: every bytes key before every str key, each kind
bytewise (str by code point, which is its UTF-8 byte order).

:class:`BaseLevel` reads a finished image;
:class:`~statelog.storage.builder.ImageBuilder` writes one (the compactor's
job, in its own temporary directory). py-lmdb rules kept
here: an environment is never used across ``fork()`` (checked), the same
file is never opened twice in one process (py-lmdb refuses), no
``writemap``, and a full map grows instead of failing.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Protocol, Self

import lmdb

from statelog.errors import CorruptionError, StoreClosedError
from statelog.format.exact import tagged_keys
from statelog.format.records import Key

__all__ = ["Base", "BaseLevel", "Delta", "EmptyBase", "decode_key", "encode_key", "encode_keys"]

_CHUNK = 1024  # items fetched per read transaction while iterating
# Read-only image: no lock file or reader table (nothing writes it); no readahead (random reads).
_READ_ONLY = {"subdir": False, "readonly": True, "lock": False, "readahead": False}
_HINT = "extract the image from its verified snapshot again"
_DAMAGE = (lmdb.InvalidError, lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.IncompatibleError)

Delta = tuple[str, Sequence[Key], Sequence[bytes], Sequence[Key]]
"""``(table, keys, values, deleted keys)``: one table's part of a commit."""


def encode_key(key: Key) -> bytes:
    """The LMDB key of ``key``: a type tag byte, then the raw bytes or the UTF-8 text.

    :raises TypeError: ``key`` is neither str nor bytes.
    """
    if isinstance(key, bytes):
        return b"\x00" + key
    if isinstance(key, str):
        return b"\x01" + key.encode("utf-8")
    raise TypeError(f"keys are str or bytes, not {type(key).__name__}")


def encode_keys(keys: Sequence[Key]) -> list[bytes]:
    """:func:`encode_key` of each of ``keys``, in order.

    A list of str and bytes keys is encoded in one call
    (:func:`statelog.format.exact.tagged_keys`): the compactor encodes every key of
    every record it folds.

    :raises TypeError: a key is neither str nor bytes.
    """
    tagged = tagged_keys(keys if type(keys) is list else list(keys))
    if tagged is not None:
        return tagged
    return [encode_key(k) for k in keys]  # some key no image stores: named here


def decode_key(data: bytes) -> Key:
    """Invert :func:`encode_key`.

    :raises ValueError: an empty key or an unknown tag byte.
    """
    if data[:1] == b"\x00":
        return data[1:]
    if data[:1] == b"\x01":
        return data[1:].decode("utf-8")
    raise ValueError(f"not an encoded key (tag {data[:1]!r})")


class Base(Protocol):
    """What the store reads beneath its overlay: :class:`BaseLevel` or :class:`EmptyBase`."""

    def get(self, table: str, key: Key) -> bytes | None: ...
    def items(self, table: str, prefix: Key | None = None) -> Iterator[tuple[Key, bytes]]: ...
    def count(self, table: str) -> int: ...
    def tables(self) -> list[str]: ...
    def close(self) -> None: ...


class EmptyBase:
    """The base of a store that has no snapshot yet: no tables, no keys."""

    def get(self, table: str, key: Key) -> bytes | None:
        return None

    def items(self, table: str, prefix: Key | None = None) -> Iterator[tuple[Key, bytes]]:
        return iter(())

    def count(self, table: str) -> int:
        return 0

    def tables(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class BaseLevel:
    """A finished image, opened read-only and memory-mapped.

    Thread-safe for readers: each call takes its own read transaction and
    :meth:`close` waits for calls in flight, so an unmap never races a read.
    :meth:`items` holds no transaction between chunks of ``_CHUNK`` keys (the
    image is immutable, so chunks resume exactly). A disk I/O error while
    touching a mapped page arrives as SIGBUS, as for any memory-mapped file.
    Reads after :meth:`close` raise :class:`~statelog.errors.StoreClosedError`,
    reads in a forked child ``RuntimeError``.
    """

    def __init__(self, path: Path) -> None:
        """Open the image at ``path`` (tables counted first by a short open and close,
        since LMDB needs ``max_dbs`` up front; never two opens at once).

        :raises FileNotFoundError: no file at ``path``.
        :raises CorruptionError: the file is not a readable LMDB image.
        :raises lmdb.Error: the file is already open in this process.
        """
        self.path = path
        size = os.stat(path).st_size  # FileNotFoundError is not damage
        env = None
        try:
            if size == 0:  # read-only LMDB would try to initialise it: EBADF
                raise lmdb.InvalidError("empty file")
            with self._open(path, size, 0) as probe, probe.begin() as txn:
                tables = txn.stat()["entries"]
            env = self._open(path, size, max(1, tables))
            self._dbs = {n.decode("utf-8"): env.open_db(n, create=False) for n in env.dbs()}
        except (*_DAMAGE, UnicodeDecodeError) as exc:
            if env is not None:
                env.close()
            raise CorruptionError(path, 0, f"not a readable LMDB image: {exc}", hint=_HINT) from exc
        self._env = env
        self._pid = os.getpid()
        self._mu = threading.Condition()
        self._active = 0
        self._closed = False

    @staticmethod
    def _open(path: Path, size: int, max_dbs: int) -> lmdb.Environment:
        return lmdb.open(str(path), max_dbs=max_dbs, map_size=max(size, 1), **_READ_ONLY)

    @contextlib.contextmanager
    def _txn(self, db: lmdb._Database | None = None) -> Iterator[lmdb.Transaction[bytes]]:
        """A read transaction, counted so that :meth:`close` waits for it."""
        if os.getpid() != self._pid:
            raise RuntimeError(f"{self.path}: an LMDB environment cannot cross fork(); reopen it")
        with self._mu:
            if self._closed:
                raise StoreClosedError(f"base level {self.path} is closed")
            self._active += 1
        try:
            with self._env.begin(db=db) as txn:
                yield txn
        finally:
            with self._mu:
                self._active -= 1
                self._mu.notify_all()

    def get(self, table: str, key: Key) -> bytes | None:
        """The stored (msgpack) value of ``key`` in ``table``, or None."""
        db = self._dbs.get(table)
        if db is None:
            return None
        ekey = encode_key(key)
        with self._txn(db) as txn:
            return txn.get(ekey)

    def get_many(self, table: str, ekeys: Sequence[bytes]) -> list[bytes | None]:
        """The stored values of the encoded keys ``ekeys`` in ``table`` (None: absent),
        all in one read transaction."""
        db = self._dbs.get(table)
        if db is None:
            return [None] * len(ekeys)
        with self._txn(db) as txn:
            get = txn.get
            return [get(k) for k in ekeys]

    def count(self, table: str) -> int:
        """Keys in ``table`` (0 for an unknown table), from the sub-database's stat."""
        db = self._dbs.get(table)
        if db is None:
            return 0
        with self._txn() as txn:
            return txn.stat(db)["entries"]

    def tables(self) -> list[str]:
        """Table names in the image, sorted."""
        return sorted(self._dbs)

    def items(self, table: str, prefix: Key | None = None) -> Iterator[tuple[Key, bytes]]:
        """``(key, value)`` in key order; a str prefix selects str keys, bytes bytes keys."""
        db = self._dbs.get(table)
        if db is None:
            return
        bound = b"" if prefix is None else encode_key(prefix)
        after: bytes | None = None
        while True:
            chunk = self._chunk(db, bound, after)
            for ekey, value in chunk:
                yield decode_key(ekey), value
            if len(chunk) < _CHUNK:
                return
            after = chunk[-1][0]

    def raw_chunks(self, table: str) -> Iterator[list[tuple[bytes, bytes]]]:
        """The encoded ``(key, value)`` pairs of ``table`` in key order, in lists of up to
        ``_CHUNK`` (a compactor merging a delta's image reads it this way)."""
        db = self._dbs.get(table)
        if db is None:
            return
        after: bytes | None = None
        while chunk := self._chunk(db, b"", after):
            yield chunk
            if len(chunk) < _CHUNK:
                return
            after = chunk[-1][0]

    def _chunk(
        self, db: lmdb._Database, bound: bytes, after: bytes | None
    ) -> list[tuple[bytes, bytes]]:
        """Up to ``_CHUNK`` items starting with ``bound``, past ``after`` if given."""
        out: list[tuple[bytes, bytes]] = []
        with self._txn(db) as txn, txn.cursor() as cur:
            found = cur.set_range(bound if after is None else after)
            if found and after is not None and cur.key() == after:
                found = cur.next()
            if found and not bound:  # a whole table: read in C, without a call per key
                return list(islice(cur.iternext(keys=True, values=True), _CHUNK))
            while found and len(out) < _CHUNK:
                ekey, value = cur.item()
                if not ekey.startswith(bound):
                    break
                out.append((ekey, value))
                found = cur.next()
        return out

    def close(self) -> None:
        """Unmap the image once calls in flight have returned. Idempotent."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
            while self._active:
                self._mu.wait()
        if os.getpid() == self._pid:
            self._env.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
