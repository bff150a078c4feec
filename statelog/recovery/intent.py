"""The intent of a rewind in place, ``STORE/REWIND``: reading it, and checking it
against the log before anyone trusts it (:mod:`statelog.recovery.rewind` writes and
carries it out; a read-only open reads the state it names).

The file may come from anywhere: it is read bounded, from a regular file only,
its fields checked, and the log must end the named epoch's record at the
named cut (or, without one, at the end of the segment holding it, or a
snapshot must stand at the epoch) before it moves a file or decides what a
reader sees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from statelog.errors import CorruptionError
from statelog.format.records import RecordSchemaError, decode_record
from statelog.format.wal import HEADER_SIZE
from statelog.log.reader import scan_segment
from statelog.log.segments import list_segments
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import REWIND, StoreLayout
from statelog.storage.marks import read_mark
from statelog.storage.snapshots import list_snapshots

__all__ = ["checked_rewind", "pending_rewind"]


def pending_rewind(root: Path) -> dict[str, Any] | None:
    """The intent of an unfinished rewind of ``root`` (None: there is none).

    :raises CorruptionError: ``REWIND`` exists but is not a rewind's intent.
    """
    doc = read_mark(root / REWIND)
    if doc is None:
        return None
    try:
        epoch, evidence, cut = doc["epoch"], doc["evidence"], doc["cut"]
        ok = (
            isinstance(epoch, int)
            and not isinstance(epoch, bool)
            and epoch >= 0
            and isinstance(evidence, str)
            and evidence.startswith(".rewound-")
            and _plain(evidence[1:])
            and (cut is None or (_plain(cut["file"]) and _offset(cut["offset"])))
        )
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise CorruptionError(
            root / REWIND, 0, "not the intent of a rewind statelog wrote",
            hint="move REWIND aside and open the store; it was not written by statelog",
        )  # fmt: skip
    return doc


def _offset(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= HEADER_SIZE


def _plain(name: object) -> bool:
    """A plain file name: no directory part, nothing hidden, bounded."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= 255
        and "/" not in name
        and "\0" not in name
        and not name.startswith(".")
    )


def check_intent(
    layout: StoreLayout, epoch: int, cut: dict[str, Any] | None, files: FileLayer
) -> None:
    """Refuse an intent that does not describe this store, before anything moves: the
    log must end epoch ``epoch``'s record at the cut (or, without one, at the end of
    the segment holding it, or a snapshot must be at ``epoch``).

    :raises CorruptionError: it does not (a planted or foreign ``REWIND``).
    """
    if cut is not None:
        segment, offset = layout.wal / cut["file"], int(cut["offset"])
    else:
        holders = [p for _s, first, p in list_segments(layout.wal) if first <= epoch]
        snaps = {e for e, _l, _p in list_snapshots(layout.snapshots)}
        if not holders:
            if epoch in snaps or epoch == 0:
                return
            raise _foreign(layout.root, f"no segment or snapshot holds epoch {epoch}")
        segment, offset = holders[-1], -1
    try:
        data = files.read(segment)
    except FileNotFoundError:
        raise _foreign(layout.root, f"{segment.name} is not in the log") from None
    end = len(data) if offset < 0 else min(offset, len(data))
    scan = scan_segment(segment, data[:end], store_id=None, prev_crc=None, is_last=True)
    last = scan.records[-1] if scan.records else None
    try:
        ok = last is not None and decode_record(last.payload).epoch == epoch
    except RecordSchemaError:
        ok = False
    if offset >= 0:
        ok = ok and last is not None and last.end == offset
    elif not ok:
        ok = scan.sealed_lsn == epoch
    if not ok:
        raise _foreign(layout.root, f"the log does not end epoch {epoch} where REWIND says")


def _foreign(root: Path, why: str) -> CorruptionError:
    return CorruptionError(
        root / REWIND, 0, f"not the intent of a rewind of this store: {why}",
        hint="move REWIND aside and open the store; nothing was moved or cut",
    )  # fmt: skip


def checked_rewind(root: Path, files: FileLayer | None = None) -> dict[str, Any] | None:
    """:func:`pending_rewind`, checked against the log (:func:`check_intent`).

    :raises CorruptionError: ``REWIND`` is not a rewind's intent for this store.
    """
    doc = pending_rewind(root)
    if doc is not None:
        check_intent(StoreLayout(root), int(doc["epoch"]), doc["cut"], files or FileLayer())
    return doc
