"""Steps 3, 4 and 6 of a compaction pass: choose the base, then write a full or a delta snapshot.

A pass with no usable snapshot folds the log from LSN 1 into an empty image and writes
a full snapshot. A pass on a snapshot opens its chain (every link verified:
:func:`statelog.storage.levels.open_chain`), then asks
:class:`~statelog.compaction.delta.ChainPolicy`:

* **delta pass** (the common case): the tail is folded into
  :class:`~statelog.compaction.delta.Changes`, the changed keys are looked up in the
  chain's base, and a delta snapshot of only those keys is written; its image (small)
  is published to ``STORE/base`` beside the chain's. Nothing is read or written in
  proportion to the state.
* **full merge**: the tail is folded into changes as for a delta, then the chain's
  full image, each delta's image in order and the changes are merged in key order
  into a fresh image (:func:`~statelog.compaction.merge.merge_levels`), and a full
  snapshot written from it, which starts a new chain.

Either way the image is built, fsynced and its CRC-32C taken before the snapshot
file is written durably (temp file, fsync, rename, fsync of ``snapshots/``); a full
merge streams the body to a scratch file while it builds the image. Then the image is
published (a rename and a small stamp), so a writer never sees the new snapshot for
long without its image. An I/O error while the image is sealed fails the pass before
its snapshot exists. A SIGKILL at any step leaves the store as it was plus scratch
files step 2 of the next pass removes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path

from statelog.compaction.base import (
    CompactionResult,
    Pass,
    Start,
    fold_tail,
    human_bytes,
    report_mismatch,
)
from statelog.compaction.delta import Changes, delta_meta, plan_delta
from statelog.compaction.merge import merged
from statelog.compaction.replay import Folding
from statelog.compaction.tail import (
    SegmentInfo,
    Tail,
    count_unsealed,
    list_segment_infos,
    peek_seal,
    sealed_tail,
)
from statelog.compaction.verdicts import mark_verified
from statelog.errors import CorruptionError, FormatVersionError
from statelog.format.snapshot import IMAGE_VERSION, SnapshotHeader
from statelog.storage.builder import ImageBuilder
from statelog.storage.image_cache import publish_image, seal_image
from statelog.storage.layered import LayeredBase
from statelog.storage.levels import Chain, ImageSources, open_chain
from statelog.storage.pins import pin
from statelog.storage.snapshot_body import stream_image
from statelog.storage.snapshots import (
    SnapshotMeta,
    StreamWriter,
    list_snapshots,
    write_delta_snapshot,
    write_snapshot,
)

__all__ = ["fold_pass"]


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
                why = _nothing_new(segs, base_lsn)
                return _skip(p, "nothing_new", why, base=base_name, base_lsn=base_lsn)
            if not _triggered(p, tail.bytes, new):
                why = _below_trigger(p, tail.bytes, new)
                return _skip(
                    p, "below_trigger", why, base=base_name, tail_bytes=tail.bytes,
                    tail_records=new,
                )  # fmt: skip
            p.tail_bytes = tail.bytes
            result = _fold_from(p, cand[2] if cand is not None else None, base_lsn, tail.segments)
            if result is not None:
                return result
    why = "no snapshot verifies and links to the log, and the log does not begin at LSN 1"
    p.say(logging.ERROR, "no_base", reason=why)
    return CompactionResult(p.root, skipped="no_base")


def _skip(p: Pass, why: str, detail: str, **fields: object) -> CompactionResult:
    """Log and return a skipped pass: ``reason`` a fixed word, ``detail`` its numbers."""
    p.say(logging.INFO, "compaction_skipped", reason=why, detail=detail, **fields)
    return CompactionResult(p.root, skipped=why, skip_detail=detail)


def _below_trigger(p: Pass, tail_bytes: int, tail_records: int) -> str:
    """How far the sealed tail is from each trigger that is on: ``700 KiB of 64 MiB``."""
    parts = []
    if p.min_tail_bytes > 0:
        parts.append(f"{human_bytes(tail_bytes)} of {human_bytes(p.min_tail_bytes)}")
    if p.min_tail_records > 0:
        parts.append(f"{tail_records} of {p.min_tail_records} commits")
    return ", ".join(parts)


def _nothing_new(segs: list[SegmentInfo], base_lsn: int) -> str:
    """Why nothing sealed follows ``base_lsn``: the commits the writer's active
    segment holds, which no pass folds before the writer seals it, if any."""
    active = segs[-1] if segs and segs[-1].first_lsn > base_lsn else None
    try:
        if active is not None and peek_seal(active.path, active.size) is None:
            records, size, complete = count_unsealed(active)
            if records:
                n = f"{records}" if complete else f"at least {records}"
                return f"{n} commits ({human_bytes(size)}) in the active segment, not sealed"
    except OSError:
        pass  # the segment was sealed and removed meanwhile: nothing to count
    return f"no commit after epoch {base_lsn}"


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


def _clear(p: Pass) -> Path:
    """The pass's working image path, with anything a walked-past base left removed."""
    for stale in ("work.mdb", "base.mdb", "image.mdb", "delta.mdb"):
        if (p.scratch / stale).exists():
            p.files.remove(p.scratch / stale)
    return p.scratch / "work.mdb"


def _fold_from(
    p: Pass, base: Path | None, base_lsn: int, tail: tuple[SegmentInfo, ...]
) -> CompactionResult | None:
    """Fold ``tail`` onto ``base``; None if ``base`` cannot be used (walk back)."""
    work = _clear(p)
    if base is None:
        p.before_fold(True)
        with ImageBuilder.create(work) as builder:
            return _full(p, None, base_lsn, tail, Start(builder), builder)
    opened = _open_chain(p, base)
    if opened is None:
        return None
    chain, layered = opened
    try:
        meta = chain.meta
        start = Start(Changes(), dict(meta.offsets), meta.low_watermark_ms, meta.chain)
        kind = p.policy.choose(meta, p.tail_bytes, portable=_portable(chain.snapshots[0]))
        p.before_fold(kind == "full")
        if kind == "delta":
            return _delta(p, chain, layered, base_lsn, tail, start)
        if kind == "rebase":
            return _rebase(p, chain, layered, base_lsn, tail, start)
        return _merge(p, chain, layered, base_lsn, tail, start, work)
    finally:
        layered.close()


def _portable(full: Path) -> bool:
    """Whether the full snapshot at ``full`` is of format 2 (a delta may rest on it)."""
    with open(full, "rb") as fh:
        return SnapshotHeader.peek_version(fh.read(10)) != IMAGE_VERSION


def _open_chain(p: Pass, base: Path) -> tuple[Chain, LayeredBase] | None:
    """``base``'s chain and its stack of images; None if a link is damaged or unreadable.
    A damaged base is reported (once per process) and left in place as evidence."""
    levels = p.scratch / "levels"
    try:
        return open_chain(p.files, base, p.store_id, ImageSources(levels, (p.layout.base, levels)))
    except CorruptionError as exc:
        p.say(logging.ERROR, "snapshot_damaged", file=f"snapshots/{base.name}", reason=exc.reason)
        p.damaged.append(base)
        report_mismatch(p, base, exc.offset, exc.reason, walk_back=True)
        return None
    except FormatVersionError as exc:
        p.say(logging.WARNING, "snapshot_unreadable", file=base.name, reason=exc.message)
        return None


def _folded(
    p: Pass, start: Start, base: Path | None, base_lsn: int, tail: tuple[SegmentInfo, ...]
) -> Folding | CompactionResult | None:
    """The tail folded onto ``start``, or the result that ends the pass instead."""
    fold = fold_tail(p, start, base, base_lsn, tail)
    if not isinstance(fold, Folding):
        return fold
    if fold.good_epoch == base_lsn:
        return CompactionResult(p.root, base=base, skipped="damaged")
    if p.stop():
        return CompactionResult(p.root, base=base, skipped="interrupted")
    return fold


def _full(
    p: Pass,
    base: Path | None,
    base_lsn: int,
    tail: tuple[SegmentInfo, ...],
    start: Start,
    builder: ImageBuilder,
) -> CompactionResult | None:
    """Fold ``tail`` into ``builder`` and write a full snapshot of the result."""
    fold = _folded(p, start, base, base_lsn, tail)
    if not isinstance(fold, Folding):
        return fold
    # The working image itself is streamed and published, not a compacted copy of
    # it: that copy would write the whole state once more per full pass.
    builder.close()
    image = builder.path
    return _write_full(p, base, base_lsn, fold, image, functools.partial(stream_image, image))


def _write_full(
    p: Pass, base: Path | None, base_lsn: int, fold: Folding, image: Path, stream: StreamWriter
) -> CompactionResult:
    """Write the full snapshot of the state at ``fold``, its body written by ``stream``
    (which reads the finished ``image``, or finishes it meanwhile: see
    :func:`~statelog.storage.snapshots.write_snapshot`); seal ``image`` once the body is
    written, before the snapshot appears; then publish ``image``. The keys per table
    are the stream's."""
    meta_out = SnapshotMeta(
        p.store_id, fold.good_epoch, fold.good_epoch, fold.good_chain, fold.good_offsets,
        fold.good_wm, {}, 0, int(time.time() * 1000), commit_ms=fold.good_commit_ms,
    )  # fmt: skip
    crc = 0

    def body(write: Callable[[bytes], object]) -> tuple[int, dict[str, int]]:
        nonlocal crc
        made = stream(write)
        crc = _seal(p, image, fold)  # finished: sealed before the snapshot appears
        return made

    path, written = write_snapshot(
        p.files, p.layout.snapshots, meta_out, image, level=p.level, stream=body
    )
    mark_verified(path)  # built from this pass's own image: retention need not parse it
    publish_image(p.files, image, p.layout.base, path, written, crc=crc)
    return _done(p, path, written, base, base_lsn, fold)


def _seal(p: Pass, image: Path, fold: Folding) -> int:
    """Say the finished image's size, then fsync it; its CRC-32C."""
    p.say(logging.DEBUG, "snapshot_writing", epoch=fold.good_epoch,
          image_bytes=image.stat().st_size)  # fmt: skip
    return seal_image(p.files, image)


def _merge(
    p: Pass,
    chain: Chain,
    layered: LayeredBase,
    base_lsn: int,
    tail: tuple[SegmentInfo, ...],
    start: Start,
    image: Path,
) -> CompactionResult | None:
    """Fold ``tail`` into changes, merge them with every level of ``chain`` into a fresh
    image at ``image`` (:func:`~statelog.compaction.merge.merge_levels`), and write a
    full snapshot of it: the start of a new chain."""
    base = chain.snapshots[-1]
    fold = _folded(p, start, base, base_lsn, tail)
    if not isinstance(fold, Folding):
        return fold
    assert isinstance(start.target, Changes)
    p.bytes_read += sum(s.stat().st_size for s in chain.snapshots)
    return _write_full(p, base, base_lsn, fold, image, merged(layered, start.target, image))


def _delta(
    p: Pass,
    chain: Chain,
    layered: LayeredBase,
    base_lsn: int,
    tail: tuple[SegmentInfo, ...],
    start: Start,
) -> CompactionResult | None:
    """Fold ``tail`` into changes and write them as a delta on top of ``chain``."""
    base = chain.snapshots[-1]
    fold = _folded(p, start, base, base_lsn, tail)
    if not isinstance(fold, Folding):
        return fold
    assert isinstance(start.target, Changes)
    plan = plan_delta(layered, chain.meta, start.target)
    meta = delta_meta(chain, fold, plan)
    image = p.scratch / "delta.mdb"
    plan.build_image(image)
    crc = seal_image(p.files, image)
    path, written = write_delta_snapshot(
        p.files, p.layout.snapshots, meta, plan.stream, scratch=p.scratch, level=p.level
    )
    mark_verified(path)
    publish_image(p.files, image, p.layout.base, path, written, keep=chain.names, crc=crc)
    return _done(p, path, written, base, base_lsn, fold)


def _rebase(
    p: Pass,
    chain: Chain,
    layered: LayeredBase,
    base_lsn: int,
    tail: tuple[SegmentInfo, ...],
    start: Start,
) -> CompactionResult | None:
    """Merge the chain's newest deltas and the tail into one delta on the snapshot below them.

    :meth:`~statelog.compaction.delta.ChainPolicy.rebase_keep` says how many of the
    chain's snapshots stay below. The merged deltas' entries are loaded oldest first,
    then the tail folded over them, so the newest change of each key wins; the delta
    is then planned against the kept levels alone (a delete of a key they lack
    dropped, counts moved from the kept top's counts). Reads and writes what the
    merged deltas and the tail hold, never the state.
    """
    assert isinstance(start.target, Changes)
    changes = start.target
    keep = p.policy.rebase_keep(chain.metas)
    for level in layered.levels[keep:]:
        for table in level.tables():
            for chunk in level.raw_chunks(table):
                changes.load_level(table, chunk)
    p.bytes_read += sum(s.stat().st_size for s in chain.snapshots[keep:])
    newest = chain.snapshots[-1]
    fold = _folded(p, start, newest, base_lsn, tail)
    if not isinstance(fold, Folding):
        return fold
    kept = Chain(chain.snapshots[:keep], chain.metas[:keep], chain.images[:keep])
    below = LayeredBase(kept.images, kept.meta.tables)
    try:
        plan = plan_delta(below, kept.meta, changes)
    finally:
        below.close()
    meta = delta_meta(kept, fold, plan)
    image = p.scratch / "delta.mdb"
    plan.build_image(image)
    crc = seal_image(p.files, image)
    path, written = write_delta_snapshot(
        p.files, p.layout.snapshots, meta, plan.stream, scratch=p.scratch, level=p.level
    )
    mark_verified(path)
    publish_image(p.files, image, p.layout.base, path, written, keep=kept.names, crc=crc)
    return _done(p, path, written, newest, base_lsn, fold)


def _done(
    p: Pass, path: Path, written: SnapshotMeta, base: Path | None, base_lsn: int, fold: Folding
) -> CompactionResult:
    folded = tuple(s.path for s in fold.segments[: fold.good_count])
    size = path.stat().st_size
    p.say(
        logging.INFO, "snapshot_written", file=f"snapshots/{path.name}",
        base=base.name if base else "empty", kind="delta" if written.delta is not None else "full",
        depth=written.depth, epochs=f"{base_lsn + 1}-{fold.good_epoch}", segments=len(folded),
        body_bytes=written.body_bytes, snapshot_bytes=size,
    )  # fmt: skip
    return CompactionResult(
        p.root, path, base, folded, range(base_lsn + 1, fold.good_epoch + 1),
        full=written.delta is None, depth=written.depth, written_bytes=size,
    )  # fmt: skip
