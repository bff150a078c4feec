"""Retention: keep N verified snapshots and the log they need; delete the rest, loudly.

Rules (invariant 8 of docs/architecture.md):

* Keep the ``retain`` newest restore points: snapshots that verify and,
  for a delta, whose whole chain verifies and links (each parent present,
  verified, with the SHA-256 its child names). Keep every snapshot of
  their chains too, so no kept delta ever loses its parent. A snapshot
  that fails verification is kept as evidence, never deleted and never
  counted; one that cannot be read (I/O error, newer format) is kept and
  not counted. Verified snapshots older than the oldest restore point
  kept and in no kept chain are deleted.
* With a window (``retain_for``, :mod:`statelog.compaction.window`), also
  keep every restore point back to the newest one whose time is at or
  before the window's start (now minus the window): the union with the
  ``retain`` newest. That one and the log after it rebuild every epoch
  committed after the window's start. While no restore point is that old
  (a store younger than its window), every restore point and every segment
  is kept: the epochs of the window before the oldest snapshot are only in
  the log.
* Keep every segment needed to replay forward from the oldest snapshot
  kept: delete only the segments before the one the log continues in after
  that snapshot (the first segment starting at its LSN + 1 whose header
  links to its chain), all of whose records it covers. If no segment links
  to it while later ones exist, delete no segment at all (ERROR: the
  snapshot does not link to the log, so walking back needs the log). The
  last segment is never deleted: the writer continues from it.
* Nothing pinned (:mod:`statelog.storage.pins`) is deleted. Segments go oldest
  first and stop at the first pinned one, so the log left is always one
  unbroken run of segments.

Durable-step order: choose what to delete (reads only, verifying every
snapshot); then, inside :func:`statelog.storage.pins.retention_guard`, list the
pins and unlink the unpinned files, snapshots newest first (a delta goes
before the parent it names, so a crash never leaves a delta without its
chain), then segments oldest first, each through ``FileLayer.remove``;
release the guard; fsync ``snapshots/`` and ``wal/``; then log every
deletion and emit the pass's ``retention_delete`` event. A crash in between
leaves a subset deleted, which is itself a valid retention state: the
snapshots left are older restore points with their whole chains. Nothing that can
block (logging, whose handler may write to a full pipe; event listeners,
the audit trail among them) runs while the guard is held, because every
reader's :func:`~statelog.storage.pins.pin` waits for it.

Verifying costs a read of every snapshot, so it runs only when the cheap
plan (names only, assuming every snapshot verifies) finds something to
delete: a pass that wrote no new snapshot usually deletes nothing. How much
of each snapshot is read depends on what this process read before
(:mod:`statelog.compaction.verdicts`): parsed in full once, then hashed,
and within the hour of a hash of the unchanged file not read at all; but
before a pass deletes an older full snapshot, or a segment from before the
oldest full snapshot kept, the full snapshots on which every restore point
kept rests are hashed again. ``statelog verify`` reads every snapshot whole
each time.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from statelog.compaction.logfmt import LOGGER, kv
from statelog.compaction.tail import SegmentInfo, find_link, list_segment_infos, peek_seal
from statelog.compaction.verdicts import mark_verified, verified
from statelog.compaction.window import check_window, cutoff_ms, meta_time, peek_time, window_count
from statelog.errors import CorruptionError, FormatVersionError, InvalidOptionError
from statelog.events import emit
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import SNAPSHOT_DIR, WAL_DIR
from statelog.storage.pins import ALL, Note, log_notes, pinned_names, retention_guard
from statelog.storage.snapshot_read import peek_meta
from statelog.storage.snapshots import SnapshotMeta, list_snapshots
from statelog.storage.whole_checks import now

__all__ = ["RetentionResult", "apply_retention", "mark_verified"]

log = logging.getLogger(LOGGER)


@dataclass(frozen=True)
class RetentionResult:
    kept: tuple[Path, ...] = ()  # verified snapshots kept (newest first)
    deleted: tuple[Path, ...] = ()  # files removed, in the order removed
    damaged: tuple[Path, ...] = ()  # snapshots that failed verification (kept)
    deferred: tuple[Path, ...] = ()  # files retention wanted gone but found pinned


def apply_retention(
    store: Path,
    files: FileLayer,
    store_id: uuid.UUID,
    *,
    retain: int,
    retain_for: timedelta | None = None,
    now_ms: int | None = None,
    hashed_since: float | None = None,
) -> RetentionResult:
    """Apply the retention rules (module docstring) to ``store``.

    :param retain: the newest restore points to keep, at least 1.
    :param retain_for: also keep every epoch committed after now minus this
        window restorable (a positive ``timedelta``; None: by count only).
    :param now_ms: the window's end, Unix ms (default: the clock now); for
        tests and tools that replay a decision.
    :param hashed_since: a reading of :func:`~statelog.storage.whole_checks.now`
        taken before this pass read anything: a full snapshot this process hashed
        after it, read back from the file (the pass's read-ahead,
        :mod:`statelog.compaction.read_ahead`),
        counts as read again (default: every one is read now).

    :raises InvalidOptionError: ``retain`` is not an int >= 1, or ``retain_for``
        not a positive timedelta; nothing was read or deleted.
    :raises OSError: listing, verifying, unlinking or an fsync failed; what
        was unlinked before the failure stays unlinked (all of it unneeded).
    """
    if not isinstance(retain, int) or isinstance(retain, bool) or retain < 1:
        raise InvalidOptionError(f"retain={retain!r}", hint="an integer >= 1")
    check_window(retain_for)
    snaps = list_snapshots(store / SNAPSHOT_DIR)
    segs = list_segment_infos(store / WAL_DIR)
    cutoff = cutoff_ms(retain_for, now_ms)
    need = window_count(snaps, cutoff)
    # The cheap plan's guess: the window's count ends at a snapshot at or before
    # its start, or runs out of snapshots without finding one.
    anchored = need == 0 or _before(peek_time(snaps[need - 1][2]), cutoff)
    if not snaps or not _may_delete(snaps, segs, max(retain, need), anchored):
        return RetentionResult()
    damaged: list[Path] = []
    good = _verify_each(store, files, [p for _, _, p in snaps], store_id, damaged)
    kept, old, doomed_segs = _plan(store, good, segs, store_id, retain, cutoff)
    fulls = [p for p, m in good if m.delta is None and (p, m) not in old]
    if kept and _leans_on(fulls, good, old, doomed_segs):
        # Every restore point kept rests on the full snapshots left, and this pass
        # would delete what recovery needs if one of them were bad: read them whole
        # during this pass, whatever this process noted of them before.
        since = now() if hashed_since is None else hashed_since
        fresh = _verify_each(store, files, fulls, store_id, damaged, hashed_since=since)
        if len(fresh) < len(fulls):
            gone = set(fulls) - {p for p, _ in fresh}
            good = [(p, m) for p, m in good if p not in gone]
            kept, old, doomed_segs = _plan(store, good, segs, store_id, retain, cutoff)
    done = _Deletions()
    # Only the pin listing and the unlinks run under the guard: every open of
    # the store waits for it, so nothing that can block (a log handler on a
    # full pipe, an event listener, an audit append) may run inside it.
    pinned: set[str] = set()
    notes: list[Note] = []
    try:
        with retention_guard(store):
            pinned = pinned_names(store, notes=notes)
            if ALL not in pinned:
                _delete(files, pinned, old, doomed_segs, done)
        for d in {p.parent for p in done.deleted}:
            files.fsync_dir(d)
    finally:
        # Also after a failed unlink or fsync: what went before it is gone, and said so.
        log_notes(notes)
        _tell(store, done, retain, oldest=_rel(kept[-1][0]) if kept else None)
    if ALL in pinned:
        _say(logging.WARNING, "retention_deferred", store, reason="an unreadable live pin")
        return RetentionResult(tuple(p for p, _ in kept), (), tuple(damaged))
    return RetentionResult(
        tuple(p for p, _ in kept), tuple(done.deleted), tuple(damaged), tuple(done.deferred)
    )


def _plan(
    store: Path,
    good: list[tuple[Path, SnapshotMeta]],
    segs: list[SegmentInfo],
    store_id: uuid.UUID,
    retain: int,
    cutoff: int | None,
) -> tuple[list[tuple[Path, SnapshotMeta]], list[tuple[Path, SnapshotMeta]], list[SegmentInfo]]:
    """The restore points kept, the snapshots and the segments to delete."""
    kept, old = _restore_points(good, retain, cutoff)
    # A window no restore point reaches back to also needs the log before the oldest.
    anchored = cutoff is None or (bool(kept) and _before(meta_time(kept[-1][1]), cutoff))
    doomed_segs = _covered(store, segs, kept[-1][1], store_id) if kept and anchored else []
    return kept, old, doomed_segs


def _leans_on(
    fulls: list[Path],
    good: list[tuple[Path, SnapshotMeta]],
    old: list[tuple[Path, SnapshotMeta]],
    doomed_segs: list[SegmentInfo],
) -> bool:
    """Whether the deletions planned are safe only if the full snapshots kept are good:
    a full snapshot goes, or a segment from before the oldest full snapshot kept."""
    if any(m.delta is None for _, m in old):
        return True
    floor = min((m.lsn for p, m in good if p in fulls), default=None)
    return floor is not None and any(seg.first_lsn <= floor for seg in doomed_segs)


def _verify_each(
    store: Path,
    files: FileLayer,
    paths: list[Path],
    store_id: uuid.UUID,
    damaged: list[Path],
    *,
    hashed_since: float | None = None,
) -> list[tuple[Path, SnapshotMeta]]:
    """The snapshots of ``paths`` that verify, with their metas (``verified``); each
    damaged one logged and added to ``damaged``, each unreadable one logged."""
    good: list[tuple[Path, SnapshotMeta]] = []
    for path in paths:
        try:
            good.append((path, verified(files, path, store_id, hashed_since=hashed_since)))
        except CorruptionError as exc:
            _say(logging.ERROR, "snapshot_damaged", store, file=_rel(path), reason=exc.reason)
            damaged.append(path)
        except (FormatVersionError, OSError) as exc:
            _say(logging.WARNING, "snapshot_unreadable", store, file=_rel(path), reason=str(exc))
    return good


@dataclass
class _Deletions:
    """What one pass unlinked or found pinned, in order: told once the guard is released."""

    deleted: list[Path] = field(default_factory=list)
    deferred: list[Path] = field(default_factory=list)
    snapshots: list[tuple[Path, SnapshotMeta]] = field(default_factory=list)
    segments: list[SegmentInfo] = field(default_factory=list)


def _delete(
    files: FileLayer,
    pinned: set[str],
    old: list[tuple[Path, SnapshotMeta]],
    doomed_segs: list[SegmentInfo],
    done: _Deletions,
) -> None:
    """Unlink what is not pinned: snapshots newest first (each delta before its parent),
    then segments oldest first.

    Runs inside the retention guard, so it only unlinks and records; a
    pinned segment stops the segments there, so the log left stays one
    unbroken run.

    :raises OSError: an unlink failed; what was unlinked before stays unlinked.
    """
    for path, meta in old:  # newest first: a child never outlives its parent
        if _rel(path) in pinned:
            done.deferred.append(path)
            continue
        files.remove(path)
        done.deleted.append(path)
        done.snapshots.append((path, meta))
    for seg in doomed_segs:
        if seg.name in pinned:
            done.deferred.append(seg.path)
            break
        files.remove(seg.path)
        done.deleted.append(seg.path)
        done.segments.append(seg)


def _tell(store: Path, done: _Deletions, retain: int, oldest: str | None) -> None:
    """Log every deletion and deferral of the pass, then report the deletions as one event."""
    for path in done.deferred:
        _say(logging.INFO, "deletion_deferred", store, file=_rel(path), reason="pinned")
    gone: list[dict[str, str]] = []  # one audit entry per pass, not one per file
    for path, meta in done.snapshots:
        _say(
            logging.INFO, "deleted", store, file=_rel(path), reason="older_than_retained",
            epoch=meta.epoch, retain=retain, oldest_kept=oldest,
        )  # fmt: skip
        gone.append({"file": _rel(path), "reason": "older_than_retained"})
    for seg in done.segments:
        _say(
            logging.INFO, "deleted", store, file=seg.name, reason="covered",
            first_lsn=seg.first_lsn, covered_by=oldest,
        )  # fmt: skip
        gone.append({"file": seg.name, "reason": f"covered by {oldest}"})
    if gone:
        emit(store, "retention_delete", files=gone, count=len(gone))


def _restore_points(
    good: list[tuple[Path, SnapshotMeta]], retain: int, cutoff: int | None = None
) -> tuple[list[tuple[Path, SnapshotMeta]], list[tuple[Path, SnapshotMeta]]]:
    """``(kept restore points, deletable)`` among the verified snapshots ``good`` (newest first).

    A restore point is a verified snapshot whose chain is all in ``good``,
    each link matching. Kept: the newest ``retain``, and with a window every
    one back to the first at or before ``cutoff``. Deletable: older than the
    oldest kept restore point and in none of the kept chains.
    """
    by_name = {p.name: (p, m) for p, m in good}
    kept: list[tuple[Path, SnapshotMeta]] = []
    needed: set[str] = set()
    for path, meta in good:
        if len(kept) >= retain and _before(meta_time(kept[-1][1]), cutoff):
            break
        chain = _chain_names(path, meta, by_name)
        if chain is not None:
            kept.append((path, meta))
            needed |= chain
    if not kept:
        return [], []
    oldest = kept[-1][1].lsn
    old = [(p, m) for p, m in good if m.lsn < oldest and p.name not in needed]
    return kept, old


def _before(t: int | None, cutoff: int | None) -> bool:
    """Whether a snapshot of time ``t`` (None: unknown) is at or before the window's start."""
    return cutoff is None or (t is not None and t <= cutoff)


def _chain_names(
    path: Path, meta: SnapshotMeta, by_name: dict[str, tuple[Path, SnapshotMeta]]
) -> set[str] | None:
    """The names of ``path``'s chain, if every link is verified and matches; else None."""
    names = {path.name}
    while meta.delta is not None:
        parent = by_name.get(meta.delta.parent)
        if parent is None or parent[1].sha256 != meta.delta.parent_sha256:
            return None
        if parent[1].depth != meta.delta.depth - 1 or parent[0].name in names:
            return None
        names.add(parent[0].name)
        meta = parent[1]
    return names


def _parent_of(path: Path) -> str | None:
    """The parent a delta snapshot names, read from its meta unverified (None: a full
    snapshot, or unreadable; retention's plan only)."""
    doc = peek_meta(path)
    return doc.delta.parent if doc is not None and doc.delta is not None else None


def _may_delete(
    snaps: list[tuple[int, int, Path]], segs: list[SegmentInfo], retain: int, anchored: bool
) -> bool:
    """Whether anything could go, judged by names and parent links alone (every snapshot
    assumed good): the cheap plan that spares a pass from hashing every snapshot.
    ``anchored``: False when a window reaches back past every snapshot (no segment goes)."""
    if len(snaps) > retain:
        needed: set[str] = set()
        for _e, _l, path in snaps[:retain]:
            name: str | None = path.name
            while name is not None and name not in needed:
                needed.add(name)
                name = _parent_of(path.parent / name)
        oldest = snaps[retain - 1][1]
        if any(lsn < oldest and p.name not in needed for _e, lsn, p in snaps[retain:]):
            return True
    if not anchored:
        return False
    oldest_lsn = snaps[min(retain, len(snaps)) - 1][1]
    # Segment i ends at first_lsn(i + 1) - 1; the last segment is never deleted.
    return any(nxt.first_lsn - 1 <= oldest_lsn for nxt in segs[1:])


def _covered(
    store: Path, segs: list[SegmentInfo], meta: SnapshotMeta, store_id: uuid.UUID
) -> list[SegmentInfo]:
    """Segments, oldest first, that no replay from the snapshot ``meta`` needs."""
    link = find_link(segs, meta.lsn, meta.chain, store_id)
    if link is not None:
        doomed = segs[:link]
    elif segs and all(s.first_lsn <= meta.lsn for s in segs):
        # The log ends where the snapshot ends: its last segment, sealed at
        # the snapshot's LSN with the snapshot's chain, is kept (the writer
        # continues from it); every one before it is covered.
        last = segs[-1]
        if peek_seal(last.path, last.path.stat().st_size) != (meta.lsn, meta.chain):
            _say(
                logging.WARNING, "segments_kept", store, reason="the last segment does not end "
                "where the oldest kept snapshot does", snapshot_lsn=meta.lsn,
            )  # fmt: skip
            return []
        doomed = segs[:-1]
    else:
        if segs:
            why = "no segment continues the log from the oldest kept snapshot; none is deleted"
            chain = f"{meta.chain:#010x}"
            _say(logging.ERROR, "snapshot_unlinked", store, lsn=meta.lsn, chain=chain, reason=why)
        return []
    doomed = doomed[: max(0, len(segs) - 1)]  # never the last segment
    # By name, segment i ends at first_lsn(i + 1) - 1: every record covered.
    covered = [segs[i + 1].first_lsn - 1 <= meta.lsn for i in range(len(doomed))]
    return list(doomed[: covered.index(False)] if False in covered else doomed)


def _rel(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _say(level: int, event: str, store: Path, **fields: object) -> None:
    log.log(level, "%s", kv(event=event, store=store, **fields))
