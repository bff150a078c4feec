"""The record stream of format-2 snapshots (statelog.format.stream), as a table of failure modes.

Every stream here is built by hand, chunk by chunk, with a msgpack encoder
of its own (not the module's ``encode_*``), so a rule the checker forgets
shows up as a row that stops raising. Each broken stream must raise
:class:`StreamError`, never another exception, at the offset of the chunk
that broke the rule, whatever pieces it arrives in.

| stream                                           | expected                               |
|--------------------------------------------------|----------------------------------------|
| an unknown chunk kind, a ``D`` chunk             | StreamError at that chunk              |
| ``P`` before any ``T``                           | StreamError                            |
| table names out of order, repeated, not UTF-8,   | StreamError at the ``T`` chunk         |
| empty, holding NUL, over 255 bytes               |                                        |
| a table with no keys (``T`` then ``T`` or ``E``) | StreamError                            |
| keys not increasing (in a chunk, across chunks), | StreamError at the ``P`` chunk         |
| repeated, untagged, empty, over 500 bytes,       |                                        |
| str keys that are not UTF-8                      |                                        |
| values not msgpack, nested 5000 deep, trailing   | StreamError                            |
| bytes, counts of keys and values that differ     |                                        |
| an end chunk with the wrong counts or size       | StreamError at the ``E`` chunk         |
| bytes after the end, no end, a torn last chunk   | StreamError (from ``finish``, or feed) |
| every valid edge (255-byte name, 501-byte key,   | parsed, the same in any split          |
| empty keys of both types, raw bytes keys)        |                                        |

Then the writer and the builder: ``stream_image`` and ``StreamBuild`` carry
a state across (bytes and str keys, several tables, a value over 1 MiB in a
chunk of its own, an empty table left out) and refuse what the checker
would have, should a caller skip it.
"""

from __future__ import annotations

import io
import random
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from statelog.format.records import encode_value
from statelog.format.stream import (
    TARGET_CHUNK_BYTES,
    TARGET_CHUNK_RECORDS,
    StreamChecker,
    StreamError,
    TableChunk,
)
from statelog.state.live import Key
from statelog.storage.builder import ImageBuilder
from statelog.storage.image import BaseLevel, decode_key, encode_key
from statelog.storage.snapshot_body import StreamBuild, stream_image

# -- hand-built chunks --------------------------------------------------------


def chunk(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("<I", len(payload)) + payload


def T(name: bytes | str) -> bytes:
    return chunk(b"T", name.encode("utf-8") if isinstance(name, str) else name)


def P(keys: list[bytes], values: list[bytes] | None = None) -> bytes:
    """A puts chunk of stored keys (tag byte included) and msgpack values (default: 1 each)."""
    vals = [V] * len(keys) if values is None else values
    return chunk(b"P", msgspec.msgpack.encode([keys, [msgspec.Raw(v) for v in vals]]))


def E(records: int, tables: int) -> bytes:
    return chunk(b"E", struct.pack("<QI", records, tables))


def S(text: str) -> bytes:
    """A stored str key."""
    return b"\x01" + text.encode("utf-8")


def B(raw: bytes) -> bytes:
    """A stored bytes key."""
    return b"\x00" + raw


V = msgspec.msgpack.encode(1)
GOOD_A = T("a") + P([B(b"k"), S("x"), S("y")])


def feed_all(pieces: list[bytes]) -> list[TableChunk]:
    """Feed ``pieces`` to one checker, then finish; every chunk it yields."""
    checker = StreamChecker()
    out: list[TableChunk] = []
    for piece in pieces:
        out.extend(checker.feed(piece))
    checker.finish()
    return out


def splits(data: bytes, rng: random.Random, most: int) -> list[bytes]:
    """``data`` cut at random points into pieces of 0 to ``most`` bytes."""
    out, at = [], 0
    while at < len(data):
        n = rng.randrange(0, most + 1)
        out.append(data[at : at + n])
        at += n
    return out


def as_state(chunks: list[TableChunk]) -> list[tuple[str, list[bytes], list[bytes]]]:
    return [(c.table, list(c.keys), [bytes(v) for v in c.values]) for c in chunks]


# -- the failure table ----------------------------------------------------------


@dataclass(frozen=True)
class Broken:
    """A stream of ``parts``; the error's offset is where ``parts[at]`` starts."""

    id: str
    parts: list[bytes]
    at: int
    reason: str


# A puts payload with a byte after its two arrays: msgpack that does not end where the chunk does.
_TRAILING = msgspec.msgpack.encode([[S("x")], [msgspec.Raw(V)]]) + b"\xc0"

BROKEN = [
    # chunk kinds
    Broken("unknown-kind", [GOOD_A, chunk(b"X", b"")], 1, "unknown chunk kind b'X'"),
    Broken("lowercase-kind", [chunk(b"t", b"a")], 0, "unknown chunk kind"),
    Broken("nul-kind", [bytes(5)], 0, "unknown chunk kind"),
    Broken("deletes-chunk", [GOOD_A, chunk(b"D", msgspec.msgpack.encode([S("x")]))], 1, "deletes"),
    Broken("puts-before-table", [P([S("x")]), E(1, 0)], 0, "keys before any table chunk"),
    Broken("end-then-puts", [E(0, 0), P([S("x")])], 1, "bytes after the end chunk"),
    # table names
    Broken("tables-out-of-order", [T("b"), P([S("x")]), T("a"), P([S("x")])], 2, "out of order"),
    Broken("table-repeated", [GOOD_A, T("a"), P([S("z")])], 1, "out of order"),
    Broken("name-not-utf8", [T(b"\xff")], 0, "not UTF-8"),
    Broken("name-surrogate", [T(b"\xed\xa0\x80")], 0, "not UTF-8"),
    Broken("name-truncated-utf8", [T(b"ab\xe2\x82")], 0, "not UTF-8"),
    Broken("name-empty", [T(b"")], 0, "empty"),
    Broken("name-nul", [T(b"a\x00b")], 0, "NUL"),
    Broken("name-256-bytes", [T("a" * 256)], 0, "over 255"),
    Broken("name-256-bytes-multibyte", [T("é" * 128)], 0, "over 255"),
    # empty tables
    Broken("table-then-table", [T("a"), T("b"), P([S("x")]), E(1, 2)], 1, "holds no keys"),
    Broken("table-then-end", [GOOD_A, T("b"), E(3, 2)], 2, "holds no keys"),
    Broken("puts-of-no-keys", [T("a"), P([]), E(0, 1)], 1, "0 keys and 0 values"),
    # key order
    Broken("keys-descending", [T("a"), P([S("y"), S("x")])], 1, "not strictly increasing"),
    Broken("keys-unsorted-inside", [T("a"), P([S("a"), S("c"), S("b")])], 1, "not strictly"),
    Broken("key-repeated", [T("a"), P([S("x"), S("x")])], 1, "not strictly increasing"),
    Broken("keys-back-across-chunks", [GOOD_A, P([S("m")])], 1, "does not sort after"),
    Broken("key-repeated-across-chunks", [GOOD_A, P([S("y")])], 1, "does not sort after"),
    Broken("str-then-bytes-across", [T("a"), P([S("x")]), P([B(b"z")])], 2, "does not sort after"),
    # key form
    Broken("tag-2-first", [T("a"), P([b"\x02a"])], 1, "valid type tag"),
    Broken("tag-2-last", [T("a"), P([S("x"), b"\x02"])], 1, "valid type tag"),
    Broken("tag-ff-last", [T("a"), P([B(b""), b"\xff" * 3])], 1, "valid type tag"),
    Broken("key-empty", [T("a"), P([b""])], 1, "does not decode"),
    Broken("key-empty-after-good", [GOOD_A, P([S("z"), b""])], 1, "does not decode"),
    Broken("str-key-501-bytes", [T("a"), P([S("k" * 501)])], 1, "does not decode"),
    Broken("bytes-key-501-bytes", [T("a"), P([B(b"k" * 501)])], 1, "does not decode"),
    Broken(
        "key-as-msgpack-str",
        [T("a"), chunk(b"P", msgspec.msgpack.encode([["\x01x"], [1]]))],
        1,
        "does not decode",
    ),
    Broken("str-key-not-utf8", [T("a"), P([S("a"), b"\x01\xff"])], 1, "not valid UTF-8"),
    Broken("str-key-surrogate", [T("a"), P([b"\x01\xed\xa0\x80"])], 1, "not valid UTF-8"),
    Broken("str-key-overlong", [T("a"), P([b"\x01\xc0\x80"])], 1, "not valid UTF-8"),
    # A sequence cut at a key's end: the next key's tag (0x01) can never complete it.
    Broken("str-key-cut-then-key", [T("a"), P([b"\x01a\xe2\x82", S("b")])], 1, "not valid UTF-8"),
    Broken("str-key-cut-at-last", [T("a"), P([S("a"), b"\x01b\xe2\x82"])], 1, "not valid UTF-8"),
    Broken("str-key-cut-after-bytes", [T("a"), P([B(b"\xe2"), b"\x01\x82\xac"])], 1, "UTF-8"),
    # values
    Broken("value-never-msgpack", [T("a"), P([S("x")], [b"\xc1"])], 1, "does not decode"),
    Broken("value-truncated", [T("a"), P([S("x")], [b"\x92\x01"])], 1, "does not decode"),
    Broken("value-nested-5000", [T("a"), P([S("x")], [b"\x91" * 5000 + b"\xc0"])], 1, "decode"),
    Broken(
        "value-map-nested-5000",
        [T("a"), P([S("x")], [b"\x81\xc0" * 5000 + b"\xc0"])],
        1,
        "does not decode",
    ),
    Broken("puts-trailing-bytes", [T("a"), chunk(b"P", _TRAILING)], 1, "does not decode"),
    Broken(
        "puts-not-a-pair",
        [T("a"), chunk(b"P", msgspec.msgpack.encode({"k": [S("x")]}))],
        1,
        "does not decode",
    ),
    Broken(
        "puts-triple",
        [T("a"), chunk(b"P", msgspec.msgpack.encode([[S("x")], [1], []]))],
        1,
        "does not decode",
    ),
    Broken("more-keys-than-values", [T("a"), P([S("x"), S("y")], [V])], 1, "2 keys and 1 values"),
    Broken("more-values-than-keys", [T("a"), P([S("x")], [V, V])], 1, "1 keys and 2 values"),
    # the end chunk
    Broken("end-records-high", [GOOD_A, E(4, 1)], 1, "counts 4 records in 1 tables"),
    Broken("end-records-low", [GOOD_A, E(2, 1)], 1, "held 3 in 1"),
    Broken("end-tables-wrong", [GOOD_A, E(3, 2)], 1, "counts 3 records in 2 tables"),
    Broken("end-too-long", [GOOD_A, chunk(b"E", struct.pack("<QI", 3, 1) + b"\0")], 1, "13 bytes"),
    Broken("end-too-short", [GOOD_A, chunk(b"E", struct.pack("<QI", 3, 1)[:-1])], 1, "11 bytes"),
    Broken("end-empty", [chunk(b"E", b"")], 0, "an end chunk of 0 bytes"),
    # what follows, or does not
    Broken("chunk-after-end", [GOOD_A, E(3, 1), T("b")], 2, "bytes after the end chunk"),
    Broken("end-after-end", [GOOD_A, E(3, 1), E(3, 1)], 2, "bytes after the end chunk"),
    Broken("one-byte-after-end", [GOOD_A, E(3, 1), b"\0"], 2, "torn chunk at the end"),
    Broken("no-end", [GOOD_A], 1, "stops before its end chunk"),
    Broken("nothing-at-all", [], 0, "stops before its end chunk"),
    Broken("torn-header", [GOOD_A, E(3, 1)[:4]], 1, "4 bytes of a torn chunk"),
    Broken("torn-payload", [GOOD_A, E(3, 1)[:-1]], 1, "16 bytes of a torn chunk"),
    Broken("torn-puts", [T("a"), P([S("x")])[:-2]], 1, "torn chunk"),
    Broken("length-claims-4-gib", [GOOD_A, b"P\xff\xff\xff\xff" + b"\x92"], 1, "torn chunk"),
]


def offset_of(case: Broken) -> int:
    return sum(map(len, case.parts[: case.at]))


@pytest.mark.parametrize("case", BROKEN, ids=[b.id for b in BROKEN])
def test_a_broken_stream_raises_stream_error_at_its_chunk(case: Broken) -> None:
    stream = b"".join(case.parts)
    with pytest.raises(StreamError) as whole:
        feed_all([stream])
    assert case.reason in whole.value.reason, whole.value.reason
    assert whole.value.offset == offset_of(case), whole.value
    assert str(whole.value).startswith(f"record stream offset {offset_of(case)}: ")
    # The same error, whatever the pieces: byte by byte, and at random cuts.
    with pytest.raises(StreamError) as by_byte:
        feed_all([stream[i : i + 1] for i in range(len(stream))])
    assert (by_byte.value.offset, by_byte.value.reason) == (whole.value.offset, whole.value.reason)
    rng = random.Random(case.id)
    for _ in range(3):
        with pytest.raises(StreamError) as cut:
            feed_all(splits(stream, rng, 40))
        assert (cut.value.offset, cut.value.reason) == (whole.value.offset, whole.value.reason)


@pytest.mark.parametrize("case", BROKEN, ids=[b.id for b in BROKEN])
def test_nothing_is_yielded_from_the_broken_chunk_on(case: Broken) -> None:
    """Chunks before the break come out checked; the broken one and any after never do."""
    stream = b"".join(case.parts)
    checker = StreamChecker()
    got: list[TableChunk] = []
    with pytest.raises(StreamError):
        for i in range(len(stream)):
            got.extend(checker.feed(stream[i : i + 1]))
        checker.finish()
    before = b"".join(case.parts[: case.at])
    assert as_state(got) == as_state(feed_all_prefix(before))


def feed_all_prefix(prefix: bytes) -> list[TableChunk]:
    """The chunks a whole (valid) prefix yields, without finishing it."""
    return list(StreamChecker().feed(prefix))


# -- valid edges ------------------------------------------------------------------

VALID = {
    "no-tables": [E(0, 0)],
    "one-table": [GOOD_A, E(3, 1)],
    "name-255-bytes": [T("a" * 255), P([S("x")]), E(1, 1)],
    "name-multibyte": [T("z"), P([S("x")]), T("é"), P([S("x")]), T("𝄞"), P([S("x")]), E(3, 3)],
    "keys-500-bytes": [T("a"), P([B(b"k" * 500), S("k" * 500)]), E(2, 1)],
    "empty-keys-of-each-type": [T("a"), P([b"\x00", b"\x01"]), E(2, 1)],
    "bytes-keys-not-utf8": [T("a"), P([B(b"\xe2\x82"), B(b"\xed\xa0\x80"), B(b"\xff")]), E(3, 1)],
    "str-keys-4-byte-utf8": [T("a"), P([S("€"), S("𝄞"), S("\U0010ffff")]), E(3, 1)],
    "many-chunks": [T("a"), P([S("a")]), P([S("b"), S("c")]), P([S("d")]), E(4, 1)],
    "values-of-every-shape": [
        T("t"),
        P(
            [S("a"), S("b"), S("c"), S("d"), S("e")],
            [msgspec.msgpack.encode(v) for v in (None, "s" * 70_000, [1, [2]], {"k": b"\0"}, -1)],
        ),
        E(5, 1),
    ],
    "value-nested-100": [T("a"), P([S("x")], [b"\x91" * 100 + b"\xc0"]), E(1, 1)],
}


@pytest.mark.parametrize("parts", VALID.values(), ids=list(VALID))
def test_a_valid_stream_parses_the_same_in_every_split(parts: list[bytes]) -> None:
    stream = b"".join(parts)
    whole = feed_all([stream])
    checker = StreamChecker()
    from_views = [
        c for i in range(0, len(stream), 3) for c in checker.feed(memoryview(stream)[i : i + 3])
    ]
    checker.finish()
    assert as_state(from_views) == as_state(whole)
    assert checker.ended and checker.records == sum(len(c.keys) for c in whole)
    by_byte = feed_all([stream[i : i + 1] for i in range(len(stream))])
    assert as_state(by_byte) == as_state(whole)
    # Two pieces at every cut point.
    for cut in range(0, len(stream) + 1, max(1, len(stream) // 200)):
        assert as_state(feed_all([stream[:cut], stream[cut:]])) == as_state(whole)


def test_the_checker_counts_what_it_yields() -> None:
    checker = StreamChecker()
    stream = T("a") + P([S("x"), S("y")]) + P([S("z")]) + T("b") + P([B(b"")]) + E(4, 2)
    chunks = list(checker.feed(stream))
    checker.finish()
    assert [(c.table, len(c.keys)) for c in chunks] == [("a", 2), ("a", 1), ("b", 1)]
    assert checker.counts == {"a": 3, "b": 1} and checker.records == 4 and checker.ended


def test_a_large_stream_in_random_splits_yields_the_same_chunks() -> None:
    rng = random.Random(11)
    parts: list[bytes] = []
    records = 0
    for name in ("alpha", "beta", "gamma"):
        parts.append(T(name))
        keys = sorted({encode_key(rng.choice([f"s{rng.randrange(10**6)}", rng.randbytes(6)]))
                       for _ in range(3000)})  # fmt: skip
        for start in range(0, len(keys), 700):
            part = keys[start : start + 700]
            values = [encode_value(rng.randbytes(rng.randrange(0, 90))) for _ in part]
            parts.append(P(part, values))
        records += len(keys)
    parts.append(E(records, 3))
    stream = b"".join(parts)
    assert len(stream) > 400_000
    whole = as_state(feed_all([stream]))
    assert sum(len(keys) for _, keys, _ in whole) == records
    for most in (13, 4096, 1 << 20):
        assert as_state(feed_all(splits(stream, rng, most))) == whole, most


# -- the writer and the builder ----------------------------------------------------

BIG = 1 << 20  # TARGET_CHUNK_BYTES


def build_image(path: Path, tables: dict[str, dict[Key, bytes]], emptied: tuple[str, ...]) -> None:
    with ImageBuilder.create(path.with_name(path.name + ".work")) as builder:
        for name, kv in tables.items():
            builder.apply(name, list(kv), list(kv.values()), [])
        for name in emptied:
            builder.apply(name, ["gone"], [encode_value(0)], [])
            builder.apply(name, [], [], ["gone"])
        builder.finish(path)


def image_state(path: Path) -> dict[str, dict[Key, bytes]]:
    with BaseLevel(path) as base:
        return {name: dict(base.items(name)) for name in base.tables() if base.count(name)}


def sample_tables(rng: random.Random) -> dict[str, dict[Key, bytes]]:
    many: dict[Key, bytes] = {f"r{i:06d}": encode_value(i) for i in range(2 * 8192 + 5)}
    return {
        "mixed": {
            **{b"b%d" % i: encode_value(rng.randbytes(20)) for i in range(50)},
            **{f"s{i}é": encode_value({"i": i}) for i in range(50)},
            b"": encode_value(None),
            "": encode_value(""),
            "𝄞": encode_value("clef"),
        },
        "big": {
            "a": encode_value("x"),
            "b": encode_value(rng.randbytes(BIG + 5)),  # over 1 MiB: closes its chunk
            "c": encode_value("after"),
            "d": encode_value(rng.randbytes(BIG // 2)),
            "e": encode_value(rng.randbytes(BIG // 2)),
        },
        "many": many,
    }


def test_stream_image_and_stream_build_round_trip_a_state(tmp_path: Path) -> None:
    assert (TARGET_CHUNK_BYTES, TARGET_CHUNK_RECORDS) == (BIG, 8192)
    tables = sample_tables(random.Random(5))
    image = tmp_path / "image.mdb"
    build_image(image, tables, emptied=("emptied", "zz-emptied"))
    out = io.BytesIO()
    size, counts = stream_image(image, out.write)
    stream = out.getvalue()
    assert size == len(stream)
    assert counts == {name: len(kv) for name, kv in tables.items()}  # the empty ones left out
    assert b"emptied" not in stream

    checker = StreamChecker()
    chunks = list(checker.feed(stream))
    checker.finish()
    assert checker.counts == counts and checker.records == sum(counts.values())
    assert [c.table for c in chunks if c.table == "many"] == ["many"] * 3  # cut at 8192 records
    assert [len(c.keys) for c in chunks if c.table == "many"] == [8192, 8192, 5]
    big = [[decode_key(k) for k in c.keys] for c in chunks if c.table == "big"]
    assert big == [["a", "b"], ["c", "d", "e"]]  # cut once the values pass 1 MiB
    decoded = {
        c.table: {decode_key(k): bytes(v) for k, v in zip(c.keys, c.values, strict=True)}
        for c in chunks
    }
    assert sorted(decoded) == sorted(tables)

    built = tmp_path / "built.mdb"
    build = StreamBuild(built, tables=len(counts), size_hint=0)  # the map must grow
    for c in chunks:
        build.add(c)
    build.close()
    assert image_state(built) == tables
    with BaseLevel(built) as base:
        assert base.tables() == sorted(tables)
        assert {name: base.count(name) for name in base.tables()} == counts
        assert list(base.items("mixed")) == list(BaseLevel(image).items("mixed"))


def test_the_stream_of_an_image_with_no_keys_is_its_end_chunk(tmp_path: Path) -> None:
    image = tmp_path / "image.mdb"
    build_image(image, {}, emptied=("only",))
    out = io.BytesIO()
    assert stream_image(image, out.write) == (17, {})
    assert out.getvalue() == E(0, 0)
    assert feed_all([out.getvalue()]) == []


def test_a_large_image_streams_the_same_in_random_splits(tmp_path: Path) -> None:
    tables = sample_tables(random.Random(9))
    image = tmp_path / "image.mdb"
    build_image(image, tables, emptied=())
    out = io.BytesIO()
    stream_image(image, out.write)
    stream = out.getvalue()
    whole = as_state(feed_all([stream]))
    rng = random.Random(3)
    for most in (257, 70_000, 3 << 20):
        assert as_state(feed_all(splits(stream, rng, most))) == whole


# Should a caller skip the checker: (id, chunks added in order, tables declared, reason,
# what the image holds after: the refused chunk never lands, not one key of it)
BUILD_REFUSALS: list[tuple[str, list[TableChunk], int, str, dict[str, Any]]] = [
    ("key-before-the-last", [
        TableChunk("t", [S("b")], [msgspec.Raw(V)]),
        TableChunk("t", [S("a")], [msgspec.Raw(V)]),
    ], 1, "keys out of order", {"t": {"b": V}}),
    ("key-repeated", [
        TableChunk("t", [S("b")], [msgspec.Raw(V)]),
        TableChunk("t", [S("b")], [msgspec.Raw(b"\x02")]),
    ], 1, "keys out of order", {"t": {"b": V}}),
    ("descending-in-a-chunk", [
        TableChunk("t", [S("c"), S("a")], [msgspec.Raw(V)] * 2),
    ], 1, "keys out of order", {"t": {}}),
    ("more-tables-than-declared", [
        TableChunk("t", [S("a")], [msgspec.Raw(V)]),
        TableChunk("u", [S("a")], [msgspec.Raw(V)]),
    ], 1, "more tables than the 1", {"t": {"a": V}}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("added", "tables", "reason", "kept"),
    [row[1:] for row in BUILD_REFUSALS],
    ids=[row[0] for row in BUILD_REFUSALS],
)
def test_stream_build_refuses_what_the_checker_would(
    tmp_path: Path, added: list[TableChunk], tables: int, reason: str, kept: dict[str, Any]
) -> None:
    path = tmp_path / "built.mdb"
    build = StreamBuild(path, tables=tables, size_hint=0)
    try:
        with pytest.raises(StreamError, match=reason):
            for c in added:
                build.add(c)
    finally:
        build.close()
    with BaseLevel(path) as base:
        assert {n: dict(base.items(n)) for n in base.tables()} == kept


def test_stream_build_refuses_an_existing_path(tmp_path: Path) -> None:
    (tmp_path / "taken.mdb").write_bytes(b"")
    with pytest.raises(FileExistsError):
        StreamBuild(tmp_path / "taken.mdb", tables=1, size_hint=0)
    assert (tmp_path / "taken.mdb").read_bytes() == b""


APPEND_REFUSALS = [
    ("a key repeated", [(b"\x01a", b"\x01"), (b"\x01a", b"\x02")], {"t": {"a": 1}}),
    ("keys out of order", [(b"\x01b", b"\x01"), (b"\x01a", b"\x02")], {"t": {"b": 1}}),
]


@pytest.mark.parametrize(
    ("items", "kept"), [r[1:] for r in APPEND_REFUSALS], ids=[r[0] for r in APPEND_REFUSALS]
)
def test_append_sorted_refuses_keys_out_of_order(
    tmp_path: Path, items: list[tuple[bytes, bytes]], kept: dict[str, Any]
) -> None:
    path = tmp_path / "built.mdb"
    build = StreamBuild(path, tables=1, size_hint=0)
    try:
        with pytest.raises(StreamError, match="out of order"):
            build.append_sorted("t", iter(items))
    finally:
        build.close()
    with BaseLevel(path) as base:  # the refused append left its transaction unwritten
        assert {n: dict(base.items(n)) for n in base.tables()} == {n: {} for n in kept}


def test_append_sorted_grows_the_map(tmp_path: Path) -> None:
    path = tmp_path / "built.mdb"
    items = [(b"\x01k%07d" % i, b"\xc4\x00" + bytes(200)) for i in range(120_000)]
    build = StreamBuild(path, tables=1, size_hint=0)  # 16 MiB: far below what this needs
    try:
        build.append_sorted("t", items)
    finally:
        build.close()
    with BaseLevel(path) as base:
        assert base.count("t") == len(items)
