"""Snapshot bodies: the record stream written from an image, and an image built from one.

:mod:`statelog.storage.snapshots` frames, hashes and compresses; this module
turns a finished LMDB image into the record stream of
:mod:`statelog.format.stream` (:func:`stream_image`) and back
(:class:`StreamBuild`), and holds the byte sinks the decompressor writes
into. The sizes a snapshot declares are checked against
:func:`body_limit` before a byte is decompressed, and every sink stops at
its limit instead of counting on, so a crafted body can neither fill the
disk nor run for long.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import IO, Protocol

import lmdb
import msgspec

from statelog.format.stream import (
    TARGET_CHUNK_BYTES,
    TARGET_CHUNK_RECORDS,
    StreamChecker,
    StreamError,
    TableChunk,
    encode_deletes,
    encode_end,
    encode_puts,
    encode_table,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_RATIO",
    "TOMBSTONE",
    "BodyTooLarge",
    "ChunkConsumer",
    "CountingSink",
    "StreamBuild",
    "StreamSink",
    "StreamTee",
    "body_limit",
    "stream_delta",
    "stream_image",
]

TOMBSTONE = b""
"""The value a delta's image stores for a deleted key: no msgpack object encodes to b"",
so a read tells it from every value."""

MAX_RATIO = 1024
"""A body may decompress to at most this many times its compressed size (plus 1 MiB)."""
DEFAULT_MAX_BODY_BYTES = 1 << 40
"""Default for ``STATELOG_MAX_SNAPSHOT_BYTES``: the largest body any snapshot may declare."""
_SLACK = 1 << 20
_KEY, _VALUE = itemgetter(0), itemgetter(1)
_READ_ONLY = {"subdir": False, "readonly": True, "lock": False, "readahead": False}
# Scratch image: no fsync (the snapshot file is what gets synced); never writemap (SIGBUS).
_SCRATCH = {"subdir": False, "lock": False, "sync": False, "metasync": False, "writemap": False}


class ChunkConsumer(Protocol):
    """Whatever a parsed stream's chunks are handed to: a :class:`StreamBuild`, or a check."""

    def add(self, chunk: TableChunk) -> None: ...


class BodyTooLarge(Exception):
    """A body declares, or yields, more bytes than :func:`body_limit` allows."""


def body_limit(body_len: int) -> int:
    """The most bytes a body of ``body_len`` compressed bytes may decompress to.

    The smaller of :data:`MAX_RATIO` times ``body_len`` (plus 1 MiB) and
    ``STATELOG_MAX_SNAPSHOT_BYTES`` (default :data:`DEFAULT_MAX_BODY_BYTES`;
    a value that is not a positive integer is ignored).
    """
    cap = DEFAULT_MAX_BODY_BYTES
    raw = os.environ.get("STATELOG_MAX_SNAPSHOT_BYTES", "")
    if raw.isdigit() and int(raw) > 0:
        cap = int(raw)
    return min(cap, MAX_RATIO * body_len + _SLACK)


class CountingSink:
    """Writes at most ``limit`` bytes to ``out`` (if any); raises at byte ``limit + 1``."""

    def __init__(self, out: IO[bytes] | None, limit: int) -> None:
        self._out, self.limit, self.written = out, limit, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.limit:
            raise BodyTooLarge(f"the body yields more than the {self.limit} bytes it declares")
        if self._out is not None:
            self._out.write(data)
        return len(data)


class StreamSink(CountingSink):
    """A :class:`CountingSink` that parses what it is given as a record stream.

    Each checked chunk goes to ``build`` when one is given (an extraction),
    else nowhere (a verification that parses only).
    """

    def __init__(self, limit: int, build: ChunkConsumer | None, *, delta: bool = False) -> None:
        super().__init__(None, limit)
        self.checker = StreamChecker(delta=delta)
        self._build = build

    def write(self, data: bytes) -> int:
        super().write(data)
        for chunk in self.checker.feed(data):
            if self._build is not None:
                self._build.add(chunk)
        return len(data)


class StreamBuild:
    """An LMDB image built from checked chunks in LMDB's append mode.

    Single-threaded, scratch (no fsync). Each chunk is one write
    transaction; a full map doubles and the chunk is put again. Append mode
    refuses a key that does not sort after the last one, so the image's
    order holds even if a caller skipped the checker. With ``delta``, a
    ``D`` chunk's keys are stored with the value :data:`TOMBSTONE`, and
    keys are put in place rather than appended (a table's deletes and puts
    are each in order, not together).
    """

    def __init__(self, path: Path, *, tables: int, size_hint: int, delta: bool = False) -> None:
        """Start an empty image at ``path`` with room for ``tables`` tables.

        :raises FileExistsError: ``path`` exists.
        """
        if path.exists():
            raise FileExistsError(path)
        self.path = path
        self._map = max(16 << 20, 2 * size_hint + (8 << 20))
        self._max_tables = max(1, tables)
        self._env = lmdb.open(str(path), map_size=self._map, max_dbs=self._max_tables, **_SCRATCH)
        self._dbs: dict[str, lmdb._Database] = {}
        self._delta = delta

    def _db(self, table: str) -> lmdb._Database:
        db = self._dbs.get(table)
        if db is None:
            if len(self._dbs) >= self._max_tables:
                raise StreamError(0, f"more tables than the {self._max_tables} the meta lists")
            db = self._env.open_db(table.encode("utf-8"), create=True)
            self._dbs[table] = db
        return db

    def add(self, chunk: TableChunk) -> None:
        """Append ``chunk``'s keys to its table.

        :raises StreamError: more tables than declared, or keys out of order.
        :raises lmdb.Error: LMDB refused (the disk is full, say).
        """
        db = self._db(chunk.table)
        values: list[bytes] | list[msgspec.Raw] = chunk.values
        if chunk.deleted:
            values = [TOMBSTONE] * len(chunk.keys)
        while True:
            try:
                with self._env.begin(write=True, db=db) as txn, txn.cursor() as cur:
                    _consumed, added = cur.putmulti(
                        zip(chunk.keys, values, strict=True),
                        dupdata=False,
                        append=not self._delta,
                        overwrite=False,
                    )
                    if added != len(chunk.keys):
                        raise StreamError(0, f"table {chunk.table!r}: keys out of order")
                return
            except lmdb.MapFullError:
                self._map *= 2
                self._env.set_mapsize(self._map)

    def append_sorted(self, table: str, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Append ``items`` (encoded key, value), in strictly increasing key order, to
        ``table`` in one write transaction (a delta's puts and tombstones merged).

        :raises StreamError: more tables than declared, or keys out of order.
        :raises lmdb.Error: LMDB refused (the disk is full, say).
        """
        pairs = items if isinstance(items, list) else list(items)
        db = self._db(table)
        while True:
            try:
                with self._env.begin(write=True, db=db) as txn, txn.cursor() as cur:
                    _consumed, added = cur.putmulti(pairs, dupdata=False, append=True)
                    if added != len(pairs):
                        raise StreamError(0, f"table {table!r}: keys out of order")
                return
            except lmdb.MapFullError:
                self._map *= 2
                self._env.set_mapsize(self._map)

    def close(self) -> None:
        """Close the environment; the file stays (the caller renames or removes it)."""
        self._env.close()


def stream_image(image: Path, write: Callable[[bytes], object]) -> tuple[int, dict[str, int]]:
    """Write the record stream of the finished image at ``image`` through ``write``.

    Tables in name order, keys in order, each ``P`` chunk closed at
    :data:`~statelog.format.stream.TARGET_CHUNK_RECORDS` records or once
    its values pass :data:`~statelog.format.stream.TARGET_CHUNK_BYTES`;
    tables without keys are left out. Returns the stream's size and the
    keys per table. The image must be this process's own: it is mapped.
    """
    tee = StreamTee(write)
    with (
        lmdb.open(str(image), max_dbs=1, map_size=1, **_READ_ONLY) as probe,
        probe.begin() as txn,
    ):
        names = [bytes(k) for k, _ in txn.cursor()]
    with lmdb.open(str(image), max_dbs=max(1, len(names)), map_size=1, **_READ_ONLY) as env:
        for raw in names:
            db = env.open_db(raw, create=False)
            with env.begin(db=db, buffers=False) as txn, txn.cursor() as cur:
                entries = cur.iternext(keys=True, values=True)
                while batch := list(islice(entries, TARGET_CHUNK_RECORDS)):
                    tee.add(raw.decode("utf-8"), batch)
    return tee.finish()


class StreamTee:
    """The record stream of an image, written from its entries in order: as a full merge
    appends them to the image it builds (so the image is not read back), or as
    :func:`stream_image` reads them from a finished one. The same entries make the same
    bytes either way.

    Feed every table's live entries in table-name order, each table's in increasing key
    order (as :meth:`StreamBuild.append_sorted` takes them), then :meth:`finish`. Chunks
    are cut as :func:`stream_image` cuts them: per table, every
    :data:`~statelog.format.stream.TARGET_CHUNK_RECORDS` entries, then by bytes.
    """

    def __init__(self, write: Callable[[bytes], object]) -> None:
        self._write = write
        self._table: str | None = None
        self._pending: list[tuple[bytes, bytes]] = []
        self._n = 0
        self.size = 0
        self.counts: dict[str, int] = {}

    def add(self, table: str, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Append ``items`` (encoded key, value) of ``table`` to the stream."""
        if table != self._table:
            self._end_table()
            self._table = table
        pending = self._pending
        pending.extend(items)
        if len(pending) >= TARGET_CHUNK_RECORDS:
            whole = len(pending) - len(pending) % TARGET_CHUNK_RECORDS
            self._emit(pending[:whole])
            del pending[:whole]

    def finish(self) -> tuple[int, dict[str, int]]:
        """End the stream; its size and the keys per table (as :func:`stream_image`)."""
        self._end_table()
        tail = encode_end(sum(self.counts.values()), len(self.counts))
        self._write(tail)
        self.size += len(tail)
        return self.size, self.counts

    def _emit(self, items: list[tuple[bytes, bytes]]) -> None:
        for keys, values in _chunks(iter(items)):
            part = encode_puts(keys, values)
            if not self._n:
                assert self._table is not None
                part = encode_table(self._table) + part
            self._write(part)
            self.size += len(part)
            self._n += len(keys)

    def _end_table(self) -> None:
        if self._pending:
            self._emit(self._pending)
            self._pending = []
        if self._n:
            assert self._table is not None
            self.counts[self._table] = self._n
        self._n = 0


def stream_delta(
    tables: Iterable[tuple[str, Sequence[bytes], Sequence[tuple[bytes, bytes]]]],
    write: Callable[[bytes], object],
) -> tuple[int, dict[str, int]]:
    """Write a delta's record stream through ``write``.

    ``tables`` gives, in table-name order, each table's deleted keys
    (encoded, sorted) and its puts (encoded key and msgpack value, sorted
    by key); a table with neither is left out. Returns the stream's size
    and the records (puts and deletes) per table.
    """
    size, counts = 0, {}
    for table, deletes, puts in tables:
        if not deletes and not puts:
            continue
        parts = [encode_table(table)]
        for i in range(0, len(deletes), TARGET_CHUNK_RECORDS):
            parts.append(encode_deletes(deletes[i : i + TARGET_CHUNK_RECORDS]))
        for keys, values in _chunks(iter(puts)):
            parts.append(encode_puts(keys, values))
        for part in parts:
            write(part)
            size += len(part)
        counts[table] = len(deletes) + len(puts)
    tail = encode_end(sum(counts.values()), len(counts))
    write(tail)
    return size + len(tail), counts


def _chunks(
    items: Iterator[tuple[bytes, bytes]],
) -> Iterator[tuple[Sequence[bytes], Sequence[bytes]]]:
    """``(keys, values)`` of consecutive records, cut at the chunk targets."""
    while batch := list(islice(items, TARGET_CHUNK_RECORDS)):
        keys, values = list(map(_KEY, batch)), list(map(_VALUE, batch))
        if sum(map(len, values)) <= TARGET_CHUNK_BYTES:
            yield keys, values
            continue
        start = total = 0
        for i, value in enumerate(values):  # large values: cut by bytes
            total += len(value)
            if total >= TARGET_CHUNK_BYTES:
                yield keys[start : i + 1], values[start : i + 1]
                start, total = i + 1, 0
        if start < len(values):
            yield keys[start:], values[start:]
