"""``statelog drill``: kill a writer mid-write again and again, and check every recovery.

Each round starts the drill's writer (:mod:`statelog.cli.drill_writer`) as a
subprocess on the store, lets it commit the seeded workload, and SIGKILLs
it at a random moment: while it commits, while a compaction pass runs in a
second subprocess (held at one of its durable steps until the writer is
dead), or together with that compactor, killed mid-pass. Then the drill
opens the store, as a restarted reconciler would, and checks that recovery
succeeded, kept every epoch the writer acknowledged, and produced exactly
the model's state at the recovered epoch, with nothing applied twice; that
the recovery report rejects only snapshots the drill damaged (``--damage``)
and that every other snapshot verifies. The next round's writer resumes
from there, with the source redelivering events it has already applied.

This module is the command: its arguments, the store it drills, the
output. The rounds themselves are :mod:`statelog.cli.drill_rounds`.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from statelog.cli.drill_rounds import Drill, RoundResult, verifies
from statelog.cli.drill_writer import APPLIED, BUFFER, Origin, origin_of
from statelog.cli.output import EXIT_OK, EXIT_USAGE, print_json, say_error
from statelog.errors import StatelogError
from statelog.storage.layout import IDENTITY
from statelog.storage.snapshots import list_snapshots, parse_snapshot_name
from statelog.store.store import open as open_store

__all__ = ["EXIT_FAILED", "KINDS", "RoundResult", "add_parser", "run"]

EXIT_FAILED = 1
KINDS = ("compaction", "commit", "compactor", "compaction", "commit")
"""The first rounds' kill moments, in order; later rounds pick one at random."""


def add_parser(
    subparsers: argparse._SubParsersAction[Any],
    parents: list[argparse.ArgumentParser] | None = None,
) -> None:
    """Add the ``drill`` subcommand and its flags to the ``statelog`` parser.

    :param parents: parsers whose options every subcommand shares (``--quiet`` ...).
    """
    p = subparsers.add_parser(
        "drill",
        parents=parents or [],
        help="kill a writer mid-write N times and check every recovery (staging only)",
        description="Kill a writer with SIGKILL mid-write N times (also during and with a "
        "compaction pass), recover after each kill, and check the recovered state against a "
        "deterministic model: no acknowledged epoch lost, nothing applied twice.",
        epilog="exit status: 0 every round passed; 1 a round failed (the store is kept for "
        "inspection); 2 the store was not recoverable before the drill began; 3 usage error or "
        "refused store; 4 the store is busy; 5 another error. See docs/runbook.md.",
    )
    p.add_argument(
        "store",
        metavar="STORE-OR-TEMP",
        help="'temp' or a path that does not exist: a fresh store, removed after a pass; "
        "an existing store: only with --force (the drill writes to it)",
    )
    p.add_argument(
        "--kills", type=int, default=5, metavar="N", help="writer kills, one per round (5)"
    )
    p.add_argument(
        "--seed", type=int, default=None, metavar="S", help="seed of workload and timing (random)"
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--force", action="store_true", help="drill an existing store (staging)")
    p.add_argument(
        "--damage",
        action="store_true",
        help="flip a byte in the newest snapshot before one recovery and check the walk-back "
        "(needs --kills 4 or more)",
    )
    p.add_argument(
        "--segment-bytes",
        type=int,
        default=16 * 1024,
        metavar="BYTES",
        help="the writer's segment size (16384)",
    )
    p.set_defaults(func=run)


def _short(name: str) -> str:
    parsed = parse_snapshot_name(name)
    return f"snap@{parsed[0]}" if parsed else name


class _Usage(Exception):
    """Arguments or a target the drill refuses; exits :data:`EXIT_USAGE` with ``hint``."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def _target(arg: str, force: bool) -> tuple[Path, Callable[[], None] | None]:
    """The store to drill, and how to remove it after a pass (None: keep it).

    :raises _Usage: an existing store without ``force``, or a path that is not a store.
    """
    if arg == "temp":
        root = Path(tempfile.mkdtemp(prefix="statelog-drill-"))
        return root / "store", lambda: shutil.rmtree(root, ignore_errors=True)
    path = Path(arg)
    if not path.exists():
        return path, lambda: shutil.rmtree(path, ignore_errors=True)
    if path.is_dir() and (path / IDENTITY).is_file():
        if not force:
            raise _Usage(
                f"{path} is an existing store and the drill writes to it; refused",
                "drills belong in staging: use 'temp', or pass --force on a staging store",
            )
        return path, None
    if path.is_dir() and not any(path.iterdir()):

        def empty() -> None:
            for entry in path.iterdir():
                shutil.rmtree(entry, ignore_errors=True)

        return path, empty
    raise _Usage(f"{path} exists and is not a statelog store", "name a store, a new path or 'temp'")


def _prepare(store: Path) -> tuple[Origin, dict[str, Any]]:
    """Open (or create) the store once: its origin, with a previous drill's tables emptied.

    :raises StatelogError: the store cannot be opened (locked, damaged, ...).
    """
    with open_store(store) as s:
        if s.count(BUFFER) or s.count(APPLIED):
            with s.transaction() as tx:
                for table in (BUFFER, APPLIED):
                    for key, _ in s.items(table):
                        tx.delete(key, table=table)
        return origin_of(s)


@contextlib.contextmanager
def _progress(total: int, *, quiet: bool) -> Iterator[Callable[[], None]]:
    """A callback per finished round: a bar on a terminal's stderr, else nothing."""
    if quiet or not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("drill"), BarColumn(), MofNCompleteColumn(), console=Console(stderr=True),
        transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("rounds", total=total)
        yield lambda: bar.advance(task)


_COLUMNS = ("round", "kill moment", "acked", "recovered", "snapshot", "rejected", "replayed",
            "seconds", "verdict")  # fmt: skip


def _row(r: RoundResult) -> list[str]:
    rejected = ", ".join(_short(x["file"]) for x in r.rejected) or "-"
    return [
        str(r.round), r.moment, str(r.acked), "-" if r.recovered is None else str(r.recovered),
        _short(r.snapshot) if r.snapshot else "-", rejected, str(r.replayed),
        f"{r.seconds:.3f}", "pass" if r.passed else "FAIL",
    ]  # fmt: skip


def _print_table(results: list[RoundResult]) -> None:
    rows = [_row(r) for r in results]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(*_COLUMNS)
        for row in rows:
            table.add_row(
                *row[:-1], f"[green]{row[-1]}" if row[-1] == "pass" else f"[red]{row[-1]}"
            )
        Console().print(table)
    else:
        widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(_COLUMNS)]
        for row in (list(_COLUMNS), *rows):
            print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    for r in results:
        if r.damaged:
            print(f"round {r.round}: {r.damaged} was damaged before the recovery")
        for problem in r.problems:
            print(f"round {r.round} FAIL: {problem}")


def _usage(message: str, hint: str) -> int:
    print(f"statelog drill: error: {message} (hint: {hint})", file=sys.stderr)
    return EXIT_USAGE


def run(args: argparse.Namespace, *, writer: Sequence[str] | None = None) -> int:
    """Run the drill ``args`` describe; print the table (or JSON); return the exit status.

    :param writer: the writer command to kill instead of the drill's own
        (see :class:`statelog.cli.drill_rounds.Drill`); a test passes one
        that misbehaves, to prove the drill catches it.

    :returns: 0 when every round passed, 1 when one failed (the store is then
        kept and its path printed), :data:`EXIT_USAGE` for bad arguments or a
        refused store, or the status of the error that stopped the first open.
    """
    if args.kills < 1:
        return _usage(f"--kills {args.kills}: at least 1", "for example --kills 5")
    if args.damage and args.kills < 4:
        return _usage("--damage needs --kills 4 or more", "two compaction rounds must come first")
    if args.segment_bytes < 4096:
        return _usage(
            f"--segment-bytes {args.segment_bytes}: at least 4096", "the default is 16384"
        )
    try:
        store, cleanup = _target(args.store, args.force)
    except _Usage as u:
        return _usage(str(u), u.hint)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    try:
        origin, others = _prepare(store)
    except StatelogError as exc:
        if cleanup is not None:  # only ever a store this run created
            cleanup()
        return say_error(exc)
    drill = Drill(
        store,
        seed,
        origin,
        damage=bool(args.damage),
        segment_bytes=args.segment_bytes,
        writer=writer,
    )
    drill.others = others
    # Damage found before the first kill is the store's, not a recovery's: allowed, and told.
    already = sorted(p.name for _, _, p in list_snapshots(store / "snapshots") if not verifies(p))
    drill.damaged.update(already)
    results: list[RoundResult] = []
    with _progress(args.kills, quiet=args.json or getattr(args, "quiet", False)) as tick:
        for n in range(1, args.kills + 1):
            kind = KINDS[n - 1] if n <= len(KINDS) else drill.rng.choice(KINDS)
            results.append(drill.round(n, kind))
            tick()
    if drill.damage_pending:
        results[-1].problems.append("--damage: no round had two verified snapshots to walk back")
    passed = all(r.passed for r in results)
    if args.json:
        print_json({"store": str(store), "seed": seed, "kills": args.kills, "passed": passed,
                    "damaged_before": already,
                    "kept": not passed or cleanup is None,
                    "rounds": [r.to_dict() for r in results]})  # fmt: skip
    else:
        print(f"statelog drill: {store}, seed {seed}, {args.kills} kills")
        if already:
            print(f"damaged before the drill (allowed as rejections): {', '.join(already)}")
        _print_table(results)
        failed = [str(r.round) for r in results if not r.passed]
        print(f"result: FAIL (round {', '.join(failed)})" if failed else "result: PASS")
    if passed and cleanup is not None:
        cleanup()
    elif not passed:
        print(f"statelog drill: the store is kept for inspection: {store}", file=sys.stderr)
    return EXIT_OK if passed else EXIT_FAILED
