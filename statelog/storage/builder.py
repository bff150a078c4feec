"""The compactor's writable LMDB image: folded into, then compacted into a finished image.

The image's grammar is :mod:`statelog.storage.image`'s; this module only
writes it. Scratch files: no fsync, since durability comes from the
snapshot file written from the finished image.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Self

import lmdb

from statelog.errors import StoreClosedError
from statelog.format.records import Key
from statelog.storage.image import Delta, encode_keys

__all__ = ["ImageBuilder"]

_MAP_SIZE = 64 << 20  # initial map of a builder; it doubles whenever full
_TABLES = 64  # initial max_dbs of a builder; raised when more tables arrive
# Scratch image: no fsync (the snapshot file is what gets synced); never writemap (SIGBUS).
_SCRATCH = {"subdir": False, "lock": False, "sync": False, "metasync": False, "writemap": False}
_Encoded = tuple[str, list[bytes], list[bytes], list[bytes]]  # a Delta, keys encoded


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
        batch = [(t, encode_keys(ks), list(vs), encode_keys(ds)) for t, ks, vs, ds in deltas]
        for t, ks, vs, _ in batch:
            if len(ks) != len(vs):
                raise ValueError(f"table {t!r}: {len(ks)} keys but {len(vs)} values")
        while True:
            try:
                self._write(batch, self._handles([t for t, _, _, _ in batch]))
                return
            except lmdb.MapFullError:
                self._grow()

    def apply_encoded(
        self, table: str, puts: Sequence[tuple[bytes, bytes]], deletes: Sequence[bytes]
    ) -> None:
        """Delete the encoded keys ``deletes``, then put ``puts`` (encoded keys, in key
        order), in ``table``, in one write transaction (retried whole on a full map).

        :raises lmdb.Error: LMDB refused (disk full, ...).
        """
        while True:
            try:
                db = self._handles([table])[0]
                with self.env.begin(write=True) as txn:
                    for k in deletes:
                        txn.delete(k, db=db)
                    if puts:
                        with txn.cursor(db=db) as cur:
                            cur.putmulti(puts, dupdata=False, overwrite=True)
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
