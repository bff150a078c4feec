"""The base level as a stack of images: a full snapshot's, then one per delta of its chain.

A delta snapshot holds only what its tail changed, so the state it
restores is its chain read top down: the newest delta's image first, then
the older deltas', then the full snapshot's. In a delta's image a deleted
key is stored with the value :data:`~statelog.storage.snapshot_body.TOMBSTONE`
(no msgpack object encodes to ``b""``), which hides the key in every
older level. :class:`LayeredBase` reads such a stack as one
:class:`~statelog.storage.image.Base`; a full snapshot's base is the
stack of one.

py-lmdb refuses to open one file twice in a process, and a writer's old
and new base share every level but the newest, so levels are opened
through one process-wide, reference-counted registry: a level is unmapped
when the last base holding it is closed.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from statelog.errors import StoreClosedError
from statelog.format.records import Key
from statelog.storage.image import BaseLevel, encode_key
from statelog.storage.snapshot_body import TOMBSTONE

__all__ = ["LayeredBase", "open_levels"]


class _Held:
    __slots__ = ("holds", "level")

    def __init__(self, level: BaseLevel) -> None:
        self.level, self.holds = level, 0


class _Registry:
    """Every level this process has open, by resolved path, with how many bases hold it."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._open: dict[Path, _Held] = {}

    def acquire(self, path: Path) -> BaseLevel:
        """The open level of ``path``, opened now if no base holds it.

        :raises FileNotFoundError: no file at ``path``.
        :raises CorruptionError: the file is not a readable LMDB image.
        """
        key = path.resolve()
        with self._mu:
            held = self._open.get(key)
            if held is None:
                held = self._open[key] = _Held(BaseLevel(path))
            held.holds += 1
            return held.level

    def release(self, level: BaseLevel) -> None:
        """Drop one hold on ``level``; the last one closes it (after reads in flight)."""
        key = level.path.resolve()
        with self._mu:
            held = self._open.get(key)
            if held is None or held.level is not level:
                return
            held.holds -= 1
            if held.holds > 0:
                return
            del self._open[key]
        level.close()


_registry = _Registry()


def open_levels(paths: Sequence[Path], tables: Mapping[str, int]) -> LayeredBase:
    """A :class:`LayeredBase` over the images at ``paths``, oldest (the full one) first.

    ``tables`` is the keys per table of the state the stack spells (the
    newest snapshot's meta). Levels already open in this process are shared.

    :raises FileNotFoundError: an image is missing (nothing stays open).
    :raises CorruptionError: an image is not a readable LMDB image.
    """
    return LayeredBase(paths, tables)


def _sort_key(k: Key) -> tuple[int, Key]:
    return (0, k) if type(k) is bytes else (1, k)


def _tagged(
    level: BaseLevel, rank: int, table: str, prefix: Key | None
) -> Iterator[tuple[tuple[int, Key], int, Key, bytes]]:
    """``level``'s items as merge entries: sort key, then ``rank`` (lower: newer level)."""
    for k, v in level.items(table, prefix):
        yield _sort_key(k), rank, k, v


class LayeredBase:
    """A stack of read-only images read as one base level. Thread-safe for readers."""

    def __init__(self, paths: Sequence[Path], tables: Mapping[str, int]) -> None:
        if not paths:
            raise ValueError("a layered base needs at least its full image")
        levels: list[BaseLevel] = []
        try:
            for path in paths:
                levels.append(_registry.acquire(path))
        except BaseException:
            for level in levels:
                _registry.release(level)
            raise
        self._levels = levels
        self._tables = {t: n for t, n in tables.items() if n > 0}
        self._closed = False
        self._mu = threading.Lock()

    @property
    def paths(self) -> tuple[Path, ...]:
        """The images of the stack, oldest (the full snapshot's) first."""
        return tuple(level.path for level in self._levels)

    @property
    def levels(self) -> tuple[BaseLevel, ...]:
        """The open levels, oldest (the full snapshot's) first."""
        return tuple(self._levels)

    @property
    def path(self) -> Path:
        """The newest level's image."""
        return self._levels[-1].path

    @property
    def depth(self) -> int:
        """Delta levels above the full one."""
        return len(self._levels) - 1

    def get(self, table: str, key: Key) -> bytes | None:
        """The stored value of ``key`` in the newest level holding it; None if deleted or absent."""
        self._check_open()
        if len(self._levels) == 1:
            return self._levels[0].get(table, key)
        ekey = [encode_key(key)]
        for level in reversed(self._levels):
            value = level.get_many(table, ekey)[0]
            if value is not None:
                return None if value == TOMBSTONE else value
        return None

    def get_many(self, table: str, ekeys: Sequence[bytes]) -> list[bytes | None]:
        """The values of the encoded keys ``ekeys`` (None: deleted or absent), one read
        transaction per level, newest first, each asked only for keys still unresolved."""
        self._check_open()
        out: list[bytes | None] = [None] * len(ekeys)
        todo = list(range(len(ekeys)))
        for level in reversed(self._levels):
            if not todo:
                break
            got = level.get_many(table, [ekeys[i] for i in todo])
            left = []
            for i, value in zip(todo, got, strict=True):
                if value is None:
                    left.append(i)
                elif value != TOMBSTONE:
                    out[i] = value
            todo = left
        return out

    def count(self, table: str) -> int:
        """Keys in ``table``: the image's own count for a full snapshot, else as the
        newest snapshot's meta counts them (checked against its parent by the compactor)."""
        self._check_open()
        if len(self._levels) == 1:
            return self._levels[0].count(table)
        return self._tables.get(table, 0)

    def tables(self) -> list[str]:
        """Tables that hold at least one key, sorted."""
        self._check_open()
        if len(self._levels) == 1:
            return self._levels[0].tables()
        return sorted(self._tables)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"base level {self.path} is closed")

    def items(self, table: str, prefix: Key | None = None) -> Iterator[tuple[Key, bytes]]:
        """``(key, value)`` in key order, each key from the newest level that holds it."""
        self._check_open()
        if len(self._levels) == 1:
            yield from self._levels[0].items(table, prefix)
            return
        streams = [_tagged(level, -i, table, prefix) for i, level in enumerate(self._levels)]
        last: tuple[int, Key] | None = None
        for sk, _newer, k, v in heapq.merge(*streams):
            if sk == last:
                continue  # an older level's entry for a key a newer one already gave
            last = sk
            if v != TOMBSTONE:
                yield k, v

    def close(self) -> None:
        """Release every level (the last holder unmaps it). Idempotent."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
        for level in self._levels:
            _registry.release(level)
