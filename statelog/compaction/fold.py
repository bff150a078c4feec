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

import contextlib
import errno
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import lmdb

from statelog.compaction.base import CompactionResult, Pass
from statelog.compaction.delta import ChainPolicy
from statelog.compaction.lock import CompactorLock
from statelog.compaction.read_ahead import HashAhead, likely_rereads
from statelog.compaction.retention import apply_retention
from statelog.compaction.window import check_window
from statelog.compaction.write import fold_pass
from statelog.errors import InvalidOptionError, StorageError
from statelog.events import emit
from statelog.storage import whole_checks
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import REWIND, StoreLayout
from statelog.storage.marks import check_not_standby

__all__ = ["SCRATCH_DIR", "CompactionResult", "compact"]

SCRATCH_DIR = "compactor.tmp"


def compact(
    store: Path,
    *,
    files: FileLayer | None = None,
    min_tail_bytes: int = 0,
    min_tail_records: int = 0,
    retain: int = 3,
    retain_for: timedelta | None = None,
    level: int = 3,
    max_chain: int = 8,
    full_ratio: float = 0.5,
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
    :param retain_for: also keep every epoch committed after now minus this
        window restorable (a positive ``timedelta``; None: by count only): the
        newest restore point at or before the window's start, every one after
        it and the log from it. With ``retain``, whichever keeps more
        (:mod:`statelog.compaction.retention`).
    :param level: zstd level of the snapshot body.
    :param max_chain: the most delta snapshots on top of a full one; a pass
        that would pass it writes a full snapshot (0: every pass does).
    :param full_ratio: a pass writes a full snapshot once the chain's delta
        bytes, its own tail included, would exceed this fraction of the full
        snapshot's body (``docs/architecture.md``, "Delta passes and full merges").
    :param lock: the caller's lock on this store (the daemon holds one for
        its whole life); None: take it for this pass.
    :param stop: polled between steps; when it returns True the pass is
        abandoned safely (``skipped="interrupted"``, no retention).
    :param progress: called as ``(segment, bytes folded, bytes to fold)``
        before each segment is folded and once at the end (the CLI's bar).
    :raises InvalidOptionError: an option is out of range (``retain_for`` not a
        positive timedelta among them), or ``lock`` is not held.
    :raises StoreNotFoundError: ``store`` holds no statelog store.
    :raises CompactorLockedError: another compactor holds the store.
    :raises StandbyCopyError: ``store`` is a standby's copy (compact its source).
    :raises FormatVersionError: a segment of a newer format (nothing judged damaged).
    :raises StorageError: LMDB could not grow the pass's image: the disk is
        full (``errno`` ENOSPC) or the map cannot be enlarged (ENOMEM); no
        partial snapshot is visible.
    :raises OSError: a read, write or sync failed; no partial snapshot is visible.
    """
    _check_options(min_tail_bytes, min_tail_records, retain, level)
    check_window(retain_for)
    policy = ChainPolicy.checked(max_chain, full_ratio)
    started = time.perf_counter()
    root = Path(store)
    files = files or FileLayer()
    layout = StoreLayout(root)
    sid = layout.read_identity(files)
    _check_compactable(root)
    if lock is not None and not (lock.held and lock.store.resolve() == root.resolve()):
        raise InvalidOptionError(f"lock={lock!r} is not a held compactor lock on {root}")
    held = lock if lock is not None else CompactorLock(root)
    try:
        p = Pass(
            root, layout, files, sid, root / SCRATCH_DIR, min_tail_bytes, min_tail_records,
            level, stop or (lambda: False), policy,
        )  # fmt: skip
        if progress is not None:
            p.progress = progress
        try:
            result = _run(p, retain, retain_for, started)
        except _OUT_OF_SPACE as exc:
            raise _image_full(root, exc) from exc
        _report(p, result)
        return result
    finally:
        if lock is None:
            held.release()


def _run(p: Pass, retain: int, retain_for: timedelta | None, started: float) -> CompactionResult:
    """Steps 2 to 7 under the lock; the scratch space is removed whatever happens."""
    p.say(logging.DEBUG, "pass_started")
    _clear_scratch(p)
    since = whole_checks.now()
    ahead = HashAhead(p.files, p.store_id, p.stop)

    def read_ahead(full: bool) -> None:
        with contextlib.suppress(OSError):  # a guess: retention lists and reads for itself
            ahead.start(likely_rereads(p.root, retain, retain_for, full=full))

    p.before_fold = read_ahead
    try:
        try:
            result = fold_pass(p)
        except BaseException:
            ahead.abandon()  # it only reads: no need to wait for the file it is on
            raise
        deleted: tuple[Path, ...] = ()
        if result.skipped == "interrupted":
            ahead.abandon()
        else:
            ahead.wait()
            p.say(logging.DEBUG, "retention_started", retain=retain)
            kept = apply_retention(
                p.root, p.files, p.store_id, retain=retain, retain_for=retain_for,
                hashed_since=since,
            )  # fmt: skip
            deleted = kept.deleted
            p.damaged.extend(d for d in kept.damaged if d not in p.damaged)
    finally:
        shutil.rmtree(p.scratch, ignore_errors=True)
    return replace(
        result,
        deleted=deleted,
        damaged=tuple(p.damaged),
        bytes_read=p.bytes_read,
        seconds=time.perf_counter() - started,
    )


def _report(p: Pass, result: CompactionResult) -> None:
    """Log the pass; a pass that wrote a snapshot is also a ``compaction`` event."""
    p.say(
        logging.INFO,
        "pass_done",
        snapshot=result.snapshot.name if result.snapshot else None,
        skipped=result.skipped,
        folded=len(result.segments),
        deleted=len(result.deleted),
        bytes_read=result.bytes_read,
        seconds=result.seconds,
    )
    if result.snapshot is not None:
        emit(
            p.root,
            "compaction",
            snapshot=result.snapshot.name,
            epoch=result.epochs.stop - 1,
            lsn=result.epochs.stop - 1,
            base=result.base.name if result.base else None,
            segments=len(result.segments),
            records=len(result.epochs),
            snapshot_kind="full" if result.full else "delta",
            depth=result.depth,
            written_bytes=result.written_bytes,
            bytes=result.bytes_read,
            seconds=round(result.seconds, 6),
        )


# What LMDB raises when the pass's scratch image cannot grow: the disk is
# full, or the map cannot be enlarged (address space, memory limits).
_OUT_OF_SPACE = (lmdb.DiskError, lmdb.MapFullError, lmdb.MemoryError)


def _image_full(root: Path, exc: lmdb.Error) -> StorageError:
    """The typed error for LMDB refusing to grow the pass's scratch image."""
    if isinstance(exc, lmdb.DiskError):
        what, code = "ran out of disk space", errno.ENOSPC
    elif isinstance(exc, lmdb.MemoryError):
        what, code = "could not be mapped larger", errno.ENOMEM
    else:
        what, code = "reached its map size", None
    return StorageError(
        f"compacting {root} failed: the scratch image under {root / SCRATCH_DIR} {what}: {exc}",
        errno=code,
        hint="free disk space (or memory) on the compactor's host, then run the pass again; "
        "the store is unchanged and no partial snapshot is visible",
    )


def _check_compactable(root: Path) -> None:
    """:raises StandbyCopyError: a standby's copy (its source is the one to compact).
    :raises InvalidOptionError: a rewind in place is under way (``REWIND``)."""
    check_not_standby(root)
    if (root / REWIND).exists():
        raise InvalidOptionError(
            f"{root} has a rewind in progress",
            hint="open the store as its writer (or run `statelog recover --to-epoch` again) "
            "to finish it, then compact",
        )


def _check_options(min_bytes: int, min_records: int, retain: int, level: int) -> None:
    for name, v, low in (
        ("min_tail_bytes", min_bytes, 0),
        ("min_tail_records", min_records, 0),
        ("retain", retain, 1),
        ("level", level, 1),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v < low or (name == "level" and v > 22):
            raise InvalidOptionError(f"{name}={v!r}", hint=f"an integer >= {low}")


def _clear_scratch(p: Pass) -> None:
    """Remove what a compactor that died left: the scratch dir and ``snapshots/*.tmp``."""
    if p.scratch.exists():
        shutil.rmtree(p.scratch)
        p.say(logging.INFO, "scratch_removed", dir=p.scratch.name)
    for stray in sorted(t for t in p.layout.snapshots.glob("*.tmp") if t.is_file()):
        p.files.remove(stray)
        p.say(logging.INFO, "temp_removed", file=f"snapshots/{stray.name}")
    p.files.makedirs(p.scratch)
