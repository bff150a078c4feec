"""Retention: keep N verified snapshots and the log they need; delete the rest, loudly.

Rules (invariant 8 of docs/architecture.md):

* Keep the ``retain`` newest snapshots that verify. A snapshot that fails
  verification is kept as evidence, never deleted and never counted; one
  that cannot be read (I/O error, newer format) is kept and not counted.
  Verified snapshots older than the ``retain`` kept are deleted.
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
pins and unlink the unpinned files, snapshots oldest first, then segments
oldest first, each through ``FileLayer.remove`` and logged; then fsync
``snapshots/`` and ``wal/``. A crash in between leaves a subset deleted,
oldest first, which is itself a valid retention state.

Verifying costs a read of every snapshot, so it runs only when the cheap
plan (names only, assuming every snapshot verifies) finds something to
delete: a pass that wrote no new snapshot usually deletes nothing.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

from statelog.compaction.logfmt import LOGGER, kv
from statelog.compaction.tail import SegmentInfo, find_link, list_segment_infos, peek_seal
from statelog.errors import CorruptionError, FormatVersionError
from statelog.events import emit
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import SNAPSHOT_DIR, WAL_DIR
from statelog.storage.pins import ALL, pinned_names, retention_guard
from statelog.storage.snapshots import SnapshotMeta, list_snapshots, verify_snapshot

__all__ = ["RetentionResult", "apply_retention"]

log = logging.getLogger(LOGGER)


@dataclass(frozen=True)
class RetentionResult:
    kept: tuple[Path, ...] = ()  # verified snapshots kept (newest first)
    deleted: tuple[Path, ...] = ()  # files removed, in the order removed
    damaged: tuple[Path, ...] = ()  # snapshots that failed verification (kept)
    deferred: tuple[Path, ...] = ()  # files retention wanted gone but found pinned


def apply_retention(
    store: Path, files: FileLayer, store_id: uuid.UUID, *, retain: int
) -> RetentionResult:
    """Apply the retention rules (module docstring) to ``store``.

    :raises OSError: listing, verifying, unlinking or an fsync failed; what
        was unlinked before the failure stays unlinked (all of it unneeded).
    """
    snaps = list_snapshots(store / SNAPSHOT_DIR)
    segs = list_segment_infos(store / WAL_DIR)
    if not snaps or not _may_delete(snaps, segs, retain):
        return RetentionResult()
    good: list[tuple[Path, SnapshotMeta]] = []
    damaged: list[Path] = []
    for _, _, path in snaps:
        try:
            good.append((path, verify_snapshot(files, path, store_id=store_id)))
        except CorruptionError as exc:
            _say(logging.ERROR, "snapshot_damaged", store, file=_rel(path), reason=exc.reason)
            damaged.append(path)
        except (FormatVersionError, OSError) as exc:
            _say(logging.WARNING, "snapshot_unreadable", store, file=_rel(path), reason=str(exc))
    kept, old = good[:retain], good[retain:]
    doomed_segs = _covered(store, segs, kept[-1][1], store_id) if kept else []
    deleted: list[Path] = []
    deferred: list[Path] = []
    gone: list[dict[str, str]] = []  # reported once per pass: one audit entry, not one per file
    oldest = _rel(kept[-1][0]) if kept else None
    with retention_guard(store):
        pinned = pinned_names(store)
        if ALL in pinned:
            _say(logging.WARNING, "retention_deferred", store, reason="an unreadable live pin")
            return RetentionResult(tuple(p for p, _ in kept), (), tuple(damaged))
        for path, meta in reversed(old):
            if _rel(path) in pinned:
                _say(logging.INFO, "deletion_deferred", store, file=_rel(path), reason="pinned")
                deferred.append(path)
                continue
            files.remove(path)
            deleted.append(path)
            _say(
                logging.INFO, "deleted", store, file=_rel(path), reason="older_than_retained",
                epoch=meta.epoch, retain=retain, oldest_kept=oldest,
            )  # fmt: skip
            gone.append({"file": _rel(path), "reason": "older_than_retained"})
        for seg in doomed_segs:
            if seg.name in pinned:
                _say(logging.INFO, "deletion_deferred", store, file=seg.name, reason="pinned")
                deferred.append(seg.path)
                break  # keep the log one unbroken run
            files.remove(seg.path)
            deleted.append(seg.path)
            _say(
                logging.INFO, "deleted", store, file=seg.name, reason="covered",
                first_lsn=seg.first_lsn, covered_by=oldest,
            )  # fmt: skip
            gone.append({"file": seg.name, "reason": f"covered by {oldest}"})
    for d in {p.parent for p in deleted}:
        files.fsync_dir(d)
    if gone:
        emit(store, "retention_delete", files=gone, count=len(gone))
    return RetentionResult(
        tuple(p for p, _ in kept), tuple(deleted), tuple(damaged), tuple(deferred)
    )


def _may_delete(snaps: list[tuple[int, int, Path]], segs: list[SegmentInfo], retain: int) -> bool:
    """Whether anything could go, judged by names alone (every snapshot assumed good)."""
    if len(snaps) > retain:
        return True
    oldest_lsn = snaps[-1][1]  # all kept, the oldest one included
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
