"""Full merges as one sequential pass: a chain's levels and a tail's changes, merged in key
order into a fresh image.

A full merge must produce the state that the chain's full image, each of
its delta images in order and then the folded tail add up to. Copying the
full image and applying the rest to the copy in place writes the whole
file once more, plus every page the updates dirty, and leaves the copy
larger than the state (the pages LMDB freed stay in the file, and the next
merge copies them again). Instead, every source is read in key order and
the result appended to a new image in LMDB's append mode: it is written
once, with full pages, and the work is one read of each source.

Per table, the full image is read in chunks (:meth:`BaseLevel.raw_chunks`);
for each chunk, every newer source gives up the entries whose keys sort at
or before the chunk's last key, oldest source first, so a newer value or a
:data:`~statelog.storage.snapshot_body.TOMBSTONE` wins. The chunk's
entries are merged in a dict and sorted (C-level work), tombstones
dropped, and the live entries appended. What the newer sources hold past
the full image's last key is merged last.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from statelog.compaction.delta import Changes
from statelog.storage.layered import LayeredBase
from statelog.storage.snapshot_body import TOMBSTONE, StreamBuild, StreamTee
from statelog.storage.snapshots import StreamWriter

__all__ = ["merge_levels", "merged"]

Pair = tuple[bytes, bytes]
_BATCH = 65536  # entries appended per write transaction


def _first(pair: Pair) -> bytes:
    return pair[0]


class _Sorted:
    """A source of ``(key, value)`` pairs in increasing key order, read in chunks."""

    def __init__(self, chunks: Iterable[list[Pair]]) -> None:
        self._chunks: Iterator[list[Pair]] = iter(chunks)
        self._buf: list[Pair] = []
        self._at = 0

    def upto(self, last: bytes | None) -> list[Pair]:
        """The pairs not yet taken whose key is at most ``last`` (None: all of them)."""
        out: list[Pair] = []
        while True:
            if self._at >= len(self._buf):
                chunk = next(self._chunks, None)
                if chunk is None:
                    return out
                self._buf, self._at = chunk, 0
                continue
            end = (
                len(self._buf)
                if last is None
                else bisect.bisect_right(self._buf, last, lo=self._at, key=_first)
            )
            out.extend(self._buf[self._at : end])
            self._at = end
            if end < len(self._buf):
                return out


class _Appender:
    """Appends one table's merged entries to the image in batches (and to ``tee``, if
    given); counts the live keys."""

    def __init__(self, build: StreamBuild, table: str, tee: StreamTee | None) -> None:
        self._build = build
        self._tee = tee
        self._table = table
        self._batch: list[Pair] = []
        self.count = 0

    def add(self, merged: dict[bytes, bytes], *, ordered: bool) -> None:
        items = list(merged.items()) if ordered else sorted(merged.items())
        live = [kv for kv in items if kv[1] != TOMBSTONE]
        self.count += len(live)
        self._batch.extend(live)
        if len(self._batch) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        if self._batch:
            self._build.append_sorted(self._table, self._batch)
            if self._tee is not None:
                self._tee.add(self._table, self._batch)
            self._batch = []


def _tail_pairs(entries: dict[bytes, bytes | None]) -> list[Pair]:
    """The tail's changes of one table as sorted pairs, a delete as a tombstone."""
    keys = sorted(entries)
    values = list(map(entries.__getitem__, keys))
    if None in values:
        values = [TOMBSTONE if v is None else v for v in values]
    return list(zip(keys, values, strict=True))  # type: ignore[arg-type]


def _merge_table(
    build: StreamBuild, table: str, base: LayeredBase, tail: list[Pair], tee: StreamTee | None
) -> int:
    """Merge ``table`` of every level of ``base`` and then ``tail`` into ``build``."""
    full, *deltas = base.levels
    newer = [_Sorted(level.raw_chunks(table)) for level in deltas]
    if tail:
        newer.append(_Sorted([tail]))
    out = _Appender(build, table, tee)
    for chunk in full.raw_chunks(table):
        merged = dict(chunk)
        changed = False
        for source in newer:
            taken = source.upto(chunk[-1][0])
            if taken:
                merged.update(taken)
                changed = True
        out.add(merged, ordered=not changed)
    rest: dict[bytes, bytes] = {}
    for source in newer:
        rest.update(source.upto(None))
    out.add(rest, ordered=False)
    out.flush()
    return out.count


def merge_levels(
    base: LayeredBase, changes: Changes, image: Path, tee: StreamTee | None = None
) -> dict[str, int]:
    """Write the state of ``base`` with ``changes`` applied as a new image at ``image``.

    Scratch: no fsync (the snapshot streamed from the image is what a pass
    makes durable). Returns the live keys per table, tables without keys
    left out. With ``tee``, every entry appended is also fed to it, so the
    snapshot's record stream is written without reading the image back.

    :raises FileExistsError: ``image`` exists.
    :raises lmdb.Error: LMDB refused (the disk is full, say).
    """
    tables = sorted(set(base.tables()) | set(changes.tables), key=lambda t: t.encode("utf-8"))
    hint = sum(p.stat().st_size for p in base.paths)
    build = StreamBuild(image, tables=len(tables), size_hint=hint)
    counts: dict[str, int] = {}
    try:
        for table in tables:
            tail = _tail_pairs(changes.tables.get(table, {}))
            n = _merge_table(build, table, base, tail, tee)
            if n:
                counts[table] = n
    finally:
        build.close()
    return counts


def merged(base: LayeredBase, changes: Changes, image: Path) -> StreamWriter:
    """The body of a full merge's snapshot: writing it runs :func:`merge_levels` into
    ``image`` and streams every entry appended (one read of each level; the image is
    not read back to make the body)."""

    def stream(write: Callable[[bytes], object]) -> tuple[int, dict[str, int]]:
        tee = StreamTee(write)
        merge_levels(base, changes, image, tee)
        return tee.finish()

    return stream
