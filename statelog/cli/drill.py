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

An existing store is drilled on a copy unless ``--in-place`` (or its
synonym ``--force``) asks for the store itself; a drill in place puts back
the bytes ``--damage`` flipped and tells what it changed
(:mod:`statelog.cli.drill_target`).

This module is the command: its arguments, the store it drills, the
output. The rounds themselves are :mod:`statelog.cli.drill_rounds`.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from statelog.cli.drill_rounds import Drill, RoundResult, verifies
from statelog.cli.drill_target import (
    Footprint,
    Target,
    changes,
    choose_target,
    footprint,
    print_changes,
    settle_damage,
)
from statelog.cli.drill_writer import APPLIED, BUFFER, Origin, origin_of
from statelog.cli.exits import EXIT_OK, EXIT_USAGE
from statelog.cli.output import print_json, say_error
from statelog.errors import NotAStoreError, StatelogError
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
        epilog="An existing store is drilled on a copy and left unchanged, unless --in-place. "
        "exit status: 0 every round passed; 1 a round failed (the store drilled is kept for "
        "inspection); 2 the store was not recoverable before the drill began; 3 usage error or "
        "refused store; 4 the store is busy (in place); 5 another error. See docs/runbook.md.",
    )
    p.add_argument(
        "store",
        metavar="STORE-OR-TEMP",
        help="'temp' or a path that does not exist: a fresh store, removed after a pass; "
        "an existing store: a copy of it, removed after a pass (the store is only read), "
        "or the store itself with --in-place",
    )
    p.add_argument(
        "--kills", type=int, default=5, metavar="N", help="writer kills, one per round (5)"
    )
    p.add_argument(
        "--seed", type=int, default=None, metavar="S", help="seed of workload and timing (random)"
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument(
        "--in-place",
        "--force",
        dest="in_place",
        action="store_true",
        help="drill an existing store itself, not a copy (staging only): the drill commits to "
        "it, compacts it and, with --damage, damages a snapshot and puts it back; it tells "
        "what it changed. --force is the same option",
    )
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


def _prepare(store: Path, *, in_place: bool) -> tuple[Origin, dict[str, Any], Footprint | None]:
    """Open (or create) the store once: its origin, with a previous drill's tables emptied;
    in place, also the store as it was before (:func:`footprint`).

    :raises StatelogError: the store cannot be opened (locked, damaged, ...).
    """
    before = footprint(store) if in_place else None
    with open_store(store, tables=(APPLIED, BUFFER)) as s:
        if s.count(BUFFER) or s.count(APPLIED):
            with s.transaction() as tx:
                for table in (BUFFER, APPLIED):
                    for key, _ in s.items(table):
                        tx.delete(key, table=table)
        return (*origin_of(s), before)


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


def _bad_args(args: argparse.Namespace) -> int | None:
    """:data:`EXIT_USAGE` (told on stderr) for arguments the drill refuses, else None."""
    if args.kills < 1:
        return _usage(f"--kills {args.kills}: at least 1", "for example --kills 5")
    if args.damage and args.kills < 4:
        return _usage("--damage needs --kills 4 or more", "two compaction rounds must come first")
    if args.segment_bytes < 4096:
        return _usage(
            f"--segment-bytes {args.segment_bytes}: at least 4096", "the default is 16384"
        )
    return None


def _rounds(drill: Drill, args: argparse.Namespace) -> list[RoundResult]:
    results: list[RoundResult] = []
    with _progress(args.kills, quiet=args.json or getattr(args, "quiet", False)) as tick:
        for n in range(1, args.kills + 1):
            kind = KINDS[n - 1] if n <= len(KINDS) else drill.rng.choice(KINDS)
            results.append(drill.round(n, kind))
            tick()
    if drill.damage_pending:
        results[-1].problems.append("--damage: no round had two verified snapshots to walk back")
    return results


def _report(
    args: argparse.Namespace,
    target: Target,
    head: dict[str, Any],
    results: list[RoundResult],
    changed: dict[str, Any] | None,
) -> None:
    """Print the outcome: one JSON document, or the header, the table, what changed, the
    result line."""
    passed = all(r.passed for r in results)
    if args.json:
        print_json({**head, "passed": passed, "kept": not passed or target.cleanup is None,
                    "changes": changed, "rounds": [r.to_dict() for r in results]})  # fmt: skip
        return
    where = str(target.path)
    if target.mode == "copy":
        where = f"a copy of {target.source} (which the drill only reads) at {target.path}"
    print(f"statelog drill: {where}, seed {head['seed']}, {args.kills} kills")
    if head["damaged_before"]:
        print(
            "damaged before the drill (allowed as rejections): " + ", ".join(head["damaged_before"])
        )
    _print_table(results)
    if changed is not None:
        print_changes(target.path, changed)
    failed = [str(r.round) for r in results if not r.passed]
    print(f"result: FAIL (round {', '.join(failed)})" if failed else "result: PASS")


def run(args: argparse.Namespace, *, writer: Sequence[str] | None = None) -> int:
    """Run the drill ``args`` describe; print the table (or JSON); return the exit status.

    An existing store is drilled on a copy (removed after a pass, kept and
    named after a failure) and only read, unless ``args.in_place``; in place,
    every byte ``--damage`` flipped is put back at the end (also when the
    drill is interrupted) and what the drill changed is printed.

    :param writer: the writer command to kill instead of the drill's own
        (see :class:`statelog.cli.drill_rounds.Drill`); a test passes one
        that misbehaves, to prove the drill catches it.

    :returns: 0 when every round passed, 1 when one failed (the store drilled
        is then kept and its path printed), :data:`EXIT_USAGE` for bad
        arguments or a refused store, or the status of the error that stopped
        the copy or the first open.
    """
    bad = _bad_args(args)
    if bad is not None:
        return bad
    try:
        target = choose_target(args.store, in_place=args.in_place)
    except NotAStoreError as exc:
        return _usage(exc.message, exc.command_hint)
    except StatelogError as exc:
        return say_error(exc)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    store = target.path
    try:
        origin, others, before = _prepare(store, in_place=target.mode == "in-place")
    except StatelogError as exc:
        if target.cleanup is not None:  # only ever a store this run created
            target.cleanup()
        return say_error(exc)
    drill = Drill(
        store, seed, origin, damage=bool(args.damage), segment_bytes=args.segment_bytes,
        writer=writer,
    )  # fmt: skip
    drill.others = others
    # Damage found before the first kill is the store's, not a recovery's: allowed, and told.
    already = sorted(p.name for _, _, p in list_snapshots(store / "snapshots") if not verifies(p))
    drill.damaged.update(already)
    try:
        results = _rounds(drill, args)
    except BaseException:  # interrupted: leave no damage in a store, no copy behind
        if before is not None:
            settle_damage(store, drill.flips)
        elif target.cleanup is not None:
            target.cleanup()
        raise
    changed = None
    if before is not None:
        damaged, verdict = settle_damage(store, drill.flips)  # before the footprint
        changed = changes(before, footprint(store), damaged, verdict)
    head = {"store": str(store), "mode": target.mode, "source": target.source, "seed": seed,
            "kills": args.kills, "damaged_before": already}  # fmt: skip
    _report(args, target, head, results, changed)
    passed = all(r.passed for r in results)
    if passed and target.cleanup is not None:
        target.cleanup()
    elif not passed and target.mode == "copy":
        print(
            f"statelog drill: the copy is kept for inspection: {store} "
            f"({target.source} was not changed)",
            file=sys.stderr,
        )
    elif not passed:
        print(f"statelog drill: the store is kept for inspection: {store}", file=sys.stderr)
    return EXIT_OK if passed else EXIT_FAILED
