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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import statelog
from statelog.errors import StatelogError
from statelog.fileio import FileLayer
from statelog.layout import IDENTITY
from statelog.recovery import list_segments
from statelog.report import Outcome, RecoveryReport
from statelog.snapshot import list_snapshots, parse_snapshot_name, verify_snapshot

from .drill_writer import APPLIED, BUFFER, Model, Origin, check_state, origin_of
from .output import EXIT_OK, EXIT_USAGE, print_json, say_error

__all__ = ["EXIT_FAILED", "KINDS", "RoundResult", "add_parser", "run"]

EXIT_FAILED = 1
KINDS = ("compaction", "commit", "compactor", "compaction", "commit")
"""The first rounds' kill moments, in order; later rounds pick one at random."""
WAIT = 60.0  # seconds a child may take to reach the next step before the round fails
_WRITER = [sys.executable, "-m", "statelog.cli.drill_writer"]


@dataclasses.dataclass
class RoundResult:
    """One kill and the recovery after it."""

    round: int
    moment: str
    acked: int = 0
    recovered: int | None = None
    snapshot: str | None = None
    rejected: list[dict[str, str]] = dataclasses.field(default_factory=list)  # file, reason
    replayed: int = 0
    seconds: float = 0.0
    step: str | None = None  # the compactor's durable step held (or killed) at the writer's kill
    damaged: str | None = None  # the snapshot --damage flipped a byte in before this recovery
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when every check of the round held."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """The round as JSON-ready data."""
        return {**dataclasses.asdict(self), "verdict": "pass" if self.passed else "FAIL"}


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


class _Child:
    """A subprocess whose stdout lines a thread collects as they come."""

    def __init__(self, argv: list[str], *, stdin: bool = False) -> None:
        # stderr to a file, not a pipe: a chatty child must never block on a full pipe
        self.err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed by __exit__)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.err,
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._cond:
                self.lines.append(raw.decode().strip())
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for(self, ok: Callable[[list[str]], bool], timeout: float = WAIT) -> bool:
        """Wait until ``ok(lines)`` holds; False at end of output or after ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: ok(self.lines) or self._eof, timeout) and ok(
                self.lines
            )

    def acked(self) -> int:
        """The last epoch acknowledged so far (0: none)."""
        with self._cond:
            acks = [int(x.split()[1]) for x in self.lines if x.startswith("ack ")]
        return acks[-1] if acks else 0

    def __enter__(self) -> _Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self.err.close()

    def kill(self) -> int:
        """SIGKILL the process (if alive), read the rest of its output; its return code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        code = self.proc.wait()
        self._thread.join(10)
        return code

    def stderr_tail(self) -> str:
        """The last lines of the child's stderr, for a failure message."""
        self.err.seek(0)
        return " | ".join(self.err.read().decode(errors="replace").strip().splitlines()[-3:])


class _Drill:
    """The rounds over one store, and what they remember between rounds."""

    def __init__(self, store: Path, seed: int, origin: Origin, args: argparse.Namespace) -> None:
        self.store, self.seed, self.origin = store, seed, origin
        self.rng = random.Random(f"statelog-drill-timing:{seed}")
        self.model = Model.start(seed, origin)
        self.damaged: set[str] = set()
        self.damage_pending: bool = bool(args.damage)
        self.segment_bytes: int = args.segment_bytes
        self.last_epoch = origin.epoch
        self.others: dict[str, Any] = {}

    def round(self, n: int, kind: str) -> RoundResult:
        """Run round ``n``: start the writer, kill it at a ``kind`` moment, recover, check."""
        r = RoundResult(n, kind)
        argv = [*_WRITER, "write", str(self.store), "--seed", str(self.seed), "--origin",
                self.origin.to_json(), "--segment-bytes", str(self.segment_bytes)]  # fmt: skip
        with _Child(argv) as writer:
            try:
                if not writer.wait_for(lambda ls: any(x.startswith("open ") for x in ls)):
                    r.problems.append(f"the writer did not open the store: {writer.stderr_tail()}")
                else:
                    opened = int(next(x for x in writer.lines if x.startswith("open ")).split()[1])
                    if opened != self.last_epoch:
                        r.problems.append(
                            f"the writer recovered epoch {opened}, the drill {self.last_epoch}"
                        )
                    self._kill(writer, kind, r)
            finally:
                code = writer.kill()
            r.acked = writer.acked()
            if code != -signal.SIGKILL:
                r.problems.append(f"the writer exited with {code}: {writer.stderr_tail()}")
            elif r.acked <= self.last_epoch and not r.problems:
                r.problems.append("the writer acknowledged no commit before the kill")
        self._maybe_damage(r)
        self._recover(r)
        return r

    def _kill(self, writer: _Child, kind: str, r: RoundResult) -> None:
        start = self.last_epoch
        if kind == "commit":
            target = start + self.rng.randint(1, 80)
            if not writer.wait_for(lambda _: writer.acked() >= target):
                r.problems.append(
                    f"the writer stalled before epoch {target}: {writer.stderr_tail()}"
                )
            time.sleep(self.rng.uniform(0, 0.02))
            return
        if not writer.wait_for(lambda _: writer.acked() > start and self._sealed_tail()):
            r.problems.append(f"the writer sealed no segment: {writer.stderr_tail()}")
            return
        step = self.rng.randint(1, 8)  # every pass that writes a snapshot has 8 durable steps
        argv = [*_WRITER, "compact", str(self.store), "--pause-at", str(step)]
        with _Child(argv, stdin=True) as comp:
            comp.wait_for(lambda ls: any(x.startswith(("step ", "done")) for x in ls))
            paused = next((x for x in comp.lines if x.startswith("step ")), None)
            r.step = paused.split()[1] if paused else None
            r.moment = "compaction" if paused else "commit (pass ended first)"
            time.sleep(self.rng.uniform(0, 0.02))
            writer.kill()
            if kind == "compactor" and paused:
                r.moment = "compactor killed"
                code = comp.kill()
                if code != -signal.SIGKILL:
                    r.problems.append(f"the compactor exited with {code}: {comp.stderr_tail()}")
                return
            assert comp.proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # a compactor that died is caught below
                comp.proc.stdin.write(b"go\n")
                comp.proc.stdin.close()
            if comp.proc.wait(WAIT) != 0 or not comp.wait_for(
                lambda ls: any(x.startswith("done") for x in ls)
            ):
                r.problems.append(f"the compaction pass failed: {comp.stderr_tail()}")

    def _sealed_tail(self) -> bool:
        """True when a sealed segment lies after the newest snapshot (the compactor has work)."""
        snaps = list_snapshots(self.store / "snapshots")
        lsn = snaps[0][1] if snaps else 0
        return sum(first > lsn for _, first, _ in list_segments(self.store / "wal")) >= 2

    def _maybe_damage(self, r: RoundResult) -> None:
        """With --damage, flip a byte in the newest snapshot once two verified ones exist."""
        if not self.damage_pending:
            return
        good = [p for _, _, p in list_snapshots(self.store / "snapshots") if _verifies(p)]
        if len(good) < 2:
            return
        newest = good[0]
        with newest.open("r+b") as fh:
            fh.seek(newest.stat().st_size // 2)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([byte[0] ^ 0xFF]))
        self.damaged.add(newest.name)
        self.damage_pending = False
        r.damaged = newest.name

    def _recover(self, r: RoundResult) -> None:
        try:
            store = statelog.open(self.store)
        except StatelogError as exc:
            r.problems.append(f"recovery failed: {exc}")
            return
        try:
            rep: RecoveryReport = store.recovery
            r.recovered, r.replayed, r.seconds = rep.epoch, rep.replayed, round(rep.seconds, 6)
            r.snapshot = rep.snapshot.name if rep.snapshot else None
            r.rejected = [{"file": x.path.name, "reason": x.reason} for x in rep.rejected]
            if rep.epoch < r.acked:
                r.problems.append(
                    f"lost acknowledged epochs: recovered {rep.epoch} < acked {r.acked}"
                )
            elif rep.epoch > r.acked + 1:  # one commit may have landed unacknowledged, not two
                r.problems.append(f"recovered epoch {rep.epoch} is past the last ack {r.acked} + 1")
            r.problems += self._check_report(rep)
            j = rep.epoch - self.origin.epoch
            if j < self.model.j:
                self.model = Model.start(self.seed, self.origin)
            self.model.advance_to(j)
            r.problems += check_state(store, self.model)
            others = origin_of(store)[1]
            if self.others and others != self.others:
                r.problems.append("the store's own (non-drill) state changed")
            self.others = others
            self.last_epoch = rep.epoch
        finally:
            store.close()
        for _, _, snap in list_snapshots(self.store / "snapshots"):
            if snap.name not in self.damaged and not _verifies(snap):
                r.problems.append(
                    f"{snap.name} does not verify: a snapshot the drill did not damage"
                )

    def _check_report(self, rep: RecoveryReport) -> list[str]:
        problems = []
        snap_dir = (self.store / "snapshots").resolve()
        for rej in rep.rejected:
            is_snap = rej.path.resolve().parent == snap_dir
            if is_snap and rej.path.name not in self.damaged:
                problems.append(f"rejected {rej.path.name}, which the drill did not damage: {rej}")
            elif not is_snap and rep.outcome is not Outcome.TORN_TAIL:
                problems.append(f"rejected {rej} (outcome {rep.outcome})")
        if rep.outcome is Outcome.CORRUPTION or rep.lost_epochs:
            problems.append(f"outcome {rep.outcome}, lost epochs {list(rep.lost_epochs)}")
        rejected = {x.path.name for x in rep.rejected}
        used = parse_snapshot_name(rep.snapshot) if rep.snapshot else None
        for name in sorted(self.damaged - rejected):
            at = parse_snapshot_name(name)
            # The ladder stops at the newest snapshot that verifies: a damaged one newer
            # than the snapshot used must have been walked past, and reported.
            if (self.store / "snapshots" / name).exists() and (used is None or (at and at > used)):
                problems.append(f"the damaged {name} was not reported as rejected")
        if rep.snapshot is not None and rep.snapshot.name in self.damaged:
            problems.append(f"recovery used the damaged {rep.snapshot.name}")
        return problems


def _verifies(path: Path) -> bool:
    try:
        verify_snapshot(FileLayer(), path, store_id=None)
    except StatelogError:
        return False
    return True


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
    with statelog.open(store) as s:
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


def run(args: argparse.Namespace) -> int:
    """Run the drill ``args`` describe; print the table (or JSON); return the exit status.

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
    drill = _Drill(store, seed, origin, args)
    drill.others = others
    # Damage found before the first kill is the store's, not a recovery's: allowed, and told.
    already = sorted(p.name for _, _, p in list_snapshots(store / "snapshots") if not _verifies(p))
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
