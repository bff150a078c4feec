"""The record stream: the portable body of a format-2 snapshot.

A snapshot's body decompresses to a sequence of chunks that spell out the
whole state, table by table, key by key, in the base level's order. The
store builds its LMDB base from it with LMDB's own API, so bytes that came
from someone else's disk or bucket never reach LMDB as pages: each chunk
is parsed and checked here first (:class:`StreamChecker`). Pure code: no
file I/O; :mod:`statelog.storage.snapshot_body` reads and writes streams.

Grammar (integers little-endian; ``docs/format.md``, "Record stream")::

    stream := table* end
    table  := chunk("T", UTF-8 table name) chunk("P", puts)+
    end    := chunk("E", records(u64) tables(u32))
    chunk  := kind(u8, ASCII) length(u32) payload(length)
    puts   := msgpack [ [key(bin), ...], [value, ...] ]   -- equal lengths, >= 1

A key is an encoded key (tag 0x00 + bytes, or tag 0x01 + UTF-8) within
:mod:`statelog.format.limits`; a value is one whole msgpack object, the
bytes a commit record carried, that decodes as a read decodes it.
Tables appear once each, in increasing UTF-8 byte order; keys increase
strictly within a table, across its chunks.

A delta snapshot's stream (``StreamChecker(delta=True)``) holds only what
its tail changed, and its tables may also hold deletes::

    table  := chunk("T", name) chunk("D", deletes)* chunk("P", puts)*   -- >= 1 chunk
    deletes := msgpack [ key(bin), ... ]                                -- >= 1 key

Deleted keys increase strictly across a table's ``D`` chunks, put keys
across its ``P`` chunks, and no key is both deleted and put. A full
snapshot holding a ``D`` chunk is damaged.
"""

from __future__ import annotations

import operator
import struct
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Annotated

import msgspec

from statelog.format.limits import MAX_KEY_BYTES, table_name_problem
from statelog.format.records import DECODE_ERRORS
from statelog.format.values import check_values

__all__ = [
    "CHUNK_HEADER_SIZE",
    "DELETES",
    "END",
    "PUTS",
    "TABLE",
    "TARGET_CHUNK_BYTES",
    "TARGET_CHUNK_RECORDS",
    "StreamChecker",
    "StreamError",
    "TableChunk",
    "encode_deletes",
    "encode_end",
    "encode_puts",
    "encode_table",
]

TABLE, PUTS, DELETES, END = b"T", b"P", b"D", b"E"
CHUNK_HEADER_SIZE = 5
TARGET_CHUNK_BYTES = 1 << 20
"""Writers close a ``P`` chunk once it holds this much (a larger value gets one alone)."""
TARGET_CHUNK_RECORDS = 8192

_HEAD = struct.Struct("<cI")
_END = struct.Struct("<QI")
_MAX_STORED_KEY = MAX_KEY_BYTES + 1  # the tag byte
# Key lengths are checked by the decoder itself, in C: a tag byte, then at most MAX_KEY_BYTES.
_StoredKey = Annotated[bytes, msgspec.Meta(min_length=1, max_length=_MAX_STORED_KEY)]
_puts_decoder = msgspec.msgpack.Decoder(tuple[list[_StoredKey], list[msgspec.Raw]])
_deletes_decoder = msgspec.msgpack.Decoder(list[_StoredKey])


class StreamError(Exception):
    """The stream breaks its grammar at ``offset`` (a decompressed-stream offset)."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"record stream offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TableChunk:
    """One checked ``P`` chunk: keys (encoded) and values (msgpack), in key order.

    Each value is a :class:`msgspec.Raw`: the bytes of one whole msgpack
    object, sliced from the chunk without a copy (``bytes(value)`` copies).
    A ``D`` chunk of a delta stream comes as ``deleted=True``, without values.
    """

    table: str
    keys: list[bytes]
    values: list[msgspec.Raw]
    deleted: bool = False


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return _HEAD.pack(kind, len(payload)) + payload


def encode_table(name: str) -> bytes:
    """The ``T`` chunk that opens table ``name``."""
    return _chunk(TABLE, name.encode("utf-8"))


def encode_puts(keys: Sequence[bytes], values: Sequence[bytes]) -> bytes:
    """The ``P`` chunk of encoded ``keys`` and their msgpack ``values``, in key order."""
    vals = b"".join(values)
    keys_part = msgspec.msgpack.encode(list(keys))
    n = len(values)
    head = bytes([0x92]) + keys_part  # fixarray(2) of the key array, then the value array
    if n < 16:
        arr = bytes([0x90 | n])
    elif n < 1 << 16:
        arr = b"\xdc" + n.to_bytes(2, "big")
    else:
        arr = b"\xdd" + n.to_bytes(4, "big")
    return _chunk(PUTS, head + arr + vals)


def encode_deletes(keys: Sequence[bytes]) -> bytes:
    """The ``D`` chunk of encoded ``keys`` a delta deletes, in key order."""
    return _chunk(DELETES, msgspec.msgpack.encode(list(keys)))


def encode_end(records: int, tables: int) -> bytes:
    """The ``E`` chunk: how many records and tables the stream held."""
    return _chunk(END, _END.pack(records, tables))


class StreamChecker:
    """Parses a stream fed in pieces and checks every rule of the grammar.

    :meth:`feed` takes decompressed bytes in any split and yields each
    table's checked chunks; :meth:`finish` says the stream ended whole. No
    buffer is sized from a length field: a chunk is held only as its bytes
    arrive, so memory follows the bytes fed (which the caller bounds by
    the snapshot's checked body size), never what a header claims.
    Any break raises :class:`StreamError`; the caller makes it corruption.
    """

    def __init__(self, *, delta: bool = False) -> None:
        self.delta = delta
        self._buf = bytearray()
        self._at = 0  # stream offset of _buf[0]
        self._table: str | None = None
        self._table_raw = b""
        self._last_key = b""
        self._last_deleted = b""
        self._deleted: set[bytes] = set()  # this table's deleted keys (delta streams only)
        self._puts_in_table = 0
        self._chunks_in_table = 0
        self.records = 0
        self.counts: dict[str, int] = {}
        self.ended = False

    def feed(self, data: bytes | memoryview) -> Iterator[TableChunk]:
        """Append ``data``; yield every whole ``P`` chunk it completes, checked.

        :raises StreamError: the stream breaks the grammar.
        """
        self._buf += data
        pos = 0
        try:
            while len(self._buf) - pos >= CHUNK_HEADER_SIZE:
                kind, length = _HEAD.unpack_from(self._buf, pos)
                at = self._at + pos
                if self.ended:
                    raise StreamError(at, "bytes after the end chunk")
                end = pos + CHUNK_HEADER_SIZE + length
                if len(self._buf) < end:
                    break
                payload = bytes(self._buf[pos + CHUNK_HEADER_SIZE : end])
                pos = end
                got = self._chunk(kind, payload, at)
                if got is not None:
                    yield got
        finally:
            del self._buf[:pos]
            self._at += pos

    def finish(self) -> None:
        """Check that the stream ended with its end chunk and nothing after it.

        :raises StreamError: it stopped short, or the end chunk disagrees.
        """
        if self._buf:
            raise StreamError(self._at, f"{len(self._buf)} bytes of a torn chunk at the end")
        if not self.ended:
            raise StreamError(self._at, "the stream stops before its end chunk")

    def _chunk(self, kind: bytes, payload: bytes, at: int) -> TableChunk | None:
        if kind == TABLE:
            self._open_table(payload, at)
            return None
        if kind == PUTS:
            return self._puts(payload, at)
        if kind == END:
            self._end(payload, at)
            return None
        if kind == DELETES:
            if not self.delta:
                raise StreamError(at, "a deletes chunk in a full snapshot")
            return self._deletes(payload, at)
        raise StreamError(at, f"unknown chunk kind {kind!r}")

    def _close_table(self, at: int) -> None:
        if self._table is not None and not self._chunks_in_table:
            raise StreamError(at, f"table {self._table!r} holds no keys")

    def _open_table(self, payload: bytes, at: int) -> None:
        self._close_table(at)
        try:
            name = payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StreamError(at, f"a table name that is not UTF-8: {exc}") from None
        why = table_name_problem(name)
        if why is not None:
            raise StreamError(at, why)
        if self._table is not None and payload <= self._table_raw:
            raise StreamError(at, f"table {name!r} out of order after {self._table!r}")
        self._table, self._table_raw = name, payload
        self._last_key, self._puts_in_table, self._chunks_in_table = b"", 0, 0
        self._last_deleted = b""
        self._deleted = set()
        self.counts[name] = 0

    def _deletes(self, payload: bytes, at: int) -> TableChunk:
        if self._table is None:
            raise StreamError(at, "deletes before any table chunk")
        if self._puts_in_table:
            raise StreamError(at, f"table {self._table!r}: deletes after puts")
        try:
            keys = _deletes_decoder.decode(payload)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise StreamError(at, f"a deletes chunk that does not decode: {exc}") from None
        if not keys:
            raise StreamError(at, "an empty deletes chunk")
        why = _keys_problem(keys, self._last_deleted)
        if why is not None:
            raise StreamError(at, f"table {self._table!r}: deletes: {why}")
        self._last_deleted = keys[-1]
        self._deleted.update(keys)
        self._counted(keys)
        return TableChunk(self._table, keys, [], deleted=True)

    def _counted(self, keys: list[bytes]) -> None:
        assert self._table is not None
        self._chunks_in_table += 1
        self.counts[self._table] += len(keys)
        self.records += len(keys)

    def _puts(self, payload: bytes, at: int) -> TableChunk:
        if self._table is None:
            raise StreamError(at, "keys before any table chunk")
        try:
            keys, raws = _puts_decoder.decode(payload)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise StreamError(at, f"a puts chunk that does not decode: {exc}") from None
        if not keys or len(keys) != len(raws):
            raise StreamError(at, f"{len(keys)} keys and {len(raws)} values in a puts chunk")
        try:
            # Every value checked as a read decodes it (the whole chunk decoded unless
            # it is proven plain): a bare skip over the structure would pass bad UTF-8,
            # bad timestamps and unhashable map keys, which the log's own check refuses.
            check_values([payload])
        except DECODE_ERRORS as exc:
            raise StreamError(at, f"a value that does not decode: {exc}") from None
        why = _keys_problem(keys, self._last_key)
        if why is not None:
            raise StreamError(at, f"table {self._table!r}: {why}")
        if self._deleted and not self._deleted.isdisjoint(keys):
            raise StreamError(at, f"table {self._table!r}: a key both deleted and put")
        self._last_key = keys[-1]
        self._puts_in_table += 1
        self._counted(keys)
        return TableChunk(self._table, keys, raws)

    def _end(self, payload: bytes, at: int) -> None:
        self._close_table(at)
        if len(payload) != _END.size:
            raise StreamError(at, f"an end chunk of {len(payload)} bytes, not {_END.size}")
        records, tables = _END.unpack(payload)
        if (records, tables) != (self.records, len(self.counts)):
            raise StreamError(
                at,
                f"the end chunk counts {records} records in {tables} tables, "
                f"the stream held {self.records} in {len(self.counts)}",
            )
        self.ended = True


def _keys_problem(keys: list[bytes], after: bytes) -> str | None:
    """Why ``keys`` (one chunk's, encoded) break the key rules, or None.

    Each check runs in C over the whole chunk: strictly increasing order
    (so tags need checking only at the two ends: every 0x00 key sorts
    before every 0x01 key) and UTF-8 of the str keys decoded in
    one join (a 0x01 tag is never a continuation byte, so a key's broken
    sequence cannot be mended by its neighbour).
    """
    if keys[0] <= after:
        return f"key {keys[0][:16]!r} does not sort after {after[:16]!r}"
    if not all(map(operator.lt, keys, islice(keys, 1, None))):
        return "keys not strictly increasing"
    if keys[0][:1] not in (b"\x00", b"\x01") or keys[-1][:1] not in (b"\x00", b"\x01"):
        return "a key without a valid type tag"
    first_str = bisect_left(keys, b"\x01")
    try:
        b"".join(keys[first_str:]).decode("utf-8")
    except UnicodeDecodeError:
        return "a str key that is not valid UTF-8"
    return None
