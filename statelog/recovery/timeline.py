"""Point in time, read side: an epoch found by time, and the state as of an epoch.

Every commit record carries the wall-clock time of its commit (``commit_ms``,
non-decreasing along the log), and a snapshot's meta the time of its epoch's
commit. :func:`epoch_at` answers "the last epoch committed at or before
this time": it merges the times of the retained snapshots (read from their
meta, a hint only: the state is verified when it is opened) and of every
verified record of the retained log, in epoch order, and stops at the first
time after the one asked. A record or snapshot written before statelog
recorded commit times has no time and is passed over, so the answer is
never later than the truth.

:func:`recover_at` recovers the state as of exactly one epoch, read-only:
the newest snapshot at or before it that verifies and links, then the log
up to it (:func:`~statelog.recovery.ladder.recover_store` with ``upto``).
It changes no byte of the store and pins what it reads, as any read-only
open does. An epoch it cannot rebuild raises
:class:`~statelog.errors.EpochUnavailableError` naming what it can.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from statelog.errors import (
    EpochUnavailableError,
    InvalidOptionError,
    ResnapshotRequired,
)
from statelog.format.records import RecordSchemaError, decode_record
from statelog.log.reader import StopKind, scan_segment
from statelog.log.segments import list_segments
from statelog.recovery.intent import checked_rewind
from statelog.recovery.readonly import ReadOnlyRecovery, recover_readonly
from statelog.recovery.report import Outcome
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.snapshot_read import peek_meta
from statelog.storage.snapshots import list_snapshots

__all__ = ["epoch_at", "oldest_restorable", "recover_at", "snapshot_commit_ms", "to_ms"]

_MS = 1000
_UNIX = datetime(1970, 1, 1, tzinfo=UTC)


def to_ms(when: datetime) -> int:
    """``when`` as Unix milliseconds.

    :raises InvalidOptionError: not a datetime, or one without a time zone.
    """
    if not isinstance(when, datetime):
        raise InvalidOptionError(f"{when!r} is not a datetime", hint="pass a datetime or an epoch")
    if when.tzinfo is None or when.utcoffset() is None:
        raise InvalidOptionError(
            f"{when.isoformat()} has no time zone",
            hint="give one, e.g. datetime(2026, 12, 5, 9, 14, tzinfo=timezone.utc); a naive "
            "time would be read in whatever zone this host runs in",
        )
    # Floored, in integers: "at or before" must never take a commit made after it.
    return (when - _UNIX) // timedelta(milliseconds=1)


def snapshot_commit_ms(path: Path) -> int:
    """The commit time a snapshot's meta names (0: none, or not a readable snapshot), read
    bounded and unverified: a hint for choosing where to start, never a state."""
    doc = peek_meta(path)
    return 0 if doc is None else int(doc.commit_ms)


def _snapshot_times(root: Path) -> list[tuple[int, int]]:
    """``(epoch, commit_ms)`` of each snapshot whose meta names a time."""
    out = []
    for epoch, _lsn, path in list_snapshots(StoreLayout(root).snapshots):
        t = snapshot_commit_ms(path)
        if t:
            out.append((epoch, t))
    return out


def _log_times(root: Path, after: int, files: FileLayer) -> list[tuple[int, int]]:
    """``(epoch, commit_ms)`` of the retained log's verified records after epoch ``after``,
    in order, up to the first damage."""
    segments = list_segments(StoreLayout(root).wal)
    out: list[tuple[int, int]] = []
    for i, (_seq, _first, path) in enumerate(segments):
        if i + 1 < len(segments) and segments[i + 1][1] <= after + 1:
            continue  # every record of it is at or before ``after``
        data = files.read(path)
        scan = scan_segment(
            path, data, store_id=None, prev_crc=None, is_last=i == len(segments) - 1
        )
        for rec in scan.records:
            try:
                decoded = decode_record(rec.payload)
            except RecordSchemaError:
                return out
            if decoded.epoch > after and decoded.commit_ms:
                out.append((decoded.epoch, decoded.commit_ms))
        if scan.stop.kind is not StopKind.CLEAN:
            break
    return out


def epoch_at(root: Path, when: datetime, files: FileLayer | None = None) -> int:
    """The last epoch committed at or before ``when`` that the store at ``root`` retains.

    :raises InvalidOptionError: ``when`` has no time zone.
    :raises EpochUnavailableError: every retained commit with a time is after
        ``when`` (the message names the oldest and its time).
    :raises StoreNotFoundError: ``root`` holds no store.
    :raises OSError: a file could not be read.
    """
    files = files or FileLayer()
    limit = to_ms(when)
    StoreLayout(root).read_identity(files)
    pending = checked_rewind(root, files)
    cap = int(pending["epoch"]) if pending is not None else None  # the rewound store's end
    snaps = sorted(_snapshot_times(root))
    start = max((e for e, t in snaps if t <= limit), default=0)
    points = sorted([*snaps, *_log_times(root, start, files)])
    if cap is not None:
        points = [(e, t) for e, t in points if e <= cap]
    found: int | None = None
    for epoch, t in points:
        if t > limit:
            break
        found = epoch
    if found is None:
        first = points[0] if points else None
        raise EpochUnavailableError(
            f"no commit the store at {root} retains was made at or before {when.isoformat()}"
            + (f"; the oldest is epoch {first[0]} at {_iso(first[1])}" if first else ""),
            epoch=None,
            oldest=first[0] if first else None,
            newest=None,
        )
    return found


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / _MS).astimezone().isoformat(timespec="milliseconds")


def oldest_restorable(root: Path) -> int | None:
    """The oldest epoch the store at ``root`` can rebuild, as its file names say (None:
    nothing). Epoch 1 when the log reaches back to the start; else the oldest
    snapshot the log continues from. Not verified: a view of it checks everything."""
    try:
        segments = list_segments(StoreLayout(root).wal)
    except FileNotFoundError:
        segments = []
    if segments and segments[0][1] == 1:
        return 1
    first = segments[0][1] if segments else None
    snaps = [e for e, _l, _p in list_snapshots(StoreLayout(root).snapshots)]
    usable = [e for e in snaps if first is None or e + 1 >= first]
    return min(usable, default=None)


def recover_at(
    root: Path, at: int | datetime, *, files: FileLayer | None = None, strict: bool = False
) -> ReadOnlyRecovery:
    """The state of the store at ``root`` as of epoch ``at`` (or the epoch :func:`epoch_at`
    finds for a time), read-only (module docstring).

    :raises InvalidOptionError: ``at`` is neither an epoch (an int >= 0) nor a
        datetime with a time zone.
    :raises EpochUnavailableError: that epoch cannot be rebuilt: retention
        removed what it needs, it is after the newest epoch, or damage in the
        log stops the replay before it (the message says which, and the range).
    :raises StatelogError: as :func:`~statelog.recovery.readonly.recover_readonly`.
    """
    root = Path(root)
    if isinstance(at, datetime):
        epoch = epoch_at(root, at, files)
    elif isinstance(at, int) and not isinstance(at, bool) and at >= 0:
        epoch = at
    else:
        raise InvalidOptionError(
            f"at={at!r}", hint="an epoch (an int >= 0) or a datetime with a time zone"
        )
    try:
        ro = recover_readonly(root, files=files, strict=strict, upto=epoch)
    except ResnapshotRequired as exc:
        oldest = oldest_restorable(root)
        raise EpochUnavailableError(
            f"epoch {epoch} of {root} cannot be rebuilt: no snapshot at or before it "
            f"verifies and the log does not reach back to it; the oldest epoch that can "
            f"be rebuilt is {oldest}",
            epoch=epoch, oldest=oldest, newest=None,
        ) from exc  # fmt: skip
    reached, report = ro.state.epoch, ro.report
    if reached == epoch:
        return ro
    ro.close()
    if report.outcome is Outcome.CORRUPTION:
        why = f"the log is damaged after epoch {reached} (run `statelog verify`)"
    else:
        why = f"the newest epoch it holds is {reached}"
    raise EpochUnavailableError(
        f"epoch {epoch} of {root} cannot be rebuilt: {why}",
        epoch=epoch, oldest=oldest_restorable(root), newest=reached,
    )  # fmt: skip
