"""Point in time on the command line: ``--epoch``/``--at`` of ``restore``, and
``statelog recover STORE --to-epoch N | --at TIME [--dry-run]``.

A rewind in place (:mod:`statelog.recovery.rewind`) takes the writer's lock
and the compactor's first (exit 4 while either is held), refuses a standby's
copy, a store whose standby was promoted, and a store that ships to a remote
(its remote log would fork: restore the point from the remote into a new
directory instead), finishes a rewind that died half-way, then plans and
carries out the rewind. ``--dry-run`` plans it read-only and says what it
would set aside.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from statelog.cli.exits import EXIT_OK
from statelog.cli.output import print_json
from statelog.compaction.lock import CompactorLock
from statelog.errors import InvalidOptionError
from statelog.recovery.rewind import Rewind, finish_rewind, plan_rewind, rewind
from statelog.recovery.timeline import epoch_at
from statelog.replica.promoted import check_not_promoted
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import REMOTE_RECORD, StoreLayout
from statelog.storage.lock import StoreLock
from statelog.storage.marks import check_not_standby

__all__ = ["add_point_args", "point_of", "run_rewind", "when_arg"]


def when_arg(text: str) -> datetime:
    """An argparse type: an ISO 8601 time with a zone, ``2026-12-05T09:14:00Z``."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (e.g. 2026-12-05T09:14:00Z or 2026-12-05T10:14+01:00)"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no time zone (add Z for UTC, or an offset such as +01:00)"
        )
    return when


def _epoch_arg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 1:
        raise argparse.ArgumentTypeError(
            f"not an epoch to restore or rewind to: {text!r} (an integer >= 1; epoch 0 is "
            "the empty store: start a new one instead)"
        )
    return v


def add_point_args(p: argparse.ArgumentParser, epoch_flag: str, what: str) -> None:
    """``epoch_flag N`` and ``--at TIME``, exclusive, on ``p``."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        epoch_flag, dest="epoch", type=_epoch_arg, metavar="N", help=f"{what} as of epoch N"
    )
    g.add_argument(
        "--at",
        type=when_arg,
        metavar="TIME",
        help=f"{what} as of the last epoch committed at or before TIME (ISO 8601 with a "
        "zone, e.g. 2026-12-05T09:14:00Z)",
    )


def point_of(args: argparse.Namespace, store: Path | None) -> int | datetime | None:
    """The epoch (or time, resolved against ``store`` if given) the arguments name."""
    if args.epoch is not None:
        return int(args.epoch)
    if args.at is None:
        return None
    return epoch_at(store, args.at) if store is not None else args.at


def run_rewind(args: argparse.Namespace) -> int:
    """``recover --to-epoch``/``--at``: plan, or carry out, the rewind of ``args.store``."""
    store: Path = args.store
    StoreLayout(store).read_identity(FileLayer())  # StoreNotFoundError: exit 3
    target = point_of(args, store)
    assert isinstance(target, int)
    if args.dry_run:
        planned = plan_rewind(store, target)
        _report(planned, args, done=False)
        return EXIT_OK
    _refuse_shared(store)
    lock = StoreLock(store)
    try:
        with CompactorLock(store):
            finished = finish_rewind(store)
            if finished is not None:
                print(f"finished the rewind to epoch {finished['epoch']} that was under way")
            planned = plan_rewind(store, target)
            rewind(store, planned)
    finally:
        lock.release()
    _report(planned, args, done=True)
    return EXIT_OK


def _refuse_shared(store: Path) -> None:
    """:raises StatelogError: the store is a standby's copy, promoted away, or ships."""
    check_not_standby(store)
    check_not_promoted(store)
    if (store / REMOTE_RECORD).exists():
        raise InvalidOptionError(
            f"{store} ships to a remote copy: rewinding it in place would fork its remote log",
            hint="restore the point from the remote into a new directory (`statelog restore "
            "URL NEW --epoch N --take-over`) and run the reconciler there",
        )


def _report(planned: Rewind, args: argparse.Namespace, *, done: bool) -> None:
    plan = planned.plan
    doc = {
        "dry_run": not done,
        "store": str(args.store),
        **planned.intent(),
        "chain": [p.name for p in plan.chain],
        "snapshots": [p.name for p in plan.later_snapshots],
        "segments": [p.name for p in plan.later_segments],
        "cut_bytes": plan.cut_bytes,
    }
    if args.json:
        print_json(doc)
        return
    would = "" if done else "would "
    head = "rewound" if done else "dry run: nothing was changed"
    print(f"{head}; epoch {plan.last_epoch} -> {plan.epoch}")
    first, last = doc["discarded"]
    if last >= first:
        print(f"{would}discard epochs {first}..{last} ({last - first + 1} commits)")
    print(f"{would}use     {' <- '.join(doc['chain']) or 'no snapshot: the log from epoch 1'}")
    for path in plan.later_snapshots:
        print(f"{would}set aside snapshots/{path.name}")
    if doc["cut"]:
        cut = doc["cut"]
        print(
            f"{would}cut     wal/{cut['file']} at offset {cut['offset']} ({plan.cut_bytes} bytes)"
        )
    for path in plan.later_segments:
        print(f"{would}set aside wal/{path.name}")
    print(f"evidence  each file set aside keeps its name, with {doc['evidence']} appended")
