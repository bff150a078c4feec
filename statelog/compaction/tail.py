"""The log as the compactor sees it: segments by name, seals by peeking, links by header.

Planning a pass must not read the log in full: most passes find the tail
below the trigger and stop. So planning looks only at the fixed-size parts
of a segment that never change once written:

* the 64-byte header (written whole, durably, before the first record);
* the last 24 bytes, which hold the ``SEAL`` frame if the segment is sealed.
  Its frame checksum is verified, and the last LSN it names gives the tail's
  record count without decoding anything. A sealed segment is immutable, so
  what the peek saw is what the fold will read (and verify in full).

The writer's active segment is the last one and is unsealed: nothing in
it is folded. Besides the peek of its last 24 bytes, a pass that finds
nothing new walks its frame headers (:func:`count_unsealed`, bounded) only
to say how many commits wait there for the writer to seal it. Segment
names are ``<sequence>-<first LSN>`` (``statelog.format.wal``): a segment
``i`` that is not the last holds the LSNs ``first_lsn(i) .. first_lsn(i + 1) - 1``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from statelog.format.wal import (
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    HEADER_SIZE,
    FrameType,
    SegmentHeader,
    padding,
)
from statelog.log.reader import peek_seal
from statelog.log.segments import list_segments

__all__ = [
    "SegmentInfo",
    "Tail",
    "count_unsealed",
    "covered_generation",
    "find_link",
    "list_segment_infos",
    "peek_seal",
    "sealed_tail",
]

# Re-exported: the compactor's planning peeks at seals exactly as recovery does.


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A segment as named in ``wal/``, with its size when listed."""

    sequence: int
    first_lsn: int
    path: Path
    size: int

    @property
    def name(self) -> str:
        """The name pins and logs use: relative to the store."""
        return f"{self.path.parent.name}/{self.path.name}"


@dataclass(frozen=True, slots=True)
class Tail:
    """The sealed segments after an LSN, in log order, as far as the seals reach."""

    segments: tuple[SegmentInfo, ...]
    last_lsn: int  # the LSN named by the last segment's SEAL (the base LSN if none)
    problem: str | None = None  # why planning stopped short of the unsealed end, if it did
    blocked_by: SegmentInfo | None = None  # an unsealed segment that is not the last one

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.segments)


def list_segment_infos(wal_dir: Path) -> list[SegmentInfo]:
    """Every segment of ``wal_dir`` in log order (none if the directory is missing).

    A segment that vanishes between the listing and its ``stat`` (moved
    aside by recovery) is left out.

    :raises OSError: the directory exists but cannot be listed.
    """
    try:
        listed = list_segments(wal_dir)
    except FileNotFoundError:
        return []
    out = []
    for seq, lsn, path in listed:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        out.append(SegmentInfo(seq, lsn, path, size))
    return out


def _pread(path: Path, size: int, offset: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def read_header(path: Path) -> SegmentHeader | None:
    """The segment's header if its checksum verifies, else None.

    :raises OSError: reading failed.
    """
    data = _pread(path, HEADER_SIZE, 0)
    if SegmentHeader.peek_version(data) is None or not SegmentHeader.crc_ok(data):
        return None
    return SegmentHeader.unpack(data)


def covered_generation(wal_dir: Path, lsn: int) -> int:
    """The writer generation in the header of the last segment of ``wal_dir`` starting at or
    before ``lsn``: the baseline of rule H5 for a fold from a snapshot at ``lsn``.

    Exactly as recovery takes it: the last segment the snapshot covers, if
    still present; 0 if there is none, or its header is gone or does not
    verify (a baseline only: an unreadable file weakens the check, never
    fails it).

    :raises OSError: ``wal_dir`` cannot be listed, or a header cannot be read.
    """
    return _generation_before(list_segment_infos(wal_dir), lsn)


def _generation_before(segments: Sequence[SegmentInfo], lsn: int) -> int:
    covered = [s for s in segments if s.first_lsn <= lsn]
    if not covered:
        return 0
    try:
        header = read_header(covered[-1].path)
    except FileNotFoundError:
        return 0
    return header.generation if header is not None else 0


_COUNT_LIMIT = 8 << 20
"""The most bytes of an active segment :func:`count_unsealed` walks."""
_RECORD_FRAMES = (FrameType.FULL, FrameType.FIRST, FrameType.MIDDLE, FrameType.LAST)


def count_unsealed(seg: SegmentInfo) -> tuple[int, int, bool]:
    """``(records, bytes, complete)``: the whole records in the writer's active
    segment, as far as its listed size, to tell a person why nothing is folded.

    Walks the frame headers only (no checksum is verified: this counts, it
    never folds), from the first :data:`_COUNT_LIMIT` bytes in 1 MiB reads,
    and stops at the first frame that does not parse (a torn or growing
    tail). ``complete`` is False when the limit cut the walk short: the
    counts are then a lower bound.

    :raises OSError: reading failed.
    """
    fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        stop = min(seg.size, HEADER_SIZE + _COUNT_LIMIT)
        off = end = HEADER_SIZE
        records, buf, buf_at = 0, b"", 0
        while off + FRAME_HEADER_SIZE <= stop:
            if off + FRAME_HEADER_SIZE > buf_at + len(buf):
                buf, buf_at = os.pread(fd, min(1 << 20, stop - off), off), off
                if len(buf) < FRAME_HEADER_SIZE:
                    break
            _crc, length, ftype, *_ = FRAME_HEADER.unpack_from(buf, off - buf_at)
            nxt = off + FRAME_HEADER_SIZE + length + padding(length)
            if ftype not in _RECORD_FRAMES or nxt > seg.size:
                break
            off = nxt
            if ftype in (FrameType.FULL, FrameType.LAST):
                records, end = records + 1, off
    finally:
        os.close(fd)
    return records, end - HEADER_SIZE, stop == seg.size


def find_link(
    segments: Sequence[SegmentInfo], lsn: int, chain: int, store_id: uuid.UUID
) -> int | None:
    """Index of the segment the log continues in after ``lsn`` with chain value ``chain``.

    That is the first segment, in log order, whose name says it starts at
    ``lsn + 1`` and whose verified header belongs to ``store_id`` and links
    to ``chain``. Several segments may start at ``lsn + 1``: a writer opened
    and closed without committing leaves a sealed segment with no record,
    and the next one starts at the same LSN, chained to that seal.

    None if that segment is a fenced writer's (rule H5 of ``docs/format.md``:
    its header names a generation below the one of the last segment of
    ``segments`` starting at or before ``lsn``): recovery cuts the log
    there, so it does not continue in it. Retention then deletes nothing
    after the snapshot, which keeps the segment that names the higher
    generation, the evidence every later check needs.

    :raises OSError: reading a header failed.
    """
    for i, seg in enumerate(segments):
        if seg.first_lsn != lsn + 1:
            continue
        try:
            header = read_header(seg.path)
        except FileNotFoundError:
            continue
        if header is not None and header.store_id == store_id and header.prev_crc == chain:
            floor = _generation_before(segments, lsn)
            return None if header.generation and header.generation < floor else i
    return None


def sealed_tail(segments: Sequence[SegmentInfo], lsn: int) -> Tail:
    """The sealed segments that follow ``lsn``: from the first named to start at
    ``lsn + 1``, in sequence order, up to (not including) the first unsealed one.

    Empty sealed segments at the start (from open-close cycles) are included;
    the fold picks the one that links to its base. ``problem`` is set when no
    segment starts at ``lsn + 1`` while later ones exist (the log does not
    continue from ``lsn``), or when a sequence number is missing.

    :raises OSError: peeking at a seal failed.
    """
    start = next((i for i, s in enumerate(segments) if s.first_lsn == lsn + 1), None)
    if start is None:
        later = [s for s in segments if s.first_lsn > lsn]
        why = f"no segment starts at LSN {lsn + 1}" if later else None
        return Tail((), lsn, why)
    found: list[SegmentInfo] = []
    last = lsn
    for seg in segments[start:]:
        if found and seg.sequence != found[-1].sequence + 1:
            return Tail(tuple(found), last, f"segment {found[-1].sequence + 1} is missing")
        try:
            seal = peek_seal(seg.path, seg.size)
        except FileNotFoundError:
            seal = None
        if seal is None:
            # The writer's active segment; or, if a segment follows it, one the
            # writer left unsealed after a failed sync: sealed segments only.
            blocked = seg if seg is not segments[-1] else None
            return Tail(tuple(found), last, blocked_by=blocked)
        found.append(seg)
        last = max(last, seal[0])
    return Tail(tuple(found), last)
