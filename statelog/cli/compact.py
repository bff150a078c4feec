"""``statelog compact STORE``: one compaction pass, the code the daemon's ``--once`` runs.

The pass is :func:`statelog.compaction.fold.compact`, called as the daemon calls it;
this module only parses the options and tells the result. Ctrl-C asks the
pass to stop at its next checkpoint (a snapshot being written is finished
first: it is atomic), as SIGINT does for the daemon.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from statelog.cli.exits import EXIT_DAMAGED, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNRECOVERABLE
from statelog.cli.output import (
    add_chain_options,
    duration_arg,
    fmt_bytes,
    print_json,
    progress,
    size_arg,
)
from statelog.compaction.fold import CompactionResult, compact
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout

__all__ = ["add_parser", "run"]


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{text} is below {low}")
        return v

    return parse


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``compact`` on the subcommand parsers ``sub``."""
    p = sub.add_parser(
        "compact",
        parents=parents,
        help="one compaction pass (the same code as statelog-compactor --once)",
        description="Fold the sealed log tail into a new snapshot, then apply retention: "
        "one pass of the compaction daemon. Takes COMPACTOR.LOCK for the pass; the writer "
        "may keep running. Exit 0: a snapshot was written, or there was nothing to fold. "
        "1: damaged files were met and walked past (named). 2: no snapshot verifies and "
        "the log does not begin at LSN 1 (a re-snapshot is required). 4: another "
        "compactor holds the store. 130: interrupted.",
    )
    p.add_argument("store", type=Path, metavar="STORE", help="the store directory")
    p.add_argument(
        "--min-tail-bytes",
        type=size_arg,
        default=0,
        metavar="SIZE",
        help="fold only once the sealed tail holds this many bytes: 67108864, 64k, 64MiB, "
        "1G (default 0: fold whatever is sealed; the daemon's default is 64MiB)",
    )
    p.add_argument(
        "--min-tail-records",
        type=_at_least(0),
        default=0,
        help="fold only once the sealed tail holds this many records (default 0: off)",
    )
    p.add_argument("--retain", type=_at_least(1), default=3, help="verified snapshots to keep (3)")
    p.add_argument(
        "--retain-for",
        type=duration_arg,
        default=None,
        metavar="DURATION",
        help="also keep every epoch committed within this window restorable: seconds, or "
        "500ms, 90s, 30m, 1.5h, 7d",
    )
    p.add_argument("--level", type=_at_least(1), default=3, help="zstd level, 1-22 (3)")
    add_chain_options(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def run(args: argparse.Namespace) -> int:
    """Run one pass over ``args.store``; print what it did; return the exit status."""
    stop = [False]

    def on_sigint(_sig: int, _frame: FrameType | None) -> None:
        stop[0] = True

    StoreLayout(args.store).read_identity(FileLayer())  # fail before saying anything
    before = signal.signal(signal.SIGINT, on_sigint)
    started = time.monotonic()
    quiet = args.quiet or args.json
    if not quiet:
        print(f"compact: one pass over {args.store}", file=sys.stderr)
    try:
        with progress("compact", quiet=quiet) as bar:
            result = compact(
                args.store,
                min_tail_bytes=args.min_tail_bytes,
                min_tail_records=args.min_tail_records,
                retain=args.retain,
                retain_for=args.retain_for,
                level=args.level,
                max_chain=args.max_chain,
                full_ratio=args.full_ratio,
                stop=lambda: stop[0],
                progress=bar,
            )
    finally:
        signal.signal(signal.SIGINT, before)
    if not quiet:
        print(f"compact: done in {time.monotonic() - started:.2f}s", file=sys.stderr)
    if args.json:
        print_json(_doc(result))
    else:
        _print(result)
    if result.skipped == "interrupted":
        return EXIT_INTERRUPTED
    if result.skipped == "no_base":
        return EXIT_UNRECOVERABLE
    return EXIT_DAMAGED if result.damaged or result.skipped == "damaged" else EXIT_OK


def _doc(r: CompactionResult) -> dict[str, Any]:
    return {
        "store": str(r.store),
        "snapshot": str(r.snapshot) if r.snapshot else None,
        "base": str(r.base) if r.base else None,
        "kind": None if r.snapshot is None else ("full" if r.full else "delta"),
        "depth": r.depth if r.snapshot is not None else None,
        "written_bytes": r.written_bytes,
        "segments": [str(p) for p in r.segments],
        "epochs": [r.epochs.start, r.epochs.stop - 1] if r.epochs else [],
        "bytes_read": r.bytes_read,
        "seconds": round(r.seconds, 6),
        "deleted": [str(p) for p in r.deleted],
        "skipped": r.skipped,
        "skip_reason": r.skip_reason,
        "damaged": [str(p) for p in r.damaged],
    }


def _print(r: CompactionResult) -> None:
    if r.snapshot is not None:
        base = r.base.name if r.base else "the empty image"
        kind = "a full snapshot" if r.full else f"a delta, depth {r.depth}"
        print(f"wrote    snapshots/{r.snapshot.name} from {base}: {kind}, "
              f"{fmt_bytes(r.written_bytes)}")  # fmt: skip
        print(
            f"folded   epochs {r.epochs.start}..{r.epochs.stop - 1} from {len(r.segments)} segments"
        )
    else:
        print(f"skipped  {r.skip_reason}")
    print(f"read     {fmt_bytes(r.bytes_read)} in {r.seconds:.2f}s")
    for p in r.deleted:
        print(f"deleted  {p.parent.name}/{p.name} (retention)")
    for p in r.damaged:
        print(f"DAMAGED  {p.parent.name}/{p.name} (walked past; run `statelog verify`)")
