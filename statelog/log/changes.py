"""The changes feed: every committed epoch after a given one, read back from the retained log.

:func:`read_changes` walks the segments of ``STORE/wal`` in log order and yields one
:class:`Change` per commit record after ``since``: its epoch, the offsets it
advanced, its watermark, and per table the keys it put (values decoded) and
deleted. It is how a downstream system consumes a store as change data capture,
how ``statelog tail`` prints a store's history, and what a standby follows.

Every record is verified as recovery verifies it: the segment header (magic,
checksum, store id, its name, the writer generation of rule H5), the chain from
frame to frame and from each sealed segment into the next, the record schema,
and consecutive epochs. The first segment read is the one exception: its link
to the segment before it is not checked, because that segment may be gone.

Outcomes, kept apart as the reader keeps them:

* the end of what is written (a clean end or a torn tail of the newest segment):
  the feed ends, or with ``follow`` waits for more;
* damage anywhere else: the changes before it are yielded, then
  :class:`~statelog.errors.CorruptionError` is raised naming the file and offset;
* the changes after ``since`` are no longer in the log (compaction folded them
  into a snapshot and retention deleted their segments):
  :class:`~statelog.errors.ChangesUnavailableError`, naming the oldest epoch left;
* an I/O error: :class:`~statelog.errors.StorageError`, never taken for damage.

The segment being read is pinned (``statelog.storage.pins``) while the feed reads
it or waits on it, so retention cannot delete it, nor any segment after it.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statelog.errors import (
    ChangesUnavailableError,
    CorruptionError,
    InvalidOptionError,
    StorageError,
)
from statelog.format.records import (
    DECODE_ERRORS,
    CommitRecord,
    Key,
    RecordSchemaError,
    decode_record_values,
    decode_value,
)
from statelog.log.reader import SegmentScan, StopKind, peek_generation, scan_segment
from statelog.log.segments import list_segments
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.pins import PIN_DIR, pin

__all__ = ["Change", "LogRecord", "TableChange", "read_changes", "read_records"]

log = logging.getLogger("statelog.log.changes")

_HINT = "run `statelog verify STORE` to see the damage; the changes before it were yielded"


@dataclass(frozen=True, slots=True)
class TableChange:
    """What one commit did to one table: ``puts`` (key -> value) and ``deletes``.

    Within a commit a key is either put or deleted, never both.
    """

    puts: Mapping[Key, Any]
    deletes: tuple[Key, ...] = ()


@dataclass(frozen=True, slots=True)
class Change:
    """One committed epoch as its record holds it.

    ``offsets`` are the partitions this commit advanced (the store's committed
    offsets are these merged over every earlier commit's); ``low_watermark_ms``
    is the watermark committed with it.
    """

    epoch: int
    offsets: Mapping[str, int]
    low_watermark_ms: int
    tables: Mapping[str, TableChange] = field(default_factory=dict)
    commit_ms: int = 0
    """When it was committed (Unix ms; 0: written before statelog recorded it)."""

    @property
    def updates(self) -> int:
        """Puts plus deletes, over every table."""
        return sum(len(t.puts) + len(t.deletes) for t in self.tables.values())


def _change(r: LogRecord) -> Change:
    rec = r.record
    tables: dict[str, TableChange] = {}
    try:
        for i, t in enumerate(rec.tables):
            old = tables.get(t.name)
            puts = dict(old.puts) if old else {}
            for k in t.deletes:
                puts.pop(k, None)
            values = r.values[i] if r.values is not None else map(decode_value, t.values)
            puts.update(zip(t.keys, values, strict=True))
            dels = tuple(old.deletes) if old else ()
            tables[t.name] = TableChange(puts, dels + tuple(t.deletes))
    except DECODE_ERRORS as exc:  # decode_record checked every value: damage past the checks
        raise CorruptionError(
            r.path, r.offset, f"a value does not decode: {exc}", hint=_HINT
        ) from exc
    return Change(rec.epoch, dict(rec.offsets), rec.low_watermark_ms, tables, rec.commit_ms)


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One verified commit record as the log holds it, for a reader that applies it
    (a standby): values still encoded, and where it was read."""

    record: CommitRecord
    sequence: int
    """The sequence of the segment that holds it."""
    path: Path
    offset: int
    size: int
    """Its bytes in the log, frames included."""
    values: list[list[Any]] | None = None
    """Each table's values decoded, if asked for (``read_records(values=True)``)."""


Segment = tuple[int, int, Path]
"""``(sequence, first_lsn, path)``, as :func:`~statelog.log.segments.list_segments` lists it."""


@dataclass(slots=True)
class _Cursor:
    """Where the feed stands: the segment it reads and what that segment must link to."""

    sequence: int
    chain: int | None
    """What the segment's header must link to (None: the first segment read, not checked)."""
    epoch: int
    """The epoch before the segment's first record."""
    generation: int
    """The highest non-zero writer generation before the segment (rule H5)."""
    last: int
    """The last epoch yielded, or ``since``."""


class _Pin:
    """The one segment the feed holds pinned; the next is pinned before this one is let go.

    A store whose ``pins/`` cannot be written (a read-only file system) is
    read unpinned, with a warning: retention may then delete a segment
    before it is read, which the feed reports as changes no longer held.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.name: str | None = None
        self._held: contextlib.ExitStack | None = None

    def hold(self, name: str) -> bool:
        """Pin ``name`` (if not pinned already); whether it is gone."""
        if name == self.name:
            return not (self.root / name).exists()
        held = contextlib.ExitStack()
        gone = not (self.root / name).exists()
        if (self.root / PIN_DIR).is_dir():
            try:
                gone = name in held.enter_context(pin(self.root, [name], purpose="changes")).missing
            except OSError as exc:
                log.warning("event=unpinned_changes store=%s reason=%r", self.root, exc)
        self.release()
        self.name, self._held = name, held
        return gone

    def release(self) -> None:
        if self._held is not None:
            self._held.close()
        self.name, self._held = None, None


def read_changes(
    root: Path,
    since: int = 0,
    *,
    files: FileLayer | None = None,
    follow: bool = False,
    poll: float = 0.5,
    upto: Callable[[], int] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Generator[Change, None, None]:
    """Yield every committed epoch after ``since`` in ``root``'s log, in order (module doc).

    Close the iterator (or read it to its end) to release the pin it holds.

    :param since: yield epochs ``since + 1`` on (0: from the first epoch).
    :param follow: at the end of what is written, wait ``poll`` seconds and look
        again, until ``stop()`` returns True or the caller closes the iterator.
    :param upto: the highest epoch that may be yielded now (a writer's durable
        epoch); None: every epoch in the files.
    :raises InvalidOptionError: ``since`` is not an int >= 0, or ``poll`` is not > 0.
    :raises StoreNotFoundError: ``root`` holds no store.
    :raises ChangesUnavailableError: the log no longer holds epoch ``since + 1``.
    :raises CorruptionError: damage in the log; the changes before it were yielded.
    :raises FormatVersionError: a segment of a newer format.
    :raises StorageError: an I/O error (never taken for damage).
    """
    records = read_records(
        root, since, files=files, follow=follow, poll=poll, upto=upto, stop=stop, values=True
    )
    try:
        for r in records:
            yield _change(r)
    finally:
        records.close()


def read_records(
    root: Path,
    since: int = 0,
    *,
    files: FileLayer | None = None,
    follow: bool = False,
    poll: float = 0.5,
    upto: Callable[[], int] | None = None,
    stop: Callable[[], bool] | None = None,
    values: bool = False,
) -> Generator[LogRecord, None, None]:
    """:func:`read_changes`, as the verified records themselves (values still encoded;
    with ``values``, also decoded: :attr:`LogRecord.values`)."""
    if not isinstance(since, int) or isinstance(since, bool) or since < 0:
        raise InvalidOptionError(f"since={since!r}", hint="give an epoch: an int >= 0")
    if not isinstance(poll, int | float) or not poll > 0:
        raise InvalidOptionError(f"poll={poll!r}", hint="give a positive number of seconds")
    files = files or FileLayer()
    layout = StoreLayout(root)
    store_id = layout.read_identity(files)
    held = _Pin(root)
    try:
        cur: _Cursor | None = None
        while True:
            segments = _list(layout.wal)
            if cur is None:
                cur = _start(root, segments, since)
            relist = False
            if cur is not None:
                rest = _from(root, segments, cur)
                relist = yield from _read_on(root, files, store_id, rest, cur, upto, held, values)
            if relist:
                continue
            if not follow or (stop is not None and stop()):
                return
            time.sleep(poll)
    finally:
        held.release()


def _list(wal: Path) -> list[Segment]:
    try:
        return list_segments(wal)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorageError(f"listing {wal} failed: {exc}", errno=exc.errno) from exc


def _start(root: Path, segments: list[Segment], since: int) -> _Cursor | None:
    """The cursor at the segment holding epoch ``since + 1``; None for an empty log."""
    if not segments:
        return None
    at = [i for i, (_s, first, _p) in enumerate(segments) if first <= since + 1]
    if not at:
        raise ChangesUnavailableError(root, since, segments[0][1])
    i = at[-1]
    generation = 0
    if i > 0:
        with contextlib.suppress(OSError):  # a baseline only, as recovery takes it
            generation = peek_generation(segments[i - 1][2])
    return _Cursor(segments[i][0], None, segments[i][1] - 1, generation, since)


def _from(root: Path, segments: list[Segment], cur: _Cursor) -> list[Segment]:
    """The segments from the cursor's on; empty while the next one is not written yet.

    :raises ChangesUnavailableError: the cursor's segment is gone and later ones exist
        (deleted before it could be pinned).
    """
    rest = [s for s in segments if s[0] >= cur.sequence]
    # A gap in the sequence is fine while the segment before it is still there
    # (the pin keeps it): the chain then links across the gap.
    before = any(s[0] < cur.sequence for s in segments)
    if rest and rest[0][0] != cur.sequence and not before:
        raise ChangesUnavailableError(root, cur.last, segments[0][1])
    return rest


def _read_on(
    root: Path,
    files: FileLayer,
    store_id: uuid.UUID,
    segments: list[Segment],
    cur: _Cursor,
    upto: Callable[[], int] | None,
    held: _Pin,
    values: bool = False,
) -> Generator[LogRecord, None, bool]:
    """Yield from ``segments`` on; return whether every one was sealed (list again)."""
    for n, seg in enumerate(segments):
        is_last = n == len(segments) - 1
        scan = _scan(root, files, store_id, seg, cur, is_last, held)
        path, epoch = seg[2], cur.epoch
        limit = upto() if upto is not None else None
        for rec in scan.records:
            if epoch < cur.last:
                # Read before (or before ``since``): its frames verified in this scan, and
                # the first record decoded below checks that the epochs line up.
                epoch += 1
                continue
            try:
                decoded, decoded_values = decode_record_values(rec.payload, keep=values)
            except RecordSchemaError as exc:
                raise CorruptionError(path, rec.offset, exc.message, hint=_HINT) from None
            if decoded.epoch != epoch + 1:
                why = f"epoch {decoded.epoch} where {epoch + 1} was expected"
                raise CorruptionError(path, rec.offset, why, hint=_HINT)
            epoch = decoded.epoch
            if limit is not None and epoch > limit:
                return False  # not durable yet: look again later
            if epoch > cur.last:
                cur.last = epoch
                size = rec.end - rec.offset
                yield LogRecord(decoded, seg[0], path, rec.offset, size, decoded_values)
        if scan.stop.kind is StopKind.CORRUPT:
            raise CorruptionError(path, scan.stop.offset, scan.stop.reason, hint=_HINT)
        if scan.sealed_lsn is None:
            if not is_last:
                why = "not sealed, though later segments follow"
                raise CorruptionError(path, scan.stop.offset, why, hint=_HINT)
            return False  # the live end of the log
        if scan.sealed_lsn != epoch:
            why = f"the seal names LSN {scan.sealed_lsn}, the records end at {epoch}"
            raise CorruptionError(path, scan.stop.offset, why, hint=_HINT)
        if scan.header is not None and scan.header.generation:
            cur.generation = max(cur.generation, scan.header.generation)
        cur.sequence, cur.chain, cur.epoch = seg[0] + 1, scan.end_crc, epoch
    return bool(segments)


def _scan(
    root: Path,
    files: FileLayer,
    store_id: uuid.UUID,
    seg: Segment,
    cur: _Cursor,
    is_last: bool,
    held: _Pin,
) -> SegmentScan:
    """Pin, read and verify one segment against the cursor (header, name, rule H5).

    :raises ChangesUnavailableError: the segment was deleted before it was pinned.
    """
    seq, first, path = seg
    gone = held.hold(f"wal/{path.name}")
    try:
        data = b"" if gone else files.read(path)
    except FileNotFoundError:
        gone = True
    except OSError as exc:
        raise StorageError(f"reading {path} failed: {exc}", errno=exc.errno) from exc
    if gone:
        left = _list(root / "wal")
        raise ChangesUnavailableError(root, cur.last, left[0][1] if left else cur.last + 1)
    scan = scan_segment(path, data, store_id=store_id, prev_crc=cur.chain, is_last=is_last)
    header = scan.header
    if header is None:
        if is_last and scan.stop.kind is StopKind.TORN:
            return scan  # nothing written in it yet
        raise CorruptionError(path, 0, scan.stop.reason, hint=_HINT)
    if scan.stop.kind is StopKind.CORRUPT and scan.stop.offset == 0:
        raise CorruptionError(path, 0, scan.stop.reason, hint=_HINT)
    named, expected = (header.sequence, header.first_lsn), (seq, first)
    if named != expected or first != cur.epoch + 1 or seq < cur.sequence:
        why = (
            f"the header names segment {named[0]} from LSN {named[1]}; the name says {expected}, "
            f"the log is at epoch {cur.epoch}"
        )
        raise CorruptionError(path, 0, why, hint=_HINT)
    if header.generation and header.generation < cur.generation:
        why = f"generation {header.generation} after {cur.generation}: a fenced writer's segment"
        raise CorruptionError(path, 0, why, hint=_HINT)
    return scan
