"""The recovery ladder: newest verified snapshot that links to the log, then the log tail.

On open, snapshots in ``STORE/snapshots/`` are tried newest first. One is
used only if its SHA-256 verifies (on this read, not at write time) and it
links to the log: the first segment after its LSN starts at LSN + 1 and its
header's ``prev_crc`` equals the snapshot's ``chain`` (a damaged header on
that segment is the log's damage, not a broken link: see :func:`check_link`).
A snapshot that fails either check is logged at ERROR, listed in
``RecoveryReport.rejected`` with the reason, left in place as evidence, and
recovery walks back to the next older one, replaying more of the log. With
no snapshot left, the log must reach back to epoch 1; if it does not,
:class:`ResnapshotRequired` names every file tried and why it was refused.

The chosen snapshot's LMDB image is extracted to ``STORE/base/`` (a
derived cache, rebuilt on every open) under a fresh name, and memory-mapped
as the base level. Images left by an earlier process are deleted by a
background thread: unlinking a large file costs as much as a tenth of a
second, and a restart should not wait for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import uuid
import warnings
from pathlib import Path
from typing import BinaryIO

from statelog.errors import (
    CorruptionError,
    DataLossWarning,
    FormatVersionError,
    ResnapshotRequired,
)
from statelog.events import emit
from statelog.format.wal import (
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    HEADER_SIZE,
    SegmentHeader,
    frame_crc,
)
from statelog.log.reader import peek_seal
from statelog.log.segments import list_segments
from statelog.recovery.replay import LogEnd, recover_log
from statelog.recovery.report import Outcome, RecoveryReport, Rejection
from statelog.state.live import LiveState
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.levels import ImageSources, open_chain, remove_stale_images
from statelog.storage.pins import PIN_DIR, pin
from statelog.storage.snapshots import SnapshotMeta, list_snapshots

__all__ = ["check_link", "install_snapshot", "recover_store"]

log = logging.getLogger("statelog.recovery.replay")


def check_link(wal_dir: Path, meta: SnapshotMeta) -> str | None:
    """Why ``meta`` does not link to the log in ``wal_dir``, or None if it does.

    The first segment after the snapshot's LSN must start at LSN + 1 with a
    header chained to the snapshot's ``chain``. No segment after it is fine:
    the log ends at the snapshot (retention removed what it covers).

    A segment named for LSN + 1 whose header does not verify is the log's
    next segment, damaged: it links unless its first frame verifies and
    chains to another value. The damage is then the log replay's to judge
    (it stops at the snapshot and reports what it loses); refusing the
    snapshot instead would leave no restore point once retention removed the
    log it covers.
    """
    try:
        segments = list_segments(wal_dir)
    except FileNotFoundError:
        segments = []
    later = [s for s in segments if s[1] > meta.lsn]
    if not later:
        covered = [s for s in segments if s[1] <= meta.lsn]
        if not covered:
            return None  # retention removed the whole log the snapshot covers
        # The log ends at the snapshot: its last segment must end in the seal named.
        seal = peek_seal(covered[-1][2], covered[-1][2].stat().st_size)
        if seal != (meta.lsn, meta.chain):
            name = covered[-1][2].name
            return f"{name} does not end in a seal at LSN {meta.lsn} with crc {meta.chain:#010x}"
        return None
    _seq, first_lsn, path = later[0]
    if first_lsn != meta.lsn + 1:
        return f"the log continues at LSN {first_lsn}, not {meta.lsn + 1}"
    with open(path, "rb") as fh:
        head = fh.read(HEADER_SIZE)
        if not SegmentHeader.crc_ok(head):
            return _first_frame_link(fh, path.name, meta.chain)
    prev = SegmentHeader.unpack(head).prev_crc
    if prev != meta.chain:
        return f"{path.name} links to {prev:#010x}, the snapshot ends at {meta.chain:#010x}"
    return None


def _first_frame_link(fh: BinaryIO, name: str, chain: int) -> str | None:
    """Why a segment with a damaged header does not continue ``chain`` (None: it may).

    Only a first frame that verifies on its own can contradict the link (its
    ``prev`` is the header's ``prev_crc``); a length field is trusted only as
    far as the file reaches, so damage never sizes the read.
    """
    size = os.fstat(fh.fileno()).st_size
    fh.seek(HEADER_SIZE)
    head = fh.read(FRAME_HEADER_SIZE)
    if len(head) < FRAME_HEADER_SIZE:
        return None
    crc, length, _type, _pad, _reserved, prev = FRAME_HEADER.unpack(head)
    if length > size - HEADER_SIZE - FRAME_HEADER_SIZE:
        return None
    if frame_crc(head[4:], fh.read(length)) != crc or prev == chain:
        return None
    return (
        f"{name} has a damaged header and its first frame links to {prev:#010x}, not {chain:#010x}"
    )


def install_snapshot(
    files: FileLayer,
    image_dir: Path,
    path: Path,
    store_id: uuid.UUID,
    state: LiveState,
    wal_dir: Path | None = None,
    *,
    shared_images: Path | None = None,
    settle: bool = True,
) -> tuple[SnapshotMeta, str | None]:
    """Verify ``path`` and its chain while extracting them, then map them as ``state``'s base.

    For a delta snapshot every link of its chain is verified
    (:func:`statelog.storage.levels.open_chain`) and the base is the chain's
    stack of images. An image that is still intact (``statelog.storage.image_cache``)
    is mapped instead of being built from the snapshot's body again: one in
    ``image_dir`` (extracted by this store before, or published there by the
    compactor), else a private copy of one in ``shared_images`` (a read-only
    open copies the writer's ``STORE/base`` image rather than map it). With
    ``wal_dir``, the snapshot is installed only if it links to that log;
    otherwise the reason is returned and nothing is installed. ``settle``: an
    image in ``image_dir`` that passes a whole check has its stamp settled
    (only by the owner of ``image_dir``: a writer or a standby, not a read-only
    recovery or a restore's check).

    :raises CorruptionError: the snapshot or a link of its chain did not
        verify (nothing installed).
    """
    files.makedirs(image_dir)
    copy = shared_images if shared_images not in (None, image_dir) else None
    sources = ImageSources(image_dir, (image_dir,), copy, settle)
    chain, base = open_chain(files, path, store_id, sources)
    meta = chain.meta
    for snap, image in zip(chain.snapshots, chain.images, strict=True):
        if image not in chain.made:
            log.info("snapshot=%s event=image_reused image=%s", snap.name, image.name)
    why = check_link(wal_dir, meta) if wal_dir is not None else None
    if why is not None:
        base.close()
        return meta, why
    old = state.swap_base(base, meta.lsn)
    old.close()
    state.epoch = meta.lsn
    state.offsets = dict(meta.offsets)
    state.low_watermark_ms = meta.low_watermark_ms
    state.commit_ms = meta.commit_ms
    return meta, None


def recover_store(
    files: FileLayer,
    layout: StoreLayout,
    store_id: uuid.UUID,
    state: LiveState,
    *,
    image_dir: Path,
    repair: bool,
    strict: bool = False,
    upto: int | None = None,
    settle: bool | None = None,
    values_checked: bool = False,
) -> tuple[RecoveryReport, LogEnd]:
    """Climb the ladder: snapshot (newest that verifies and links), then the log tail.

    :param image_dir: where to extract the chosen snapshot's image (the
        writer's ``STORE/base``; a private temporary directory for a
        read-only open, which changes nothing in the store; a restore's own
        staging ``base/``). Images there other than the ones mapped are removed.
    :param settle: settle the stamp of an image in ``image_dir`` that passes a whole
        check: for the owner of ``image_dir`` (a writer, a standby). Default: ``repair``.
    :param upto: recover the state as of this epoch, not the newest: only
        snapshots at or before it are tried, and the replay stops there
        (without ``repair`` only). The state may end before it (the log ends
        or is damaged first): the caller checks ``state.epoch``.
    :param values_checked: every value in the log was decoded before (a restore's
        staging copy): :func:`~statelog.recovery.replay.recover_log` does not decode them again.

    :raises ResnapshotRequired: no snapshot is usable and the log does not reach epoch 1.
    :raises CorruptionError: ``strict`` and the log tail is damaged.
    :raises StorageError: an I/O error (never taken for damage).
    """
    # Recovery pins every file it may read, so a compactor's retention cannot
    # delete the snapshot or the segments it replays. A read-only open (which
    # promises to change nothing) pins only where ``pins/`` already exists and
    # can be written; its pin file is gone again when recovery returns.
    names = [f"snapshots/{p.name}" for _e, _l, p in list_snapshots(layout.snapshots)]
    with contextlib.suppress(FileNotFoundError):
        names += [f"wal/{p.name}" for _s, _l, p in list_segments(layout.wal)]
    with contextlib.ExitStack() as stack:
        if repair:
            stack.enter_context(pin(layout.root, names, purpose="recovery"))
        elif (layout.root / PIN_DIR).is_dir():
            try:
                stack.enter_context(pin(layout.root, names, purpose="read-only recovery"))
            except OSError as exc:
                log.warning("event=unpinned_recovery reason=%r", exc)
        settles = repair if settle is None else settle
        report, end = _climb(
            files, layout, store_id, state, image_dir, repair, strict, upto, settles,
            values_checked,
        )  # fmt: skip
    _announce(layout.root, report, writable=repair)
    return report, end


def _announce(root: Path, report: RecoveryReport, *, writable: bool) -> None:
    """Emit what this recovery found and did (audit trail, metrics).

    A refused snapshot is a walk-back and an integrity mismatch; damage in
    the log is a mismatch; every byte range moved aside is a truncation.
    """
    for r in report.rejected:
        is_snapshot = r.path.suffix == ".snap"
        if is_snapshot:
            emit(root, "walk_back", writable=writable, file=r.path.name, reason=r.reason,
                 source="recovery")  # fmt: skip
        if is_snapshot or (report.outcome is Outcome.CORRUPTION and r.offset is not None):
            emit(root, "integrity_mismatch", writable=writable, file=r.path.name,
                 offset=r.offset, reason=r.reason, source="recovery")  # fmt: skip
    if writable:
        reason = "corrupt" if report.outcome is Outcome.CORRUPTION else "torn"
        for aside in report.saved_aside:
            emit(
                root,
                "truncation",
                file=_segment_of(aside),
                reason=reason,
                saved_as=aside.name,
                offset=_offset_of(report, aside),
                bytes_dropped=report.truncated_bytes if reason == "torn" else None,
            )
    lost = report.lost_epochs
    _warn_if_lossy(root, report)
    emit(
        root,
        "recovery",
        writable=writable,
        epoch=report.epoch,
        snapshot=report.snapshot.name if report.snapshot else None,
        replay_from=report.epoch - report.replayed + 1 if report.replayed else None,
        replay_to=report.epoch,
        records_replayed=report.replayed,
        outcome=str(report.outcome),
        rejected=[
            {"file": r.path.name, "offset": r.offset, "reason": r.reason} for r in report.rejected
        ],
        lost_epochs=[lost.start, lost.stop - 1] if lost else [],
        seconds=round(report.seconds, 6),
        readonly=not writable,
    )


def _warn_if_lossy(root: Path, report: RecoveryReport) -> None:
    """A :class:`~statelog.errors.DataLossWarning` when the open got less than the files held.

    Shown without any logging set up: lost epochs, and snapshots refused
    (the open fell back to an older restore point and a longer replay).
    """
    refused = [r.path.name for r in report.rejected if r.path.suffix == ".snap"]
    lost = report.lost_epochs
    if not lost and not refused and report.outcome is not Outcome.CORRUPTION:
        return
    parts = [f"statelog: {root} recovered to epoch {report.epoch}"]
    if lost:
        parts.append(f"epochs {lost.start}..{lost.stop - 1} were lost to damage in the log")
    elif report.outcome is Outcome.CORRUPTION:
        parts.append("damage in the log was cut off")
    if refused:
        parts.append(f"damaged snapshots refused: {', '.join(refused)}")
    warnings.warn(
        "; ".join(parts) + " (run `statelog verify` on the store; strict=True raises instead)",
        DataLossWarning,
        stacklevel=2,
    )


def _segment_of(aside: Path) -> str:
    """``X.wal`` of an evidence file ``X.wal.broken[.N]`` or ``X.wal.corrupt[.N]``."""
    name = aside.name
    return name[: name.index(".wal") + 4] if ".wal" in name else name


def _offset_of(report: RecoveryReport, aside: Path) -> int | None:
    base = _segment_of(aside)
    return next((r.offset for r in report.rejected if r.path.name == base), None)


def _climb(
    files: FileLayer,
    layout: StoreLayout,
    store_id: uuid.UUID,
    state: LiveState,
    image_dir: Path,
    repair: bool,
    strict: bool,
    upto: int | None = None,
    settle: bool = False,
    values_checked: bool = False,
) -> tuple[RecoveryReport, LogEnd]:
    started = time.perf_counter()  # the report's seconds include the snapshot's extraction
    rejected: list[Rejection] = []
    for epoch, _lsn, path in list_snapshots(layout.snapshots):
        if upto is not None and epoch > upto:
            continue  # newer than the state asked for
        at: int | None = None
        try:
            # Hash verified on this read, while the image is extracted.
            meta, why = install_snapshot(
                files, image_dir, path, store_id, state, layout.wal, shared_images=layout.base,
                settle=settle,
            )  # fmt: skip
        except (CorruptionError, FormatVersionError) as exc:
            why = getattr(exc, "reason", None) or str(exc)
            at = getattr(exc, "offset", None)
        if why is not None:
            log.error("snapshot=%s event=snapshot_rejected offset=%s reason=%r", path.name, at, why)
            rejected.append(Rejection(path, at, why))
            continue
        report, end = recover_log(
            files,
            layout.wal,
            store_id,
            state,
            repair=repair,
            strict=strict,
            after=(meta.lsn, meta.chain),
            upto=upto,
            values_checked=values_checked,
        )
        remove_stale_images(files, image_dir, keep=_mapped(state))
        return _with(report, path, rejected, started), end
    try:
        report, end = recover_log(
            files, layout.wal, store_id, state, repair=repair, strict=strict, upto=upto,
            values_checked=values_checked,
        )  # fmt: skip
    except ResnapshotRequired as exc:
        if not rejected:
            raise
        tried = [(r.path, r.reason) for r in rejected] + exc.tried
        raise ResnapshotRequired(
            "no snapshot verifies and the log does not reach epoch 1", tried
        ) from exc
    remove_stale_images(files, image_dir, keep=())
    return _with(report, None, rejected, started), end


def _with(
    report: RecoveryReport, snapshot: Path | None, rejected: list[Rejection], started: float
) -> RecoveryReport:
    return dataclasses.replace(
        report,
        snapshot=snapshot,
        rejected=tuple(rejected) + report.rejected,
        seconds=time.perf_counter() - started,
    )


def _mapped(state: LiveState) -> tuple[Path, ...]:
    """The image files ``state``'s base maps (none: the empty base)."""
    return tuple(getattr(state.base, "paths", ()))
