"""Byte layout of write-ahead log segments (format version 1).

This module holds constants and pure functions only: no file I/O. The
writer (:mod:`statelog.log.writer`) and the reader (:mod:`statelog.log.reader`)
both build on it. ``docs/format.md`` specifies the same layout as byte-offset
tables with a worked example.

Grammar (all integers little-endian)::

    segment  := header frame* [seal]
    header   := magic(8) version(u16) header_len(u16) flags(u32)
                store_id(16) sequence(u64) first_lsn(u64)
                prev_crc(u32) generation(u64) header_crc(u32)    -- 64 bytes
    frame    := crc(u32) length(u32) type(u8) pad(u8) reserved(u16)
                prev(u32) payload(length) zero(pad)               -- 8-aligned
    seal     := frame of type SEAL, always the last frame of a sealed segment

``crc`` is the masked crc32c of every frame byte after it (length, type, pad,
reserved, prev, payload). ``prev`` is the ``crc`` field of the frame before,
or the header's ``prev_crc`` for a segment's first frame: a chain that
detects a missing, reordered or foreign frame even when each frame is
intact on its own. Frames start on 8-byte boundaries, so the length field
(bytes 4..8 of a frame) never straddles a sector and is never torn.

``generation`` is the remote writer generation that wrote the segment
(``docs/remote.md``, "Fencing"); 0 means none. It sits in bytes that were
reserved and always zero, so every segment written before it existed reads
as generation 0, and its bytes are unchanged.
"""

from __future__ import annotations

import enum
import re
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path

import crc32c

__all__ = [
    "FRAME_HEADER",
    "FRAME_HEADER_SIZE",
    "HEADER_SIZE",
    "MAGIC",
    "SEAL_FRAME_SIZE",
    "SEAL_PAYLOAD",
    "SEGMENT_SUFFIX",
    "VERSION",
    "FrameType",
    "SegmentHeader",
    "frame_crc",
    "mask",
    "pack_frame_header",
    "padding",
    "parse_segment_name",
    "segment_name",
    "unmask",
]

MAGIC = b"STLGWAL\x00"
VERSION = 1
HEADER_SIZE = 64
SEGMENT_SUFFIX = ".wal"

# magic, version, header_len, flags, store_id, sequence, first_lsn, prev_crc, generation
_HEADER_BODY = struct.Struct("<8sHHI16sQQIQ")
_HEADER_CRC = struct.Struct("<I")
assert _HEADER_BODY.size + _HEADER_CRC.size == HEADER_SIZE

# crc, length, type, pad, reserved, prev
FRAME_HEADER = struct.Struct("<IIBBHI")
FRAME_HEADER_SIZE = FRAME_HEADER.size
ALIGN = 8
assert FRAME_HEADER_SIZE == 16
SEAL_PAYLOAD = struct.Struct("<Q")  # the last LSN of the segment
SEAL_FRAME_SIZE = FRAME_HEADER_SIZE + SEAL_PAYLOAD.size

_MASK_DELTA = 0xA282EAD8


class FrameType(enum.IntEnum):
    """What a frame carries. Zero is never valid, so zero-filled space never parses."""

    FULL = 1
    FIRST = 2
    MIDDLE = 3
    LAST = 4
    SEAL = 5


def mask(crc: int) -> int:
    """Mask a crc32c before storing it inside checksummed data (LevelDB's rotation).

    A crc computed over bytes that themselves contain a plain crc is prone to
    degenerate values; rotating and offsetting breaks that relation.
    """
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def unmask(masked: int) -> int:
    """Invert :func:`mask`."""
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def padding(length: int) -> int:
    """Zero bytes after a payload of ``length`` so the next frame is 8-aligned."""
    return -(FRAME_HEADER_SIZE + length) % ALIGN


def frame_crc(header_tail: bytes | memoryview, payload: bytes | memoryview) -> int:
    """Masked crc32c of a frame: the 12 header bytes after the crc field, then the payload.

    The GIL is kept: most frames take tens of microseconds (the largest, 16 MiB by
    default, about two milliseconds), and a
    thread that lets the GIL go per frame waits for it again behind any busy thread,
    up to the switch interval (5 ms) each time: a scan of a segment, or a commit's
    frames, would pay that once per frame beside a compaction pass or a host's
    busy threads.
    """
    return mask(crc32c.crc32c(payload, crc32c.crc32c(header_tail, 0, 0), 0))


def pack_frame_header(ftype: FrameType, payload: bytes | memoryview, prev: int) -> bytes:
    """The 16-byte header of a frame carrying ``payload``, chained to the crc ``prev``."""
    length = len(payload)
    tail = FRAME_HEADER.pack(0, length, ftype, padding(length), 0, prev)[4:]
    return struct.pack("<I", frame_crc(tail, payload)) + tail


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """The 64-byte header that opens every segment.

    ``generation``: the remote writer generation of the writer that created
    the segment (bytes 52..59, covered by the header crc); 0: no remote.
    """

    store_id: uuid.UUID
    sequence: int
    first_lsn: int
    prev_crc: int
    version: int = VERSION
    flags: int = 0
    generation: int = 0

    def pack(self) -> bytes:
        body = _HEADER_BODY.pack(
            MAGIC,
            self.version,
            HEADER_SIZE,
            self.flags,
            self.store_id.bytes,
            self.sequence,
            self.first_lsn,
            self.prev_crc,
            self.generation,
        )
        return body + _HEADER_CRC.pack(mask(crc32c.crc32c(body)))

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> SegmentHeader:
        """Parse a header whose magic, length and crc the caller has already checked."""
        _magic, version, _hlen, flags, sid, seq, lsn, prev, gen = _HEADER_BODY.unpack_from(data)
        return cls(uuid.UUID(bytes=bytes(sid)), seq, lsn, prev, version, flags, gen)

    @staticmethod
    def peek_version(data: bytes | memoryview) -> int | None:
        """The version field if ``data`` starts with the magic, else None."""
        if len(data) < 10 or bytes(data[:8]) != MAGIC:
            return None
        return int(struct.unpack_from("<H", data, 8)[0])

    @staticmethod
    def crc_ok(data: bytes | memoryview) -> bool:
        """Whether the first 64 bytes of ``data`` carry a valid header crc."""
        if len(data) < HEADER_SIZE:
            return False
        (stored,) = _HEADER_CRC.unpack_from(data, _HEADER_BODY.size)
        return bool(mask(crc32c.crc32c(data[: _HEADER_BODY.size])) == stored)


_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.wal$")


def segment_name(sequence: int, first_lsn: int) -> str:
    """File name of a segment: hex sequence and hex first LSN, so name order is log order."""
    return f"{sequence:016x}-{first_lsn:016x}{SEGMENT_SUFFIX}"


def parse_segment_name(path: Path | str) -> tuple[int, int] | None:
    """``(sequence, first_lsn)`` from a segment file name, or None for any other file."""
    m = _NAME.match(Path(path).name)
    if m is None:
        return None
    return int(m.group(1), 16), int(m.group(2), 16)
