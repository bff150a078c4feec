"""Snapshot files: layout, verification of every part, atomic writes, extraction.

Invariants (docs/architecture.md): 5, a snapshot is verified on every read; 6, a
damaged one is rejected whole, never repaired; 7, a half-written snapshot
never becomes visible, whatever moment the power goes.

Format 2 (the body a record stream) is what the writer makes; format 1 (the
body a raw LMDB image) is what older stores hold, written here with
``version=1``: the damage tables run against both, and a format-1 file must
still verify and extract where it was written, but never as a portable one.
Crafted, hash-valid bodies are tests/test_hostile_snapshots.py's.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import os
import random
import shutil
import struct
import tempfile
import uuid
from pathlib import Path
from typing import IO, Any, get_args

import lmdb
import msgspec
import pytest
import zstandard

import statelog.storage.snapshot_read as snapshot_read_mod
import statelog.storage.snapshots as snapshot_mod
from statelog.errors import CorruptionError, FormatVersionError
from statelog.format.records import encode_value
from statelog.format.snapshot import FOOTER_SIZE, DeltaDoc
from statelog.format.stream import PUTS, TABLE, StreamChecker
from statelog.kit import CrashMode, FaultyFiles
from statelog.state.live import Key, LiveState
from statelog.storage.builder import ImageBuilder
from statelog.storage.fileio import FileLayer
from statelog.storage.image import BaseLevel, decode_key
from statelog.storage.snapshots import (
    SnapshotMeta,
    extract_snapshot,
    list_snapshots,
    parse_snapshot_name,
    snapshot_name,
    verify_snapshot,
    write_snapshot,
)
from tests.helpers import flip_bit, poke, truncate

STORE = uuid.UUID("0123abcd-4567-89ef-0123-456789abcdef")
FILES = FileLayer()
MODES: tuple[CrashMode, ...] = get_args(CrashMode)


def tables_of(state: LiveState) -> dict[str, dict[Key, bytes]]:
    """Every table of ``state`` as a plain dict (what a snapshot of it must hold)."""
    return {name: dict(state.items(name)) for name in state.tables()}


def build_image(path: Path, state: LiveState) -> int:
    with ImageBuilder.create(path.with_name(path.name + ".work")) as builder:
        builder.apply_batch(
            (name, list(t), list(t.values()), []) for name, t in sorted(tables_of(state).items())
        )
        return builder.finish(path)


def sample_state(n: int = 20, seed: int = 0) -> LiveState:
    rng = random.Random(seed)
    state = LiveState()
    keys: list[Key] = [f"k{i}" for i in range(n)] + [b"b%d" % i for i in range(n)]
    values = [encode_value({"i": i, "r": rng.random()}) for i in range(2 * n)]
    state.apply(1, {"p0": 7}, 1000, [("default", keys, values, [])])
    state.apply(2, {"p1": 3}, 2000, [("other", ["x"], [encode_value(1)], [])])
    return state


def make_meta(image: Path, state: LiveState, **over: Any) -> SnapshotMeta:
    """The meta a caller hands the writer (``body_bytes`` is the writer's to fill in)."""
    fields: dict[str, Any] = {
        "store_id": STORE,
        "epoch": state.epoch,
        "lsn": state.epoch,
        "chain": 0x13FBE3C2,
        "offsets": dict(state.offsets),
        "low_watermark_ms": state.low_watermark_ms,
        "tables": {name: len(t) for name, t in tables_of(state).items()},
        "body_bytes": 0,
        "created_ms": 1_700_000_000_000,
    }
    fields.update(over)
    return SnapshotMeta(**fields)


@pytest.fixture
def state() -> LiveState:
    return sample_state()


@pytest.fixture
def image(tmp_path: Path, state: LiveState) -> Path:
    path = tmp_path / "work" / "image.mdb"
    path.parent.mkdir()
    build_image(path, state)
    return path


@pytest.fixture
def snap_dir(tmp_path: Path) -> Path:
    d = tmp_path / "store" / "snapshots"
    d.mkdir(parents=True)
    return d


def expect_meta(
    image: Path, state: LiveState, body_bytes: int, snap: Path, **over: Any
) -> SnapshotMeta:
    """The meta the writer must return and the readers report: ``make_meta``, sizes filled,
    and the SHA-256 of everything before ``snap``'s footer (which the footer must hold)."""
    digest = hashlib.sha256(snap.read_bytes()[:-FOOTER_SIZE]).hexdigest()
    return make_meta(image, state, body_bytes=body_bytes, sha256=digest, **over)


@pytest.fixture
def version() -> int:
    """The format the ``snap`` fixture writes; tests parametrize it to run against both."""
    return 2


@pytest.fixture
def snap(snap_dir: Path, image: Path, state: LiveState, version: int) -> Path:
    path, _ = write_snapshot(FILES, snap_dir, make_meta(image, state), image, version=version)
    return path


def body_of(path: Path) -> bytes:
    """The decompressed body of a snapshot file (unverified: for aiming and comparing)."""
    at = parts(path)
    frame = path.read_bytes()[at["body"] : at["footer"]]
    return zstandard.ZstdDecompressor().decompressobj().decompress(frame)


def stream_tables(stream: bytes) -> dict[str, dict[Key, bytes]]:
    """The state a record stream holds, through the checker (which raises on any break)."""
    checker = StreamChecker()
    out: dict[str, dict[Key, bytes]] = {}
    for chunk in checker.feed(stream):
        t = out.setdefault(chunk.table, {})
        for k, v in zip(chunk.keys, chunk.values, strict=True):
            t[decode_key(k)] = bytes(v)
    checker.finish()
    return out


def image_tables(path: Path) -> dict[str, dict[Key, bytes]]:
    """Every table of the LMDB image at ``path``, in the base level's order."""
    with BaseLevel(path) as base:
        return {name: dict(base.items(name)) for name in base.tables()}


def parts(path: Path) -> dict[str, int]:
    """Start offsets of each part of a snapshot file, from its header."""
    meta_len, body_len = struct.unpack_from("<IQ", path.read_bytes(), 52)
    body = 64 + meta_len
    return {"meta": 64, "body": body, "footer": body + body_len, "size": body + body_len + 40}


KEEP = "same as parsed"


def assert_rejected(
    path: Path,
    tmp_path: Path,
    expect: str,
    *,
    unparsed: str | None = KEEP,
    extracted: str = KEEP,
) -> CorruptionError:
    """Both readers refuse ``path`` naming ``expect``; extraction leaves nothing behind.

    ``unparsed`` is what the hash-only check (``parse=False``) must name: by
    default the same, None where it cannot see the damage (the bytes hash true).
    ``extracted`` is what extraction names, by default the same.
    """
    with pytest.raises(CorruptionError) as exc:
        verify_snapshot(FILES, path, store_id=STORE)
    assert exc.value.reason.startswith(expect), exc.value.reason
    assert exc.value.path == path
    want = expect if unparsed == KEEP else unparsed
    if want is None:
        verify_snapshot(FILES, path, store_id=STORE, parse=False)
    else:
        with pytest.raises(CorruptionError) as hashed:
            verify_snapshot(FILES, path, store_id=STORE, parse=False)
        assert hashed.value.reason.startswith(want), hashed.value.reason
    dest = tmp_path / "extracted.mdb"
    with pytest.raises(CorruptionError) as again:
        extract_snapshot(FILES, path, dest, store_id=STORE)
    want = expect if extracted == KEEP else extracted
    assert again.value.reason.startswith(want), again.value.reason
    assert not dest.exists() and not dest.with_name(dest.name + ".tmp").exists()
    return exc.value


# -- layout ----------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 1])
def test_without_the_body_every_check_but_the_bodys_and_the_hash_still_runs(
    snap_dir: Path, image: Path, state: LiveState, version: int
) -> None:
    """``body=False`` is for a file the caller read whole before: a flipped body bit
    goes unseen by it (and only by it), damage anywhere else is still refused."""
    snap, meta = write_snapshot(FILES, snap_dir, make_meta(image, state), image, version=version)
    size = snap.stat().st_size
    flip_bit(snap, size - FOOTER_SIZE - 3)  # inside the body
    assert verify_snapshot(FILES, snap, store_id=STORE, parse=False, body=False) == meta
    with pytest.raises(CorruptionError):
        verify_snapshot(FILES, snap, store_id=STORE, parse=False)
    flip_bit(snap, size - FOOTER_SIZE - 3)
    flip_bit(snap, size - 1)  # the footer's end magic
    with pytest.raises(CorruptionError, match="footer"):
        verify_snapshot(FILES, snap, store_id=STORE, parse=False, body=False)
    flip_bit(snap, size - 1)
    flip_bit(snap, 0)  # the header's magic
    with pytest.raises(CorruptionError, match="header"):
        verify_snapshot(FILES, snap, store_id=STORE, parse=False, body=False)
    flip_bit(snap, 0)
    with pytest.raises(CorruptionError):  # another store's snapshot
        verify_snapshot(FILES, snap, store_id=uuid.uuid4(), parse=False, body=False)
    for misuse in ({"parse": True}, {"parse": False, "portable_only": True}):
        with pytest.raises(ValueError, match="body=False"):
            verify_snapshot(FILES, snap, store_id=STORE, body=False, **misuse)


@pytest.mark.parametrize("version", [2, 1])
def test_round_trip(snap_dir: Path, image: Path, state: LiveState, version: int) -> None:
    given = make_meta(image, state, body_bytes=12345)  # the writer replaces the size
    snap, written = write_snapshot(FILES, snap_dir, given, image, version=version)
    size = len(body_of(snap))  # format 1: the image's size; format 2: the stream's
    assert size == image.stat().st_size if version == 1 else size < image.stat().st_size
    meta = expect_meta(image, state, size, snap)
    assert written == meta
    assert snap == snap_dir / "0000000000000002-0000000000000002.snap"
    assert sorted(p.name for p in snap_dir.iterdir()) == [snap.name]  # no temp files left
    assert verify_snapshot(FILES, snap, store_id=STORE) == meta
    assert verify_snapshot(FILES, snap, store_id=None) == meta
    assert verify_snapshot(FILES, snap, store_id=STORE, parse=False) == meta
    dest = snap_dir.parent / "base.mdb"
    assert extract_snapshot(FILES, snap, dest, store_id=STORE) == meta
    assert image_tables(dest) == tables_of(state)
    if version == 1:
        assert dest.read_bytes() == image.read_bytes()  # the image itself, as written
    else:
        assert stream_tables(body_of(snap)) == tables_of(state)


def test_the_writer_fills_in_the_counts_and_leaves_out_empty_tables(
    snap_dir: Path, tmp_path: Path
) -> None:
    state = sample_state()
    state.apply(3, {}, 3000, [("emptied", ["z"], [encode_value(0)], [])])
    state.apply(4, {}, 4000, [("emptied", [], [], ["z"])])
    image = tmp_path / "emptied.mdb"
    build_image(image, state)
    with BaseLevel(image) as base:
        assert "emptied" in base.tables() and base.count("emptied") == 0
    lying = make_meta(image, state, tables={"default": 1, "ghost": 9})
    path, written = write_snapshot(FILES, snap_dir, lying, image)
    assert written.tables == {"default": 40, "other": 1}
    assert verify_snapshot(FILES, path, store_id=STORE).tables == written.tables
    assert TABLE + struct.pack("<I", 7) + b"emptied" not in body_of(path)


def test_a_format_1_snapshot_is_no_portable_one(
    snap_dir: Path, image: Path, state: LiveState
) -> None:
    """An older store's own file reads; from elsewhere (a bucket) it is refused, unjudged."""
    old, _ = write_snapshot(FILES, snap_dir, make_meta(image, state), image, version=1)
    with pytest.raises(FormatVersionError) as exc:
        verify_snapshot(FILES, old, store_id=STORE, portable_only=True)
    assert (exc.value.found, exc.value.supported) == (1, 2)
    flip_bit(old, parts(old)["body"] + 3)  # refused before its body is judged
    with pytest.raises(FormatVersionError):
        verify_snapshot(FILES, old, store_id=STORE, portable_only=True)
    new, meta = write_snapshot(FILES, snap_dir, make_meta(image, state, epoch=3), image)
    assert verify_snapshot(FILES, new, store_id=STORE, portable_only=True) == meta


def check_frame_and_footer(snap: Path) -> tuple[dict[str, Any], bytes]:
    """The parts every version shares; returns the meta map and the frame."""
    data = snap.read_bytes()
    at = parts(snap)
    magic, _, hlen, flags, sid, epoch, lsn, chain, meta_len, body_len = struct.unpack_from(
        "<8sHHI16sQQIIQ", data
    )
    assert (magic, hlen, flags) == (b"STLGSNAP", 64, 0)
    assert (uuid.UUID(bytes=sid), epoch, lsn, chain) == (STORE, 2, 2, 0x13FBE3C2)
    meta = msgspec.msgpack.decode(data[64 : 64 + meta_len])
    assert meta["compression"] == "zstd" and meta["tables"] == {"default": 40, "other": 1}
    assert meta["offsets"] == {"p0": 7, "p1": 3}
    body = data[at["body"] : at["footer"]]
    assert len(body) == body_len
    assert data[at["footer"] :] == hashlib.sha256(data[: at["footer"]]).digest() + b"STLGSEND"
    assert len(data) == at["size"]
    return meta, body


def test_bytes_follow_the_documented_layout(snap: Path, state: LiveState) -> None:
    """Format 2: a zstd frame (checksummed, size unset) of T/P/E chunks; the meta says
    ``body_bytes``, the stream's size."""
    assert struct.unpack_from("<H", snap.read_bytes(), 8) == (2,)
    meta, body = check_frame_and_footer(snap)
    assert list(meta) == [
        "offsets", "low_watermark_ms", "tables", "body_bytes", "created_ms", "compression"
    ]  # fmt: skip
    params = zstandard.get_frame_parameters(body)
    assert params.has_checksum and params.content_size == zstandard.CONTENTSIZE_UNKNOWN
    stream = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    assert meta["body_bytes"] == len(stream)
    # T "default" P(40 keys: bytes keys, tag 0, before str keys, tag 1) T "other" P E(41, 2)
    assert stream[:5] == TABLE + struct.pack("<I", 7) and stream[5:12] == b"default"
    assert stream[12:13] == PUTS
    assert stream[-17:] == b"E" + struct.pack("<IQI", 12, 41, 2)
    assert stream_tables(stream) == tables_of(state)


@pytest.mark.parametrize("version", [1])
def test_bytes_follow_the_documented_layout_of_format_1(snap: Path, image: Path) -> None:
    """Format 1: the frame holds the LMDB image, content size set; the meta says
    ``image_bytes``."""
    assert struct.unpack_from("<H", snap.read_bytes(), 8) == (1,)
    meta, body = check_frame_and_footer(snap)
    assert list(meta) == [
        "offsets", "low_watermark_ms", "tables", "image_bytes", "created_ms", "compression"
    ]  # fmt: skip
    assert meta["image_bytes"] == image.stat().st_size
    params = zstandard.get_frame_parameters(body)
    assert params.content_size == image.stat().st_size and params.has_checksum
    assert zstandard.ZstdDecompressor().decompress(body) == image.read_bytes()


def test_names_and_listing_newest_first(snap_dir: Path) -> None:
    assert snapshot_name(1, 0xAB) == "0000000000000001-00000000000000ab.snap"
    assert parse_snapshot_name("x/0000000000000001-00000000000000ab.snap") == (1, 0xAB)
    for bad in ("0000000000000001-00000000000000AB.snap", "1-2.snap", "a.snap.tmp", "x"):
        assert parse_snapshot_name(bad) is None
    made = [(1, 1), (2, 9), (2, 10), (16, 16), (0x100, 0x100)]
    for e, lsn in made:
        (snap_dir / snapshot_name(e, lsn)).write_bytes(b"")
    for junk in (snapshot_name(999, 999) + ".tmp", snapshot_name(998, 1) + ".tmp.tmp", "notes"):
        (snap_dir / junk).write_bytes(b"")
    assert [(e, lsn) for e, lsn, _ in list_snapshots(snap_dir)] == sorted(made, reverse=True)
    assert all(p.parent == snap_dir for _, _, p in list_snapshots(snap_dir))
    assert list_snapshots(snap_dir / "missing") == []


# -- verification: every part ------------------------------------------------

HEADER_FLIPS = [
    (0, "header: bad magic"),
    (10, "header: header_len"),
    (12, "meta: a delta link"),  # flags: bit 0 claims a delta the meta does not link
    (13, "header: header_len"),  # flags: bit 8, no such flag
    (16, "header: snapshot of store"),
    (32, "header: epoch"),
    (40, "header: epoch"),  # lsn
    (48, "sha256 mismatch"),  # chain: nothing but the hash covers it
    (52, "size:"),  # meta_len
    (56, "size:"),  # body_len
]


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize(("offset", "expect"), HEADER_FLIPS)
def test_header_bit_flip(
    snap: Path, tmp_path: Path, offset: int, expect: str, version: int
) -> None:
    if version == 1 and offset == 12:
        expect = "header: header_len"  # format 1 has no delta flag at all
    flip_bit(snap, offset)
    assert_rejected(snap, tmp_path, expect)


@pytest.mark.parametrize("version", [2, 1])
def test_meta_damage(snap: Path, tmp_path: Path) -> None:
    meta_at = parts(snap)["meta"]
    raw = snap.read_bytes()
    flip_bit(snap, raw.index(b"compression") + 2)  # a key: required field missing
    assert_rejected(snap, tmp_path, "meta: does not decode")
    snap.write_bytes(raw)
    flip_bit(snap, meta_at, 2)  # the map header: the wrong number of fields
    assert_rejected(snap, tmp_path, "meta:")
    snap.write_bytes(raw)
    flip_bit(snap, raw.index(b"zstd", meta_at))  # a value the decoder checks
    assert_rejected(snap, tmp_path, "meta: unknown compression")
    snap.write_bytes(raw)
    flip_bit(snap, raw.index(b"created_ms") + 12)  # a value only the hash covers
    assert_rejected(snap, tmp_path, "sha256 mismatch")


@pytest.mark.parametrize("version", [2, 1])
def test_body_damage_is_named(snap: Path, tmp_path: Path) -> None:
    at = parts(snap)
    raw = snap.read_bytes()
    # zstd magic, first block header, compressed data, content checksum
    for offset in (at["body"], at["body"] + 7, (at["body"] + at["footer"]) // 2, at["footer"] - 1):
        snap.write_bytes(raw)
        flip_bit(snap, offset)
        err = assert_rejected(snap, tmp_path, "body:")
        assert err.offset == at["body"]


@pytest.mark.parametrize("version", [2, 1])
def test_every_body_bit_is_rejected_mostly_named_body(snap: Path) -> None:
    at = parts(snap)
    raw = snap.read_bytes()
    reasons: list[str] = []
    for offset in range(at["body"], at["footer"]):
        for bit in range(8):
            damaged = bytearray(raw)
            damaged[offset] ^= 1 << bit
            snap.write_bytes(bytes(damaged))
            with pytest.raises(CorruptionError) as exc:
                verify_snapshot(FILES, snap, store_id=STORE)
            reasons.append(exc.value.reason.split(":")[0])
    # A few bits zstd itself never checks (unused header or entropy-table
    # bits) still decode to the same body: only the hash catches those.
    assert set(reasons) == {"body", "sha256 mismatch"}
    assert reasons.count("body") > 0.9 * len(reasons)


# A writer bug: the meta written disagrees with the body it frames (the hash is
# right, so only the parse can tell; format 1 checks its frame's content size).
# (version, size off by, counts changed, verify names, the hash-only check, extraction)
WRITER_BUGS = [
    (2, +4096, False, "body: ", None, KEEP),  # declares more than the stream holds
    (2, -1, False, "body: the body yields more", None, KEEP),  # stops at the declared size
    (2, 0, True, "meta: its table counts disagree", None, KEEP),
    (1, +4096, False, "meta: image_bytes", KEEP, KEEP),
    (1, -1, False, "meta: image_bytes", KEEP, "body: the body yields more"),
]


@pytest.mark.parametrize(
    ("version", "off_by", "recount", "expect", "unparsed", "extracted"), WRITER_BUGS
)
def test_writer_bug_meta_disagreeing_with_body_is_caught(
    snap_dir: Path,
    image: Path,
    state: LiveState,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    version: int,
    off_by: int,
    recount: bool,
    expect: str,
    unparsed: str | None,
    extracted: str,
) -> None:
    real = snapshot_mod._with

    def buggy(meta: SnapshotMeta, body_bytes: int, tables: dict[str, int]) -> SnapshotMeta:
        wrong = {**tables, "default": tables["default"] + 1} if recount else tables
        return real(meta, body_bytes + off_by, wrong)

    monkeypatch.setattr(snapshot_mod, "_with", buggy)
    path, written = write_snapshot(FILES, snap_dir, make_meta(image, state), image, version=version)
    assert written.body_bytes == len(body_of(path)) + off_by
    assert_rejected(path, tmp_path, expect, unparsed=unparsed, extracted=extracted)


def test_a_declared_size_over_the_cap_is_refused_before_decompression(
    snap: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    declared = verify_snapshot(FILES, snap, store_id=STORE).body_bytes
    monkeypatch.setenv("STATELOG_MAX_SNAPSHOT_BYTES", str(declared))
    assert verify_snapshot(FILES, snap, store_id=STORE).body_bytes == declared  # at the cap
    monkeypatch.setenv("STATELOG_MAX_SNAPSHOT_BYTES", str(declared - 1))
    err = assert_rejected(snap, tmp_path, "size: the meta declares a body of")
    assert err.hint and "STATELOG_MAX_SNAPSHOT_BYTES" in err.hint
    for ignored in ("0", "-5", "lots", ""):  # not a positive integer: the default cap
        monkeypatch.setenv("STATELOG_MAX_SNAPSHOT_BYTES", ignored)
        assert verify_snapshot(FILES, snap, store_id=STORE).body_bytes == declared


@pytest.mark.parametrize("version", [2, 1])
def test_footer_damage(snap: Path, tmp_path: Path) -> None:
    at = parts(snap)
    raw = snap.read_bytes()
    flip_bit(snap, at["footer"] + 5)
    err = assert_rejected(snap, tmp_path, "sha256 mismatch")
    assert err.offset == at["footer"]
    snap.write_bytes(raw)
    flip_bit(snap, at["size"] - 1)
    assert_rejected(snap, tmp_path, "footer: bad end magic")


@pytest.mark.parametrize("version", [2, 1])
def test_every_single_bit_flip_is_rejected(snap: Path) -> None:
    raw = snap.read_bytes()
    rng = random.Random(3)
    for offset in range(len(raw)):
        if offset in (8, 9):
            continue  # the version field: FormatVersionError, tested below
        damaged = bytearray(raw)
        damaged[offset] ^= 1 << rng.randrange(8)
        snap.write_bytes(bytes(damaged))
        with pytest.raises(CorruptionError):
            verify_snapshot(FILES, snap, store_id=STORE)
        with pytest.raises(CorruptionError):
            verify_snapshot(FILES, snap, store_id=STORE, parse=False)


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("cut", [0, 5, 8, 9, 63, 64, 70, "body", "footer", -1])
def test_truncation(snap: Path, tmp_path: Path, cut: int | str) -> None:
    at = parts(snap)
    size = at[cut] + 3 if isinstance(cut, str) else cut
    truncate(snap, size)
    assert_rejected(snap, tmp_path, "size:")


@pytest.mark.parametrize("version", [2, 1])
def test_appended_bytes(snap: Path, tmp_path: Path) -> None:
    with snap.open("ab") as fh:
        fh.write(b"\0" * 8)
    assert_rejected(snap, tmp_path, "size:")


@pytest.mark.parametrize("version", [2, 1])
def test_wrong_store(snap: Path) -> None:
    with pytest.raises(CorruptionError, match="header: snapshot of store"):
        verify_snapshot(FILES, snap, store_id=uuid.uuid4())
    assert verify_snapshot(FILES, snap, store_id=None).store_id == STORE


@pytest.mark.parametrize("found", [0, 3, 0xFFFF])
def test_unknown_version_is_not_corruption(snap: Path, tmp_path: Path, found: int) -> None:
    poke(snap, 8, "<H", found)
    flip_bit(snap, parts(snap)["body"] + 3)  # damage elsewhere is not judged either
    for parse in (True, False):
        with pytest.raises(FormatVersionError) as exc:
            verify_snapshot(FILES, snap, store_id=STORE, parse=parse)
        assert (exc.value.found, exc.value.supported) == (found, 2)
    with pytest.raises(FormatVersionError):
        extract_snapshot(FILES, snap, tmp_path / "x.mdb", store_id=STORE)
    assert not (tmp_path / "x.mdb").exists() and not (tmp_path / "x.mdb.tmp").exists()


@pytest.mark.parametrize("version", [2, 1])
def test_name_must_agree_with_header(snap: Path, tmp_path: Path) -> None:
    moved = snap.with_name(snapshot_name(3, 3))
    snap.rename(moved)
    assert_rejected(moved, tmp_path, "header: epoch")
    odd = moved.with_name("latest.snap")
    moved.rename(odd)
    assert_rejected(odd, tmp_path, "name:")


@pytest.mark.parametrize("version", [2, 1])
def test_io_error_is_not_corruption(
    snap: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Failing(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            if self.tell() > 100:
                raise OSError(errno.EIO, "simulated EIO")
            return super().read(n)

        def fileno(self) -> int:
            return fd

    fd = os.open(snap, os.O_RDONLY)
    try:

        def failing_open(path: Path) -> IO[bytes]:
            return Failing(path.read_bytes())

        # snapshots.py imported the name too: both module attributes are the seam.
        monkeypatch.setattr(snapshot_read_mod, "open_read", failing_open)
        monkeypatch.setattr(snapshot_mod, "open_read", failing_open)
        for parse in (True, False):
            with pytest.raises(OSError) as exc:
                verify_snapshot(FILES, snap, store_id=STORE, parse=parse)
            assert not isinstance(exc.value, CorruptionError) and exc.value.errno == errno.EIO
        dest = tmp_path / "x.mdb"
        with pytest.raises(OSError, match="simulated"):
            extract_snapshot(FILES, snap, dest, store_id=STORE)
        assert not dest.exists() and not dest.with_name("x.mdb.tmp").exists()
    finally:
        os.close(fd)
    monkeypatch.undo()
    as_dir = tmp_path / snapshot_name(1, 1)
    as_dir.mkdir()
    with pytest.raises(IsADirectoryError):
        verify_snapshot(FILES, as_dir, store_id=STORE)


# -- writing -----------------------------------------------------------------


@pytest.mark.parametrize(
    "over", [{"chain": 1 << 32}, {"chain": -1}, {"lsn": 1 << 64}, {"epoch": -1}]
)
def test_write_refuses_bad_meta_and_existing_names(
    snap: Path, snap_dir: Path, image: Path, state: LiveState, over: dict[str, int]
) -> None:
    with pytest.raises(FileExistsError):
        write_snapshot(FILES, snap_dir, make_meta(image, state), image)
    with pytest.raises(FileExistsError):
        write_snapshot(FILES, snap_dir, make_meta(image, state), image, version=1)
    with pytest.raises(ValueError, match="range"):
        write_snapshot(FILES, snap_dir, make_meta(image, state, **{"epoch": 9, **over}), image)
    assert [p.name for p in snap_dir.iterdir()] == [snap.name]


def _write_with(files: FileLayer, snap_dir: Path, image: Path, state: LiveState) -> Path:
    path, _ = write_snapshot(files, snap_dir, make_meta(image, state), image)
    return path


def test_power_loss_at_every_step_leaves_no_visible_snapshot(
    tmp_path: Path, image: Path, state: LiveState
) -> None:
    root = tmp_path / "dry"
    (root / "snapshots").mkdir(parents=True)
    dry = FaultyFiles(root)
    _write_with(dry, root / "snapshots", image, state)
    steps = dry.ops
    assert any(t.startswith("rename") for t in dry.trace) and dry.trace[-1].startswith("fsync_dir")
    for at in range(1, steps + 1):
        for mode in MODES:
            root = tmp_path / f"cut-{at}-{mode}"
            snaps = root / "snapshots"
            snaps.mkdir(parents=True)
            files = FaultyFiles(root)
            files.cut_power(at=at)
            with pytest.raises(OSError):
                _write_with(files, snaps, image, state)
            files.crash(mode, seed=at)
            assert list_snapshots(snaps) == [], (at, mode, dry.trace[at - 1])
            assert all(p.name.endswith(".tmp") for p in snaps.iterdir())
    # Uninterrupted, the snapshot survives the power loss and verifies.
    root = tmp_path / "whole"
    (root / "snapshots").mkdir(parents=True)
    files = FaultyFiles(root)
    path = _write_with(files, root / "snapshots", image, state)
    files.crash("drop")
    assert list_snapshots(root / "snapshots") == [(2, 2, path)]
    meta = verify_snapshot(FILES, path, store_id=STORE)
    assert meta == expect_meta(image, state, len(body_of(path)), path)


@pytest.mark.parametrize("kind", ["create", "write", "sync", "rename", "fsync_dir"])
def test_io_error_while_writing_leaves_nothing(
    tmp_path: Path, image: Path, state: LiveState, kind: Any
) -> None:
    root = tmp_path / "store"
    snaps = root / "snapshots"
    snaps.mkdir(parents=True)
    files = FaultyFiles(root)
    files.fail(kind, errno=errno.ENOSPC, partial=5 if kind == "write" else 0)
    with pytest.raises(OSError):
        _write_with(files, snaps, image, state)
    assert list_snapshots(snaps) == []
    assert list(snaps.iterdir()) == []  # the temp file was removed too
    files.free_space()
    path = _write_with(files, snaps, image, state)
    assert verify_snapshot(FILES, path, store_id=STORE).epoch == 2


# -- extraction --------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 1])
def test_extract_then_base_level_reads_the_same_state(
    tmp_path: Path, snap_dir: Path, version: int
) -> None:
    rng = random.Random(7)
    state = LiveState()
    for epoch in range(1, 31):
        keys: list[Key] = []
        for _ in range(400):
            n = rng.randrange(5000)
            keys.append(f"s{n}" if rng.random() < 0.5 else b"b%d" % n)
        values = [encode_value(rng.randbytes(rng.randrange(1, 40))) for _ in keys]
        dels: list[Key] = [f"s{rng.randrange(5000)}" for _ in range(50)]
        table = rng.choice(["a", "b", "c"])
        state.apply(epoch, {f"p{epoch % 3}": epoch}, epoch * 10, [(table, keys, values, dels)])
    image = tmp_path / "img" / "image.mdb"
    image.parent.mkdir()
    build_image(image, state)
    path, meta = write_snapshot(
        FILES, snap_dir, make_meta(image, state), image, level=1, version=version
    )
    dest = tmp_path / "base.mdb"
    got = extract_snapshot(FILES, path, dest, store_id=STORE)
    assert got == meta and got.tables == {n: len(t) for n, t in tables_of(state).items()}
    assert got.body_bytes == len(body_of(path))
    with BaseLevel(dest) as base:
        assert base.tables() == state.tables()
        for name in state.tables():
            assert list(base.items(name)) == list(state.items(name))
            assert base.count(name) == meta.tables[name]
            assert list(base.items(name, "s1")) == list(state.items(name, "s1"))


@pytest.mark.parametrize("version", [2, 1])
def test_large_image_streams_in_chunks(tmp_path: Path, snap_dir: Path, version: int) -> None:
    rng = random.Random(1)
    state = LiveState()
    keys: list[Key] = [b"%08d" % i for i in range(60_000)]
    state.apply(1, {}, 0, [("t", keys, [encode_value(rng.randbytes(40)) for _ in keys], [])])
    image = tmp_path / "image.mdb"
    build_image(image, state)
    assert image.stat().st_size > 3 << 20
    path, meta = write_snapshot(FILES, snap_dir, make_meta(image, state), image, version=version)
    assert parts(path)["footer"] - parts(path)["body"] > 2 << 20  # several 1 MiB chunks
    assert meta.body_bytes > 2 << 20
    if version == 2:  # one P chunk per 8192 records
        chunks = list(StreamChecker().feed(body_of(path)))
        assert [len(c.keys) for c in chunks] == [8192] * 7 + [60_000 - 7 * 8192]
    dest = tmp_path / "out.mdb"
    extract_snapshot(FILES, path, dest, store_id=STORE)
    if version == 1:
        assert dest.read_bytes() == image.read_bytes()
    assert image_tables(dest) == tables_of(state)
    flip_bit(path, parts(path)["body"] + (2 << 20) + 17)
    assert_rejected(path, tmp_path, "body:")


@pytest.mark.parametrize("version", [2, 1])
def test_extract_replaces_a_stale_image(snap: Path, tmp_path: Path, state: LiveState) -> None:
    dest = tmp_path / "base.mdb"
    dest.write_bytes(b"stale")
    (tmp_path / "base.mdb.tmp").write_bytes(b"left by a crash")
    extract_snapshot(FILES, snap, dest, store_id=STORE)
    assert image_tables(dest) == tables_of(state)
    assert not (tmp_path / "base.mdb.tmp").exists()
    shutil.copy(dest, tmp_path / "copy.mdb")
    flip_bit(snap, parts(snap)["footer"])
    with pytest.raises(CorruptionError):
        extract_snapshot(FILES, snap, dest, store_id=STORE)
    assert dest.read_bytes() == (tmp_path / "copy.mdb").read_bytes()  # untouched


@pytest.mark.parametrize("version", [2, 1])
def test_a_frame_cut_short_under_a_true_hash_is_refused(
    snap: Path, tmp_path: Path, version: int
) -> None:
    """The frame loses its end (a writer bug, or a crafted file re-hashed): zstd yields
    less than the meta declares, with no error of its own; the reader must count."""
    data = snap.read_bytes()
    meta_len, body_len = struct.unpack_from("<IQ", data, 52)
    cut = body_len // 2
    head = data[:52] + struct.pack("<IQ", meta_len, cut) + data[64 : 64 + meta_len]
    kept = head + data[64 + meta_len : 64 + meta_len + cut]
    snap.write_bytes(kept + hashlib.sha256(kept).digest() + b"STLGSEND")
    dest = tmp_path / "x.mdb"
    with pytest.raises(CorruptionError, match="body:"):
        extract_snapshot(FILES, snap, dest, store_id=STORE)
    assert not dest.exists() and not dest.with_name("x.mdb.tmp").exists()


@pytest.mark.parametrize("kind", ["full", "delta"])
def test_a_body_stream_failing_on_a_full_disk_raises_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A body stream that fails because the disk filled up (LMDB's error, while a full
    merge builds its image beside the stream) is the error raised: not the compressor's
    flush of what it held, which fails on the same full disk afterwards. Nothing is left
    in ``snapshots/``."""
    full = False

    class FullDisk(io.RawIOBase):
        def __init__(self) -> None:
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            if full:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.data += bytes(b)
            return len(b)

    def scratch(**kw: Any) -> IO[bytes]:
        # As the real one: a buffered file unless asked for none, whose close would
        # flush onto the full disk.
        raw = FullDisk()
        return raw if kw.get("buffering") == 0 else io.BufferedWriter(raw)  # type: ignore[return-value]

    monkeypatch.setattr(snapshot_mod.tempfile, "TemporaryFile", scratch)

    def stream(write: Any) -> tuple[int, dict[str, int]]:
        nonlocal full
        write(os.urandom(3 << 20))  # held in part by the compressor
        full = True
        raise lmdb.DiskError("mdb_txn_commit: No space left on device")

    snaps = tmp_path / "snapshots"
    snaps.mkdir()
    meta = make_meta(tmp_path / "image.mdb", LiveState(), epoch=2, lsn=2)
    with pytest.raises(lmdb.DiskError):
        if kind == "full":
            snapshot_mod.write_snapshot(FileLayer(), snaps, meta, tmp_path / "image.mdb",
                                        stream=stream)  # fmt: skip
        else:
            link = DeltaDoc(snapshot_mod.snapshot_name(1, 1), "0" * 64, 1, 0, 0, {})
            delta = dataclasses.replace(meta, delta=link)
            snapshot_mod.write_delta_snapshot(FileLayer(), snaps, delta, stream, scratch=tmp_path)
    assert list(snaps.iterdir()) == []


@pytest.mark.parametrize("kind", ["full", "image"])
def test_short_writes_to_the_scratch_file_are_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: LiveState, kind: str
) -> None:
    """A write to the unbuffered scratch file may take only part of what it is given (a
    disk filling up); the rest is written too, so the snapshot verifies."""
    real = tempfile.TemporaryFile

    class Short(io.FileIO):
        def write(self, b: Any) -> int:
            view = memoryview(b)
            return super().write(view[: max(1, len(view) // 3)])

    def scratch(**kw: Any) -> IO[bytes]:
        assert kw.get("buffering") == 0
        with real(dir=kw.get("dir")) as f:
            return Short(os.dup(f.fileno()), "w+b")

    image = tmp_path / "image.mdb"
    build_image(image, state)
    monkeypatch.setattr(snapshot_mod.tempfile, "TemporaryFile", scratch)
    snaps = tmp_path / "snapshots"
    snaps.mkdir()
    version = snapshot_mod.IMAGE_VERSION if kind == "image" else snapshot_mod.VERSION
    path, _ = snapshot_mod.write_snapshot(
        FileLayer(), snaps, make_meta(image, state), image, version=version
    )
    monkeypatch.undo()
    snapshot_mod.verify_snapshot(FileLayer(), path, store_id=STORE)
