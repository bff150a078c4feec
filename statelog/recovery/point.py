"""Point in time, write side: which files make up the store as of one epoch.

:func:`plan_point` answers, for a store directory and an epoch ``N`` that a
read-only view rebuilt exactly (:func:`~statelog.recovery.timeline.recover_at`):
the snapshot chain the view used, the segment that snapshot ends in (it
keeps sequence numbers going), the segments after it up to the one holding
``N``, where in that one the record of ``N`` ends (the cut), and what lies
after ``N``: later snapshots, later segments, the bytes after the cut.

:func:`write_point` writes a new store from such a plan (``statelog restore
STORE DEST --epoch N``): into a staging directory beside ``DEST``, each file
copied and fsynced, the segment holding ``N`` cut after it; the staging
copy is recovered read-only and must reach ``N`` exactly; then it is renamed
to ``DEST`` and the parent directory fsynced. A crash leaves ``DEST``
absent (and, at worst, the staging directory, removed by the next attempt).
The new store keeps the store id: it is the same store's history, forked.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from statelog.errors import CorruptionError, InvalidOptionError, NotAStoreError, StorageError
from statelog.format.records import RecordSchemaError, decode_record
from statelog.log.reader import peek_seal, scan_segment
from statelog.log.segments import list_segments
from statelog.recovery.readonly import ReadOnlyRecovery, recover_readonly
from statelog.recovery.timeline import recover_at
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import IDENTITY, SNAPSHOT_DIR, WAL_DIR, StoreLayout
from statelog.storage.levels import chain_links
from statelog.storage.pins import PIN_DIR, pin
from statelog.storage.snapshots import SnapshotMeta, list_snapshots, verify_snapshot

__all__ = ["PointPlan", "plan_point", "record_end", "restore_point", "write_point"]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class PointPlan:
    """The files of a store as of ``epoch``, and what comes after it."""

    epoch: int
    chain: tuple[Path, ...]
    """The view's snapshot chain, full snapshot first (empty: the log from epoch 1)."""
    segments: tuple[Path, ...]
    """The segment the snapshot ends in, if any, then the log up to the segment holding
    ``epoch`` (the last one; cut at :attr:`cut` when that is set)."""
    cut: int | None
    """Where the record of ``epoch`` ends in the last of :attr:`segments`, if bytes
    follow it there (None: the segment ends at it)."""
    cut_bytes: int
    """How many bytes follow the cut."""
    later_segments: tuple[Path, ...]
    later_snapshots: tuple[Path, ...]
    last_epoch: int
    """The last epoch the log holds (as its records verify): ``epoch + 1 ..
    last_epoch`` are what a rewind discards."""


def plan_point(root: Path, view: ReadOnlyRecovery, files: FileLayer | None = None) -> PointPlan:
    """The plan for the epoch ``view`` (a read-only view of ``root`` as of it) stands at.

    :raises CorruptionError: the segment holding the epoch no longer verifies
        up to it (it changed since the view read it).
    :raises OSError: a file could not be read.
    """
    files = files or FileLayer()
    layout = StoreLayout(root)
    epoch = view.state.epoch
    snapshot = view.report.snapshot
    chain: tuple[Path, ...] = ()
    base_lsn = 0
    if snapshot is not None:
        links = chain_links(layout.snapshots, snapshot, lambda p: (_meta(files, p, view), None))
        chain = tuple(p for p, _m, _x in links)
        base_lsn = links[-1][1].lsn
    segs = list_segments(layout.wal)
    covering = [p for _s, first, p in segs if first <= base_lsn][-1:] if base_lsn else []
    used = [p for _s, first, p in segs if base_lsn < first <= epoch]
    later = tuple(p for _s, first, p in segs if first > epoch)
    cut, cut_bytes = None, 0
    holder = used[-1] if used else (covering[-1] if covering else None)
    if holder is not None and epoch > base_lsn:
        cut, cut_bytes = _cut_of(holder, epoch, files)
    later_snaps = tuple(p for e, _l, p in list_snapshots(layout.snapshots) if e > epoch)
    return PointPlan(
        epoch, chain, tuple(covering + used), cut, cut_bytes, later, later_snaps,
        max(epoch, _last_epoch(segs, files)),
    )  # fmt: skip


def _meta(files: FileLayer, path: Path, view: ReadOnlyRecovery) -> SnapshotMeta:
    return verify_snapshot(files, path, store_id=view.store_id)


def record_end(path: Path, data: bytes, epoch: int) -> int | None:
    """Where the verified record of ``epoch`` ends in the segment ``data`` (None: it holds
    no verified record of it)."""
    scan = scan_segment(path, data, store_id=None, prev_crc=None, is_last=True)
    for rec in scan.records:
        try:
            if decode_record(rec.payload).epoch == epoch:
                return rec.end
        except RecordSchemaError:
            return None
    return None


def _cut_of(path: Path, epoch: int, files: FileLayer) -> tuple[int | None, int]:
    """Where the record of ``epoch`` ends in ``path`` and how many bytes follow it (None:
    nothing but the SEAL of ``epoch``, or nothing at all, follows).

    :raises CorruptionError: no verified record of ``epoch`` is in it.
    """
    data = files.read(path)
    end = record_end(path, data, epoch)
    if end is None:
        raise CorruptionError(path, 0, f"no verified record of epoch {epoch} in it any more")
    seal = peek_seal(path, len(data))
    if (seal is not None and seal[0] == epoch) or len(data) <= end:
        return None, 0  # the segment ends at the epoch (its SEAL, if any, names it)
    return end, len(data) - end


def _last_epoch(segs: list[tuple[int, int, Path]], files: FileLayer) -> int:
    """The last epoch of the log as its last segment's records verify (0: none)."""
    for _s, first, path in reversed(segs):
        scan = scan_segment(path, files.read(path), store_id=None, prev_crc=None, is_last=True)
        if scan.sealed_lsn is not None:
            return scan.sealed_lsn
        if scan.records:
            try:
                return decode_record(scan.records[-1].payload).epoch
            except RecordSchemaError:
                return first - 1 + len(scan.records) - 1
        return first - 1
    return 0


def write_point(root: Path, dest: Path, plan: PointPlan, files: FileLayer | None = None) -> None:
    """Write the store of ``plan`` (made from ``root``) at ``dest`` (module docstring).

    :raises NotAStoreError: ``dest`` exists and is not an empty directory; nothing written.
    :raises StorageError: a copy failed, or the copy does not recover to the plan's
        epoch; ``dest`` was not created.
    """
    files = files or FileLayer()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise NotAStoreError(
            f"{dest} exists and is not empty", hint="restore into a new or empty directory"
        )
    staging = dest.with_name(f".{dest.name}.restoring")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _copy_plan(root, staging, plan, files)
        with recover_readonly(staging, files=files) as ro:
            got = ro.state.epoch
        if got != plan.epoch:
            raise StorageError(f"the copy recovers to epoch {got}, not {plan.epoch}")
        if dest.exists():
            dest.rmdir()
        files.rename(staging, dest)
        files.fsync_dir(dest.parent)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise StorageError(f"writing {dest} failed: {exc}", errno=exc.errno) from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _copy_plan(root: Path, staging: Path, plan: PointPlan, files: FileLayer) -> None:
    """Copy the plan's files into ``staging``, each fsynced, the last segment cut."""
    for sub in (WAL_DIR, SNAPSHOT_DIR):
        files.makedirs(staging / sub)
    files.create_durable(staging / IDENTITY, files.read(root / IDENTITY))
    for snap in plan.chain:
        _copy(snap, staging / SNAPSHOT_DIR / snap.name, None, files)
    for i, seg in enumerate(plan.segments):
        last = i == len(plan.segments) - 1
        _copy(seg, staging / WAL_DIR / seg.name, plan.cut if last else None, files)
    for sub in (WAL_DIR, SNAPSHOT_DIR):
        files.fsync_dir(staging / sub)


def _copy(src: Path, dst: Path, size: int | None, files: FileLayer) -> None:
    """Copy ``src`` (its first ``size`` bytes) to ``dst`` in chunks, then fsync it; the
    caller fsyncs the directory."""
    left = src.stat().st_size if size is None else size
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while left > 0:
            chunk = fin.read(min(left, _CHUNK))
            if not chunk:
                raise StorageError(f"{src} ended {left} bytes early while it was copied")
            fout.write(chunk)
            left -= len(chunk)
        fout.flush()
        os.fsync(fout.fileno())


def restore_point(
    root: Path, dest: Path, at: int | datetime, files: FileLayer | None = None
) -> PointPlan:
    """Write at ``dest`` a new store that opens at exactly epoch ``at`` of ``root`` (or the
    epoch :func:`~statelog.recovery.timeline.epoch_at` finds for a time); ``root``
    is only read, its files pinned until the copy is written (where ``pins/`` exists).

    :returns: the plan written.
    :raises EpochUnavailableError: that epoch cannot be rebuilt (the range is named).
    :raises NotAStoreError: ``dest`` exists and is not an empty directory.
    :raises StorageError: as :func:`write_point`; ``dest`` was not created.
    """
    root, dest = Path(root), Path(dest)
    files = files or FileLayer()
    if isinstance(at, int) and (isinstance(at, bool) or at < 1):
        raise InvalidOptionError(
            f"epoch {at!r}: a store is restored to an epoch >= 1",
            hint="epoch 0 is the empty store: start a new store instead",
        )
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise NotAStoreError(
            f"{dest} exists and is not empty", hint="restore into a new or empty directory"
        )
    layout = StoreLayout(root)
    layout.read_identity(files)
    names = [f"{SNAPSHOT_DIR}/{p.name}" for _e, _l, p in list_snapshots(layout.snapshots)]
    names += [f"{WAL_DIR}/{p.name}" for _s, _l, p in list_segments(layout.wal)]
    with contextlib.ExitStack() as stack:
        if (root / PIN_DIR).is_dir() and os.access(root / PIN_DIR, os.W_OK):
            stack.enter_context(pin(root, names, purpose="point-in-time restore"))
        with recover_at(root, at, files=files) as view:
            plan = plan_point(root, view, files)
        write_point(root, dest, plan, files)
    return plan
