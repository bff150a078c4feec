"""One compaction pass: previous snapshot + sealed segments -> next snapshot, then retention.

The pass reads only immutable files: snapshots and sealed segments, never
the writer's memory and never its active segment (of which it reads at most
the last 24 bytes, to see that it is not sealed: :mod:`statelog.compaction.tail`).

Steps of :func:`compact`, in order:

1. Read ``IDENTITY``; take ``COMPACTOR.LOCK`` (unless the caller holds it).
2. Clear the scratch space: ``STORE/compactor.tmp/`` and ``snapshots/*.tmp``
   left by a compactor that died (no other compactor can be writing them).
3. Pin every snapshot and segment listed (:mod:`statelog.storage.pins`), before
   opening any of them.
4. Choose the base: the newest snapshot, newest first. Plan its tail (the
   sealed segments after its LSN); skip the pass if nothing sealed is new or
   no trigger is reached. Extract the base (which verifies every byte); a
   damaged one is logged at ERROR, left in place and walked past, as is one
   the log does not continue from. With no snapshot left the base is an
   empty image, valid only while the log still begins at LSN 1.
5. Fold: copy the base image, apply each segment's records in one LMDB
   transaction per segment, in log order, each segment verified whole
   (header, chain, every frame, seal) and decoded to consecutive epochs.
   Damage stops the fold; the clean prefix of segments is still folded.
   Trailing segments with no record are not counted as folded, so a
   snapshot's chain is always the SEAL of the segment holding its last
   record, and the log continues in the first segment that starts after it.
6. Write the snapshot (:func:`statelog.storage.snapshots.write_snapshot`: temp file,
   fsync, rename, fsync of ``snapshots/``) with epoch = LSN = the last
   folded epoch and chain = that segment's SEAL crc. Release the pin.
7. Retention (:mod:`statelog.compaction.retention`), then remove the scratch space.

A SIGKILL at any step leaves the store as it was, plus at worst a
``*.tmp`` file and the scratch directory, both cleared by step 2 of the
next pass (the writer leaves ``snapshots/*.tmp`` to the compactor).
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from statelog.compaction.lock import CompactorLock
from statelog.compaction.logfmt import LOGGER, kv
from statelog.compaction.replay import Folding, fold_segment
from statelog.compaction.retention import apply_retention
from statelog.compaction.tail import SegmentInfo, Tail, find_link, list_segment_infos, sealed_tail
from statelog.errors import CorruptionError, FormatVersionError, InvalidOptionError
from statelog.events import emit
from statelog.storage.fileio import FileLayer
from statelog.storage.image import ImageBuilder
from statelog.storage.layout import StoreLayout
from statelog.storage.pins import pin
from statelog.storage.snapshots import (
    SnapshotMeta,
    extract_snapshot,
    list_snapshots,
    write_snapshot,
)

__all__ = ["SCRATCH_DIR", "CompactionResult", "compact"]

log = logging.getLogger(LOGGER)

SCRATCH_DIR = "compactor.tmp"


@dataclass(frozen=True)
class CompactionResult:
    """What one pass did. ``skipped`` is None when a snapshot was written."""

    store: Path
    snapshot: Path | None = None  # the snapshot written
    base: Path | None = None  # the snapshot folded from (None: the empty image)
    segments: tuple[Path, ...] = ()  # segments folded, in log order
    epochs: range = range(0)  # epochs folded: base LSN + 1 .. new epoch
    bytes_read: int = 0  # snapshot and segment bytes read by the fold
    seconds: float = 0.0
    deleted: tuple[Path, ...] = ()  # files removed by retention
    skipped: str | None = None  # nothing_new, below_trigger, no_base, damaged, interrupted
    damaged: tuple[Path, ...] = ()  # damaged snapshots and segments met (left in place)


@dataclass
class _Pass:
    """Everything one pass knows; built by :func:`compact`."""

    root: Path
    layout: StoreLayout
    files: FileLayer
    store_id: uuid.UUID
    scratch: Path
    min_tail_bytes: int
    min_tail_records: int
    level: int
    stop: Callable[[], bool]
    progress: Callable[[str, int, int], None] = lambda _item, _done, _total: None
    damaged: list[Path] = field(default_factory=list)
    bytes_read: int = 0

    def say(self, level: int, event: str, **fields: object) -> None:
        log.log(level, "%s", kv(event=event, store=self.root, **fields))


def compact(
    store: Path,
    *,
    files: FileLayer | None = None,
    min_tail_bytes: int = 0,
    min_tail_records: int = 0,
    retain: int = 3,
    level: int = 3,
    lock: CompactorLock | None = None,
    stop: Callable[[], bool] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> CompactionResult:
    """Run one compaction pass over ``store`` (steps in the module docstring).

    :param min_tail_bytes: compact once the sealed tail holds this many
        bytes; 0 turns this trigger off.
    :param min_tail_records: compact once the sealed tail holds this many
        records; 0 turns this trigger off. The pass compacts when any
        trigger that is on is reached, and whenever anything sealed is new
        if both are off.
    :param retain: snapshots that verify to keep (at least 1).
    :param level: zstd level of the snapshot body.
    :param lock: the caller's lock on this store (the daemon holds one for
        its whole life); None: take it for this pass.
    :param stop: polled between steps; when it returns True the pass is
        abandoned safely (``skipped="interrupted"``, no retention).
    :param progress: called as ``(segment, bytes folded, bytes to fold)``
        before each segment is folded and once at the end (the CLI's bar).
    :raises InvalidOptionError: an option is out of range, or ``lock`` is not held.
    :raises StoreNotFoundError: ``store`` holds no statelog store.
    :raises CompactorLockedError: another compactor holds the store.
    :raises FormatVersionError: a segment of a newer format (nothing judged damaged).
    :raises OSError: a read, write or sync failed; no partial snapshot is visible.
    """
    _check_options(min_tail_bytes, min_tail_records, retain, level)
    started = time.perf_counter()
    root = Path(store)
    files = files or FileLayer()
    layout = StoreLayout(root)
    sid = layout.read_identity(files)
    if lock is not None and not (lock.held and lock.store.resolve() == root.resolve()):
        raise InvalidOptionError(f"lock={lock!r} is not a held compactor lock on {root}")
    held = lock if lock is not None else CompactorLock(root)
    try:
        p = _Pass(
            root, layout, files, sid, root / SCRATCH_DIR, min_tail_bytes, min_tail_records,
            level, stop or (lambda: False),
        )  # fmt: skip
        if progress is not None:
            p.progress = progress
        p.say(logging.DEBUG, "pass_started")
        _clear_scratch(p)
        try:
            result = _fold(p)
            deleted: tuple[Path, ...] = ()
            if result.skipped != "interrupted":
                p.say(logging.DEBUG, "retention_started", retain=retain)
                kept = apply_retention(root, files, sid, retain=retain)
                deleted = kept.deleted
                p.damaged.extend(d for d in kept.damaged if d not in p.damaged)
        finally:
            shutil.rmtree(p.scratch, ignore_errors=True)
        result = replace(
            result,
            deleted=deleted,
            damaged=tuple(p.damaged),
            bytes_read=p.bytes_read,
            seconds=time.perf_counter() - started,
        )
        p.say(
            logging.INFO,
            "pass_done",
            snapshot=result.snapshot.name if result.snapshot else None,
            skipped=result.skipped,
            folded=len(result.segments),
            deleted=len(deleted),
            bytes_read=result.bytes_read,
            seconds=result.seconds,
        )
        if result.snapshot is not None:
            emit(
                root,
                "compaction",
                snapshot=result.snapshot.name,
                epoch=result.epochs.stop - 1,
                lsn=result.epochs.stop - 1,
                base=result.base.name if result.base else None,
                segments=len(result.segments),
                records=len(result.epochs),
                bytes=result.bytes_read,
                seconds=round(result.seconds, 6),
            )
        return result
    finally:
        if lock is None:
            held.release()


# (store, file, reason) already reported by this process: a daemon that meets
# the same damaged file on every pass reports it once, so the mismatch
# counter and the audit trail count damage, not passes.
_reported: set[tuple[str, str, str]] = set()


def _mismatch(p: _Pass, path: Path, offset: int | None, reason: str, *, walk_back: bool) -> None:
    key = (str(p.root.resolve()), path.name, reason)
    if key in _reported:
        return
    _reported.add(key)
    if walk_back:
        emit(p.root, "walk_back", file=path.name, reason=reason, source="compactor")
    emit(
        p.root, "integrity_mismatch", file=path.name, offset=offset, reason=reason,
        source="compactor",
    )  # fmt: skip


def _check_options(min_bytes: int, min_records: int, retain: int, level: int) -> None:
    for name, v, low in (
        ("min_tail_bytes", min_bytes, 0),
        ("min_tail_records", min_records, 0),
        ("retain", retain, 1),
        ("level", level, 1),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v < low or (name == "level" and v > 22):
            raise InvalidOptionError(f"{name}={v!r}", hint=f"an integer >= {low}")


def _clear_scratch(p: _Pass) -> None:
    """Remove what a compactor that died left: the scratch dir and ``snapshots/*.tmp``."""
    if p.scratch.exists():
        shutil.rmtree(p.scratch)
        p.say(logging.INFO, "scratch_removed", dir=p.scratch.name)
    for stray in sorted(p.layout.snapshots.glob("*.tmp")):
        p.files.remove(stray)
        p.say(logging.INFO, "temp_removed", file=f"snapshots/{stray.name}")
    p.files.makedirs(p.scratch)


def _fold(p: _Pass) -> CompactionResult:
    """Steps 3 to 6: choose the base, fold its sealed tail, write the snapshot."""
    snaps = list_snapshots(p.layout.snapshots)
    segs = list_segment_infos(p.layout.wal)
    names = [f"snapshots/{path.name}" for _, _, path in snaps] + [s.name for s in segs]
    with pin(p.root, names, purpose="compactor fold"):
        for cand in [*snaps, None]:
            if p.stop():
                return CompactionResult(p.root, skipped="interrupted")
            base_lsn = cand[1] if cand is not None else 0
            tail = sealed_tail(segs, base_lsn)
            _warn_tail(p, tail)
            base_name = cand[2].name if cand is not None else "empty"
            if tail.problem is not None and not tail.segments:
                p.say(logging.ERROR, "log_unlinked", base=base_name, reason=tail.problem)
                continue  # an older snapshot may still link to the log
            new = tail.last_lsn - base_lsn
            if new <= 0:
                return _skip(p, "nothing_new", base=base_name, base_lsn=base_lsn)
            if not _triggered(p, tail.bytes, new):
                return _skip(
                    p, "below_trigger", base=base_name, tail_bytes=tail.bytes, tail_records=new
                )
            result = _fold_from(p, cand[2] if cand is not None else None, base_lsn, tail.segments)
            if result is not None:
                return result
    p.say(
        logging.ERROR,
        "no_base",
        reason="no snapshot verifies and links to the log, and the log does not begin at LSN 1",
    )
    return CompactionResult(p.root, skipped="no_base")


def _skip(p: _Pass, why: str, **fields: object) -> CompactionResult:
    p.say(logging.INFO, "compaction_skipped", reason=why, **fields)
    return CompactionResult(p.root, skipped=why)


def _triggered(p: _Pass, tail_bytes: int, tail_records: int) -> bool:
    """Whether the tail reaches a trigger that is on (any new record if none is on)."""
    on = [(p.min_tail_bytes, tail_bytes), (p.min_tail_records, tail_records)]
    on = [(limit, have) for limit, have in on if limit > 0]
    return not on or any(have >= limit for limit, have in on)


def _warn_tail(p: _Pass, tail: Tail) -> None:
    """Say why the sealed tail stops short of the writer's active segment, if it does."""
    if tail.blocked_by is not None:
        p.say(
            logging.WARNING,
            "unsealed_segment_blocks",
            segment=tail.blocked_by.name,
            reason="a segment before the last is not sealed (a sync failed there); "
            "the compactor folds sealed segments only",
        )
    if tail.problem is not None and tail.segments:
        p.say(logging.ERROR, "log_gap", reason=tail.problem, folded_up_to=tail.last_lsn)


def _fold_from(
    p: _Pass, base: Path | None, base_lsn: int, tail: tuple[SegmentInfo, ...]
) -> CompactionResult | None:
    """Fold ``tail`` onto ``base``; None if ``base`` cannot be used (walk back)."""
    work = p.scratch / "work.mdb"
    for stale in (work, p.scratch / "base.mdb", p.scratch / "image.mdb"):
        if stale.exists():  # left by a base that was walked past
            p.files.remove(stale)
    if base is None:
        meta_offsets: dict[str, int] = {}
        wm, chain = 0, 0
        builder = ImageBuilder.create(work)
    else:
        extracted = p.scratch / "base.mdb"
        try:
            meta = extract_snapshot(p.files, base, extracted, store_id=p.store_id)
        except CorruptionError as exc:
            p.say(
                logging.ERROR, "snapshot_damaged", file=f"snapshots/{base.name}", reason=exc.reason
            )
            p.damaged.append(base)
            _mismatch(p, base, exc.offset, exc.reason, walk_back=True)
            return None
        except FormatVersionError as exc:
            p.say(logging.WARNING, "snapshot_unreadable", file=base.name, reason=exc.message)
            return None
        p.bytes_read += base.stat().st_size
        meta_offsets, wm, chain = dict(meta.offsets), meta.low_watermark_ms, meta.chain
        builder = ImageBuilder.open_copy(extracted, work)
        p.files.remove(extracted)
    with builder:
        start = find_link(tail, base_lsn, chain, p.store_id)
        if start is None:
            unlinked = f"no segment starts at LSN {base_lsn + 1} with prev_crc {chain:#010x}"
            name = base.name if base else "empty"
            p.say(logging.ERROR, "snapshot_unlinked", base=name, reason=unlinked)
            if base is not None:
                _mismatch(p, base, None, unlinked, walk_back=True)
            return None
        p.say(
            logging.DEBUG, "fold_started", base=base.name if base else "empty",
            segments=len(tail) - start,
        )  # fmt: skip
        fold = Folding(base_lsn, chain, meta_offsets, wm)
        last_in_log = [s.path for s in list_segment_infos(p.layout.wal)[-1:]]
        total = sum(s.size for s in tail[start:])
        done = 0
        for seg in tail[start:]:
            p.progress(seg.name, done, total)
            done += seg.size
            if p.stop():
                return CompactionResult(p.root, base=base, skipped="interrupted")
            why = fold_segment(p.files, p.store_id, builder, seg, fold, seg.path in last_in_log)
            if why is not None:
                if why:  # else: the end of the sealed log, not damage
                    p.say(
                        logging.ERROR, "segment_damaged", segment=seg.name, reason=why,
                        folded_to=fold.epoch,
                    )  # fmt: skip
                    p.damaged.append(seg.path)
                    _mismatch(p, seg.path, None, why, walk_back=False)
                break
        p.bytes_read += fold.bytes_read
        p.progress("folded", done, total)
        if fold.good_epoch == base_lsn:
            return CompactionResult(p.root, base=base, skipped="damaged")
        if p.stop():
            return CompactionResult(p.root, base=base, skipped="interrupted")
        image = p.scratch / "image.mdb"
        size = builder.finish(image)
        tables = builder.counts()
    meta_out = SnapshotMeta(
        p.store_id, fold.good_epoch, fold.good_epoch, fold.good_chain, fold.good_offsets,
        fold.good_wm, tables, size, int(time.time() * 1000),
    )  # fmt: skip
    p.say(logging.DEBUG, "snapshot_writing", epoch=fold.good_epoch, image_bytes=size)
    path = write_snapshot(p.files, p.layout.snapshots, meta_out, image, level=p.level)
    folded = tuple(s.path for s in fold.segments[: fold.good_count])
    p.say(
        logging.INFO,
        "snapshot_written",
        file=f"snapshots/{path.name}",
        base=base.name if base else "empty",
        epochs=f"{base_lsn + 1}-{fold.good_epoch}",
        segments=len(folded),
        image_bytes=size,
        snapshot_bytes=path.stat().st_size,
    )
    return CompactionResult(p.root, path, base, folded, range(base_lsn + 1, fold.good_epoch + 1))
