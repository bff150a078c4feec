"""The live state: epoch, offsets, watermark, a base level and an overlay of generations.

Two levels, as in ``docs/architecture.md``:

* the **base** is a snapshot's LMDB image, read-only and memory-mapped
  (:class:`~statelog.storage.image.BaseLevel`), or :class:`~statelog.storage.image.EmptyBase`;
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

import bisect
import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from statelog.errors import CorruptionError
from statelog.format.records import DECODE_ERRORS, CommitHead, CommitRecord, Key, decode_value
from statelog.storage.image import Base, EmptyBase

__all__ = [
    "MAX_GENERATIONS",
    "MAX_HELD_GENERATIONS",
    "EpochsOnly",
    "Generation",
    "Key",
    "LiveState",
    "read_value",
]

MAX_GENERATIONS = 32
"""The generations reads keep the overlay at: a read that finds more merges two adjacent
ones first (one merge per read, so the reads after a long run of commits share them)."""
MAX_HELD_GENERATIONS = 128
"""The most generations the overlay holds: a roll past this merges two adjacent ones at once
(a store nobody compacts and nobody reads)."""

_MISSING = object()


class Generation:
    """The overlay entries written to one WAL segment (or, after a merge, to several)."""

    __slots__ = ("first_epoch", "last_epoch", "record_bytes", "segment", "tables")

    def __init__(self, segment: int, first_epoch: int) -> None:
        self.segment = segment
        self.first_epoch = first_epoch
        self.last_epoch = first_epoch - 1
        self.record_bytes = 0  # the log bytes of the records applied (what a fold removes)
        self.tables: dict[str, dict[Key, bytes | None]] = {}


def _sort_key(k: Key) -> tuple[int, Key]:
    return (0, k) if type(k) is bytes else (1, k)


class _Sealed(NamedTuple):
    """One table of the sealed generations (all but the newest), merged once.

    Reads merge the newest generation (small: bounded by a segment) over
    this and the base, instead of merging and sorting every generation on
    every call: a high-churn table piles up deleted keys in its generations
    until a snapshot folds them, and sorting all of them per read made a
    scan cost the whole churn since the last snapshot.
    """

    entries: dict[Key, bytes | None]  # newest sealed entry per key; None: deleted
    ordered: list[tuple[tuple[int, Key], Key, bytes]]  # the live entries, in key order
    deleted: frozenset[Key]  # keys the sealed generations delete (hiding the base's)
    live_delta: int  # live keys the sealed entries add to the base's count


class LiveState:
    """Everything a reader sees. Mutated only by :meth:`apply` and :meth:`swap_base`.

    Not thread-safe: once another thread may use it, every call, reads included, holds
    the store's view lock. A read writes too (the per-table list of dicts it walks), and
    a list saved from before a writer's change would go on hiding that change's entries.
    """

    def __init__(self) -> None:
        self.epoch = 0
        self.offsets: dict[str, int] = {}
        self.low_watermark_ms = 0
        self.commit_ms = 0
        """When the commit at :attr:`epoch` was made (Unix ms; 0: not recorded)."""
        self.base: Base = EmptyBase()
        self.base_epoch = 0
        self.generations: list[Generation] = [Generation(0, 1)]
        self.overlay_bytes = 0
        """Log bytes of the records in the overlay: what a compactor has yet to fold."""
        self._sealed: dict[str, _Sealed] = {}  # cleared whenever the sealed set changes
        # Per table, its dict in each generation, newest first: a read walks this list
        # instead of asking every generation for the table (half the lookups of a miss).
        # Cleared whenever a generation, or a table's dict in one, comes or goes.
        self._chains: dict[str, list[dict[Key, bytes | None]]] = {}
        self._read_limit = MAX_GENERATIONS

    # -- writing ----------------------------------------------------------
    def begin_generation(
        self, segment: int, limit: int = MAX_GENERATIONS, hold: int = MAX_HELD_GENERATIONS
    ) -> None:
        """Start a new generation for records of WAL segment ``segment``.

        :param limit: the generations reads keep the overlay at (at least 2). Above it,
            a read merges two adjacent sealed ones before it walks, one merge per read,
            so a writer that does not read pays no merge for generations that the next
            snapshot swap drops whole.
        :param hold: above this many generations (or ``limit``, if more), the roll
            itself merges. A standby, whose base no snapshot swap folds, passes 2 for
            both: one generation of everything sealed (each key once) and the newest.
        """
        if max(2, limit) < self._read_limit:
            self._chains.clear()  # a list kept under the higher bound would skip the merges
        self._read_limit = max(2, limit)
        top = self.generations[-1]
        if top.segment == segment:
            return
        if not top.tables:
            top.segment, top.first_epoch = segment, self.epoch + 1
            return
        self.generations.append(Generation(segment, self.epoch + 1))
        self._changed()
        while len(self.generations) > max(self._read_limit, hold):
            self._merge_smallest_pair()

    def apply(
        self,
        epoch: int,
        offsets: Mapping[str, int],
        low_watermark_ms: int,
        deltas: Iterable[tuple[str, Sequence[Key], Sequence[bytes], Sequence[Key]]],
        record_bytes: int = 0,
    ) -> None:
        """Apply one verified commit to the newest generation. The caller checked the epoch.

        ``record_bytes``: the commit's size in the log, counted in :attr:`overlay_bytes`.
        """
        top = self.generations[-1]
        top.record_bytes += record_bytes
        self.overlay_bytes += record_bytes
        # A delete must hide the key in lower levels; with none, just forget it.
        shadowing = len(self.generations) > 1 or not isinstance(self.base, EmptyBase)
        for name, keys, values, deletes in deltas:
            table = top.tables.get(name)
            if table is None:
                table = top.tables[name] = {}
                self._chains.pop(name, None)
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

    def apply_record(self, rec: CommitRecord, record_bytes: int = 0) -> None:
        self.apply(
            rec.epoch,
            rec.offsets,
            rec.low_watermark_ms,
            ((t.name, t.keys, t.values, t.deletes) for t in rec.tables),
            record_bytes,
        )
        if rec.commit_ms:
            self.commit_ms = rec.commit_ms

    def swap_base(self, base: Base, epoch: int, dropped: list[Generation] | None = None) -> Base:
        """Install ``base`` (the state at ``epoch``); drop generations it covers.

        Only generations wholly at or below ``epoch`` are dropped, so a
        generation straddling it stays and still shadows the base correctly
        (its entries are at least as new). Returns the old base to close.
        ``dropped``, if given, receives the generations dropped: a caller
        holding a lock can then free their entries (a large overlay takes tens
        of milliseconds) after releasing it.
        """
        old = self.base
        self.base, self.base_epoch = base, epoch
        kept = [g for g in self.generations if g.last_epoch > epoch or g is self.generations[-1]]
        top = self.generations[-1]
        if top.last_epoch <= epoch and top.tables:
            # The newest generation is folded too: keep an empty one to write into.
            kept = [Generation(top.segment, self.epoch + 1)]
        if dropped is not None:
            kept_ids = set(map(id, kept))
            dropped.extend(g for g in self.generations if id(g) not in kept_ids)
        self.generations = kept
        self.overlay_bytes = sum(g.record_bytes for g in kept)
        self._changed()
        return old

    def _merge_smallest_pair(self) -> None:
        """Merge the two adjacent sealed generations holding the fewest entries together.

        Not the two oldest: the oldest would grow towards the whole state, and each
        entry merged into it would cost a random insert into a dict of millions
        (cache misses and a freed value each) on the commit or read path. The smallest pair
        keeps merges among recent, small generations, which a base swap usually
        drops whole.
        """
        gens = self.generations
        sizes = [sum(map(len, g.tables.values())) for g in gens[:-1]]  # the top is written to
        pairs = [sizes[i] + sizes[i + 1] for i in range(len(sizes) - 1)]
        self._merge_at(pairs.index(min(pairs)))

    def _merge_at(self, i: int) -> None:
        older, newer = self.generations[i], self.generations[i + 1]
        # Delete markers are kept even with nothing below yet: a snapshot may
        # later land inside the merged range and bring the deleted key back.
        for name, entries in newer.tables.items():
            older.tables.setdefault(name, {}).update(entries)
        older.last_epoch = newer.last_epoch
        older.record_bytes += newer.record_bytes
        older.segment = newer.segment
        del self.generations[i + 1]
        self._changed()

    def _changed(self) -> None:
        """The generations changed: forget what was derived from them."""
        self._sealed.clear()
        self._chains.clear()

    # -- reading ----------------------------------------------------------
    def get(self, table: str, key: Any) -> bytes | None:
        """The encoded value of ``key``, None if absent or deleted. Holds the view lock
        (the class docstring): it may save the list of ``table``'s dicts it walks, and
        merges two generations first while there are more than the read bound
        (``limit`` of :meth:`begin_generation`)."""
        chain = self._chains.get(table)
        if chain is None:
            over = len(self.generations) > self._read_limit
            if over:
                self._merge_smallest_pair()  # clears every chain: the list is built after
            found = (g.tables.get(table) for g in reversed(self.generations))
            chain = [t for t in found if t is not None]
            if not over:  # kept once within the limit: until then each read merges a pair
                self._chains[table] = chain
        for t in chain:
            v = t.get(key, _MISSING)
            if v is not _MISSING:
                return v  # type: ignore[return-value]
        return self.base.get(table, key)

    def _sealed_table(self, table: str) -> _Sealed:
        """The sealed generations of ``table`` merged and sorted (cached until they change)."""
        got = self._sealed.get(table)
        if got is not None:
            return got
        entries: dict[Key, bytes | None] = {}
        for g in self.generations[:-1]:
            t = g.tables.get(table)
            if t:
                entries.update(t)
        ordered = sorted(
            ((_sort_key(k), k, v) for k, v in entries.items() if v is not None), key=_first
        )
        deleted = frozenset(k for k, v in entries.items() if v is None)
        base = self.base
        if isinstance(base, EmptyBase):
            delta = sum(1 for v in entries.values() if v is not None)
        else:
            delta = sum(
                (v is not None) - (base.get(table, k) is not None) for k, v in entries.items()
            )
        got = self._sealed[table] = _Sealed(entries, ordered, deleted, delta)
        return got

    def count(self, table: str) -> int:
        sealed = self._sealed_table(table)
        base = self.base
        n = base.count(table) + sealed.live_delta
        for k, v in (self.generations[-1].tables.get(table) or {}).items():
            prior = sealed.entries.get(k, _MISSING)
            below = base.get(table, k) is not None if prior is _MISSING else prior is not None
            n += (v is not None) - below
        return n

    def tables(self) -> list[str]:
        names = set(self.base.tables())
        for g in self.generations:
            names.update(g.tables)
        return sorted(names)

    def items(self, table: str, prefix: Key | None = None) -> Iterator[tuple[Key, bytes]]:
        """``(key, encoded value)`` of ``table`` in key order, overlay merged over the base."""
        newest = self.generations[-1].tables.get(table) or {}
        sealed = self._sealed_table(table)
        if prefix is None:
            keys = sorted(newest, key=_sort_key)
            mid: Iterable[tuple[tuple[int, Key], Key, bytes]] = sealed.ordered
        else:
            kind = type(prefix)
            keys = sorted(k for k in newest if type(k) is kind and k.startswith(prefix))  # type: ignore[arg-type]
            mid = _prefixed(sealed.ordered, prefix)
        # Deleted keys of the sealed generations are not merged (a table with
        # churn holds far more of them than live keys): they only hide the
        # base's entries. Rank breaks ties: newest generation, sealed, base.
        dead = sealed.deleted
        top = (((_sort_key(k), 0), k, newest[k]) for k in keys)
        middle = (((sk, 1), k, v) for sk, k, v in mid)
        below = (
            ((_sort_key(k), 2), k, v) for k, v in self.base.items(table, prefix) if k not in dead
        )
        last: Any = None
        for (sk, _rank), k, v in heapq.merge(top, middle, below, key=_first):
            if sk == last:
                continue
            last = sk
            if v is not None:
                yield k, v


def read_value(raw: bytes, store: Path, table: str, key: Key) -> Any:
    """Decode a value a read found (a fresh object each call).

    Every value replayed from the log was decoded once already (the record
    schema check), so this fails only on damage that got past every check,
    such as a crafted base image.

    :raises CorruptionError: ``raw`` does not decode (malformed, nested too deeply).
    """
    try:
        return decode_value(raw)
    except DECODE_ERRORS as exc:
        raise CorruptionError(
            store,
            0,
            f"the stored value of key {key!r:.80} in table {table!r:.80} does not decode: {exc}",
            hint=f"run `statelog verify {store}`; a damaged base is rebuilt by restoring "
            "the store or from the source",
        ) from None


class EpochsOnly(LiveState):
    """A state that follows a replay's epoch, offsets and watermark and keeps no table
    entry: for a recovery run only to learn where the log ends (a restore's check of
    the copy it wrote), which would otherwise build the whole overlay to read one
    number. Every check of the replay is made as for a :class:`LiveState`; reads see
    only the base."""

    def apply(
        self,
        epoch: int,
        offsets: Mapping[str, int],
        low_watermark_ms: int,
        deltas: Iterable[tuple[str, Sequence[Key], Sequence[bytes], Sequence[Key]]],
        record_bytes: int = 0,
    ) -> None:
        self.offsets.update(offsets)
        self.low_watermark_ms = low_watermark_ms
        self.epoch = self.generations[-1].last_epoch = epoch

    def apply_record(self, rec: CommitRecord | CommitHead, record_bytes: int = 0) -> None:
        """Apply a record, or only its head (``decode_record_head``): no entry is kept."""
        self.apply(rec.epoch, rec.offsets, rec.low_watermark_ms, (), record_bytes)
        if rec.commit_ms:
            self.commit_ms = rec.commit_ms


def _first(entry: tuple[Any, ...]) -> Any:
    return entry[0]


def _prefixed(
    ordered: list[tuple[tuple[int, Key], Key, bytes]], prefix: Key
) -> Iterator[tuple[tuple[int, Key], Key, bytes]]:
    """The entries of ``ordered`` whose key starts with ``prefix`` (same type), in order."""
    at = bisect.bisect_left(ordered, _sort_key(prefix), key=_first)
    for entry in ordered[at:]:
        k = entry[1]
        if type(k) is not type(prefix) or not k.startswith(prefix):  # type: ignore[arg-type]
            return
        yield entry
