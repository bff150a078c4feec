"""Rewinding a store in place to an older epoch: ``statelog recover STORE --to-epoch N``.

The caller holds the writer's lock and the compactor's (no writer, no
compactor runs meanwhile). :func:`plan_rewind` opens a read-only view as of
``N`` (:func:`~statelog.recovery.timeline.recover_at`: the epoch must be
rebuildable exactly) and plans, with :func:`~statelog.recovery.point.plan_point`,
what comes after it: the snapshots after ``N``, the segments after the one
holding ``N``, and the bytes after ``N``'s record in that one.

:func:`rewind` then, in order, each step durable before the next:

1. writes the intent, ``STORE/REWIND`` (one JSON object: the epoch, the
   epochs discarded, the evidence suffix, the cut), as temp, fsync, rename,
   fsync of ``STORE/``. The files to set aside are not listed: they are
   every snapshot and every segment named after the epoch, which no writer or
   compactor can add to while the intent stands. From this point on the store *is* the rewound one:
   a writer's open finishes the rewind before it recovers, and a read-only
   open reads the state as of ``N``;
2. :func:`finish_rewind`: renames each later snapshot aside in its
   directory (``<name>.rewound-<N>-<unix ms>``, the evidence suffix; no
   reader takes such a name for a snapshot or a segment), fsyncs
   ``snapshots/``; saves the bytes after the cut as
   ``<segment>.rewound-<N>-<unix ms>.tail`` (temp, fsync, rename) and cuts the
   segment (truncate, fsync); renames each later segment aside, fsyncs
   ``wal/``; removes ``REWIND`` and fsyncs ``STORE/``.

Every step of :func:`finish_rewind` can run again after a crash with the same
result, so a rewind SIGKILLed at any point leaves either the old store (before
the intent is durable) or the rewound one (after), never a mix. The audit
trail records a ``rewind`` event once it is done.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from statelog.errors import InvalidOptionError
from statelog.events import emit
from statelog.log.segments import list_segments
from statelog.recovery.intent import check_intent, pending_rewind
from statelog.recovery.point import PointPlan, plan_point
from statelog.recovery.timeline import recover_at
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import REWIND, StoreLayout
from statelog.storage.snapshots import list_snapshots

__all__ = ["Rewind", "finish_rewind", "plan_rewind", "rewind"]


@dataclass(frozen=True)
class Rewind:
    """What a rewind does (or did): the plan, and where the evidence goes."""

    plan: PointPlan
    evidence: str
    """The evidence suffix: what is set aside keeps its name with this appended."""

    def intent(self) -> dict[str, Any]:
        """The ``REWIND`` document."""
        plan = self.plan
        last = plan.segments[-1].name if plan.segments and plan.cut is not None else None
        return {
            "epoch": plan.epoch,
            "discarded": [plan.epoch + 1, plan.last_epoch],
            "evidence": self.evidence,
            "cut": None if last is None else {"file": last, "offset": plan.cut},
        }


def plan_rewind(root: Path, epoch: int, files: FileLayer | None = None) -> Rewind:
    """The rewind of ``root`` to ``epoch``: nothing is changed.

    :raises InvalidOptionError: ``epoch`` is below 1 (a store rewound to the empty state
        would hold no log: start a new store instead).
    :raises EpochUnavailableError: the epoch cannot be rebuilt exactly.
    :raises StatelogError: as a read-only open.
    """
    _check_target(epoch)
    with recover_at(root, epoch, files=files) as view:
        plan = plan_point(root, view, files)
    return Rewind(plan, f".rewound-{epoch}-{int(time.time() * 1000)}")


def rewind(root: Path, planned: Rewind, files: FileLayer | None = None) -> dict[str, Any]:
    """Carry out ``planned`` (steps in the module docstring); the caller holds both locks.

    :returns: the intent document it carried out.
    :raises OSError: a step failed; the intent stays, and the next writer's open (or
        this call again) finishes the rewind.
    """
    files = files or FileLayer()
    doc = planned.intent()
    files.create_durable(root / REWIND, json.dumps(doc).encode() + b"\n")
    finish_rewind(root, files)
    return doc


def finish_rewind(root: Path, files: FileLayer | None = None) -> dict[str, Any] | None:
    """Finish the rewind ``REWIND`` describes (module docstring, step 2); None if none is
    pending. Idempotent.

    :raises CorruptionError: ``REWIND`` is not a rewind's intent.
    :raises OSError: a step failed; ``REWIND`` stays for the next attempt.
    """
    files = files or FileLayer()
    doc = pending_rewind(root)
    if doc is None:
        return None
    evidence, epoch = str(doc["evidence"]), int(doc["epoch"])
    layout = StoreLayout(root)
    check_intent(layout, epoch, doc["cut"], files)
    later = [p.name for e, _l, p in list_snapshots(layout.snapshots) if e > epoch]
    moved = _move(layout.snapshots, later, evidence, files)
    cut = doc["cut"]
    if cut is not None:
        _cut(layout.wal / cut["file"], int(cut["offset"]), epoch, evidence, files)
    # Newest first: what is left is always an unbroken log, so a read-only open between
    # two renames still reads the epoch (a gap would break the snapshot's link).
    later = [p.name for _s, first, p in reversed(list_segments(layout.wal)) if first > epoch]
    moved += _move(layout.wal, later, evidence, files)
    files.remove(root / REWIND)
    files.fsync_dir(root)
    emit(
        root, "rewind", epoch=doc["epoch"], discarded=doc.get("discarded"),
        evidence=doc["evidence"], files=moved, cut=cut,
    )  # fmt: skip
    return doc


def _move(src_dir: Path, names: list[str], suffix: str, files: FileLayer) -> list[str]:
    """Rename each of ``names`` still in ``src_dir`` aside (``suffix`` appended); fsync it."""
    moved = []
    for name in names:
        src = src_dir / name
        if src.exists():
            files.rename(src, src_dir / (name + suffix))
            moved.append(f"{src_dir.name}/{name}{suffix}")
    files.fsync_dir(src_dir)
    return moved


def _cut(segment: Path, offset: int, epoch: int, suffix: str, files: FileLayer) -> None:
    """Save what follows ``offset`` in ``segment`` aside, then cut it there (the record of
    ``epoch`` ends there: :func:`_check_intent`)."""
    if not segment.exists() or segment.stat().st_size <= offset:
        return  # cut already (a rewind that ran again after a crash)
    data = files.read(segment)
    files.create_durable(segment.with_name(f"{segment.name}{suffix}.tail"), data[offset:])
    files.truncate(segment, offset)


def _check_target(epoch: object) -> None:
    """:raises InvalidOptionError: not an epoch a store can be rewound or restored to."""
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
        raise InvalidOptionError(
            f"epoch {epoch!r}: a store is rewound or restored to an epoch >= 1",
            hint="epoch 0 is the empty store: start a new store instead (a view at=0 reads it)",
        )
