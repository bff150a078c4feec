"""Folding one sealed segment into the image: verify it whole, decode, apply.

A segment is folded only if everything about it checks out, in this order:
the reader's verdict (header, store id, the chain from the fold's current
value through every frame to the SEAL, nothing after the seal), the header
against the file name, its first LSN against the fold's epoch, the writer
generation in the header (rule H5 of ``docs/format.md``, as recovery
applies it: not below the highest non-zero generation before it, counting
from the last segment the base snapshot covers), then every record: it
decodes and keeps the record schema (:func:`~statelog.format.records.decode_record`:
keys, table names, offsets, watermark, values), and its epoch is the next
one; and the SEAL names the last record's LSN. A zombie's segment (a
fenced writer's, after a takeover) is therefore damage, and never folded
into a snapshot that recovery would then trust. Only then is the
segment applied, in one call of the target's ``apply_batch`` (one LMDB
transaction for an image):
each record's table deltas in order, deletes before puts within a delta,
offsets merged, the watermark taken from the last record.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from statelog.compaction.tail import SegmentInfo, covered_generation
from statelog.format.records import RecordSchemaError, decode_record
from statelog.log.reader import SegmentScan, StopKind, scan_segment
from statelog.storage.fileio import FileLayer, ReadBuffer
from statelog.storage.image import Delta

__all__ = ["FoldTarget", "Folding", "check_scan", "fold_segment"]


class FoldTarget(Protocol):
    """What a fold applies a segment's deltas to: the compactor's image
    (:class:`~statelog.storage.image.ImageBuilder`) or a delta pass's
    :class:`~statelog.compaction.delta.Changes`."""

    def apply_batch(self, deltas: Iterable[Delta]) -> None: ...


@dataclass
class Folding:
    """Where the fold stands; ``good_*``: after the last segment that held a record."""

    epoch: int
    chain: int
    offsets: dict[str, int]
    wm: int
    segments: list[SegmentInfo] = field(default_factory=list)
    good_count: int = 0  # segments folded up to the last one that held a record
    good_epoch: int = 0
    good_chain: int = 0
    good_offsets: dict[str, int] = field(default_factory=dict)
    good_wm: int = 0
    good_commit_ms: int = 0  # when the good epoch was committed (0: not recorded)
    bytes_read: int = 0
    # The highest non-zero writer generation in the headers so far; None until
    # the first segment, when it starts from the last segment the base covers.
    generation: int | None = None

    def __post_init__(self) -> None:
        self.good_epoch, self.good_chain = self.epoch, self.chain
        self.good_offsets, self.good_wm = dict(self.offsets), self.wm


def fold_segment(
    files: FileLayer,
    store_id: uuid.UUID,
    builder: FoldTarget,
    seg: SegmentInfo,
    fold: Folding,
    last_in_log: bool,
    reads: ReadBuffer,
) -> str | None:
    """Verify, decode and apply one sealed segment to ``builder``; advance ``fold``.

    The whole segment is applied in one LMDB transaction, or nothing of it:
    every check runs before the first write.

    :param reads: where the segment is read (a pass keeps one for all its segments);
        nothing applied points into it.
    :returns: None when folded; ``""`` when the segment turned out to be the
        unsealed end of the log (not damage); else why it is damaged.
    :raises OSError: reading failed (an I/O error is never taken for damage).
    :raises FormatVersionError: a segment of a newer format.
    """
    if fold.generation is None:
        fold.generation = covered_generation(seg.path.parent, fold.epoch)
    data = files.read_reusing(seg.path, reads)
    fold.bytes_read += len(data)
    scan = scan_segment(seg.path, data, store_id=store_id, prev_crc=fold.chain, is_last=False)
    if scan.sealed_lsn is None and last_in_log:
        # The peek saw a seal, the full read does not: the active segment,
        # whose last record happens to end with bytes that look like a seal.
        return ""
    deltas: list[Delta] = []
    epoch, offsets, wm = fold.epoch, dict(fold.offsets), fold.wm
    commit_ms = 0
    why = check_scan(scan, seg, epoch, fold.generation)
    if why is None:
        for rec in scan.records:
            try:
                decoded = decode_record(rec.payload)
            except RecordSchemaError as exc:
                why = f"offset {rec.offset}: {exc.message}"
                break
            if decoded.epoch != epoch + 1:
                why = f"offset {rec.offset}: epoch {decoded.epoch} where {epoch + 1} was expected"
                break
            deltas.extend((t.name, t.keys, t.values, t.deletes) for t in decoded.tables)
            offsets.update(decoded.offsets)
            wm, epoch, commit_ms = decoded.low_watermark_ms, decoded.epoch, decoded.commit_ms
        if why is None and scan.sealed_lsn != epoch:
            why = f"the seal names LSN {scan.sealed_lsn}, the records end at {epoch}"
    if why is not None:
        return why
    builder.apply_batch(deltas)
    fold.epoch, fold.chain, fold.offsets, fold.wm = epoch, scan.end_crc, offsets, wm
    fold.segments.append(seg)
    if scan.header is not None:
        fold.generation = max(fold.generation, scan.header.generation)
    if scan.records:  # an empty sealed segment is folded, but never the snapshot's last
        fold.good_count = len(fold.segments)
        fold.good_epoch, fold.good_chain = epoch, scan.end_crc
        fold.good_offsets, fold.good_wm = dict(offsets), wm
        fold.good_commit_ms = commit_ms
    return None


def check_scan(scan: SegmentScan, seg: SegmentInfo, epoch: int, generation: int = 0) -> str | None:
    """Why ``scan`` cannot be folded after ``epoch``, or None.

    :param generation: the highest non-zero writer generation before it (rule H5).
    """
    header = scan.header
    if scan.stop.kind is not StopKind.CLEAN:
        return f"{scan.stop.kind.value} at offset {scan.stop.offset}: {scan.stop.reason}"
    if header is None:
        return "no header"
    if (header.sequence, header.first_lsn) != (seg.sequence, seg.first_lsn):
        return "the header disagrees with the file name"
    if header.generation and header.generation < generation:
        return (
            f"offset 0: generation {header.generation} after {generation}: "
            "a fenced writer's segment"
        )
    if header.first_lsn != epoch + 1:
        return f"starts at LSN {header.first_lsn}, the fold is at {epoch}"
    if scan.sealed_lsn is None:
        return "not sealed, though its last frame looked like a seal"
    return None
