"""The WAL reader: parses one segment and reports what it found.

The reader has no policy. It returns the verified records, where reading
stopped, why, and how many bytes it did not use; :mod:`statelog.recovery.replay`
decides whether to truncate, move aside, raise or carry on. Layout:
:mod:`statelog.format.wal` and ``docs/format.md``.

How a stop is classified (invariant 4 of docs/architecture.md):

* ``CLEAN``: the data ended exactly after a complete record.
* ``TORN``: the damage is the unfinished tail of the *last* segment: a
  partial header, a frame longer than the bytes left, a checksum mismatch in
  a frame with a zero-filled 512-byte sector (etcd's rule: unwritten sectors
  read as zeros), a zeroed frame header, or a record whose fragments stop at
  the end. Only when no valid frame follows the damage: a torn write leaves
  nothing valid after itself.
* ``CORRUPT``: anything else: a checksum mismatch, a chain break, a broken
  fragment sequence, data after a seal, a bad segment header, damage in a
  sealed segment, or damage followed by a frame that still verifies.

An ``OSError`` while reading is not a stop: it propagates to the caller.
"""

from __future__ import annotations

import enum
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from statelog.errors import FormatVersionError
from statelog.format.wal import (
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    HEADER_SIZE,
    SEAL_FRAME_SIZE,
    SEAL_PAYLOAD,
    VERSION,
    FrameType,
    SegmentHeader,
    frame_crc,
    padding,
)
from statelog.log.salvage import SalvageLimit, salvage_frames

__all__ = [
    "Record",
    "SegmentScan",
    "Stop",
    "StopKind",
    "peek_generation",
    "peek_seal",
    "scan_from",
    "scan_segment",
]

SECTOR = 512


class StopKind(enum.Enum):
    CLEAN = "clean"
    TORN = "torn"
    CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class Stop:
    """Where and why reading a segment stopped."""

    kind: StopKind
    offset: int  # first byte not used: the start of the damaged or torn record
    reason: str


@dataclass(frozen=True, slots=True)
class Record:
    """One verified logical record (fragments joined)."""

    payload: bytes | memoryview
    offset: int  # start of its first frame
    end: int  # first byte after its last frame
    crc: int  # crc field of its last frame: the chain value after it


@dataclass(slots=True)
class SegmentScan:
    """What :func:`scan_segment` read from one segment."""

    path: Path
    size: int
    header: SegmentHeader | None
    records: list[Record] = field(default_factory=list)
    sealed_lsn: int | None = None  # the last LSN named by the SEAL frame, if sealed
    seal_offset: int | None = None  # where the SEAL frame starts
    stop: Stop = Stop(StopKind.CLEAN, 0, "")
    end_crc: int = 0  # chain value after the last verified frame (records or seal)

    @property
    def end(self) -> int:
        """Offset after the last verified frame: where a repair truncates to."""
        return self.stop.offset

    @property
    def dropped_bytes(self) -> int:
        return self.size - self.stop.offset


@dataclass(frozen=True, slots=True)
class _Frame:
    ftype: int
    payload: memoryview
    crc: int
    prev: int
    end: int


def _parse_frame(data: memoryview, off: int) -> tuple[_Frame | None, str, bool]:
    """The frame at ``off`` if complete and verified.

    Otherwise None, why, and whether a torn write could explain the damage.
    """
    size = len(data)
    if size - off < FRAME_HEADER_SIZE:
        return None, f"partial frame header ({size - off} of {FRAME_HEADER_SIZE} bytes)", True
    crc, length, ftype, pad, reserved, prev = FRAME_HEADER.unpack_from(data, off)
    if not 1 <= ftype <= FrameType.SEAL or reserved or pad != padding(length):
        # A header with a zeroed sector is space the write never reached.
        zeros = _has_zero_sector(data, off, min(size, off + FRAME_HEADER_SIZE))
        return None, f"invalid frame header (type={ftype} pad={pad} reserved={reserved})", zeros
    end = off + FRAME_HEADER_SIZE + length + pad
    if end > size:
        return None, f"frame of {length} bytes runs past the end ({size - off} bytes left)", True
    start = off + FRAME_HEADER_SIZE
    payload = data[start : start + length]
    if frame_crc(data[off + 4 : start], payload) != crc:
        return None, "checksum mismatch", _has_zero_sector(data, off, end)
    return _Frame(ftype, payload, crc, prev, end), "", False


def _has_zero_sector(data: memoryview, start: int, end: int) -> bool:
    """Whether some sector-aligned chunk of ``data[start:end]`` is entirely zero."""
    pos = start
    while pos < end:
        nxt = min(end, (pos // SECTOR + 1) * SECTOR)
        if not any(data[pos:nxt]):
            return True
        pos = nxt
    return False


def scan_segment(
    path: Path,
    data: bytes | memoryview,
    *,
    store_id: uuid.UUID | None,
    prev_crc: int | None,
    is_last: bool,
    payloads: bool = True,
) -> SegmentScan:
    """Verify and parse one segment's bytes.

    :param store_id: the store this segment must belong to (None: any).
    :param prev_crc: the chain value the header must carry (None: any).
    :param is_last: whether this is the newest segment, the only one that
        may end in a torn write.
    :param payloads: False: every check is made, but a record of several
        fragments gets an empty payload instead of their joined copy (for a
        caller that only verifies, such as shipping: the copy is most of a
        scan's cost when records are larger than a fragment).
    :raises FormatVersionError: the magic matches and the version field names a
        version this code does not read (nothing is judged damaged).
    """
    view = memoryview(data)
    # Until the header verifies, the chain value is the one the caller expects.
    scan = SegmentScan(path, len(data), None, end_crc=prev_crc or 0)
    version = SegmentHeader.peek_version(view)
    if version is not None and version != VERSION:
        # Another version may lay its header out differently, so its checksum
        # cannot be judged here: refuse to read rather than call it damage.
        raise FormatVersionError(path, version, VERSION)
    if version is None or not SegmentHeader.crc_ok(view):
        kind = StopKind.TORN if is_last and not any(view) else StopKind.CORRUPT
        scan.stop = Stop(kind, 0, "bad segment header (magic or checksum)")
        return scan
    header = SegmentHeader.unpack(view)
    scan.header = header
    if store_id is not None and header.store_id != store_id:
        scan.stop = Stop(StopKind.CORRUPT, 0, f"segment belongs to store {header.store_id}")
        return scan
    if prev_crc is not None and header.prev_crc != prev_crc:
        scan.stop = Stop(
            StopKind.CORRUPT,
            0,
            f"chain break: header links to {header.prev_crc:#010x}, log ends at {prev_crc:#010x}",
        )
        return scan
    _scan_frames(scan, view, header.prev_crc, is_last, keep=payloads)
    return scan


def scan_from(path: Path, data: bytes, *, chain: int, is_last: bool) -> SegmentScan:
    """Verify the frames of the rest of a segment: ``data`` holds its bytes from a record
    boundary of a prefix verified before, whose chain value there was ``chain``.

    The header is not read again (``header`` stays None). Offsets in the result
    (records, the stop) count from the start of ``data``. A first frame that does not
    link to ``chain`` stops the scan as corrupt at offset 0: the bytes before it are not
    the prefix that was verified.
    """
    scan = SegmentScan(path, len(data), None, end_crc=chain)
    _scan_frames(scan, memoryview(data), chain, is_last, start=0)
    return scan


def _scan_frames(
    scan: SegmentScan,
    view: memoryview,
    chain: int,
    is_last: bool,
    start: int = HEADER_SIZE,
    *,
    keep: bool = True,
) -> None:
    off = start
    record_start = off
    parts: list[memoryview] = []
    size = len(view)
    scan.end_crc = chain
    while True:
        if off == size:
            if parts:
                _stop(scan, view, record_start, "record fragments stop at end of segment", is_last)
            else:
                scan.stop = Stop(StopKind.CLEAN, off, "")
            return
        frame, why, torn_possible = _parse_frame(view, off)
        if frame is None:
            _stop(scan, view, record_start, why, is_last and torn_possible, damage_at=off)
            return
        if frame.prev != chain:
            scan.stop = Stop(
                StopKind.CORRUPT,
                record_start,
                f"chain break at offset {off}: frame links to {frame.prev:#010x}, "
                f"expected {chain:#010x}",
            )
            return
        if scan.sealed_lsn is not None:
            scan.stop = Stop(StopKind.CORRUPT, off, "frame after the seal")
            return
        ftype = frame.ftype
        in_record = bool(parts)
        if ftype in (FrameType.FULL, FrameType.FIRST, FrameType.SEAL) and in_record:
            scan.stop = Stop(StopKind.CORRUPT, record_start, f"fragment sequence broken at {off}")
            return
        if ftype in (FrameType.MIDDLE, FrameType.LAST) and not in_record:
            scan.stop = Stop(StopKind.CORRUPT, off, f"fragment without a first at {off}")
            return
        chain = frame.crc
        if ftype == FrameType.SEAL:
            if len(frame.payload) != SEAL_PAYLOAD.size:
                why = f"seal of {len(frame.payload)} bytes at offset {off}"
                scan.stop = Stop(StopKind.CORRUPT, record_start, why)
                return
            scan.sealed_lsn = int(SEAL_PAYLOAD.unpack_from(frame.payload)[0])
            scan.seal_offset = off
            scan.end_crc = chain
            record_start = off = frame.end
            continue
        off = frame.end
        if ftype == FrameType.FULL:
            scan.records.append(Record(frame.payload, record_start, off, chain))
            record_start = off
            scan.end_crc = chain
        elif ftype == FrameType.FIRST:
            parts = [frame.payload]
        elif ftype == FrameType.MIDDLE:
            parts.append(frame.payload)
        else:
            parts.append(frame.payload)
            whole = b"".join(parts) if keep else b""
            scan.records.append(Record(whole, record_start, off, chain))
            parts = []
            record_start = off
            scan.end_crc = chain


def _stop(
    scan: SegmentScan,
    view: memoryview,
    record_start: int,
    why: str,
    may_be_torn: bool,
    damage_at: int | None = None,
) -> None:
    """Record a stop at ``record_start``: torn only if allowed and nothing valid follows."""
    at = record_start if damage_at is None else damage_at
    extra = ""
    if damage_at is not None:
        try:
            follows = next(salvage_frames(view, at + 8), None)
        except SalvageLimit as exc:
            extra = f"; past offset {exc.offset} too much looks like frame headers to tell"
        else:
            extra = f"; a valid frame follows at {follows[0]}" if follows is not None else ""
    if may_be_torn and not extra:
        reason = "zero-filled tail" if not any(view[at:]) else why
        scan.stop = Stop(StopKind.TORN, record_start, f"torn write at offset {at}: {reason}")
    else:
        scan.stop = Stop(StopKind.CORRUPT, record_start, f"{why} at offset {at}{extra}")


def peek_seal(path: Path, size: int) -> tuple[int, int] | None:
    """``(last LSN, seal crc)`` if the last frame of ``path`` is a SEAL that verifies, else None.

    Reads only the last 24 bytes. Unverified bytes elsewhere are not judged:
    the fold reads and verifies a sealed segment whole.

    :raises OSError: reading failed (FileNotFoundError: the segment went away).
    """
    if size < HEADER_SIZE + SEAL_FRAME_SIZE:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        tail = os.pread(fd, SEAL_FRAME_SIZE, size - SEAL_FRAME_SIZE)
    finally:
        os.close(fd)
    if len(tail) != SEAL_FRAME_SIZE:
        return None
    crc, length, ftype, pad, reserved, _prev = FRAME_HEADER.unpack_from(tail)
    if ftype != FrameType.SEAL or length != SEAL_PAYLOAD.size or pad or reserved:
        return None
    if frame_crc(tail[4:16], tail[16:]) != crc:
        return None
    return int(SEAL_PAYLOAD.unpack_from(tail, 16)[0]), crc


def peek_generation(path: Path) -> int:
    """The writer generation in the header of ``path``; 0 if the header does not verify.

    Reads only the 64-byte header, for a baseline of the fencing check
    (``docs/remote.md``, "Fencing"): callers decide what an unreadable file means.

    :raises OSError: reading failed (FileNotFoundError: the segment went away).
    """
    with path.open("rb") as f:
        head = f.read(HEADER_SIZE)
    return SegmentHeader.unpack(head).generation if SegmentHeader.crc_ok(head) else 0
