"""``statelog tail STORE``: the committed epochs of a store's log, one per line.

Reads the log through the changes feed (:mod:`statelog.log.changes`): no
recovery and no lock, so it runs beside the writer and changes nothing but a
pin file while it reads. Plain output is one line per epoch: the epoch, the
watermark, the offsets it advanced and, per table, how many keys it put and
deleted. ``--json`` writes one JSON object per epoch with every key and value
(``puts`` as ``[key, value]`` pairs, a bytes key or value as ``{"bytes": hex}``).
``--follow`` waits for new commits until interrupted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from statelog.cli.dump import jsonable
from statelog.cli.exits import EXIT_OK
from statelog.cli.output import seconds_arg
from statelog.log.changes import Change, read_changes

__all__ = ["add_parser", "change_doc", "change_line", "run"]


def _epoch_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an epoch (an integer >= 0)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an epoch (an integer >= 0)")
    return value


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``tail`` on the subcommand parsers ``sub``."""
    p = sub.add_parser(
        "tail",
        parents=parents,
        help="print the committed epochs of the log (a changes feed)",
        description="Print every committed epoch after --since, read from the retained log "
        "and verified as recovery verifies it; with --follow, keep printing new ones. Runs "
        "beside the writer without its lock. Exit 0; 1 if the log is damaged (the epochs "
        "before the damage were printed); 2 if the log no longer holds the epoch after "
        "--since (the error names the oldest epoch left: read the state from a snapshot); "
        "130 when --follow is interrupted.",
    )
    p.add_argument("store", type=Path, metavar="STORE", help="the store directory")
    p.add_argument(
        "--since", type=_epoch_arg, default=0, metavar="N", help="print epochs after N (default 0)"
    )
    p.add_argument("--follow", "-f", action="store_true", help="wait for new commits")
    p.add_argument(
        "--poll",
        type=seconds_arg,
        default=0.5,
        metavar="DURATION",
        help="with --follow: how often to look for new commits: seconds, or 500ms, 2s, "
        "1m (default 0.5s)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per epoch")


def change_doc(change: Change) -> dict[str, Any]:
    """``change`` as one JSON-able document (every key and value)."""
    tables = {
        name: {
            "puts": [[jsonable(k), jsonable(v)] for k, v in t.puts.items()],
            "deletes": [jsonable(k) for k in t.deletes],
        }
        for name, t in change.tables.items()
    }
    return {
        "epoch": change.epoch,
        "offsets": dict(change.offsets),
        "low_watermark_ms": change.low_watermark_ms,
        "commit_ms": change.commit_ms,
        "tables": tables,
    }


def change_line(change: Change) -> str:
    """``change`` as one line for people: counts, not values."""
    offsets = ",".join(f"{p}={o}" for p, o in sorted(change.offsets.items())) or "-"
    tables = "; ".join(
        f"{name}: {len(t.puts)} put, {len(t.deletes)} deleted"
        for name, t in sorted(change.tables.items())
    )
    return f"epoch {change.epoch}  watermark {change.low_watermark_ms}  offsets {offsets}" + (
        f"  {tables}" if tables else ""
    )


def run(args: argparse.Namespace) -> int:
    """Print the epochs of ``args.store`` after ``args.since``; return the exit status."""
    feed = read_changes(args.store, args.since, follow=args.follow, poll=args.poll)
    try:
        for change in feed:
            text = json.dumps(change_doc(change)) if args.json else change_line(change)
            print(text, flush=args.follow)
    finally:
        feed.close()
    return EXIT_OK
