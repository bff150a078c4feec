"""Snapshot files: layout, verification of every part, atomic writes, extraction.

Invariants (docs/architecture.md): 5, a snapshot is verified on every read; 6, a
damaged one is rejected whole, never repaired; 7, a half-written snapshot
never becomes visible, whatever moment the power goes.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import shutil
import struct
import uuid
from pathlib import Path
from typing import IO, Any, get_args

import msgspec
import pytest
import zstandard

import statelog.storage.snapshots as snapshot_mod
from statelog.errors import CorruptionError, FormatVersionError
from statelog.format.records import encode_value
from statelog.kit import CrashMode, FaultyFiles
from statelog.state.live import Key, LiveState
from statelog.storage.fileio import FileLayer
from statelog.storage.image import BaseLevel, ImageBuilder
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
    fields: dict[str, Any] = {
        "store_id": STORE,
        "epoch": state.epoch,
        "lsn": state.epoch,
        "chain": 0x13FBE3C2,
        "offsets": dict(state.offsets),
        "low_watermark_ms": state.low_watermark_ms,
        "tables": {name: len(t) for name, t in tables_of(state).items()},
        "image_bytes": image.stat().st_size,
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


@pytest.fixture
def snap(snap_dir: Path, image: Path, state: LiveState) -> Path:
    return write_snapshot(FILES, snap_dir, make_meta(image, state), image)


def parts(path: Path) -> dict[str, int]:
    """Start offsets of each part of a snapshot file, from its header."""
    meta_len, body_len = struct.unpack_from("<IQ", path.read_bytes(), 52)
    body = 64 + meta_len
    return {"meta": 64, "body": body, "footer": body + body_len, "size": body + body_len + 40}


def assert_rejected(path: Path, tmp_path: Path, expect: str) -> CorruptionError:
    """Both readers refuse ``path`` naming ``expect``; extraction leaves nothing behind."""
    with pytest.raises(CorruptionError) as exc:
        verify_snapshot(FILES, path, store_id=STORE)
    assert exc.value.reason.startswith(expect), exc.value.reason
    assert exc.value.path == path
    dest = tmp_path / "extracted.mdb"
    with pytest.raises(CorruptionError) as again:
        extract_snapshot(FILES, path, dest, store_id=STORE)
    assert again.value.reason.startswith(expect), again.value.reason
    assert not dest.exists() and not dest.with_name(dest.name + ".tmp").exists()
    return exc.value


# -- layout ----------------------------------------------------------------


def test_round_trip(snap: Path, snap_dir: Path, image: Path, state: LiveState) -> None:
    meta = make_meta(image, state)
    assert snap == snap_dir / "0000000000000002-0000000000000002.snap"
    assert sorted(p.name for p in snap_dir.iterdir()) == [snap.name]  # no temp files left
    assert verify_snapshot(FILES, snap, store_id=STORE) == meta
    assert verify_snapshot(FILES, snap, store_id=None) == meta
    dest = snap_dir.parent / "base.mdb"
    assert extract_snapshot(FILES, snap, dest, store_id=STORE) == meta
    assert dest.read_bytes() == image.read_bytes()


def test_bytes_follow_the_documented_layout(snap: Path, image: Path) -> None:
    data = snap.read_bytes()
    at = parts(snap)
    magic, version, hlen, flags, sid, epoch, lsn, chain, meta_len, body_len = struct.unpack_from(
        "<8sHHI16sQQIIQ", data
    )
    assert (magic, version, hlen, flags) == (b"STLGSNAP", 1, 64, 0)
    assert (uuid.UUID(bytes=sid), epoch, lsn, chain) == (STORE, 2, 2, 0x13FBE3C2)
    meta = msgspec.msgpack.decode(data[64 : 64 + meta_len])
    assert list(meta) == [
        "offsets", "low_watermark_ms", "tables", "image_bytes", "created_ms", "compression"
    ]  # fmt: skip
    assert meta["compression"] == "zstd" and meta["tables"] == {"default": 40, "other": 1}
    assert meta["offsets"] == {"p0": 7, "p1": 3} and meta["image_bytes"] == image.stat().st_size
    body = data[at["body"] : at["footer"]]
    assert len(body) == body_len
    params = zstandard.get_frame_parameters(body)
    assert params.content_size == image.stat().st_size and params.has_checksum
    assert zstandard.ZstdDecompressor().decompress(body) == image.read_bytes()
    assert data[at["footer"] :] == hashlib.sha256(data[: at["footer"]]).digest() + b"STLGSEND"
    assert len(data) == at["size"]


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
    (12, "header: header_len"),  # flags
    (16, "header: snapshot of store"),
    (32, "header: epoch"),
    (40, "header: epoch"),  # lsn
    (48, "sha256 mismatch"),  # chain: nothing but the hash covers it
    (52, "size:"),  # meta_len
    (56, "size:"),  # body_len
]


@pytest.mark.parametrize(("offset", "expect"), HEADER_FLIPS)
def test_header_bit_flip(snap: Path, tmp_path: Path, offset: int, expect: str) -> None:
    flip_bit(snap, offset)
    assert_rejected(snap, tmp_path, expect)


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


def test_body_damage_is_named(snap: Path, tmp_path: Path) -> None:
    at = parts(snap)
    raw = snap.read_bytes()
    # zstd magic, first block header, compressed data, content checksum
    for offset in (at["body"], at["body"] + 7, (at["body"] + at["footer"]) // 2, at["footer"] - 1):
        snap.write_bytes(raw)
        flip_bit(snap, offset)
        err = assert_rejected(snap, tmp_path, "body:")
        assert err.offset == at["body"]


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
    # bits) still decode to the same image: only the hash catches those.
    assert set(reasons) == {"body", "sha256 mismatch"}
    assert reasons.count("body") > 0.9 * len(reasons)


def test_writer_bug_meta_disagreeing_with_body_is_caught(
    snap_dir: Path, image: Path, state: LiveState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_mod, "_check", lambda meta, size: None)
    wrong = make_meta(image, state, image_bytes=image.stat().st_size + 4096)
    path = write_snapshot(FILES, snap_dir, wrong, image)
    assert_rejected(path, tmp_path, "meta: image_bytes")


def test_footer_damage(snap: Path, tmp_path: Path) -> None:
    at = parts(snap)
    raw = snap.read_bytes()
    flip_bit(snap, at["footer"] + 5)
    err = assert_rejected(snap, tmp_path, "sha256 mismatch")
    assert err.offset == at["footer"]
    snap.write_bytes(raw)
    flip_bit(snap, at["size"] - 1)
    assert_rejected(snap, tmp_path, "footer: bad end magic")


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


@pytest.mark.parametrize("cut", [0, 5, 8, 9, 63, 64, 70, "body", "footer", -1])
def test_truncation(snap: Path, tmp_path: Path, cut: int | str) -> None:
    at = parts(snap)
    size = at[cut] + 3 if isinstance(cut, str) else cut
    truncate(snap, size)
    assert_rejected(snap, tmp_path, "size:")


def test_appended_bytes(snap: Path, tmp_path: Path) -> None:
    with snap.open("ab") as fh:
        fh.write(b"\0" * 8)
    assert_rejected(snap, tmp_path, "size:")


def test_wrong_store(snap: Path) -> None:
    with pytest.raises(CorruptionError, match="header: snapshot of store"):
        verify_snapshot(FILES, snap, store_id=uuid.uuid4())
    assert verify_snapshot(FILES, snap, store_id=None).store_id == STORE


def test_unknown_version_is_not_corruption(snap: Path, tmp_path: Path) -> None:
    poke(snap, 8, "<H", 2)
    flip_bit(snap, parts(snap)["body"] + 3)  # damage elsewhere is not judged either
    with pytest.raises(FormatVersionError) as exc:
        verify_snapshot(FILES, snap, store_id=STORE)
    assert (exc.value.found, exc.value.supported) == (2, 1)
    with pytest.raises(FormatVersionError):
        extract_snapshot(FILES, snap, tmp_path / "x.mdb", store_id=STORE)


def test_name_must_agree_with_header(snap: Path, tmp_path: Path) -> None:
    moved = snap.with_name(snapshot_name(3, 3))
    snap.rename(moved)
    assert_rejected(moved, tmp_path, "header: epoch")
    odd = moved.with_name("latest.snap")
    moved.rename(odd)
    assert_rejected(odd, tmp_path, "name:")


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

        monkeypatch.setattr(snapshot_mod, "_open_read", failing_open)
        with pytest.raises(OSError) as exc:
            verify_snapshot(FILES, snap, store_id=STORE)
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


def test_write_refuses_bad_meta_and_existing_names(
    snap: Path, snap_dir: Path, image: Path, state: LiveState
) -> None:
    with pytest.raises(FileExistsError):
        write_snapshot(FILES, snap_dir, make_meta(image, state), image)
    with pytest.raises(ValueError, match="image_bytes"):
        write_snapshot(FILES, snap_dir, make_meta(image, state, epoch=9, image_bytes=1), image)
    with pytest.raises(ValueError, match="range"):
        write_snapshot(FILES, snap_dir, make_meta(image, state, epoch=9, chain=1 << 32), image)
    assert [p.name for p in snap_dir.iterdir()] == [snap.name]


def _write_with(files: FileLayer, snap_dir: Path, image: Path, state: LiveState) -> Path:
    return write_snapshot(files, snap_dir, make_meta(image, state), image)


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
    assert verify_snapshot(FILES, path, store_id=STORE) == make_meta(image, state)


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


def test_extract_then_base_level_reads_the_same_state(tmp_path: Path, snap_dir: Path) -> None:
    rng = random.Random(7)
    state = LiveState()
    for epoch in range(1, 31):
        keys: list[Key] = []
        for _ in range(400):
            n = rng.randrange(5000)
            keys.append(f"s{n}" if rng.random() < 0.5 else b"b%d" % n)
        values = [rng.randbytes(rng.randrange(1, 40)) for _ in keys]
        dels: list[Key] = [f"s{rng.randrange(5000)}" for _ in range(50)]
        table = rng.choice(["a", "b", "c"])
        state.apply(epoch, {f"p{epoch % 3}": epoch}, epoch * 10, [(table, keys, values, dels)])
    image = tmp_path / "img" / "image.mdb"
    image.parent.mkdir()
    build_image(image, state)
    meta = make_meta(image, state)
    path = write_snapshot(FILES, snap_dir, meta, image, level=1)
    dest = tmp_path / "base.mdb"
    got = extract_snapshot(FILES, path, dest, store_id=STORE)
    assert got == meta and got.tables == {n: len(t) for n, t in tables_of(state).items()}
    with BaseLevel(dest) as base:
        assert base.tables() == state.tables()
        for name in state.tables():
            assert list(base.items(name)) == list(state.items(name))
            assert base.count(name) == meta.tables[name]
            assert list(base.items(name, "s1")) == list(state.items(name, "s1"))


def test_large_image_streams_in_chunks(tmp_path: Path, snap_dir: Path) -> None:
    rng = random.Random(1)
    state = LiveState()
    keys: list[Key] = [b"%08d" % i for i in range(60_000)]
    state.apply(1, {}, 0, [("t", keys, [rng.randbytes(40) for _ in keys], [])])
    image = tmp_path / "image.mdb"
    build_image(image, state)
    assert image.stat().st_size > 3 << 20
    path = write_snapshot(FILES, snap_dir, make_meta(image, state), image)
    assert parts(path)["footer"] - parts(path)["body"] > 2 << 20  # several 1 MiB chunks
    dest = tmp_path / "out.mdb"
    extract_snapshot(FILES, path, dest, store_id=STORE)
    assert dest.read_bytes() == image.read_bytes()
    flip_bit(path, parts(path)["body"] + (2 << 20) + 17)
    assert_rejected(path, tmp_path, "body:")


def test_extract_replaces_a_stale_image(snap: Path, tmp_path: Path, image: Path) -> None:
    dest = tmp_path / "base.mdb"
    dest.write_bytes(b"stale")
    (tmp_path / "base.mdb.tmp").write_bytes(b"left by a crash")
    extract_snapshot(FILES, snap, dest, store_id=STORE)
    assert dest.read_bytes() == image.read_bytes()
    assert not (tmp_path / "base.mdb.tmp").exists()
    shutil.copy(dest, tmp_path / "copy.mdb")
    flip_bit(snap, parts(snap)["footer"])
    with pytest.raises(CorruptionError):
        extract_snapshot(FILES, snap, dest, store_id=STORE)
    assert dest.read_bytes() == (tmp_path / "copy.mdb").read_bytes()  # untouched
