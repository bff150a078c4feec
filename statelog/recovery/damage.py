"""What recovery does about damage: the torn-tail and corruption actions.

:mod:`statelog.recovery.replay` replays the log and finds where it stops; this
module acts on a stop that is not clean, and only with ``repair=True`` (the
caller holds the writer's lock). A read-only recovery changes nothing on
disk: it records the rejection and, for corruption, the estimate of the
lost epochs.

* Torn tail of the last segment: save the torn bytes to
  ``<segment>.broken``, cut the segment back, report ``truncated_bytes``.
  An unfinished append is expected after a crash: never an error.
* Corruption before the tail: log CRITICAL, estimate the lost epochs from
  frames that still verify on their own past the damage, move every later
  segment aside to ``.corrupt``, then save the damaged remainder of this
  one to ``.corrupt`` and cut it back.

Durable order of every cut: the copy aside (temp file, fsync, rename, fsync
dir) lands before the truncation (ftruncate, fsync), and later segments are
renamed aside (then their directory fsynced) before the damaged one is cut.
A crash at any point loses nothing: the next recovery finds the same damage
and saves it again under a fresh name.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from statelog.errors import StorageError
from statelog.format.records import RecordSchemaError, decode_record
from statelog.format.wal import HEADER_SIZE, SEAL_FRAME_SIZE, FrameType, SegmentHeader
from statelog.log.reader import SegmentScan
from statelog.log.salvage import SalvageLimit, salvage_frames
from statelog.recovery.report import Outcome, Rejection
from statelog.state.live import LiveState
from statelog.storage.fileio import FileLayer

__all__ = ["Progress", "aside_path", "corruption", "torn_tail"]

# The records keep the logger recovery always used: operators filter on it.
log = logging.getLogger("statelog.recovery.replay")


@dataclass(slots=True)
class Progress:
    """What a recovery did so far: the report's counters, filled in as it goes."""

    state: LiveState
    replayed: int = 0
    truncated: int = 0
    outcome: Outcome = Outcome.CLEAN
    rejected: list[Rejection] = field(default_factory=list)
    saved: list[Path] = field(default_factory=list)
    lost: range = range(0)
    upto: int | None = None  # replay stops after this epoch (a view of the past)
    values_checked: bool = False  # every value of the log was decoded before (a restore's)


def aside_path(path: Path, suffix: str) -> Path:
    """A fresh ``<path><suffix>[.N]`` name for evidence that must not overwrite older evidence."""
    candidate = path.with_name(path.name + suffix)
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}{suffix}.{n}")
        n += 1
    return candidate


def torn_tail(
    files: FileLayer,
    scan: SegmentScan,
    data: bytes | memoryview,
    offset: int,
    reason: str,
    prog: Progress,
    *,
    repair: bool,
) -> None:
    """Record a torn tail at ``offset`` of the last segment; with ``repair``, cut it off.

    :raises StorageError: saving the torn bytes or cutting the segment failed;
        the segment is as it was, or cut with its tail saved.
    """
    path = scan.path
    prog.truncated = scan.size - offset
    prog.outcome = Outcome.TORN_TAIL
    prog.rejected.append(Rejection(path, offset, reason))
    if not repair:
        # Read-only: an unfinished tail is usually the writer's append in flight.
        log.debug(
            "segment=%s event=torn_tail offset=%d bytes=%d", path.name, offset, prog.truncated
        )
        return
    _cut(files, scan, data, offset, ".broken", prog)
    log.warning(
        "segment=%s event=torn_tail_truncated offset=%d bytes=%d reason=%r saved=%s epoch=%d",
        path.name,
        offset,
        prog.truncated,
        reason,
        prog.saved[-1].name,
        prog.state.epoch,
    )


def corruption(
    files: FileLayer,
    store_id: uuid.UUID,
    scan: SegmentScan,
    data: bytes | memoryview,
    offset: int,
    reason: str,
    later: list[Path],
    prog: Progress,
    *,
    repair: bool,
) -> None:
    """Record damage at ``offset`` before the log's tail; with ``repair``, move it aside.

    Logs CRITICAL and sets ``prog.lost`` either way. With ``repair``: the
    ``later`` segments are renamed to ``.corrupt`` (directory fsynced), then
    this segment's remainder is saved to ``.corrupt`` and cut off.

    :raises StorageError: a rename or the cut failed; what was moved stays
        moved, and the next recovery finds the rest of the damage again.
    """
    path = scan.path
    epoch = prog.state.epoch
    prog.outcome = Outcome.CORRUPTION
    prog.rejected.append(Rejection(path, offset, reason))
    prog.rejected.extend(Rejection(p, None, f"after damage in {path.name}") for p in later)
    # A damaged region larger than a SEAL frame held at least one commit.
    floor = epoch + 1 if scan.size - max(offset, HEADER_SIZE) > SEAL_FRAME_SIZE else epoch
    salvaged = _salvage_epochs(files, store_id, scan, data, offset, later)
    highest = max((e for e in salvaged if e > epoch), default=floor)
    prog.lost = range(epoch + 1, max(highest, floor) + 1)
    lost = f"{prog.lost.start}-{prog.lost.stop - 1}" if prog.lost else "none-found"
    log.critical(
        "segment=%s event=corruption offset=%d reason=%r recovered_epoch=%d lost_epochs=%s "
        "later_segments=%d",
        path.name,
        offset,
        reason,
        epoch,
        lost,
        len(later),
    )
    if not repair:
        return
    for p in later:
        aside = aside_path(p, ".corrupt")
        try:
            files.rename(p, aside)
        except OSError as exc:
            raise StorageError(f"moving {p} aside failed: {exc}") from exc
        prog.saved.append(aside)
    if later:
        files.fsync_dir(path.parent)
    _cut(files, scan, data, offset, ".corrupt", prog)


def _cut(
    files: FileLayer,
    scan: SegmentScan,
    data: bytes | memoryview,
    offset: int,
    suffix: str,
    prog: Progress,
) -> None:
    """Save ``data[offset:]`` aside, then cut the segment there (or move it whole).

    Durable order: the copy (temp, fsync, rename, fsync dir) lands before
    the truncation (ftruncate, fsync), so a crash in between loses nothing:
    the next recovery finds the same damage and saves it again.
    """
    path = scan.path
    aside = aside_path(path, suffix)
    try:
        if offset == 0:
            files.rename(path, aside)
            files.fsync_dir(path.parent)
        else:
            files.create_durable(aside, memoryview(data)[offset:])
            files.truncate(path, offset)
    except OSError as exc:
        raise StorageError(f"moving damaged bytes of {path} aside failed: {exc}") from exc
    prog.saved.append(aside)


def _salvage_epochs(
    files: FileLayer,
    store_id: uuid.UUID,
    scan: SegmentScan,
    data: bytes | memoryview,
    offset: int,
    later: list[Path],
) -> list[int]:
    """Epochs of this store's commits still intact past the damage: evidence for ``lost_epochs``.

    Frames are taken when they verify on their own, fragments reassembled;
    nothing found here is ever applied.
    """
    sources: list[bytes | memoryview] = []
    # A segment whose header is unreadable still sits in our wal/ under our
    # name: its frames count, but only for epochs past the recovered one.
    if scan.header is None or scan.header.store_id == store_id:
        sources.append(memoryview(data)[max(offset, HEADER_SIZE) :])
    for p in later:
        try:
            more = files.read(p)
        except OSError:
            continue
        if SegmentHeader.crc_ok(more) and SegmentHeader.unpack(more).store_id == store_id:
            sources.append(memoryview(more)[HEADER_SIZE:])
    found: list[int] = []
    for blob in sources:
        with contextlib.suppress(SalvageLimit):  # what was found before the bound counts
            _epochs_in(blob, found)
    return found


def _epochs_in(blob: bytes | memoryview, found: list[int]) -> None:
    """Append the epochs of the records in ``blob`` whose frames verify on their own.

    :raises SalvageLimit: as :func:`~statelog.log.salvage.salvage_frames`.
    """
    parts: list[memoryview] = []
    for _, ftype, payload in salvage_frames(blob, 0):
        if ftype in (FrameType.FULL, FrameType.FIRST):
            parts = [payload]
        elif ftype in (FrameType.MIDDLE, FrameType.LAST) and parts:
            parts.append(payload)
        else:
            parts = []
            continue
        if ftype in (FrameType.FULL, FrameType.LAST):
            with contextlib.suppress(RecordSchemaError):
                found.append(decode_record(b"".join(parts)).epoch)
            parts = []
