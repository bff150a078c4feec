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

:class:`BaseLevel` reads a finished image; :class:`ImageBuilder` writes one
(the compactor's job, in its own temporary directory). py-lmdb rules kept
here: an environment is never used across ``fork()`` (checked), the same
file is never opened twice in one process (py-lmdb refuses), no
``writemap``, and a full map grows instead of failing.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Protocol, Self

import lmdb

from statelog.errors import CorruptionError, StoreClosedError
from statelog.format.records import Key

__all__ = ["Base", "BaseLevel", "EmptyBase", "ImageBuilder", "decode_key", "encode_key"]

_CHUNK = 1024  # items fetched per read transaction while iterating
_MAP_SIZE = 64 << 20  # initial map of a builder; it doubles whenever full
_TABLES = 64  # initial max_dbs of a builder; raised when more tables arrive
# Read-only image: no lock file or reader table (nothing writes it); no readahead (random reads).
_READ_ONLY = {"subdir": False, "readonly": True, "lock": False, "readahead": False}
# Scratch image: no fsync (the snapshot file is what gets synced); never writemap (SIGBUS).
_SCRATCH = {"subdir": False, "lock": False, "sync": False, "metasync": False, "writemap": False}
_HINT = "extract the image from its verified snapshot again"
_DAMAGE = (lmdb.InvalidError, lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.IncompatibleError)

Delta = tuple[str, Sequence[Key], Sequence[bytes], Sequence[Key]]
"""``(table, keys, values, deleted keys)``: one table's part of a commit."""
_Encoded = tuple[str, list[bytes], list[bytes], list[bytes]]  # a Delta, keys encoded


def encode_key(key: Key) -> bytes:
    """The LMDB key of ``key``: a type tag byte, then the raw bytes or the UTF-8 text.

    :raises TypeError: ``key`` is neither str nor bytes.
    """
    if isinstance(key, bytes):
        return b"\x00" + key
    if isinstance(key, str):
        return b"\x01" + key.encode("utf-8")
    raise TypeError(f"keys are str or bytes, not {type(key).__name__}")


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

    def _chunk(
        self, db: lmdb._Database, bound: bytes, after: bytes | None
    ) -> list[tuple[bytes, bytes]]:
        """Up to ``_CHUNK`` items starting with ``bound``, past ``after`` if given."""
        out: list[tuple[bytes, bytes]] = []
        with self._txn(db) as txn, txn.cursor() as cur:
            found = cur.set_range(bound if after is None else after)
            if found and after is not None and cur.key() == after:
                found = cur.next()
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


class ImageBuilder:
    """A writable image the compactor folds deltas into, then compacts into a finished image.

    Single-threaded; lives in the compactor's own temporary directory. The
    working file is scratch: no fsync (``sync=False``), since durability
    comes from the snapshot file written from the finished image.
    """

    def __init__(self, path: Path, map_size: int, max_tables: int) -> None:
        self.path = path  # use create() or adopt()
        self._map_size = map_size
        self._max_tables = max_tables
        self._env: lmdb.Environment | None = None
        self._dbs: dict[str, lmdb._Database] = {}
        self._final: dict[str, int] | None = None
        self._reopen()

    @classmethod
    def create(cls, path: Path, *, map_size: int = _MAP_SIZE, max_tables: int = _TABLES) -> Self:
        """Start an empty image at ``path``, which must not exist.

        :raises FileExistsError: ``path`` exists.
        """
        if path.exists():
            raise FileExistsError(path)
        return cls(path, map_size, max_tables)

    @classmethod
    def adopt(cls, path: Path, *, map_size: int = _MAP_SIZE, max_tables: int = _TABLES) -> Self:
        """Continue from the image at ``path`` (this process's own scratch, built by
        :func:`~statelog.storage.snapshots.extract_snapshot`): it is modified in place.

        :raises FileNotFoundError: no file at ``path``.
        """
        return cls(path, max(map_size, 2 * path.stat().st_size), max_tables)

    def _reopen(self) -> None:
        """(Re)open the working file with room for every table it holds."""
        self.close()
        self._env = lmdb.open(
            str(self.path), map_size=self._map_size, max_dbs=self._max_tables, **_SCRATCH
        )
        self._room(0)  # a copied image may hold more tables than max_dbs

    def _room(self, new_tables: int) -> None:
        """Reopen with a larger ``max_dbs`` if ``new_tables`` more might not fit."""
        held = self.env.stat()["entries"]  # the main db holds only table names
        if held + new_tables >= self._max_tables:
            self._max_tables = 2 * (held + new_tables) + 1
            self._reopen()  # handles belong to one environment: all are reopened

    @property
    def env(self) -> lmdb.Environment:
        if self._env is None:
            raise StoreClosedError(f"image builder {self.path} is finished or closed")
        return self._env

    @property
    def map_size(self) -> int:
        """The current map size in bytes (grows on demand)."""
        return self._map_size

    def _handles(self, tables: list[str]) -> list[lmdb._Database]:
        """Handles of ``tables``, created if new (this may grow the map)."""
        self._room(len(set(tables) - self._dbs.keys()))
        for t in tables:
            if t not in self._dbs:
                self._dbs[t] = self.env.open_db(t.encode("utf-8"), create=True)
        return [self._dbs[t] for t in tables]

    def _grow(self) -> None:
        self._map_size *= 2
        self.env.set_mapsize(self._map_size)  # no transaction is open here

    def apply(
        self, table: str, keys: Sequence[Key], values: Sequence[bytes], deletes: Sequence[Key]
    ) -> None:
        """Delete ``deletes`` then put ``keys``/``values`` in ``table``, in one transaction."""
        self.apply_batch([(table, keys, values, deletes)])

    def apply_batch(self, deltas: Iterable[Delta]) -> None:
        """Apply ``deltas`` in order (each: deletes, then puts), all in one write transaction.

        On ``MapFullError`` the transaction is aborted, the map doubled and
        the whole batch retried, so a batch lands whole or not at all.

        :raises ValueError: a delta has more keys than values or fewer.
        :raises lmdb.Error: LMDB refused (disk full, key over 511 bytes, ...).
        """
        batch = [
            (t, [encode_key(k) for k in ks], list(vs), [encode_key(k) for k in ds])
            for t, ks, vs, ds in deltas
        ]
        for t, ks, vs, _ in batch:
            if len(ks) != len(vs):
                raise ValueError(f"table {t!r}: {len(ks)} keys but {len(vs)} values")
        while True:
            try:
                self._write(batch, self._handles([t for t, _, _, _ in batch]))
                return
            except lmdb.MapFullError:
                self._grow()

    def _write(self, batch: list[_Encoded], handles: list[lmdb._Database]) -> None:
        with self.env.begin(write=True) as txn:
            for (_, ekeys, values, edeletes), db in zip(batch, handles, strict=True):
                for k in edeletes:
                    txn.delete(k, db=db)
                if ekeys:
                    # Sorted puts touch each leaf page once; the stable sort
                    # keeps a repeated key's later value last, so it wins.
                    pairs = sorted(zip(ekeys, values, strict=True), key=itemgetter(0))
                    with txn.cursor(db=db) as cur:
                        cur.putmulti(pairs, dupdata=False, overwrite=True)

    def counts(self) -> dict[str, int]:
        """Keys per table (after :meth:`finish`: as finished)."""
        if self._final is not None:
            return dict(self._final)
        names = sorted(n.decode("utf-8") for n in self.env.dbs())
        handles = self._handles(names)  # dbs() lists at most max_dbs: _reopen made room
        with self.env.begin() as txn:
            return {name: txn.stat(db)["entries"] for name, db in zip(names, handles, strict=True)}

    def finish(self, dest: Path) -> int:
        """Write a compacted copy to ``dest`` (no fsync: ``write_snapshot`` syncs its copy),
        close the builder, return the copy's size.

        :raises FileExistsError: ``dest`` exists.
        """
        if dest.exists():
            raise FileExistsError(dest)
        final = self.counts()
        self.env.copy(str(dest), compact=True)
        self.close()
        self._final = final
        return dest.stat().st_size

    def close(self) -> None:
        """Close the environment; the working file stays for the caller to delete."""
        if self._env is not None:
            self._env.close()
            self._env = None
            self._dbs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
