"""Verify a store end to end, read-only: every snapshot hashed, every record of every segment.

:func:`verify_store` is what ``statelog verify`` runs. It does not stop at
the first damage, as recovery must: it reads every file and names every
damaged one with the offset where the damage begins. Then it asks the
recovery ladder itself, read-only, what it would reach, so the verdict can
never disagree with what an open would do:

* ``clean``: nothing damaged, nothing torn, every snapshot verifies and links;
* ``recoverable``: damage was found (a torn tail, a damaged snapshot that
  recovery walks past, a damaged record that stops replay early, a
  damaged file no recovery needs), but an open reaches a consistent epoch;
* ``unrecoverable``: no snapshot verifies and links, and the log does not
  reach back to epoch 1 (or the identity file is damaged): a re-snapshot
  (restore from a backup, or a rebuild from the source) is required.

Order of steps: read ``IDENTITY``; pin every snapshot and segment listed
(:mod:`statelog.storage.pins`, so that a compactor's retention cannot delete them
mid-read; skipped when the store's file system refuses the pin file);
re-hash each snapshot, newest first, and check that it links to the log;
check that each delta snapshot's chain holds (:mod:`statelog.ops.verify_chain`);
scan each segment in log order (header, every frame's checksum, the chain
across frames and across segments, fragments, record epochs, the seal,
and the writer generation: rule H5 of ``docs/format.md``, a generation
below the highest non-zero one before it in the log is a fenced writer's
segment, damage at its header, as recovery judges it);
compare each image in ``base/`` that a writer would map with its snapshot
(:mod:`statelog.ops.verify_base`); run the read-only recovery ladder;
release the pin. Nothing in the store
is written except the transient pin file, which is removed at the end.

The report's records (:class:`VerifyReport`, the checks, :class:`Verdict`)
are :mod:`statelog.ops.verify_report`, re-exported here.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from statelog.errors import CorruptionError, FormatVersionError, ResnapshotRequired, StorageError
from statelog.format.records import RecordSchemaError, decode_record
from statelog.format.snapshot import parse_snapshot_name
from statelog.log.reader import SegmentScan, StopKind, scan_segment
from statelog.log.segments import list_segments
from statelog.ops.verify_base import check_base_images
from statelog.ops.verify_chain import check_chains
from statelog.ops.verify_report import Finding, SegmentCheck, SnapshotCheck, Verdict, VerifyReport
from statelog.recovery.ladder import check_link
from statelog.recovery.readonly import recover_readonly
from statelog.recovery.report import RecoveryReport
from statelog.storage.fileio import FileLayer
from statelog.storage.image_stamp import STAMP_SUFFIX
from statelog.storage.layout import StoreLayout
from statelog.storage.pins import pin
from statelog.storage.snapshots import SnapshotMeta, list_snapshots, verify_snapshot

__all__ = [
    "Finding",
    "ProgressFn",
    "SegmentCheck",
    "SnapshotCheck",
    "Verdict",
    "VerifyReport",
    "verify_store",
]

log = logging.getLogger("statelog.ops.verify")

ProgressFn = Callable[[str, int, int], None]
"""Called after each file: ``(file name, bytes read so far, bytes to read in all)``."""


@dataclass
class _Run:
    root: Path
    files: FileLayer
    store_id: uuid.UUID | None
    total: int
    progress: ProgressFn | None
    done: int = 0
    findings: list[Finding] = field(default_factory=list)
    metas: dict[str, SnapshotMeta] = field(default_factory=dict)  # snapshots that verified

    def read(self, path: Path) -> bytes | None:
        """The bytes of ``path``; None if it vanished since it was listed (not damage)."""
        try:
            data = self.files.read(path)
        except FileNotFoundError:
            log.warning("store=%s event=verify_file_vanished file=%s", self.root, path.name)
            return None
        except OSError as exc:
            raise StorageError(
                f"reading {path} failed: {exc.strerror or exc}",
                errno=exc.errno,
                hint="an I/O error is not damage: fix the device and run verify again",
            ) from exc
        self.tick(path, len(data))
        return data

    def tick(self, path: Path, size: int) -> None:
        self.done += size
        if self.progress is not None:
            self.progress(path.name, self.done, self.total)

    def damaged(self, path: Path, offset: int | None, kind: str, reason: str) -> None:
        log.error(
            "store=%s event=verify_damage file=%s offset=%s kind=%s reason=%r",
            self.root, path.name, offset, kind, reason,
        )  # fmt: skip
        self.findings.append(Finding(path, offset, kind, reason))


def verify_store(path: Path, progress: ProgressFn | None = None) -> VerifyReport:
    """Read every snapshot and segment of the store at ``path``; name all damage; give a verdict.

    Read-only: the only write is a transient pin file under ``pins/`` (see
    the module docstring), removed before returning. A file that vanishes
    while being verified (retention of a store without pins) is noted in
    the log, not reported as damage.

    :param progress: called after each file read (see :data:`ProgressFn`).
    :raises StoreNotFoundError: ``path`` holds no statelog store.
    :raises NotAStoreError: ``path`` is a file.
    :raises FormatVersionError: a file of a format this statelog does not read.
    :raises StorageError: an I/O error while reading (never reported as damage).
    """
    started = time.perf_counter()
    root = Path(path)
    files = FileLayer()
    layout = StoreLayout(root)
    run = _Run(root, files, None, 0, progress)
    try:
        run.store_id = layout.read_identity(files)
    except CorruptionError as exc:
        run.damaged(exc.path, exc.offset, "identity", exc.reason)
    snaps = list_snapshots(layout.snapshots)
    try:
        segs = list_segments(layout.wal)
    except FileNotFoundError:
        segs = []
    run.total = sum(_size(p) for *_, p in snaps) + sum(_size(p) for *_, p in segs)
    names = [f"snapshots/{p.name}" for *_, p in snaps] + [f"wal/{p.name}" for *_, p in segs]
    with _pinned(root, names):
        snap_checks = tuple(_check_snapshot(run, layout, e, lsn, p) for e, lsn, p in snaps)
        snap_checks = check_chains(
            snap_checks, run.metas, lambda p, kind, why: run.damaged(p, None, kind, why)
        )
        _check_base(run, layout)
        seg_checks = tuple(_scan_log(run, segs))
        recovery, why = _ladder(run, layout, bool(segs))
    evidence = tuple(_evidence(layout))
    if why is not None:
        verdict = Verdict.UNRECOVERABLE
    else:
        verdict = Verdict.RECOVERABLE if run.findings else Verdict.CLEAN
    report = VerifyReport(
        root, run.store_id, verdict, snap_checks, seg_checks, tuple(run.findings), recovery,
        why, evidence, run.done, time.perf_counter() - started,
    )  # fmt: skip
    log.info(
        "store=%s event=verified verdict=%s findings=%d bytes=%d seconds=%.3f",
        root, verdict, len(run.findings), run.done, report.seconds,
    )  # fmt: skip
    return report


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _pinned(root: Path, names: list[str]) -> contextlib.ExitStack:
    """Pin ``names`` if the store lets us; a read-only file system verifies without a pin."""
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(pin(root, names, purpose="verify"))
    except OSError as exc:
        log.warning("store=%s event=verify_unpinned reason=%r", root, str(exc))
    return stack


def _check_snapshot(
    run: _Run, layout: StoreLayout, epoch: int, lsn: int, path: Path
) -> SnapshotCheck:
    size = _size(path)
    try:
        meta = verify_snapshot(run.files, path, store_id=run.store_id)
    except CorruptionError as exc:
        run.tick(path, size)
        run.damaged(path, exc.offset, "snapshot", exc.reason)
        return SnapshotCheck(path, epoch, lsn, size, False, False, reason=exc.reason)
    except FormatVersionError as exc:
        # Not damage, but recovery cannot use it either: it walks past it.
        run.tick(path, size)
        run.damaged(path, 8, "snapshot", exc.message)
        return SnapshotCheck(path, epoch, lsn, size, False, False, reason=exc.message)
    except FileNotFoundError:
        return SnapshotCheck(path, epoch, lsn, 0, False, False, reason="vanished during verify")
    except OSError as exc:
        raise StorageError(f"reading {path} failed: {exc}", errno=exc.errno) from exc
    run.tick(path, size)
    run.metas[path.name] = meta
    why = check_link(layout.wal, meta)  # a finding unless a chain needs it: check_chains
    return SnapshotCheck(path, epoch, lsn, size, True, why is None, meta.created_ms, why)


def _check_base(run: _Run, layout: StoreLayout) -> None:
    """Name every image in ``base/`` that a writer would map although it lies about its
    snapshot (:mod:`statelog.ops.verify_base`)."""
    if run.store_id is None:
        return
    try:
        mismatches = check_base_images(layout.base, layout.snapshots, run.store_id)
    except OSError as exc:
        raise StorageError(f"reading {layout.base} failed: {exc}", errno=exc.errno) from exc
    for m in mismatches:
        run.damaged(
            m.image,
            None,
            "base",
            f"{m.reason}; the writer's next open would map it: remove it and its "
            f"{STAMP_SUFFIX} stamp, and the open builds the image from {m.snapshot.name} again",
        )


@dataclass
class _Expect:
    """What the next segment must continue from; ``None``: unknown after damage."""

    sequence: int
    lsn: int | None
    chain: int | None


def _scan_log(run: _Run, segs: list[tuple[int, int, Path]]) -> Iterator[SegmentCheck]:
    """Scan every segment in log order, past damage too, checking links across segments.

    Rule H5 runs over the whole log present, segments covered by a snapshot
    included: a zombie's segment that a compactor folded is still named.
    """
    expect: _Expect | None = None
    highest = 0  # the highest non-zero writer generation named by a header so far
    for i, (seq, lsn, path) in enumerate(segs):
        data = run.read(path)
        if data is None:
            expect = None
            yield SegmentCheck(path, seq, lsn, 0, 0, lsn - 1, False, "vanished")
            continue
        chain: int | None = 0 if lsn == 1 else None
        if expect is not None:
            chain = expect.chain
            if seq != expect.sequence + 1:
                run.damaged(path, 0, "log", f"segment {expect.sequence + 1} is missing")
                chain = None
            elif expect.lsn is not None and lsn != expect.lsn:
                run.damaged(path, 0, "log", f"the log continues at LSN {lsn}, not {expect.lsn}")
                chain = None
        scan = scan_segment(
            path, data, store_id=run.store_id, prev_crc=chain, is_last=i == len(segs) - 1
        )
        kind, offset, reason, count = _judge(scan, seq, lsn, highest)
        if scan.header is not None:
            highest = max(highest, scan.header.generation)
        last = lsn - 1 + count
        sealed = scan.sealed_lsn is not None
        if kind is StopKind.CLEAN:
            expect = _Expect(seq, last + 1, scan.end_crc)
            yield SegmentCheck(path, seq, lsn, len(data), count, last, sealed, "ok")
            continue
        status = "torn" if kind is StopKind.TORN else "corrupt"
        run.damaged(path, offset, "torn-tail" if status == "torn" else "segment", reason)
        expect = _Expect(seq, None, None)
        yield SegmentCheck(path, seq, lsn, len(data), count, last, sealed, status, offset, reason)


def _judge(scan: SegmentScan, seq: int, lsn: int, highest: int) -> tuple[StopKind, int, str, int]:
    """The stop of ``scan``, widened by the checks recovery makes above the frame level.

    :param highest: the highest non-zero generation in the headers before it (rule H5).
    Returns ``(kind, offset, reason, records that verified and decoded in order)``.
    """
    header = scan.header
    if scan.stop.kind is not StopKind.CLEAN and scan.stop.offset == 0:
        return scan.stop.kind, 0, scan.stop.reason, 0
    if header is not None and (header.sequence, header.first_lsn) != (seq, lsn):
        return StopKind.CORRUPT, 0, "header disagrees with the file name", 0
    if header is not None and header.generation and header.generation < highest:
        why = f"generation {header.generation} after {highest}: a fenced writer's segment"
        return StopKind.CORRUPT, 0, why, 0
    count = 0
    for rec in scan.records:
        try:
            decoded = decode_record(rec.payload)
        except RecordSchemaError as exc:
            return StopKind.CORRUPT, rec.offset, exc.message, count
        if decoded.epoch != lsn + count:
            why = f"epoch {decoded.epoch} where {lsn + count} was expected"
            return StopKind.CORRUPT, rec.offset, why, count
        count += 1
    if scan.sealed_lsn is not None and scan.sealed_lsn != lsn - 1 + count:
        assert scan.seal_offset is not None
        why = f"seal names LSN {scan.sealed_lsn}, the segment ends at {lsn - 1 + count}"
        return StopKind.CORRUPT, scan.seal_offset, why, count
    return scan.stop.kind, scan.stop.offset, scan.stop.reason, count


def _ladder(
    run: _Run, layout: StoreLayout, has_log: bool
) -> tuple[RecoveryReport | None, str | None]:
    """What a read-only open reaches, or why it cannot: the verdict's source of truth.

    Whatever recovery refuses is added to the findings if the scan did not
    already name that file (so verify names every file recovery would touch).
    """
    if run.store_id is None:
        return None, "the identity file is damaged: no open can identify the log"
    try:
        with recover_readonly(layout.root) as ro:
            report = ro.report
    except ResnapshotRequired as exc:
        seen = {f.path for f in run.findings}
        for p, why in exc.tried:
            if p not in seen:
                run.damaged(p, None, "log", why)
        if not has_log and layout.wal not in seen:
            run.damaged(layout.wal, None, "log", "no segment is left in wal/")
        return None, exc.message
    named = {(f.path, f.offset) for f in run.findings} | {(f.path, None) for f in run.findings}
    for rej in report.rejected:
        if (rej.path, rej.offset) not in named:
            run.damaged(rej.path, rej.offset, "recovery", rej.reason)
    return report, None


def _evidence(layout: StoreLayout) -> Iterator[Path]:
    """Files earlier recoveries and compactions left: kept on purpose, never damage; and
    entries named like a snapshot that are not regular files, which no reader opens
    (:func:`~statelog.storage.listing.regular_files`): shown so that an operator can
    remove them. (One named like a segment fails the listing of the log instead.)"""
    for d, marks in ((layout.wal, (".broken", ".corrupt", ".tmp")), (layout.snapshots, (".tmp",))):
        with contextlib.suppress(FileNotFoundError):
            for p in sorted(d.iterdir()):
                if any(m in p.name for m in marks) or (
                    d == layout.snapshots and parse_snapshot_name(p) and not p.is_file()
                ):
                    yield p
    scratch = layout.root / "compactor.tmp"
    if scratch.exists():
        yield scratch
