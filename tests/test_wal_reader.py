"""Unit tests of the WAL byte layout and the segment reader, on bytes the real writer wrote.

Covers :mod:`statelog.format.wal` (crc masking, frame alignment, the segment
header, segment names) and :func:`statelog.log.reader.scan_segment` /
:func:`statelog.log.salvage.salvage_frames` (what is a record, what is clean,
torn or corrupt), without any store or recovery policy on top.
"""

from __future__ import annotations

import itertools
import random
import struct
import uuid
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statelog.errors import FormatVersionError
from statelog.format.wal import (
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    HEADER_SIZE,
    MAGIC,
    VERSION,
    FrameType,
    SegmentHeader,
    mask,
    pack_frame_header,
    padding,
    parse_segment_name,
    segment_name,
    unmask,
)
from statelog.log import salvage
from statelog.log.reader import SegmentScan, StopKind, scan_segment
from statelog.log.salvage import SALVAGE_FACTOR, SalvageLimit, salvage_frames
from statelog.log.writer import WalWriter
from statelog.storage.fileio import FileLayer
from tests.helpers import frames

STORE = uuid.UUID("0b5e55ed-0000-4000-8000-000000000001")
OTHER = uuid.UUID("0b5e55ed-0000-4000-8000-000000000002")

# Payload sizes around every padding residue, plus some that need several 64-byte fragments.
PAYLOADS = [bytes([0xA0 + i % 16]) * n for i, n in enumerate([0, 1, 7, 8, 9, 15, 16, 17, 63, 64])]
PAYLOADS += [bytes(range(256)) * 2 + b"tail", b"\x5a" * 200]


def write_segment(
    tmp_path: Path,
    payloads: list[bytes],
    *,
    seal: bool = True,
    fragment_bytes: int = 64,
    prev_crc: int = 0,
    first_lsn: int = 1,
) -> tuple[Path, WalWriter]:
    """Write ``payloads`` through a real WalWriter into one segment; return its path."""
    writer = WalWriter(
        FileLayer(), tmp_path, STORE, segment_bytes=1 << 20, fragment_bytes=fragment_bytes
    )
    path = writer.start_segment(3, first_lsn, prev_crc)
    for p in payloads:
        writer.append(p, sync=False)
    if seal:
        writer.seal()
    else:
        writer.close()
    return path, writer


def scan(
    path: Path,
    data: bytes | None = None,
    *,
    is_last: bool = True,
    store_id: uuid.UUID | None = STORE,
    prev_crc: int | None = 0,
) -> SegmentScan:
    raw = path.read_bytes() if data is None else data
    return scan_segment(path, raw, store_id=store_id, prev_crc=prev_crc, is_last=is_last)


def payloads_of(s: SegmentScan) -> list[bytes]:
    return [bytes(r.payload) for r in s.records]


def with_header(data: bytes, **fields: int) -> bytes:
    """``data`` with header fields replaced and the header crc recomputed."""
    buf = bytearray(data)
    offsets = {"version": (8, "<H"), "sequence": (32, "<Q"), "prev_crc": (48, "<I")}
    for name, value in fields.items():
        off, fmt = offsets[name]
        struct.pack_into(fmt, buf, off, value)
    struct.pack_into("<I", buf, HEADER_SIZE - 4, mask(crc32c.crc32c(bytes(buf[: HEADER_SIZE - 4]))))
    return bytes(buf)


def frame(ftype: FrameType, payload: bytes, prev: int) -> tuple[bytes, int]:
    """One hand-built frame (header, payload, padding) and its crc."""
    header = pack_frame_header(ftype, payload, prev)
    return header + payload + bytes(padding(len(payload))), struct.unpack_from("<I", header)[0]


# -- wal_format ---------------------------------------------------------------


def test_mask_unmask_round_trip() -> None:
    """Masking is a bijection on u32 and never the identity (LevelDB's rotate-and-add)."""
    rng = random.Random(7)
    values = [0, 1, 0x7FFF, 0x8000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
    values += [rng.getrandbits(32) for _ in range(2000)]
    for v in values:
        m = mask(v)
        assert 0 <= m <= 0xFFFFFFFF
        assert unmask(m) == v
        assert mask(unmask(v)) == v
    assert mask(0) == 0xA282EAD8  # LevelDB's kMaskDelta
    crc = crc32c.crc32c(b"statelog")
    assert mask(crc) != crc
    assert mask(crc) == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_padding_makes_every_frame_8_aligned() -> None:
    """padding(n) is the 0..7 zero bytes that end a frame of payload n on an 8-byte boundary."""
    assert HEADER_SIZE % 8 == 0 and FRAME_HEADER_SIZE == 16
    for n in range(300):
        pad = padding(n)
        assert 0 <= pad < 8
        assert (FRAME_HEADER_SIZE + n + pad) % 8 == 0


def test_writer_frames_start_8_aligned_and_length_never_straddles(tmp_path: Path) -> None:
    """Every frame the writer lays down starts 8-aligned: its length sits in one 8-byte block."""
    path, _ = write_segment(tmp_path, PAYLOADS)
    data = path.read_bytes()
    fr = frames(path)
    assert fr[0].offset == HEADER_SIZE
    assert fr[-1].end == len(data) and len(data) % 8 == 0
    for prev, f in itertools.pairwise(fr):
        assert f.offset == prev.end  # contiguous
    for f in fr:
        assert f.offset % 8 == 0
        assert (f.offset + 4) // 8 == (f.offset + 7) // 8  # bytes 4..8: length, one 8-byte block
        assert (f.offset + 4) // 512 == (f.offset + 7) // 512  # so never across a sector either
        _, length, ftype, pad, reserved, _ = FRAME_HEADER.unpack_from(data, f.offset)
        assert (pad, reserved) == (padding(length), 0)
        assert data[f.end - pad : f.end] == bytes(pad)  # padding is zeros
        assert ftype in set(FrameType)


def test_writer_fragments_large_records(tmp_path: Path) -> None:
    """A payload over fragment_bytes becomes FIRST, MIDDLE..., LAST frames of at most that size."""
    payload = bytes(range(256)) * 2
    path, _ = write_segment(tmp_path, [payload, b"x"], fragment_bytes=64)
    types = [f.ftype for f in frames(path)]
    assert types == [FrameType.FIRST] + [FrameType.MIDDLE] * 6 + [
        FrameType.LAST,
        FrameType.FULL,
        FrameType.SEAL,
    ]
    assert all(f.length <= 64 for f in frames(path))


def test_segment_header_pack_unpack_round_trip() -> None:
    """SegmentHeader packs to 64 bytes with magic and a crc, and unpacks to the same value."""
    h = SegmentHeader(STORE, sequence=0x0102030405, first_lsn=1 << 40, prev_crc=0xDEADBEEF)
    raw = h.pack()
    assert len(raw) == HEADER_SIZE
    assert raw.startswith(MAGIC)
    assert SegmentHeader.crc_ok(raw)
    assert SegmentHeader.unpack(raw) == h
    assert SegmentHeader.peek_version(raw) == VERSION == h.version
    assert SegmentHeader.unpack(raw + b"frames follow") == h
    # Every single-bit error in the header is caught by the magic or the crc.
    for i in range(HEADER_SIZE):
        for bit in (0, 7):
            bad = bytearray(raw)
            bad[i] ^= 1 << bit
            assert not SegmentHeader.crc_ok(bytes(bad)), (i, bit)
    assert not SegmentHeader.crc_ok(raw[:-1])
    assert SegmentHeader.peek_version(b"NOTAWAL!\x01\x00") is None
    assert SegmentHeader.peek_version(MAGIC) is None


def test_segment_name_round_trip_and_order() -> None:
    """Names carry hex sequence and first LSN; name order is log order; other files are ignored."""
    assert segment_name(1, 1) == "0000000000000001-0000000000000001.wal"
    pairs = [(1, 1), (2, 17), (10, 300), (16, 4096), (255, 1 << 33), ((1 << 64) - 1, (1 << 64) - 1)]
    for seq, lsn in pairs:
        name = segment_name(seq, lsn)
        assert parse_segment_name(name) == (seq, lsn)
        assert parse_segment_name(Path("/x/wal") / name) == (seq, lsn)
    names = [segment_name(s, lsn) for s, lsn in pairs]
    assert sorted(names) == names
    good = segment_name(1, 1)
    for other in [
        good + ".broken",
        good + ".corrupt",
        good + ".corrupt.1",
        good + ".tmp",
        good.upper(),
        good.replace(".wal", ".snap"),
        good[1:],
        "0000000000000001_0000000000000001.wal",
        "zz00000000000001-0000000000000001.wal",
        "IDENTITY",
    ]:
        assert parse_segment_name(other) is None, other


# -- scan_segment: clean ------------------------------------------------------------


@pytest.mark.parametrize("is_last", [True, False])
def test_scan_sealed_segment_returns_every_record(tmp_path: Path, is_last: bool) -> None:
    """A sealed segment scans CLEAN: every payload in order, contiguous offsets, the seal's LSN."""
    path, writer = write_segment(tmp_path, PAYLOADS, first_lsn=5)
    s = scan(path, is_last=is_last)
    assert s.stop.kind is StopKind.CLEAN
    assert s.end == s.size == path.stat().st_size and s.dropped_bytes == 0
    assert s.header == SegmentHeader(STORE, 3, 5, 0)
    assert payloads_of(s) == PAYLOADS
    assert s.records[0].offset == HEADER_SIZE
    for a, b in itertools.pairwise(s.records):
        assert a.end == b.offset
    seal = frames(path)[-1]
    assert seal.ftype == FrameType.SEAL and s.records[-1].end == seal.offset
    assert s.sealed_lsn == 4 + len(PAYLOADS)
    assert s.end_crc == writer.last_crc


def test_scan_unsealed_segment_chain_values(tmp_path: Path) -> None:
    """Unsealed: CLEAN, no seal, and each record's crc is its last frame's crc (the chain)."""
    path, writer = write_segment(tmp_path, PAYLOADS, seal=False)
    data = path.read_bytes()
    s = scan(path)
    assert s.stop.kind is StopKind.CLEAN and s.sealed_lsn is None
    assert payloads_of(s) == PAYLOADS
    by_end = {f.end: f for f in frames(path)}
    for r in s.records:
        last = by_end[r.end]
        assert r.crc == struct.unpack_from("<I", data, last.offset)[0]
    assert s.end_crc == s.records[-1].crc == writer.last_crc


def test_scan_empty_segment_is_clean(tmp_path: Path) -> None:
    """A segment holding only its header is a clean, empty log."""
    path, _ = write_segment(tmp_path, [], seal=False)
    s = scan(path)
    assert (s.stop.kind, s.stop.offset, s.records) == (StopKind.CLEAN, HEADER_SIZE, [])
    assert s.end_crc == 0


# -- scan_segment: header checks ------------------------------------------------------


def test_scan_follows_chain_from_previous_segment(tmp_path: Path) -> None:
    """The header's prev_crc must equal the chain value the log ended at, else chain break."""
    path, _ = write_segment(tmp_path, PAYLOADS[:3], prev_crc=0xCAFEF00D)
    assert scan(path, prev_crc=0xCAFEF00D).stop.kind is StopKind.CLEAN
    assert scan(path, prev_crc=None).stop.kind is StopKind.CLEAN
    s = scan(path, prev_crc=0xCAFEF00E)
    assert (s.stop.kind, s.stop.offset) == (StopKind.CORRUPT, 0)
    assert "chain break" in s.stop.reason and s.records == []


def test_scan_refuses_segment_of_another_store(tmp_path: Path) -> None:
    """A segment whose header names another store is corrupt at offset 0, even as the last one."""
    path, _ = write_segment(tmp_path, PAYLOADS[:3])
    s = scan(path, store_id=OTHER)
    assert (s.stop.kind, s.stop.offset, s.records) == (StopKind.CORRUPT, 0, [])
    assert str(STORE) in s.stop.reason
    assert scan(path, store_id=None).stop.kind is StopKind.CLEAN


def test_scan_unknown_version_raises(tmp_path: Path) -> None:
    """A verified header of another version raises FormatVersionError; never parsed or repaired."""
    path, _ = write_segment(tmp_path, PAYLOADS[:3])
    data = with_header(path.read_bytes(), version=VERSION + 1)
    with pytest.raises(FormatVersionError) as info:
        scan(path, data)
    assert (info.value.found, info.value.supported) == (VERSION + 1, VERSION)


def test_scan_bad_header_is_corrupt_zeroed_header_is_torn(tmp_path: Path) -> None:
    """A header failing its crc is corrupt (it is written atomically); an all-zero file is torn."""
    path, _ = write_segment(tmp_path, PAYLOADS[:3])
    data = bytearray(path.read_bytes())
    data[20] ^= 0x08  # inside the store id
    for is_last in (True, False):
        s = scan(path, bytes(data), is_last=is_last)
        assert (s.stop.kind, s.stop.offset, s.header) == (StopKind.CORRUPT, 0, None)
        assert "header" in s.stop.reason
    zeros = bytes(len(data))
    assert scan(path, zeros, is_last=True).stop.kind is StopKind.TORN
    assert scan(path, zeros, is_last=False).stop.kind is StopKind.CORRUPT


# -- scan_segment: torn versus corrupt -------------------------------------------------


@pytest.mark.parametrize("cut_into", [3, 16, -1], ids=["in-header", "at-payload", "last-byte"])
def test_scan_truncated_last_record_torn_only_in_last_segment(
    tmp_path: Path, cut_into: int
) -> None:
    """A record cut short is torn in the last segment and corrupt in any earlier one."""
    path, _ = write_segment(tmp_path, PAYLOADS, seal=False)
    last = frames(path)[-1]
    assert last.ftype == FrameType.LAST
    start = next(f.offset for f in reversed(frames(path)) if f.ftype == FrameType.FIRST)
    cut = last.offset + cut_into if cut_into > 0 else last.end + cut_into
    data = path.read_bytes()[:cut]
    torn = scan(path, data, is_last=True)
    assert (torn.stop.kind, torn.stop.offset) == (StopKind.TORN, start)
    assert torn.dropped_bytes == len(data) - start
    assert payloads_of(torn) == PAYLOADS[:-1]
    corrupt = scan(path, data, is_last=False)
    assert (corrupt.stop.kind, corrupt.stop.offset) == (StopKind.CORRUPT, start)
    assert payloads_of(corrupt) == PAYLOADS[:-1]


def test_scan_record_ending_at_fragment_boundary_is_torn(tmp_path: Path) -> None:
    """Fragments that stop at the end of the file (no LAST yet) are a torn record."""
    path, _ = write_segment(tmp_path, PAYLOADS, seal=False)
    fr = frames(path)
    start = next(i for i in range(len(fr) - 1, -1, -1) if fr[i].ftype == FrameType.FIRST)
    data = path.read_bytes()[: fr[start + 1].end]
    s = scan(path, data)
    assert (s.stop.kind, s.stop.offset) == (StopKind.TORN, fr[start].offset)
    assert "fragments stop" in s.stop.reason


def test_scan_zero_tail_is_torn_in_last_segment(tmp_path: Path) -> None:
    """Zero-filled space after the last frame is a torn tail (last segment only)."""
    path, _ = write_segment(tmp_path, PAYLOADS)
    data = path.read_bytes()
    s = scan(path, data + bytes(1000))
    assert (s.stop.kind, s.stop.offset) == (StopKind.TORN, len(data))
    assert "zero-filled" in s.stop.reason and payloads_of(s) == PAYLOADS
    assert scan(path, data + bytes(1000), is_last=False).stop.kind is StopKind.CORRUPT


def test_scan_bit_flip_is_corrupt_even_in_last_frame(tmp_path: Path) -> None:
    """A checksum mismatch with no zeroed sector is bit rot, not a torn write, even at the end."""
    big = b"\x77" * 1000  # no zero byte anywhere in the frame body
    path, _ = write_segment(tmp_path, [*PAYLOADS[:3], big], seal=False, fragment_bytes=4096)
    last = frames(path)[-1]
    data = bytearray(path.read_bytes())
    data[last.offset + FRAME_HEADER_SIZE + 500] ^= 0x10
    s = scan(path, bytes(data))
    assert (s.stop.kind, s.stop.offset) == (StopKind.CORRUPT, last.offset)
    assert "checksum mismatch" in s.stop.reason
    assert payloads_of(s) == PAYLOADS[:3]


def test_scan_zeroed_sector_in_last_frame_is_torn_unless_a_frame_follows(tmp_path: Path) -> None:
    """A frame with a zeroed 512-byte sector is torn if nothing valid follows, else corrupt."""
    big = b"\x77" * 2000
    path, _ = write_segment(tmp_path, [*PAYLOADS[:3], big], fragment_bytes=4096)
    fr = frames(path)
    last, seal = fr[-2], fr[-1]
    data = bytearray(path.read_bytes())
    sector = -(-(last.offset + FRAME_HEADER_SIZE) // 512) * 512  # a sector of payload only
    data[sector : sector + 512] = bytes(512)
    unsealed = bytes(data[: seal.offset])
    torn = scan(path, unsealed)
    assert (torn.stop.kind, torn.stop.offset) == (StopKind.TORN, last.offset)
    corrupt = scan(path, bytes(data))  # the seal still verifies after the damage
    assert (corrupt.stop.kind, corrupt.stop.offset) == (StopKind.CORRUPT, last.offset)
    assert f"a valid frame follows at {seal.offset}" in corrupt.stop.reason


def test_scan_torn_sector_boundary_inside_frame_header_is_torn(tmp_path: Path) -> None:
    """A frame starting 8 bytes before a sector boundary, the next sectors unwritten: torn.

    The first sector holds the frame's crc and length; the rest of the header
    and the payload read as zeros. A zero-filled sector means a torn write,
    whether the boundary falls in the payload or in the header.
    """
    first = b"a" * (512 - 8 - HEADER_SIZE - FRAME_HEADER_SIZE)  # pad 0: next frame at 504
    path, _ = write_segment(tmp_path, [first, b"b" * 1000], seal=False, fragment_bytes=4096)
    last = frames(path)[-1]
    assert last.offset == 504
    data = bytearray(path.read_bytes())
    data[512:] = bytes(len(data) - 512)
    s = scan(path, bytes(data))
    assert (s.stop.kind, s.stop.offset) == (StopKind.TORN, 504)
    assert payloads_of(s) == [first]
    assert scan(path, bytes(data), is_last=False).stop.kind is StopKind.CORRUPT


def test_scan_checksum_mismatch_in_middle_is_corrupt(tmp_path: Path) -> None:
    """Damage followed by frames that still verify is corruption, never a torn tail."""
    path, _ = write_segment(tmp_path, PAYLOADS)
    fr = frames(path)
    victim = fr[4]
    data = bytearray(path.read_bytes())
    data[victim.offset + FRAME_HEADER_SIZE] ^= 1
    s = scan(path, bytes(data))
    assert (s.stop.kind, s.stop.offset) == (StopKind.CORRUPT, victim.offset)
    assert payloads_of(s) == PAYLOADS[:4]
    assert s.end_crc == s.records[-1].crc


@pytest.mark.parametrize("field", ["type", "length", "prev"])
def test_frame_crc_covers_header_fields(tmp_path: Path, field: str) -> None:
    """The frame crc covers type, length and prev, not only the payload."""
    path, _ = write_segment(tmp_path, [b"a" * 24, b"b" * 24, b"c" * 24])
    victim = frames(path)[1]
    data = bytearray(path.read_bytes())
    if field == "type":
        data[victim.offset + 8] = FrameType.SEAL
    elif field == "length":
        struct.pack_into("<I", data, victim.offset + 4, victim.length - 8)
    else:
        data[victim.offset + 12] ^= 0x40
    s = scan(path, bytes(data))
    assert (s.stop.kind, s.stop.offset) == (StopKind.CORRUPT, victim.offset)
    assert payloads_of(s) == [b"a" * 24]


def test_scan_chain_break_on_swapped_frames(tmp_path: Path) -> None:
    """Two intact frames in the wrong order break the chain at the first of them."""
    path, _ = write_segment(tmp_path, [b"a" * 24, b"b" * 24, b"c" * 24, b"d" * 24])
    fr = frames(path)
    data = path.read_bytes()
    a, b = fr[1], fr[2]
    swapped = data[: a.offset] + data[b.offset : b.end] + data[a.offset : a.end] + data[b.end :]
    s = scan(path, swapped)
    assert (s.stop.kind, s.stop.offset) == (StopKind.CORRUPT, a.offset)
    assert "chain break" in s.stop.reason
    assert payloads_of(s) == [b"a" * 24]


def test_scan_fragment_sequence_rules(tmp_path: Path) -> None:
    """Chained but misordered fragment types, and frames after a seal, are corrupt."""
    header = SegmentHeader(STORE, 3, 1, 0).pack()
    path = tmp_path / segment_name(3, 1)

    first, c1 = frame(FrameType.FIRST, b"p" * 10, 0)
    full, _ = frame(FrameType.FULL, b"q" * 10, c1)
    s = scan(path, header + first + full)
    assert (s.stop.kind, s.stop.offset) == (StopKind.CORRUPT, HEADER_SIZE)
    assert "fragment sequence" in s.stop.reason

    orphan, _ = frame(FrameType.LAST, b"r" * 10, 0)
    s = scan(path, header + orphan)
    assert (s.stop.kind, s.stop.offset) == (StopKind.CORRUPT, HEADER_SIZE)
    assert "without a first" in s.stop.reason

    rec, c2 = frame(FrameType.FULL, b"s" * 10, 0)
    seal, c3 = frame(FrameType.SEAL, struct.pack("<Q", 1), c2)
    extra, _ = frame(FrameType.FULL, b"t" * 10, c3)
    s = scan(path, header + rec + seal + extra)
    assert (s.stop.kind, s.stop.offset) == (StopKind.CORRUPT, HEADER_SIZE + len(rec + seal))
    assert "after the seal" in s.stop.reason
    assert payloads_of(s) == [b"s" * 10] and s.sealed_lsn == 1


# -- salvage_frames -------------------------------------------------------------------


def test_salvage_yields_every_verified_frame(tmp_path: Path) -> None:
    """On an intact segment salvage sees every frame, with its type and payload."""
    path, _ = write_segment(tmp_path, PAYLOADS)
    data = path.read_bytes()
    got = [(off, t, bytes(p)) for off, t, p in salvage_frames(data, HEADER_SIZE)]
    fr = frames(path)
    assert [(o, t) for o, t, _ in got] == [(f.offset, f.ftype) for f in fr]
    for (off, _, payload), f in zip(got, fr, strict=True):
        assert payload == data[off + FRAME_HEADER_SIZE : off + FRAME_HEADER_SIZE + f.length]


def test_salvage_skips_damage_and_ignores_the_chain(tmp_path: Path) -> None:
    """Past a damaged frame salvage resyncs on the next verified one; swapped frames still count."""
    path, _ = write_segment(tmp_path, [bytes([65 + i]) * 40 for i in range(6)])
    fr = frames(path)
    data = bytearray(path.read_bytes())
    data[fr[2].offset + FRAME_HEADER_SIZE + 1] ^= 4
    found = [off for off, _, _ in salvage_frames(bytes(data), HEADER_SIZE)]
    assert found == [f.offset for i, f in enumerate(fr) if i != 2]
    # An unaligned start rounds up to the next 8-byte boundary.
    assert [off for off, _, _ in salvage_frames(bytes(data), fr[3].offset - 5)] == [
        f.offset for f in fr[3:]
    ]
    raw = bytes(data)
    a, b = fr[3], fr[4]
    swapped = raw[: a.offset] + raw[b.offset : b.end] + raw[a.offset : a.end] + raw[b.end :]
    payloads = [bytes(p) for _, t, p in salvage_frames(swapped, a.offset) if t == FrameType.FULL]
    assert payloads == [b"E" * 40, b"D" * 40, b"F" * 40]


def _salvage_every_offset(data: bytes, start: int) -> list[tuple[int, int, bytes]]:
    """Salvage as a step per aligned offset: what the search for candidate headers must
    find, frame for frame."""
    out, pos = [], start + (-start % 8)
    while pos + FRAME_HEADER_SIZE <= len(data):
        _crc, length, ftype, pad, reserved, prev = FRAME_HEADER.unpack_from(data, pos)
        end = pos + FRAME_HEADER_SIZE + length + pad
        body = data[pos + FRAME_HEADER_SIZE : pos + FRAME_HEADER_SIZE + length]
        if (
            1 <= ftype <= FrameType.SEAL and not reserved and pad == padding(length)
            and end <= len(data) and pack_frame_header(ftype, body, prev)[:4] == data[pos:pos + 4]
        ):  # fmt: skip
            out.append((pos, ftype, body))
            pos = end
        else:
            pos += 8
    return out


@settings(max_examples=150, deadline=None)
@given(
    pieces=st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.sampled_from([b"\x01\x00\x00\x00" * 6, bytes(24), b"\x05\x07\x00\x00" * 4]),
            st.tuples(st.sampled_from(list(FrameType)), st.binary(max_size=30)),
        ),
        max_size=12,
    ),
    start=st.integers(0, 20),
)
def test_salvage_finds_what_a_step_per_offset_finds(
    pieces: list[bytes | tuple[FrameType, bytes]], start: int
) -> None:
    """Frames among random bytes, header look-alikes and zeros, at any alignment: the
    candidate search yields exactly the frames a parse of every aligned offset yields."""
    blob = b"".join(
        p if isinstance(p, bytes) else frame(p[0], p[1], len(p[1]))[0] for p in pieces
    )
    got = [(off, t, bytes(p)) for off, t, p in salvage_frames(blob, start)]
    assert got == _salvage_every_offset(blob, start)


def test_salvage_finds_nothing_in_zeros_or_torn_bytes(tmp_path: Path) -> None:
    """Zeros and a cut-off frame yield no frames: salvage never invents evidence."""
    path, _ = write_segment(tmp_path, [b"z" * 100], seal=False, fragment_bytes=4096)
    data = path.read_bytes()
    assert list(salvage_frames(bytes(4096), 0)) == []
    assert list(salvage_frames(data[:-9], HEADER_SIZE)) == []


def _header_lookalikes(size: int, claimed: int) -> bytes:
    """Bytes a stored value may hold: a frame header every 16 bytes, each claiming a
    ``claimed``-byte payload that fits but never verifies."""
    buf = bytearray(size)
    for off in range(0, size - FRAME_HEADER_SIZE, 16):
        FRAME_HEADER.pack_into(buf, off, 0, claimed, FrameType.FULL, padding(claimed), 0, 0)
    return bytes(buf)


def test_salvage_work_is_bounded_past_bytes_shaped_like_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each candidate header costs a checksum over the length it claims: without a bound,
    a region of look-alikes costs its size times the claimed length. The search stops at
    SALVAGE_FACTOR times the region (SalvageLimit) and yields nothing it did not verify."""
    checked: list[int] = []
    real = salvage.frame_crc

    def counting(header: memoryview, payload: memoryview) -> int:
        checked.append(len(payload))
        return real(header, payload)

    monkeypatch.setattr(salvage, "frame_crc", counting)
    blob = _header_lookalikes(4 << 20, 64 << 10)  # unbounded: 262,144 checks of 64 KiB
    with pytest.raises(SalvageLimit) as err:
        list(salvage_frames(blob, 0))
    assert sum(checked) <= SALVAGE_FACTOR * len(blob)
    assert 0 < err.value.offset < len(blob)


def test_a_torn_record_of_header_lookalikes_is_judged_quickly_and_not_torn(
    tmp_path: Path,
) -> None:
    """A crash in the middle of appending a value full of header look-alikes: the search
    for a valid frame past the cut stops at its bound, and the reader refuses to call
    it torn (it cannot tell), rather than scanning for minutes."""
    value = _header_lookalikes(2 << 20, 1 << 20)
    path, _ = write_segment(tmp_path, [b"kept", value], seal=False, fragment_bytes=4 << 20)
    data = path.read_bytes()
    s = scan(path, data[: len(data) - (512 << 10) + 5])
    assert s.stop.kind is StopKind.CORRUPT and payloads_of(s) == [b"kept"]
    assert "too much looks like frame headers" in s.stop.reason


def _torn_large_record(tmp_path: Path, sector_in: int, zero: bool) -> SegmentScan:
    """One unfinished append of a FIRST and a LAST fragment after a kept record; a sector
    of fragment ``sector_in`` (1: FIRST, 2: LAST) zeroed, or one bit of it flipped."""
    big = random.Random(5).randbytes(20 << 10)
    path, _ = write_segment(tmp_path, [b"kept", big], seal=False, fragment_bytes=16 << 10)
    fr = frames(path)
    assert [f.ftype for f in fr] == [FrameType.FULL, FrameType.FIRST, FrameType.LAST]
    data = bytearray(path.read_bytes())
    at = (fr[sector_in].offset // 512 + 2) * 512
    if zero:
        data[at : at + 512] = bytes(512)
    else:
        data[at + 3] ^= 0x10
    return scan(path, bytes(data))


@pytest.mark.parametrize(
    ("sector_in", "zero", "kind"),
    [
        (1, True, StopKind.CORRUPT),  # the LAST that verifies past it: not a torn tail
        (2, True, StopKind.TORN),
        (1, False, StopKind.CORRUPT),
        (2, False, StopKind.CORRUPT),
    ],
)
def test_a_frame_that_verifies_past_the_damage_makes_it_corruption_even_its_own_rest(
    tmp_path: Path, sector_in: int, zero: bool, kind: StopKind
) -> None:
    """A LAST fragment that verifies after its FIRST's zeroed sector might be the same
    unfinished append, its sectors persisted out of order; or the FIRST was written and
    acknowledged and a zero block in the value was later damaged. The reader cannot
    tell, so it refuses to call it torn: corruption keeps the remainder aside."""
    s = _torn_large_record(tmp_path, sector_in, zero)
    assert s.stop.kind is kind and payloads_of(s) == [b"kept"]


def test_salvage_finds_a_header_overlapping_an_unaligned_lookalike(tmp_path: Path) -> None:
    """A fragment of 16 MiB has length 0x01000000: its top length byte and the header's
    type, padding and reserved bytes read as an unaligned look-alike one byte early.
    The search must still try the aligned header inside it."""
    payload = random.Random(9).randbytes(16 << 20)
    path, _ = write_segment(tmp_path, [b"a" * 10, payload], seal=False, fragment_bytes=16 << 20)
    fr = frames(path)
    data = bytearray(path.read_bytes())
    assert fr[1].length == 1 << 24
    data[fr[0].offset + FRAME_HEADER_SIZE] ^= 1  # damage the small record before it
    found = [(off, t) for off, t, _ in salvage_frames(bytes(data), fr[0].offset + 8)]
    assert found == [(fr[1].offset, fr[1].ftype)]
    s = scan(path, bytes(data))
    assert s.stop.kind is StopKind.CORRUPT and "a valid frame follows" in s.stop.reason


def test_salvage_does_not_run_out_on_a_segment_of_tiny_records(tmp_path: Path) -> None:
    """Every frame of an intact segment of tiny records is a candidate header: the bound
    must leave room for all of them (lost-epoch evidence comes from such segments)."""
    path, _ = write_segment(tmp_path, [b"e" * 40] * 18000, seal=False, fragment_bytes=4096)
    data = path.read_bytes()
    assert len(list(salvage_frames(data, HEADER_SIZE))) == len(frames(path)) == 18000


def test_a_seal_whose_payload_is_not_eight_bytes_is_corruption(tmp_path: Path) -> None:
    """A SEAL frame that verifies but holds no 8-byte LSN (a foreign or crafted file) is
    a corrupt stop, never an unpacking error."""
    path, _ = write_segment(tmp_path, [], seal=False)
    header = path.read_bytes()[:HEADER_SIZE]
    rec, c1 = frame(FrameType.FULL, b"s" * 10, 0)
    for payload in (b"", b"\x01" * 7, b"\x01" * 9):
        seal, _ = frame(FrameType.SEAL, payload, c1)
        s = scan(path, header + rec + seal)
        assert (s.stop.kind, s.stop.offset) == (StopKind.CORRUPT, HEADER_SIZE + len(rec))
        assert s.sealed_lsn is None and "seal of" in s.stop.reason


def _verdict(s: SegmentScan) -> tuple[object, ...]:
    return (
        s.stop, s.header, s.sealed_lsn, s.seal_offset, s.end_crc,
        [(r.offset, r.end, r.crc) for r in s.records],
    )  # fmt: skip


def test_a_scan_without_payloads_judges_every_cut_and_flip_alike(tmp_path: Path) -> None:
    """``payloads=False`` (shipping's scan) skips only the copy that joins a record's
    fragments: at every cut and at a bit flip in every frame, the same verdict."""
    path, _ = write_segment(tmp_path, PAYLOADS)
    data = path.read_bytes()
    damaged = [data[:cut] for cut in range(len(data) + 1)]
    damaged += [flip(data, at) for at in range(HEADER_SIZE, len(data), 37)]
    for raw in damaged:
        for is_last in (True, False):
            full = scan_segment(path, raw, store_id=STORE, prev_crc=0, is_last=is_last)
            bare = scan_segment(
                path, raw, store_id=STORE, prev_crc=0, is_last=is_last, payloads=False
            )
            assert _verdict(bare) == _verdict(full)
    whole = scan_segment(path, data, store_id=STORE, prev_crc=0, is_last=False, payloads=False)
    assert [bytes(r.payload) for r in whole.records] == [
        p if len(p) <= 64 else b"" for p in PAYLOADS
    ]


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]
