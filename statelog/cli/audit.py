"""``statelog audit STORE [--verify]``: list the audit trail, or check its hash chain.

The trail is :class:`statelog.ops.audit.AuditTrail` (``AUDIT.log`` and
``AUDIT.head``). Listing reads the entries without checking them;
``--verify`` re-hashes every entry, checks the chain from the store's
genesis value and the anchor, and exits 1 on any problem (an edit, a
deletion, a reordering, an insertion, entries cut off the end).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from statelog.cli.exits import EXIT_DAMAGED, EXIT_OK
from statelog.cli.output import print_json
from statelog.ops.audit import AuditTrail
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``audit`` on the subcommand parsers ``sub``."""
    p = sub.add_parser(
        "audit",
        parents=parents,
        help="list the audit trail, or verify its hash chain (--verify)",
        description="List the store's audit trail (recoveries, integrity mismatches, "
        "truncations, compactions, retention deletions), or with --verify check every "
        "entry's hash, the chain and the anchor. Read-only. Exit 0: no problem. 1: a "
        "problem was found (each is named with its line), or the trail is unreadable.",
    )
    p.add_argument("store", type=Path, metavar="STORE", help="the store directory")
    p.add_argument("--verify", action="store_true", help="check the hash chain and the anchor")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def run(args: argparse.Namespace) -> int:
    """List or verify the trail of ``args.store``; return the exit status."""
    StoreLayout(args.store).read_identity(FileLayer())  # not a store: exit 3, not "no entries"
    trail = AuditTrail(args.store)
    if args.verify:
        verdict = trail.verify()
        problems: list[dict[str, Any]] = [
            {"file": p.file, "line": p.line, "seq": p.seq, "kind": p.kind, "reason": p.reason}
            for p in verdict.problems
        ]
        if args.json:
            print_json({"ok": verdict.ok, "entries": verdict.entries, "problems": problems})
        else:
            for p in problems:
                line = f" line {p['line']}" if p["line"] is not None else ""
                seq = f" (entry {p['seq']})" if p["seq"] is not None else ""
                print(f"{p['kind'].upper():<10} {p['file']}{line}{seq}: {p['reason']}")
            state = "ok" if verdict.ok else "PROBLEMS FOUND"
            print(f"audit trail {state}: {verdict.entries} entries, {len(problems)} problems")
        return EXIT_OK if verdict.ok else EXIT_DAMAGED
    entries = list(trail.entries())
    if args.json:
        print_json(
            [
                {"seq": e.seq, "ts": e.ts, "kind": e.kind, "pid": e.pid, "fields": e.fields,
                 "prev": e.prev, "hash": e.hash}
                for e in entries
            ]
        )  # fmt: skip
    else:
        for e in entries:
            fields = " ".join(f"{k}={_short(v)}" for k, v in e.fields.items())
            print(f"{e.seq:>6} {e.ts} {e.kind:<18} pid={e.pid} {fields}")
        print(f"{len(entries)} entries (run with --verify to check the hash chain)")
    return EXIT_OK


def _short(v: Any) -> str:
    text = str(v)
    return text if len(text) <= 80 else text[:77] + "..."
