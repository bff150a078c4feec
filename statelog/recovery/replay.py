"""Recovery policy: replay the log into the live state and decide what to do with damage.

The reader (:mod:`statelog.log.reader`) reports; this module replays and
decides, and :mod:`statelog.recovery.damage` carries out the action on
damage (with ``repair=True`` only; a read-only recovery changes nothing):

* clean end: nothing to do;
* torn tail of the last segment: save the torn bytes to ``<segment>.broken``,
  cut the segment back (durable: copy, fsync, rename, fsync dir, truncate,
  fsync), report ``truncated_bytes``; never an error;
* corruption before the tail: stop at the last good commit, log CRITICAL,
  estimate and report the lost epochs, move the damaged remainder aside to
  ``.corrupt`` files, and let the writer continue in a new segment; with
  ``strict=True`` raise :class:`~statelog.errors.CorruptionError` instead,
  before anything on disk changes.

A segment whose header names a writer generation (``docs/remote.md``,
"Fencing") lower than the last non-zero one before it in the log is a
fenced writer's segment that followed a takeover: corruption at its header
(offset 0), handled as above. Generation 0 (no remote) is never compared.

A record is applied only after its frame verified, it decoded and kept the
record schema (:func:`~statelog.format.records.decode_record`: a record that
verifies but breaks it is corruption at that record, like a checksum
mismatch there), and its epoch was the next one. An ``OSError`` while reading is raised as
:class:`~statelog.errors.StorageError`: an I/O error is never taken for
corruption, and nothing is truncated because of it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from statelog.errors import CorruptionError, ResnapshotRequired, StorageError
from statelog.format.records import (
    CommitHead,
    CommitRecord,
    RecordSchemaError,
    decode_record,
    decode_record_head,
)
from statelog.log.reader import SegmentScan, StopKind, peek_generation, scan_segment
from statelog.log.segments import list_segments
from statelog.recovery.damage import Progress, corruption, torn_tail
from statelog.recovery.report import RecoveryReport
from statelog.state.live import MAX_GENERATIONS, EpochsOnly, LiveState
from statelog.storage.fileio import FileLayer, ReadBuffer

__all__ = ["LogEnd", "recover_log"]


@dataclass(slots=True)
class LogEnd:
    """Where the writer continues after recovery."""

    sequence: int = 0  # sequence of the last segment kept (0: none)
    chain: int = 0  # crc the next frame or segment header must link to
    unsealed: Path | None = None  # last segment, if it still needs a SEAL frame
    fresh: bool = False  # seal ``unsealed`` and continue in a new segment (after corruption)
    # last LSN -> chain value at the end of each sealed segment replayed: what
    # a snapshot folded up to that LSN must name as its link to the log.
    boundaries: dict[int, int] = field(default_factory=dict)
    generation: int = 0  # highest writer generation in the headers of the segments kept
    last_generation: int = 0  # the generation in the header of the last segment kept


def recover_log(
    files: FileLayer,
    wal_dir: Path,
    store_id: uuid.UUID,
    state: LiveState,
    *,
    repair: bool,
    strict: bool = False,
    after: tuple[int, int] | None = None,
    upto: int | None = None,
    values_checked: bool = False,
) -> tuple[RecoveryReport, LogEnd]:
    """Replay every verified commit in ``wal_dir`` into ``state``.

    :param after: ``(lsn, chain)`` of a snapshot already loaded into
        ``state``: replay only the segments after ``lsn``, the first of which
        must link to ``chain``; an empty log is then fine.
    :param upto: replay no commit after this epoch (a view of the past; only
        without ``repair``): what follows it is neither read nor judged.
    :param values_checked: every record in ``wal_dir`` was decoded and checked whole
        before (a restore checked each segment it wrote): the records' schema is
        checked without decoding their values again (``decode_record(values=False)``),
        and into a state that keeps no entry (:class:`~statelog.state.live.EpochsOnly`)
        only each record's head is decoded (``decode_record_head``).

    :param repair: the caller holds the writer's lock and may cut torn tails
        and move damage aside; False (read-only) changes nothing on disk.
    :param strict: raise on corruption instead of stopping at the last good commit.
    :raises CorruptionError: ``strict`` and damage before the tail.
    :raises ResnapshotRequired: the log is missing or does not reach back to epoch 1.
    :raises FormatVersionError: a segment of an unknown format version.
    :raises StorageError: reading failed (I/O error); nothing was changed.
    """
    started = time.perf_counter()
    prog = Progress(state, values_checked=values_checked)
    end = LogEnd()
    assert upto is None or not repair, "a view of the past never repairs the store"
    segments = _segments_to_replay(wal_dir, state, after, end)
    if upto is not None:
        segments = [s for s in segments if s[1] <= upto]
        prog.upto = upto
    _replay(files, store_id, segments, end, prog, repair=repair, strict=strict)
    report = RecoveryReport(
        epoch=state.epoch,
        snapshot=None,
        replayed=prog.replayed,
        truncated_bytes=prog.truncated,
        rejected=tuple(prog.rejected),
        lost_epochs=prog.lost,
        seconds=time.perf_counter() - started,
        outcome=prog.outcome,
        segments=len(segments),
        saved_aside=tuple(prog.saved),
    )
    return report, end


_Segments = list[tuple[int, int, Path]]


def _segments_to_replay(
    wal_dir: Path, state: LiveState, after: tuple[int, int] | None, end: LogEnd
) -> _Segments:
    """The segments after the snapshot ``after`` (all: none), with ``end`` set to link to it.

    :raises ResnapshotRequired: no log at all, or one that does not begin
        right after what ``state`` holds.
    """
    try:
        segments = list_segments(wal_dir)
    except FileNotFoundError:
        segments = []
    if after is not None:
        covered = [s for s in segments if s[1] <= after[0]]
        # Sequence numbers go on from the segments the snapshot covers.
        end.sequence = covered[-1][0] if covered else 0
        segments = [s for s in segments if s[1] > after[0]]
        end.chain = after[1]
        if covered:
            end.generation = end.last_generation = _generation_of(covered[-1][2])
        end.boundaries[after[0]] = after[1]
    elif not segments:
        # Creation writes segment 1 before the identity: an identified store
        # with no log lost it, and starting again from epoch 0 would be a guess.
        raise ResnapshotRequired(
            f"the log of {wal_dir.parent} is missing", [(wal_dir, "no segments")]
        )
    if segments and segments[0][1] != state.epoch + 1:
        raise ResnapshotRequired(
            f"the log in {wal_dir} begins at LSN {segments[0][1]} and no snapshot covers "
            f"epochs 1..{segments[0][1] - 1}",
            [(segments[0][2], "log does not reach back to the start")],
        )
    return segments


def _replay(
    files: FileLayer,
    store_id: uuid.UUID,
    segments: _Segments,
    end: LogEnd,
    prog: Progress,
    *,
    repair: bool,
    strict: bool,
) -> None:
    """Replay ``segments`` in order into ``prog.state`` until the first that does not end clean.

    That one is handled by policy (module docstring) and ends the replay.
    """
    state = prog.state
    reads = ReadBuffer()  # nothing applied or set aside points into it
    for i, (seq, lsn, path) in enumerate(segments):
        data = _read(files, path, reads)
        scan = scan_segment(
            path, data, store_id=store_id, prev_crc=end.chain, is_last=i == len(segments) - 1
        )
        # No read comes between an open's rolls: holding a long tail's generations
        # unmerged for the first reads would cost them, and memory, all at once.
        state.begin_generation(seq, hold=MAX_GENERATIONS)
        kind, offset, reason = _check_and_apply(scan, seq, lsn, end, prog)
        if prog.upto is not None and state.epoch >= prog.upto:
            break  # the view's epoch: nothing after it is read
        if kind is StopKind.CLEAN:
            end.sequence = seq
            end.unsealed = None if scan.sealed_lsn is not None else path
            if scan.sealed_lsn is not None:
                # An empty sealed segment repeats the LSN: the first seal is the link.
                end.boundaries.setdefault(scan.sealed_lsn, scan.end_crc)
            continue
        if kind is StopKind.TORN:
            torn_tail(files, scan, data, offset, reason, prog, repair=repair)
        else:
            later = [p for _, _, p in segments[i + 1 :]]
            if strict:
                raise CorruptionError(path, offset, reason)
            corruption(files, store_id, scan, data, offset, reason, later, prog, repair=repair)
            # After corruption the log goes on in a new segment: the writer
            # seals what is left of this one and rolls (writer_open).
            end.fresh = repair
        if repair and scan.header is not None and offset > 0:
            # The segment kept its header and the frames before the cut: the
            # writer continues in it. Else it went aside whole, and the writer
            # continues from the one before.
            end.sequence = scan.header.sequence
            end.unsealed = path if scan.sealed_lsn is None else None
        elif repair and offset == 0 and not end.sequence:
            # The first segment after a snapshot went aside whole and retention
            # left nothing before it: the new one takes its place in the
            # sequence, so sequence numbers never restart at 1 mid-log.
            end.sequence = seq - 1
        break


def _generation_of(path: Path) -> int:
    """The generation in ``path``'s header, 0 if unreadable: a baseline only, so an
    unreadable file weakens the check instead of failing a recovery that skips it."""
    try:
        return peek_generation(path)
    except OSError:
        return 0


def _read(files: FileLayer, path: Path, reads: ReadBuffer) -> memoryview:
    try:
        return files.read_reusing(path, reads)
    except OSError as exc:
        raise StorageError(
            f"reading {path} failed: {exc.strerror or exc}",
            errno=exc.errno,
            hint="an I/O error is not corruption: nothing was changed; fix the device and reopen",
        ) from exc


def _check_and_apply(
    scan: SegmentScan, seq: int, lsn: int, end: LogEnd, prog: Progress
) -> tuple[StopKind, int, str]:
    """Apply the scan's records in order; return the stop, widened by policy-level checks."""
    header = scan.header
    if scan.stop.kind is not StopKind.CLEAN and scan.stop.offset == 0:
        return scan.stop.kind, 0, scan.stop.reason  # the header itself was refused
    if header is not None:
        if (header.sequence, header.first_lsn) != (seq, lsn):
            return StopKind.CORRUPT, 0, "header disagrees with the file name"
        if end.sequence and seq != end.sequence + 1:
            return StopKind.CORRUPT, 0, f"segment {end.sequence + 1} is missing"
        if header.generation and header.generation < end.generation:
            why = f"generation {header.generation} after {end.generation}: a fenced writer's"
            return StopKind.CORRUPT, 0, why + " segment"
        end.generation = max(end.generation, header.generation)
        end.last_generation = header.generation
    state = prog.state
    # Records checked whole before, into a state that keeps no entry: the head is enough.
    epochs_only = state if prog.values_checked and isinstance(state, EpochsOnly) else None
    for rec in scan.records:
        try:
            if epochs_only is not None:
                decoded: CommitRecord | CommitHead = decode_record_head(rec.payload)
            else:
                decoded = decode_record(rec.payload, values=not prog.values_checked)
        except RecordSchemaError as exc:
            return StopKind.CORRUPT, rec.offset, exc.message
        if decoded.epoch != state.epoch + 1:
            why = f"epoch {decoded.epoch} where {state.epoch + 1} was expected"
            return StopKind.CORRUPT, rec.offset, why
        if isinstance(decoded, CommitHead):
            assert epochs_only is not None
            epochs_only.apply_record(decoded, len(rec.payload))
        else:
            state.apply_record(decoded, len(rec.payload))
        prog.replayed += 1
        end.chain = rec.crc
        if prog.upto is not None and decoded.epoch >= prog.upto:
            return StopKind.CLEAN, rec.end, "the epoch asked for"
    if scan.sealed_lsn is not None and scan.sealed_lsn != state.epoch:
        assert scan.seal_offset is not None
        why = f"seal names LSN {scan.sealed_lsn}, the segment ends at {state.epoch}"
        scan.sealed_lsn = None  # cutting at the seal removes it with the damage
        return StopKind.CORRUPT, scan.seal_offset, why
    end.chain = scan.end_crc
    return scan.stop.kind, scan.stop.offset, scan.stop.reason
