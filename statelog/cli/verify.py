"""``statelog verify STORE``: every snapshot re-hashed, every record checked; exit 0, 1 or 2.

The work is :func:`statelog.ops.verify.verify_store`; this module prints its
report and maps the verdict to the exit status: 0 clean, 1 damage found
but recoverable, 2 a re-snapshot is required.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from statelog.cli.exits import EXIT_DAMAGED, EXIT_OK, EXIT_UNRECOVERABLE
from statelog.cli.inspect import lock_holder
from statelog.cli.output import fmt_bytes, print_json, progress
from statelog.errors import CorruptionError
from statelog.ops.verify import Verdict, VerifyReport, verify_store
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout

__all__ = ["add_parser", "run"]

_EXIT = {
    Verdict.CLEAN: EXIT_OK,
    Verdict.RECOVERABLE: EXIT_DAMAGED,
    Verdict.UNRECOVERABLE: EXIT_UNRECOVERABLE,
}


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``verify`` on the subcommand parsers ``sub``."""
    p = sub.add_parser(
        "verify",
        parents=parents,
        help="check every snapshot and every record; exit 0 clean, 1 recoverable, 2 not",
        description="Re-hash every snapshot, check every record of every segment and the "
        "links between snapshots and the log and between each delta snapshot and its "
        "parent, then ask the recovery ladder (read-only) "
        "what an open would reach. Names every damaged file and the offset where its "
        "damage begins. Exit 0: clean. 1: damage found, the store is recoverable. "
        "2: not recoverable, a re-snapshot is required. Read-only.",
    )
    p.add_argument("store", type=Path, metavar="STORE", help="the store directory")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def run(args: argparse.Namespace) -> int:
    """Verify ``args.store``, print the report, return the verdict's exit status."""
    with progress("verify", quiet=args.quiet or args.json) as tick:
        report = verify_store(args.store, progress=tick)
    writer = lock_holder(args.store / "LOCK")
    damaged_identity = any(f.kind == "identity" for f in report.findings)
    hint = _identity_hint(args.store) if damaged_identity else None
    if args.json:
        print_json({**report.to_dict(), "writer_running": bool(writer["held"]), "hint": hint})
    else:
        _print(report, bool(writer["held"]))
        if hint is not None:
            print(f"hint       {hint}")
    return _EXIT[report.verdict]


def _identity_hint(store: Path) -> str | None:
    """What to do about the damaged ``IDENTITY`` the report names (it carries no advice)."""
    try:
        StoreLayout(store).read_identity(FileLayer())
    except CorruptionError as exc:
        return exc.command_hint
    except Exception:  # changed since the report: the report stands without a hint
        return None
    return None


def _print(report: VerifyReport, writer_running: bool) -> None:
    ok_snaps = sum(1 for s in report.snapshots if s.verified and s.links)
    ok_segs = sum(1 for s in report.segments if s.status == "ok")
    records = sum(s.records for s in report.segments)
    print(f"store      {report.store}")
    print(f"snapshots  {ok_snaps} of {len(report.snapshots)} verify and link to the log")
    deltas = [s for s in report.snapshots if s.depth]
    if deltas:
        members = sum(1 for s in report.snapshots if s.verified and not s.links and not s.chain
                      and (s.reason or "").startswith("not a restore point"))  # fmt: skip
        broken = sum(1 for s in deltas if s.chain)
        print(f"chains     {len(deltas)} delta snapshots, {broken} with a broken chain; "
              f"{members} older snapshots kept as links of a chain")  # fmt: skip
    print(f"segments   {ok_segs} of {len(report.segments)} verify ({records} records)")
    print(f"read       {fmt_bytes(report.bytes_read)} in {report.seconds:.2f}s")
    for f in report.findings:
        # A "recovery" finding is a sound file recovery would still move aside.
        print(f"{'AFFECTED' if f.kind == 'recovery' else 'DAMAGED':<10} {f}")
    if any(f.kind == "torn-tail" for f in report.findings) and writer_running:
        print("note       a writer holds the store: a torn tail may be its append in flight")
    rec = report.recovery
    if rec is not None:
        used = rec.snapshot.name if rec.snapshot else "none (replay from epoch 1)"
        print(f"recovery   would reach epoch {rec.epoch} from snapshot {used}")
        if rec.lost_epochs:
            lost = rec.lost_epochs
            print(f"LOST       epochs {lost.start}..{lost.stop - 1} ({len(lost)} commits)")
    for p in report.evidence:
        print(f"evidence   {p.parent.name}/{p.name}")
    verdict = {
        Verdict.CLEAN: "clean",
        Verdict.RECOVERABLE: "damage found; recoverable (run `statelog recover --dry-run`)",
        Verdict.UNRECOVERABLE: "NOT RECOVERABLE, a re-snapshot is required: "
        + str(report.unrecoverable),
    }[report.verdict]
    print(f"verdict    {verdict}")
