"""The drill's rounds: start a writer, kill it at a chosen moment, recover, check.

A round of ``statelog drill`` (:mod:`statelog.cli.drill`) starts the
drill's writer (:mod:`statelog.cli.drill_writer`) as a subprocess, waits
for it to open the store and commit, and SIGKILLs it at the round's kill
moment: while it commits, while a compaction pass runs in a second
subprocess (held at one of its durable steps until the writer is dead), or
together with that compactor, killed mid-pass. With ``--damage`` it flips
a byte in the newest snapshot once two verified ones exist. Then it opens
the store as a restarted reconciler would and checks the recovery: no
acknowledged epoch lost, at most one unacknowledged epoch gained, exactly
the model's state, only damaged snapshots rejected, every other snapshot
verifying. :class:`Drill` remembers between rounds what the next one
checks against; each check that fails is one line of
:attr:`RoundResult.problems`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from statelog.cli.drill_writer import (
    APPLIED,
    BUFFER,
    PASS_STEPS,
    Model,
    Origin,
    check_state,
    origin_of,
)
from statelog.errors import StatelogError
from statelog.log.segments import list_segments
from statelog.recovery.report import Outcome, RecoveryReport
from statelog.storage.fileio import FileLayer
from statelog.storage.snapshots import list_snapshots, parse_snapshot_name, verify_snapshot
from statelog.store.store import open as open_store

__all__ = ["Drill", "Flip", "RoundResult", "verifies"]

WAIT = 60.0  # seconds a child may take to reach the next step before the round fails
_WRITER = [sys.executable, "-P", "-m", "statelog.cli.drill_writer"]


@dataclasses.dataclass
class RoundResult:
    """One kill and the recovery after it."""

    round: int
    moment: str
    acked: int = 0
    recovered: int | None = None
    snapshot: str | None = None
    outcome: str | None = None  # what recovery found at the end of the log (clean, torn-tail)
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


@dataclasses.dataclass(frozen=True)
class Flip:
    """A byte ``--damage`` flipped: where, and what it held before (so it can be put back)."""

    path: Path
    offset: int
    byte: int


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


class Drill:
    """The rounds over one store, and what they remember between rounds."""

    def __init__(
        self,
        store: Path,
        seed: int,
        origin: Origin,
        *,
        damage: bool,
        segment_bytes: int,
        writer: Sequence[str] | None = None,
    ) -> None:
        """:param damage: flip a byte in a snapshot before one recovery (``--damage``).

        :param writer: the command of the writer to kill, followed by the
            arguments of ``python -m statelog.cli.drill_writer``'s ``write``
            (default: that very writer). A test passes a writer that
            misbehaves to see the drill's checks fail.
        """
        self.store, self.seed, self.origin = store, seed, origin
        self.writer = list(writer) if writer is not None else _WRITER
        self.rng = random.Random(f"statelog-drill-timing:{seed}")
        self.model = Model.start(seed, origin)
        self.damaged: set[str] = set()
        self.flips: list[Flip] = []
        self.damage_pending = damage
        self.segment_bytes = segment_bytes
        self.last_epoch = origin.epoch
        self.others: dict[str, Any] = {}

    def round(self, n: int, kind: str) -> RoundResult:
        """Run round ``n``: start the writer, kill it at a ``kind`` moment, recover, check."""
        r = RoundResult(n, kind)
        argv = [*self.writer, "write", str(self.store), "--seed", str(self.seed), "--origin",
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
        step = self.rng.randint(1, PASS_STEPS)
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
        good = [p for _, _, p in list_snapshots(self.store / "snapshots") if verifies(p)]
        if len(good) < 2:
            return
        newest = good[0]
        offset = newest.stat().st_size // 2
        with newest.open("r+b") as fh:
            fh.seek(offset)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([byte[0] ^ 0xFF]))
        self.flips.append(Flip(newest, offset, byte[0]))
        self.damaged.add(newest.name)
        self.damage_pending = False
        r.damaged = newest.name

    def _recover(self, r: RoundResult) -> None:
        try:
            store = open_store(self.store, tables=(APPLIED, BUFFER))
        except StatelogError as exc:
            r.problems.append(f"recovery failed: {exc}")
            return
        try:
            rep: RecoveryReport = store.recovery
            r.recovered, r.replayed, r.seconds = rep.epoch, rep.replayed, round(rep.seconds, 6)
            r.snapshot = rep.snapshot.name if rep.snapshot else None
            r.outcome = str(rep.outcome)
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
            if snap.name not in self.damaged and not verifies(snap):
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


def verifies(path: Path) -> bool:
    """True when the snapshot at ``path`` verifies whole (any store id)."""
    try:
        verify_snapshot(FileLayer(), path, store_id=None)
    except StatelogError:
        return False
    return True
