"""Steps 3 to 6 of a compaction pass: choose the base, fold its sealed tail, write the snapshot.

:func:`statelog.compaction.fold.compact` runs the pass and says, step by
step, what it does; this module holds the fold itself and what a pass
knows while it runs (:class:`Pass`) and returns (:class:`CompactionResult`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from statelog.compaction.logfmt import LOGGER, kv
from statelog.compaction.replay import Folding, fold_segment
from statelog.compaction.retention import mark_verified
from statelog.compaction.tail import SegmentInfo, Tail, find_link, list_segment_infos, sealed_tail
from statelog.errors import CorruptionError, FormatVersionError
from statelog.events import emit
from statelog.storage.fileio import FileLayer
from statelog.storage.image import ImageBuilder
from statelog.storage.image_cache import copy_reusable, publish_image
from statelog.storage.layout import StoreLayout
from statelog.storage.pins import pin
from statelog.storage.snapshots import (
    SnapshotMeta,
    extract_snapshot,
    list_snapshots,
    write_snapshot,
)

__all__ = ["CompactionResult", "Pass", "fold_pass"]

log = logging.getLogger(LOGGER)


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
class Pass:
    """Everything one pass knows; built by :func:`statelog.compaction.fold.compact`."""

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


# (store, file, reason) already reported by this process: a daemon that meets
# the same damaged file on every pass reports it once, so the mismatch
# counter and the audit trail count damage, not passes.
_reported: set[tuple[str, str, str]] = set()


def _mismatch(p: Pass, path: Path, offset: int | None, reason: str, *, walk_back: bool) -> None:
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


def fold_pass(p: Pass) -> CompactionResult:
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


def _skip(p: Pass, why: str, **fields: object) -> CompactionResult:
    p.say(logging.INFO, "compaction_skipped", reason=why, **fields)
    return CompactionResult(p.root, skipped=why)


def _triggered(p: Pass, tail_bytes: int, tail_records: int) -> bool:
    """Whether the tail reaches a trigger that is on (any new record if none is on)."""
    on = [(p.min_tail_bytes, tail_bytes), (p.min_tail_records, tail_records)]
    on = [(limit, have) for limit, have in on if limit > 0]
    return not on or any(have >= limit for limit, have in on)


def _warn_tail(p: Pass, tail: Tail) -> None:
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


@dataclass
class _Base:
    """The image a fold starts from, and what its snapshot says (all zero: the empty image)."""

    builder: ImageBuilder
    offsets: dict[str, int] = field(default_factory=dict)
    wm: int = 0
    chain: int = 0


def _fold_from(
    p: Pass, base: Path | None, base_lsn: int, tail: tuple[SegmentInfo, ...]
) -> CompactionResult | None:
    """Fold ``tail`` onto ``base``; None if ``base`` cannot be used (walk back)."""
    start = _open_base(p, base)
    if start is None:
        return None
    with start.builder as builder:
        fold = _fold_tail(p, start, base, base_lsn, tail)
        if not isinstance(fold, Folding):
            return fold
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
    path, written = write_snapshot(p.files, p.layout.snapshots, meta_out, image, level=p.level)
    mark_verified(path)  # built from this pass's own image: retention need not parse it
    publish_image(p.files, image, p.layout.base, path, written)
    folded = tuple(s.path for s in fold.segments[: fold.good_count])
    p.say(
        logging.INFO,
        "snapshot_written",
        file=f"snapshots/{path.name}",
        base=base.name if base else "empty",
        epochs=f"{base_lsn + 1}-{fold.good_epoch}",
        segments=len(folded),
        image_bytes=size,
        body_bytes=written.body_bytes,
        snapshot_bytes=path.stat().st_size,
    )
    return CompactionResult(p.root, path, base, folded, range(base_lsn + 1, fold.good_epoch + 1))


def _open_base(p: Pass, base: Path | None) -> _Base | None:
    """A scratch copy of ``base``'s image to fold onto; None if ``base`` is damaged or unreadable.

    A damaged base is reported (once per process) and left in place as evidence.
    """
    work = p.scratch / "work.mdb"
    for stale in (work, p.scratch / "base.mdb", p.scratch / "image.mdb"):
        if stale.exists():  # left by a base that was walked past
            p.files.remove(stale)
    if base is None:
        return _Base(ImageBuilder.create(work))
    try:
        meta = _base_image(p, base, work)
    except CorruptionError as exc:
        p.say(logging.ERROR, "snapshot_damaged", file=f"snapshots/{base.name}", reason=exc.reason)
        p.damaged.append(base)
        _mismatch(p, base, exc.offset, exc.reason, walk_back=True)
        return None
    except FormatVersionError as exc:
        p.say(logging.WARNING, "snapshot_unreadable", file=base.name, reason=exc.message)
        return None
    p.bytes_read += base.stat().st_size
    builder = ImageBuilder.adopt(work)
    return _Base(builder, dict(meta.offsets), meta.low_watermark_ms, meta.chain)


def _base_image(p: Pass, base: Path, work: Path) -> SnapshotMeta:
    """Put the image of ``base`` at ``work``: a copy of the one this compactor published
    to the writer's ``STORE/base`` if it is intact, else built from ``base`` (verified).

    :raises CorruptionError: ``base`` did not verify.
    :raises FormatVersionError: ``base`` is of a format this code does not read.
    """
    found = copy_reusable(p.layout.base, base, p.scratch, store_id=p.store_id)
    if found is not None:
        p.files.rename(found[0], work)
        p.say(logging.DEBUG, "base_image_reused", file=f"snapshots/{base.name}")
        return found[1]
    return extract_snapshot(p.files, base, work, store_id=p.store_id)


def _fold_tail(
    p: Pass, start: _Base, base: Path | None, base_lsn: int, tail: tuple[SegmentInfo, ...]
) -> Folding | CompactionResult | None:
    """Apply the segments of ``tail`` that continue the base, in log order, until damage.

    :returns: where the fold stands; None if no segment links to the base
        (walk back); an ``interrupted`` result if ``stop`` said so.
    """
    first = find_link(tail, base_lsn, start.chain, p.store_id)
    if first is None:
        unlinked = f"no segment starts at LSN {base_lsn + 1} with prev_crc {start.chain:#010x}"
        name = base.name if base else "empty"
        p.say(logging.ERROR, "snapshot_unlinked", base=name, reason=unlinked)
        if base is not None:
            _mismatch(p, base, None, unlinked, walk_back=True)
        return None
    p.say(
        logging.DEBUG, "fold_started", base=base.name if base else "empty",
        segments=len(tail) - first,
    )  # fmt: skip
    fold = Folding(base_lsn, start.chain, start.offsets, start.wm)
    last_in_log = [s.path for s in list_segment_infos(p.layout.wal)[-1:]]
    total = sum(s.size for s in tail[first:])
    done = 0
    for seg in tail[first:]:
        p.progress(seg.name, done, total)
        done += seg.size
        if p.stop():
            return CompactionResult(p.root, base=base, skipped="interrupted")
        why = fold_segment(p.files, p.store_id, start.builder, seg, fold, seg.path in last_in_log)
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
    return fold
