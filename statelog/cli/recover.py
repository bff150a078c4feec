"""``statelog recover STORE [--dry-run]``: what recovery would do (or does), told plainly.

``--dry-run`` climbs the recovery ladder read-only (``statelog.open(path,
readonly=True)``), which changes nothing on disk, and turns its
:class:`~statelog.recovery.report.RecoveryReport` into a plan: the snapshot it would
use (and, for a delta snapshot, the chain it restores: full snapshot first),
those it would reject and why, the LSNs it would replay, what it
would cut or move aside (and under which evidence name), and the epochs
that would be lost. Without ``--dry-run`` the store is opened as its
writer, which performs exactly that recovery, and closed again.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statelog.cli.exits import EXIT_DAMAGED, EXIT_OK, EXIT_UNRECOVERABLE
from statelog.cli.output import print_json
from statelog.cli.point import add_point_args, run_rewind
from statelog.errors import ResnapshotRequired
from statelog.recovery.damage import aside_path
from statelog.recovery.report import Outcome, RecoveryReport
from statelog.storage.fileio import FileLayer
from statelog.storage.levels import chain_links
from statelog.storage.snapshots import SnapshotMeta, parse_snapshot_name, verify_snapshot
from statelog.store.store import open as open_store

__all__ = ["add_parser", "plan", "run", "snapshot_chain"]


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``recover`` on the subcommand parsers ``sub``."""
    p = sub.add_parser(
        "recover",
        parents=parents,
        help="show what recovery would do (--dry-run), or do it",
        description="Recover the store: the newest snapshot that verifies and links to the "
        "log, then the log tail after it. With --dry-run nothing on disk changes: the "
        "command says which snapshot would be used, which rejected and why, the replay "
        "range, what would be cut or moved aside, and the epochs lost. Exit 0: nothing to "
        "repair. 1: damage is (or would be) repaired. 2: not recoverable, a re-snapshot "
        "is required (or the epoch to rewind to cannot be rebuilt). 4: a writer or a "
        "compactor holds the store (without --dry-run). With --to-epoch N (or --at TIME) "
        "the store is rewound in place to that epoch: later snapshots, later segments and "
        "the log after N are moved aside into rewound-N-<ms>/ as evidence, recorded in the "
        "audit trail; a crash at any step leaves the old store or the rewound one.",
    )
    p.add_argument("store", type=Path, metavar="STORE", help="the store directory")
    p.add_argument("--dry-run", action="store_true", help="change nothing; say what would happen")
    add_point_args(p, "--to-epoch", "rewind the store in place (what follows is set aside)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def plan(report: RecoveryReport, *, dry_run: bool, chain: Sequence[Path] = ()) -> dict[str, Any]:
    """The report as an operator's plan (the ``--json`` document).

    ``chain`` is the snapshot chain the recovery restores, full snapshot
    first (:func:`snapshot_chain`); empty without a snapshot.

    In a dry run the evidence names are the ones recovery would choose now
    (``<segment>.broken`` for a torn tail, ``<segment>.corrupt`` for damage,
    numbered if taken); after a real recovery they are the names it chose.
    """
    snap_lsn = 0
    if report.snapshot is not None:
        named = parse_snapshot_name(report.snapshot)
        snap_lsn = named[1] if named else 0
    snaps = [r for r in report.rejected if r.path.name.endswith(".snap")]
    log_rej = [r for r in report.rejected if not r.path.name.endswith(".snap")]
    actions: list[dict[str, Any]] = []
    suffix = ".broken" if report.outcome is Outcome.TORN_TAIL else ".corrupt"
    saved = list(report.saved_aside)
    for r in log_rej:
        size = _size(r.path)
        if r.offset:  # the damaged segment keeps its verified prefix
            action, dropped = "cut", (size - r.offset if dry_run else None)
        else:
            action, dropped = "move aside", (size if dry_run else None)
        if dry_run:
            aside: str | None = aside_path(r.path, suffix).name
        else:
            match = [p for p in saved if p.name.startswith(r.path.name)]
            aside = match[0].name if match else None
        actions.append(
            {"action": action, "file": str(r.path), "offset": r.offset, "bytes": dropped,
             "saved_as": aside, "reason": r.reason}
        )  # fmt: skip
    lost = report.lost_epochs
    return {
        "dry_run": dry_run,
        "outcome": str(report.outcome),
        "epoch": report.epoch,
        "snapshot": str(report.snapshot) if report.snapshot else None,
        "snapshot_lsn": snap_lsn,
        "chain": [p.name for p in chain],
        "rejected_snapshots": [{"file": str(r.path), "reason": r.reason} for r in snaps],
        "replay": {"from": snap_lsn + 1, "to": report.epoch, "records": report.replayed},
        "actions": actions,
        "lost_epochs": [lost.start, lost.stop - 1] if lost else [],
        "report": report.to_dict(),
    }


def snapshot_chain(snapshot: Path | None) -> list[Path]:
    """The chain of ``snapshot``, full snapshot first, each link verified again.

    A full snapshot is a chain of one. Every file is hashed (not parsed:
    recovery parsed it a moment ago), so a chain damaged since is refused
    rather than named.

    :raises CorruptionError: a link is missing, damaged or does not match.
    :raises FormatVersionError: a file of the chain is of a format not read.
    """
    if snapshot is None:
        return []
    files = FileLayer()

    def read(path: Path) -> tuple[SnapshotMeta, object]:
        return verify_snapshot(files, path, store_id=None, parse=False), None

    return [p for p, _meta, _ in chain_links(snapshot.parent, snapshot, read)]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def run(args: argparse.Namespace) -> int:
    """Recover (or plan a recovery of) ``args.store``; return the exit status."""
    if args.epoch is not None or args.at is not None:
        return run_rewind(args)
    try:
        if args.dry_run:
            with open_store(args.store, readonly=True) as ro:
                report = ro.recovery
        else:
            store = open_store(args.store)
            report = store.recovery
            store.close()
    except ResnapshotRequired as exc:
        tried = [{"file": str(p), "reason": why} for p, why in exc.tried]
        if args.json:
            print_json({"dry_run": args.dry_run, "unrecoverable": exc.message, "tried": tried})
        else:
            verb = "would fail" if args.dry_run else "failed"
            print(f"recovery {verb}: NOT RECOVERABLE, a re-snapshot is required")
            for t in tried:
                print(f"  refused  {Path(t['file']).name}: {t['reason']}")
            print(f"hint: {exc.command_hint}")
        return EXIT_UNRECOVERABLE
    doc = plan(report, dry_run=args.dry_run, chain=snapshot_chain(report.snapshot))
    if args.json:
        print_json(doc)
    else:
        _print(doc)
    return EXIT_DAMAGED if report.rejected else EXIT_OK


def _print(doc: dict[str, Any]) -> None:
    would = "would " if doc["dry_run"] else ""
    head = "dry run: nothing was changed" if doc["dry_run"] else "recovered"
    print(f"{head}; outcome {doc['outcome']}, epoch {doc['epoch']}")
    for r in doc["rejected_snapshots"]:
        print(f"{would}reject  snapshots/{Path(r['file']).name}: {r['reason']}")
    if doc["snapshot"]:
        print(f"{would}use     snapshots/{Path(doc['snapshot']).name} (LSN {doc['snapshot_lsn']})")
        if len(doc["chain"]) > 1:
            links = " <- ".join(doc["chain"])
            print(f"{would}restore the chain {links} ({len(doc['chain']) - 1} deltas)")
    else:
        print(f"{would}use     no snapshot: replay the log from epoch 1")
    rp = doc["replay"]
    if rp["records"]:
        print(f"{would}replay  LSN {rp['from']}..{rp['to']} ({rp['records']} records)")
    else:
        print(f"{would}replay  nothing (the log ends at LSN {rp['to']})")
    for a in doc["actions"]:
        at = f" at offset {a['offset']}" if a["offset"] else ""
        size = f" ({a['bytes']} bytes)" if a["bytes"] is not None else ""
        aside = f", saved as {a['saved_as']}" if a["saved_as"] else ""
        print(f"{would}{a['action']}  wal/{Path(a['file']).name}{at}{size}{aside}: {a['reason']}")
    if doc["lost_epochs"]:
        first, last = doc["lost_epochs"]
        print(f"LOST    epochs {first}..{last} ({last - first + 1} commits)")
