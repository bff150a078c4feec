"""The live state: epoch, offsets, watermark, a base level and an overlay of generations.

Two levels, as in ``docs/architecture.md``:

* the **base** is a snapshot's LMDB image, read-only and memory-mapped
  (:class:`~statelog.base.BaseLevel`), or :class:`~statelog.base.EmptyBase`;
* the **overlay** is a list of *generations*, one per WAL segment replayed or
  written since the base: each a dict per table of key -> encoded value, or
  ``None`` for a key deleted over a lower level.

A commit touches only the newest generation, a dict bounded by the segment
size, never the base. When a snapshot covering whole segments arrives,
:meth:`LiveState.swap_base` installs it and drops the generations it folded,
so the overlay's memory is bounded by the compaction trigger.

Values stay msgpack-encoded, so every read returns a fresh object. Key order:
``bytes`` keys before ``str`` keys, each bytewise (``str`` by code point,
which is its UTF-8 byte order) -- the order of the base's tagged keys.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .base import Base, EmptyBase
from .records import CommitRecord, Key

__all__ = ["MAX_GENERATIONS", "Generation", "Key", "LiveState"]

MAX_GENERATIONS = 32
"""Above this many generations (a store nobody compacts) the two oldest are merged."""

_MISSING = object()


class Generation:
    """The overlay entries written to one WAL segment (or, after a merge, to several)."""

    __slots__ = ("first_epoch", "last_epoch", "segment", "tables")

    def __init__(self, segment: int, first_epoch: int) -> None:
        self.segment = segment
        self.first_epoch = first_epoch
        self.last_epoch = first_epoch - 1
        self.tables: dict[str, dict[Key, bytes | None]] = {}


def _sort_key(k: Key) -> tuple[int, Key]:
    return (0, k) if type(k) is bytes else (1, k)


class LiveState:
    """Everything a reader sees. Mutated only by :meth:`apply` and :meth:`swap_base`."""

    def __init__(self) -> None:
        self.epoch = 0
        self.offsets: dict[str, int] = {}
        self.low_watermark_ms = 0
        self.base: Base = EmptyBase()
        self.base_epoch = 0
        self.generations: list[Generation] = [Generation(0, 1)]

    # -- writing ----------------------------------------------------------
    def begin_generation(self, segment: int) -> None:
        """Start a new generation for records of WAL segment ``segment``."""
        top = self.generations[-1]
        if top.segment == segment:
            return
        if not top.tables:
            top.segment, top.first_epoch = segment, self.epoch + 1
            return
        self.generations.append(Generation(segment, self.epoch + 1))
        if len(self.generations) > MAX_GENERATIONS:
            self._merge_oldest()

    def apply(
        self,
        epoch: int,
        offsets: Mapping[str, int],
        low_watermark_ms: int,
        deltas: Iterable[tuple[str, Sequence[Key], Sequence[bytes], Sequence[Key]]],
    ) -> None:
        """Apply one verified commit to the newest generation. The caller checked the epoch."""
        top = self.generations[-1]
        # A delete must hide the key in lower levels; with none, just forget it.
        shadowing = len(self.generations) > 1 or not isinstance(self.base, EmptyBase)
        for name, keys, values, deletes in deltas:
            table = top.tables.get(name)
            if table is None:
                table = top.tables[name] = {}
            if deletes:
                if shadowing:
                    table.update(dict.fromkeys(deletes))
                else:
                    pop = table.pop
                    for k in deletes:
                        pop(k, None)
            if keys:
                table.update(zip(keys, values, strict=True))
        self.offsets.update(offsets)
        self.low_watermark_ms = low_watermark_ms
        self.epoch = top.last_epoch = epoch

    def apply_record(self, rec: CommitRecord) -> None:
        self.apply(
            rec.epoch,
            rec.offsets,
            rec.low_watermark_ms,
            ((t.name, t.keys, t.values, t.deletes) for t in rec.tables),
        )

    def swap_base(self, base: Base, epoch: int) -> Base:
        """Install ``base`` (the state at ``epoch``); drop generations it covers.

        Only generations wholly at or below ``epoch`` are dropped, so a
        generation straddling it stays and still shadows the base correctly
        (its entries are at least as new). Returns the old base to close.
        """
        old = self.base
        self.base, self.base_epoch = base, epoch
        kept = [g for g in self.generations if g.last_epoch > epoch or g is self.generations[-1]]
        top = self.generations[-1]
        if top.last_epoch <= epoch and top.tables:
            # The newest generation is folded too: keep an empty one to write into.
            kept = [Generation(top.segment, self.epoch + 1)]
        self.generations = kept
        return old

    def _merge_oldest(self) -> None:
        older, newer = self.generations[0], self.generations[1]
        # Delete markers are kept even with nothing below yet: a snapshot may
        # later land inside the merged range and bring the deleted key back.
        for name, entries in newer.tables.items():
            older.tables.setdefault(name, {}).update(entries)
        older.last_epoch = newer.last_epoch
        older.segment = newer.segment
        del self.generations[1]

    # -- reading ----------------------------------------------------------
    def get(self, table: str, key: Any) -> bytes | None:
        for g in reversed(self.generations):
            t = g.tables.get(table)
            if t is not None:
                v = t.get(key, _MISSING)
                if v is not _MISSING:
                    return v  # type: ignore[return-value]
        return self.base.get(table, key)

    def _overlay(self, table: str) -> dict[Key, bytes | None]:
        """The generations of ``table`` merged, newest entry winning."""
        gens = [g.tables[table] for g in self.generations if table in g.tables]
        if len(gens) == 1:
            return gens[0]
        merged: dict[Key, bytes | None] = {}
        for t in gens:
            merged.update(t)
        return merged

    def count(self, table: str) -> int:
        overlay = self._overlay(table)
        if isinstance(self.base, EmptyBase):
            return sum(1 for v in overlay.values() if v is not None)
        n = self.base.count(table)
        for k, v in overlay.items():
            below = self.base.get(table, k) is not None
            n += (v is not None) - below
        return n

    def tables(self) -> list[str]:
        names = set(self.base.tables())
        for g in self.generations:
            names.update(g.tables)
        return sorted(names)

    def items(self, table: str, prefix: Key | None = None) -> Iterator[tuple[Key, bytes]]:
        """``(key, encoded value)`` of ``table`` in key order, overlay merged over the base."""
        overlay = self._overlay(table)
        if prefix is None:
            keys = sorted(overlay, key=_sort_key)
        else:
            kind = type(prefix)
            keys = sorted(k for k in overlay if type(k) is kind and k.startswith(prefix))  # type: ignore[arg-type]
        top = [(_sort_key(k), k, overlay[k]) for k in keys]
        below = ((_sort_key(k), k, v) for k, v in self.base.items(table, prefix))
        last: Any = None
        # Overlay entries sort before base entries of the same key and win.
        for sk, k, v in heapq.merge(top, below, key=lambda e: e[0]):
            if sk == last:
                continue
            last = sk
            if v is not None:
                yield k, v
