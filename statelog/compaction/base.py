"""Step 5 of a compaction pass: fold the sealed tail; and what a pass knows and returns.

:func:`statelog.compaction.fold.compact` runs the pass and says, step by
step, what it does; :mod:`statelog.compaction.write` chooses the base and
writes the snapshot; this module holds the fold itself (:func:`fold_tail`),
what a pass knows while it runs (:class:`Pass`) and what it returns
(:class:`CompactionResult`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from statelog.compaction.delta import ChainPolicy
from statelog.compaction.logfmt import LOGGER, kv
from statelog.compaction.replay import Folding, FoldTarget, fold_segment
from statelog.compaction.tail import SegmentInfo, find_link, list_segment_infos
from statelog.events import emit
from statelog.storage.fileio import FileLayer, ReadBuffer
from statelog.storage.layout import StoreLayout

__all__ = ["CompactionResult", "Pass", "Start", "fold_tail", "human_bytes", "report_mismatch"]

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
    skip_detail: str = ""  # the numbers behind ``skipped``: "700 KiB of 64 MiB"
    damaged: tuple[Path, ...] = ()  # damaged snapshots and segments met (left in place)
    full: bool = True  # a full snapshot (False: a delta on top of ``base``'s chain)
    depth: int = 0  # deltas between the snapshot written and its chain's full snapshot
    written_bytes: int = 0  # bytes of the snapshot file written

    @property
    def skip_reason(self) -> str | None:
        """``skipped`` with its numbers, ``below_trigger: 700 KiB of 64 MiB``; None: not skipped."""
        if self.skipped is None or not self.skip_detail:
            return self.skipped
        return f"{self.skipped}: {self.skip_detail}"


def human_bytes(n: int) -> str:
    """``n`` bytes for a log line or a person: ``812 B``, ``700 KiB``, ``38.2 KiB``, ``64 MiB``."""
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{n} B" if unit == "B" else f"{value:.1f}".removesuffix(".0") + f" {unit}"


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
    policy: ChainPolicy = field(default_factory=ChainPolicy)
    progress: Callable[[str, int, int], None] = lambda _item, _done, _total: None
    before_fold: Callable[[bool], None] = lambda _full: None  # the fold chosen (True: full)
    damaged: list[Path] = field(default_factory=list)
    bytes_read: int = 0
    tail_bytes: int = 0  # log bytes of the sealed tail chosen

    def say(self, level: int, event: str, **fields: object) -> None:
        log.log(level, "%s", kv(event=event, store=self.root, **fields))


# (store, file, reason) already reported by this process: a daemon that meets
# the same damaged file on every pass reports it once, so the mismatch
# counter and the audit trail count damage, not passes.
_reported: set[tuple[str, str, str]] = set()


def report_mismatch(
    p: Pass, path: Path, offset: int | None, reason: str, *, walk_back: bool
) -> None:
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


@dataclass
class Start:
    """What a fold starts from: its target, and what the base snapshot says (all zero:
    the empty image)."""

    target: FoldTarget
    offsets: dict[str, int] = field(default_factory=dict)
    wm: int = 0
    chain: int = 0


def fold_tail(
    p: Pass, start: Start, base: Path | None, base_lsn: int, tail: tuple[SegmentInfo, ...]
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
            report_mismatch(p, base, None, unlinked, walk_back=True)
        return None
    p.say(
        logging.DEBUG, "fold_started", base=base.name if base else "empty",
        segments=len(tail) - first,
    )  # fmt: skip
    fold = Folding(base_lsn, start.chain, start.offsets, start.wm)
    last_in_log = [s.path for s in list_segment_infos(p.layout.wal)[-1:]]
    total = sum(s.size for s in tail[first:])
    done = 0
    reads = ReadBuffer()  # one for the pass: a fresh buffer per segment costs a copy's time
    for seg in tail[first:]:
        p.progress(seg.name, done, total)
        done += seg.size
        if p.stop():
            return CompactionResult(p.root, base=base, skipped="interrupted")
        why = fold_segment(
            p.files, p.store_id, start.target, seg, fold, seg.path in last_in_log, reads
        )
        if why is not None:
            if why:  # else: the end of the sealed log, not damage
                p.say(
                    logging.ERROR, "segment_damaged", segment=seg.name, reason=why,
                    folded_to=fold.epoch,
                )  # fmt: skip
                p.damaged.append(seg.path)
                report_mismatch(p, seg.path, None, why, walk_back=False)
            break
    p.bytes_read += fold.bytes_read
    p.progress("folded", done, total)
    return fold
