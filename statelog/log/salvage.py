"""Frames that verify on their own, looked for past damage in a segment.

The reader (:mod:`statelog.log.reader`) asks whether anything valid follows
a damaged frame, to tell a torn tail from corruption; recovery asks which
epochs survive past it (:mod:`statelog.recovery.damage`). Neither applies
what it finds: the chain is ignored here, so these frames are evidence only.

The search is bounded: a stored value may hold bytes shaped like frame
headers, each claiming a length whose checksum costs that many bytes, and
without a bound the search is quadratic: past a torn 8 MiB record of them it
had not finished after 50 s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from statelog.format.wal import FRAME_HEADER, FRAME_HEADER_SIZE, FrameType, frame_crc, padding

__all__ = ["HIT_COST", "MISS_COST", "SALVAGE_FACTOR", "SalvageLimit", "salvage_frames"]

SALVAGE_FACTOR = 8
"""A search checks at most this many times the bytes it searches (at least 1 MiB), in
the lengths the candidate headers it checksums claim, plus :data:`HIT_COST` for each
aligned candidate and :data:`MISS_COST` for each unaligned one."""
HIT_COST = 32
MISS_COST = 8
_FLOOR = 1 << 20

# A frame header's bytes 8 to 11: a type (1 to SEAL), a padding (0 to 7), reserved zeros.
_HEADER_TYPE = re.compile(b"[\\x01-\\x%02x][\\x00-\\x07]\\x00\\x00" % FrameType.SEAL, re.DOTALL)


class SalvageLimit(Exception):
    """The search reached its bound at ``offset`` without an answer: whether a frame
    that verifies lies further on is not known."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"salvage bound reached at offset {offset}")
        self.offset = offset


def _verified_at(view: memoryview, off: int) -> tuple[tuple[int, memoryview, int] | None, int]:
    """``(type, payload, end)`` of the frame at ``off`` if it verifies on its own (else
    None), and the payload bytes its check covered. The caller matched the type,
    padding and reserved bytes."""
    if off + FRAME_HEADER_SIZE > len(view):
        return None, 0
    crc, length, ftype, pad, _reserved, _prev = FRAME_HEADER.unpack_from(view, off)
    start = off + FRAME_HEADER_SIZE
    end = start + length + pad
    if pad != padding(length) or end > len(view):
        return None, 0
    payload = view[start : start + length]
    if frame_crc(view[off + 4 : start], payload) != crc:
        return None, length
    return (ftype, payload, end), length


def salvage_frames(data: bytes | memoryview, start: int) -> Iterator[tuple[int, int, memoryview]]:
    """Yield ``(offset, type, payload)`` of every frame after ``start`` that verifies on
    its own, in order. Candidates are the 8-aligned offsets (of ``data``) whose type,
    padding and reserved bytes could belong to a header, found by a search in C.

    :raises SalvageLimit: the work bound was reached (:data:`SALVAGE_FACTOR`); the
        frames yielded before it stay valid evidence.
    """
    view = memoryview(data)
    budget = SALVAGE_FACTOR * max(len(view) - start, _FLOOR)
    pos = start + (-start % 8)
    found = _HEADER_TYPE.search(view, pos + 8)
    while found is not None:
        at = found.start() - 8
        if at % 8:
            # Matches may overlap: an unaligned one can hold the first bytes of an
            # aligned header, so the search goes on from the next byte.
            budget -= MISS_COST
            nxt = found.start() + 1
        else:
            frame, checked = _verified_at(view, at)
            budget -= HIT_COST + checked
            nxt = found.start() + 8
            if frame is not None:
                ftype, payload, end = frame
                yield at, ftype, payload
                nxt = end + 8
        if budget < 0:
            raise SalvageLimit(at)
        found = _HEADER_TYPE.search(view, nxt)
