"""The snapshot codec of statelog.format.snapshot, against the byte tables of docs/format.md."""

from __future__ import annotations

import hashlib
import struct
import uuid
from pathlib import Path

import msgspec
import pytest
import zstandard

from statelog.format.snapshot import (
    END_MAGIC,
    FOOTER_SIZE,
    HEADER_SIZE,
    IMAGE_VERSION,
    MAGIC,
    READABLE_VERSIONS,
    VERSION,
    SnapshotHeader,
    decode_meta,
    encode_meta,
    pack_footer,
    parse_snapshot_name,
    peek_created_ms,
    peek_meta_len,
    snapshot_name,
    unpack_footer,
)
from statelog.format.stream import encode_end, encode_puts, encode_table
from statelog.storage.builder import ImageBuilder
from statelog.storage.fileio import FileLayer
from statelog.storage.snapshots import SnapshotMeta, write_snapshot

STORE = uuid.UUID("0123abcd-4567-89ef-0123-456789abcdef")
HEADER = SnapshotHeader(STORE, epoch=7, lsn=7, chain=0xDEADBEEF, meta_len=123, body_len=4567)


def test_the_header_packs_to_the_documented_offsets() -> None:
    raw = HEADER.pack()
    assert len(raw) == HEADER_SIZE == 64
    assert raw[:8] == MAGIC == b"STLGSNAP"
    assert (VERSION, IMAGE_VERSION, READABLE_VERSIONS) == (2, 1, (1, 2))
    assert struct.unpack_from("<HHI", raw, 8) == (2, 64, 0)
    assert raw[16:32] == STORE.bytes
    assert struct.unpack_from("<QQI", raw, 32) == (7, 7, 0xDEADBEEF)
    assert struct.unpack_from("<IQ", raw, 52) == (123, 4567)
    assert SnapshotHeader.unpack(raw) == HEADER
    old = SnapshotHeader(STORE, 7, 7, 0xDEADBEEF, 123, 4567, version=IMAGE_VERSION)
    assert old.pack() == raw[:8] + struct.pack("<H", 1) + raw[10:]  # only the version differs
    assert SnapshotHeader.unpack(old.pack()) == old


def test_peek_version_reads_only_a_snapshot_header() -> None:
    raw = HEADER.pack()
    assert SnapshotHeader.peek_version(raw) == 2
    assert SnapshotHeader.peek_version(raw[:10]) == 2
    assert SnapshotHeader.peek_version(raw[:9]) is None
    assert SnapshotHeader.peek_version(b"STLGWAL\x00" + raw[8:]) is None
    assert SnapshotHeader.peek_version(raw[:8] + struct.pack("<H", 9) + raw[10:]) == 9


def test_peek_meta_len_wants_a_whole_header_with_the_magic() -> None:
    raw = HEADER.pack()
    assert peek_meta_len(raw) == 123
    assert peek_meta_len(raw[:-1]) is None
    assert peek_meta_len(b"X" + raw[1:]) is None


# (format version, the meta key that holds the body's decompressed size)
META_VERSIONS = [(VERSION, "body_bytes"), (IMAGE_VERSION, "image_bytes")]


@pytest.mark.parametrize(("version", "size_key"), META_VERSIONS)
def test_the_meta_round_trips_with_its_maps_in_key_order(version: int, size_key: str) -> None:
    raw = encode_meta(
        {"b": 2, "a": 1}, 99, {"t2": 0, "t1": 5}, 4096, 1_700_000_000_000, version=version
    )
    assert raw == encode_meta(
        {"a": 1, "b": 2}, 99, {"t1": 5, "t2": 0}, 4096, 1_700_000_000_000, version=version
    )
    assert list(msgspec.msgpack.decode(raw)) == [
        "offsets", "low_watermark_ms", "tables", size_key, "created_ms", "compression"
    ]  # fmt: skip
    doc = decode_meta(raw, version)
    assert list(doc.offsets) == ["a", "b"] and list(doc.tables) == ["t1", "t2"]
    assert (doc.low_watermark_ms, doc.body_bytes, doc.created_ms) == (99, 4096, 1_700_000_000_000)
    assert doc.compression == "zstd"


def test_the_default_meta_is_version_2() -> None:
    assert encode_meta({}, 0, {}, 10, 5) == encode_meta({}, 0, {}, 10, 5, version=VERSION)
    assert decode_meta(encode_meta({}, 0, {}, 10, 5)).body_bytes == 10


@pytest.mark.parametrize(("version", "size_key"), META_VERSIONS)
def test_decode_meta_refuses_a_missing_key_or_a_negative_count(version: int, size_key: str) -> None:
    full = msgspec.msgpack.decode(encode_meta({}, 0, {"t": 1}, 10, 5, version=version))
    del full[size_key]
    with pytest.raises(msgspec.DecodeError):
        decode_meta(msgspec.msgpack.encode(full), version)
    with pytest.raises(msgspec.DecodeError):
        decode_meta(encode_meta({}, 0, {"t": -1}, 10, 5, version=version), version)
    with pytest.raises(msgspec.DecodeError):
        decode_meta(encode_meta({}, 0, {"t": 1}, -1, 5, version=version), version)
    unknown = msgspec.msgpack.decode(encode_meta({}, 0, {}, 10, 5, version=version))
    unknown |= {"later": True}
    assert decode_meta(msgspec.msgpack.encode(unknown), version).body_bytes == 10


def test_each_version_refuses_the_other_versions_meta() -> None:
    """The size key names the format: a meta read as the wrong version does not decode."""
    with pytest.raises(msgspec.DecodeError):
        decode_meta(encode_meta({}, 0, {}, 10, 5, version=VERSION), IMAGE_VERSION)
    with pytest.raises(msgspec.DecodeError):
        decode_meta(encode_meta({}, 0, {}, 10, 5, version=IMAGE_VERSION), VERSION)
    with pytest.raises(KeyError):
        decode_meta(encode_meta({}, 0, {}, 10, 5), 3)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (encode_meta({}, 0, {}, 0, 1_700_000_000_123), 1_700_000_000_123),
        (msgspec.msgpack.encode({"created_ms": 5, "other": []}), 5),
        (msgspec.msgpack.encode({"created_ms": 0}), None),
        (msgspec.msgpack.encode({"created_ms": -3}), None),
        (msgspec.msgpack.encode({"created_ms": True}), None),
        (msgspec.msgpack.encode({"created_ms": "5"}), None),
        (msgspec.msgpack.encode([1, 2]), None),
        (b"\xc1", None),  # never valid msgpack
        (b"", None),
    ],
)
def test_peek_created_ms_never_raises(raw: bytes, want: int | None) -> None:
    assert peek_created_ms(raw) == want


def test_the_footer_is_the_digest_then_the_end_magic() -> None:
    digest = hashlib.sha256(b"x").digest()
    raw = pack_footer(digest)
    assert len(raw) == FOOTER_SIZE == 40
    assert raw == digest + END_MAGIC
    assert unpack_footer(raw) == (digest, b"STLGSEND")
    with pytest.raises(struct.error):
        unpack_footer(raw[:-1])


def test_names_order_by_age_and_parse_back() -> None:
    name = snapshot_name(0x1F, 0x2A)
    assert name == "000000000000001f-000000000000002a.snap"
    assert parse_snapshot_name(Path("snapshots") / name) == (0x1F, 0x2A)
    assert snapshot_name(2, 1) > snapshot_name(1, 99)
    for other in ("000000000000001f-000000000000002a.snap.tmp", "1f-2a.snap", "x.wal"):
        assert parse_snapshot_name(other) is None


@pytest.mark.parametrize("version", [VERSION, IMAGE_VERSION])
def test_a_written_snapshot_reads_back_through_the_codec(tmp_path: Path, version: int) -> None:
    image = tmp_path / "image.mdb"
    with ImageBuilder.create(tmp_path / "work.mdb") as builder:
        builder.apply_batch(
            [("t", ["k"], [b"v"], []), ("gone", ["x"], [b"1"], []), ("gone", [], [], ["x"])]
        )
        size = builder.finish(image)
    # Format 2: the size and counts given are the writer's to replace with what it wrote
    # (a table with no keys left out); format 1 keeps the counts its caller gives.
    tables = {"t": 7, "x": 1} if version == VERSION else {"t": 1}
    meta = SnapshotMeta(STORE, 3, 3, 0x1234, {"p-0": 9}, 42, tables, 1, 1_700_000_000_000)
    snap_dir = tmp_path / "snapshots"
    snap_dir.mkdir()
    path, written = write_snapshot(FileLayer(), snap_dir, meta, image, version=version)
    assert written.tables == {"t": 1}
    data = path.read_bytes()
    header = SnapshotHeader.unpack(data)
    assert header.version == version
    assert (header.store_id, header.epoch, header.lsn, header.chain) == (STORE, 3, 3, 0x1234)
    assert HEADER_SIZE + header.meta_len + header.body_len + FOOTER_SIZE == len(data)
    raw_meta = data[HEADER_SIZE : HEADER_SIZE + header.meta_len]
    assert peek_meta_len(data[:HEADER_SIZE]) == header.meta_len
    assert peek_created_ms(raw_meta) == 1_700_000_000_000
    doc = decode_meta(raw_meta, version)
    assert (doc.offsets, doc.low_watermark_ms, doc.tables) == ({"p-0": 9}, 42, {"t": 1})
    assert doc.body_bytes == written.body_bytes
    body = data[HEADER_SIZE + header.meta_len : -FOOTER_SIZE]
    inflated = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    assert len(inflated) == doc.body_bytes
    if version == IMAGE_VERSION:
        assert doc.body_bytes == size and inflated == image.read_bytes()
    else:
        assert inflated == encode_table("t") + encode_puts([b"\x01k"], [b"v"]) + encode_end(1, 1)
    digest, end = unpack_footer(data[-FOOTER_SIZE:])
    assert end == END_MAGIC
    assert digest == hashlib.sha256(data[:-FOOTER_SIZE]).digest()
