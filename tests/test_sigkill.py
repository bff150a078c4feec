"""SIGKILL a committing writer again and again; every acknowledged epoch must survive.

``tests/crash_writer.py`` runs as a real subprocess and commits the kit's
seeded stream (commit ``i`` is a pure function of the seed and ``i``),
printing ``begin i`` before and ``ack i`` after each ``commit`` returns. The
parent kills it with SIGKILL, reopens the store, and checks:

* ``last acknowledged <= recovered epoch <= last attempted``, and never
  below the epoch verified in the round before (nothing ever goes back);
* the whole state (every table, the offsets, the watermark) equals the model
  recomputed from the stream at the recovered epoch: the fold of commits
  ``1..E``, never a mix;
* the next writer recovers exactly that epoch and state (its ``open`` line
  carries its recovered epoch and a digest of its state), and continues the
  same store, so the log grows over many restarts and recoveries.

The moments of death cycle through kinds that a timed kill alone would hit
rarely or never:

``start``     killed right after start: mostly a random moment of the open
              (creating the store in the first round; later recovery, which
              may be cutting and sealing a torn tail left by the round
              before), sometimes still in interpreter start-up;
``mid``       killed a random fraction of a millisecond after ``begin k``:
              inside a commit (encode, write, fdatasync) or between two;
``roll``      killed right after announcing a commit that rolls the segment;
``torn``      the writer SIGKILLs itself halfway through writing a record,
              leaving a torn tail exactly as an interrupted write does;
``rollself``  the writer SIGKILLs itself at one step of a segment roll (SEAL
              half written, SEAL synced, temp file half written, renamed but
              directory not synced, new segment opened, first record torn).

The kill sequence is drawn from a fixed seed; the timing of external kills is
the machine's own, so every run explores a slightly different schedule, and a
failure message names the round, the mode and the store path to inspect.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import statelog
from statelog.kit import Model, Stream
from tests.helpers import segments, snapshot_of

WRITER = Path(__file__).with_name("crash_writer.py")
REPO = Path(__file__).resolve().parent.parent
STREAM_SEED = 4_817
STREAM = Stream(seed=STREAM_SEED)
SEGMENT_BYTES = 16 * 1024
FRAGMENT_BYTES = 2048
COUNT = 80  # commits a writer makes before closing cleanly, if it is not killed first
CYCLE = ("start", "mid", "torn", "start", "roll", "rollself")  # the first kill may hit creation
ROLL_POINTS = ("seal-torn", "sealed", "tmp", "renamed", "opened", "first-torn")
SELF_KILLS = ("torn", "rollself")
WAIT = 60.0  # seconds a writer may take to reach any one point before the test gives up


class _Lines:
    """Lines of a child's stdout, read with a deadline and a cursor."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._buf = b""
        self.lines: list[str] = []
        self.eof = False
        self._cursor = 0

    def _fill(self, timeout: float) -> None:
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout))
        if not ready:
            return
        chunk = os.read(self._fd, 1 << 16)
        if not chunk:
            self.eof = True
            return
        *complete, self._buf = (self._buf + chunk).split(b"\n")
        self.lines.extend(c.decode() for c in complete)

    def wait_for(self, pred: Callable[[str], bool], timeout: float = WAIT) -> str | None:
        """The next unread line matching ``pred``; None at end of output."""
        deadline = time.monotonic() + timeout
        while True:
            while self._cursor < len(self.lines):
                line = self.lines[self._cursor]
                self._cursor += 1
                if pred(line):
                    return line
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"writer stuck; output so far: {self.lines[-5:]}")
            self._fill(left)

    def drain(self) -> None:
        self.wait_for(lambda _line: False)


def _spin(seconds: float) -> None:
    """Sleep precisely (sub-millisecond): a busy wait, since time.sleep overshoots."""
    end = time.perf_counter() + seconds
    if seconds > 0.005:
        time.sleep(seconds - 0.002)
    while time.perf_counter() < end:
        pass


@dataclass
class _Run:
    """What one writer process reported before it died or finished."""

    mode: str
    die_at: str | None
    returncode: int
    lines: list[str]
    opened: tuple[int, str] | None = None
    last_begin: int | None = None
    last_ack: int | None = None

    def __post_init__(self) -> None:
        for line in self.lines:
            word, _, rest = line.partition(" ")
            if word == "open":
                epoch, digest = rest.split()
                self.opened = (int(epoch), digest)
            elif word == "begin":
                self.last_begin = int(rest.split()[0])
            elif word == "ack":
                self.last_ack = int(rest)

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def describe(self, round_no: int, store: Path) -> str:
        return (
            f"round {round_no} mode={self.mode} die_at={self.die_at} rc={self.returncode} "
            f"store={store} tail={self.lines[-4:]}"
        )


@dataclass
class _Timing:
    """Running estimates of a writer's start-up and recovery times, to aim ``start`` kills."""

    startup: float = 0.15  # spawn to "opening"
    recovery: float = 0.02  # "opening" to "open"

    def update(self, startup: float | None, recovery: float | None) -> None:
        if startup is not None:
            self.startup = 0.7 * self.startup + 0.3 * startup
        if recovery is not None:
            self.recovery = 0.7 * self.recovery + 0.3 * recovery


def _run_writer(
    store: Path, mode: str, rng: random.Random, timing: _Timing, err: Path, nth: int
) -> _Run:
    """One writer run; ``nth`` counts earlier runs of the same mode."""
    die_at: str | None = None
    if mode == "torn":
        die_at = f"torn:{rng.randint(1, 12)}:{rng.random():.4f}"
    elif mode == "rollself":
        point = ROLL_POINTS[nth % len(ROLL_POINTS)]  # every point, in turn
        die_at = f"roll:{rng.randint(1, 2)}:{point}:{rng.random():.4f}"
    cmd = [
        sys.executable,
        str(WRITER),
        str(store),
        f"--seed={STREAM_SEED}",
        f"--count={COUNT}",
        f"--segment-bytes={SEGMENT_BYTES}",
        f"--fragment-bytes={FRAGMENT_BYTES}",
    ]
    if die_at:
        cmd.append(f"--die-at={die_at}")
    with err.open("wb") as errf:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, cwd=REPO)
    out = _Lines(proc)
    startup: float | None = None
    recovery: float | None = None
    try:
        if mode == "start" and rng.random() < 0.25:
            _spin(rng.uniform(0.0, timing.startup))  # still starting the interpreter
            proc.kill()
        elif mode == "start":
            if out.wait_for(lambda line: line == "opening") is not None:
                _spin(rng.uniform(0.0, 1.2 * timing.recovery))  # somewhere in recovery
                proc.kill()
        elif mode == "mid":
            k = rng.randint(1, 25)
            if out.wait_for(lambda line: line == "opening") is not None:
                startup = time.monotonic() - started
            first = out.wait_for(lambda line: line.startswith("open "))
            if first is not None and startup is not None:
                recovery = time.monotonic() - started - startup
            if first is not None:
                target = f"begin {int(first.split()[1]) + k}"
                if out.wait_for(lambda line: line.startswith(target)) is not None:
                    _spin(rng.uniform(0.0, 0.0015))
                    proc.kill()
        elif mode == "roll":
            n = rng.randint(1, 2)
            seen = 0

            def nth_roll(line: str) -> bool:
                nonlocal seen
                seen += line.endswith(" roll")
                return seen == n

            if out.wait_for(nth_roll) is not None:
                _spin(rng.uniform(0.0, 0.001))
                proc.kill()
        # self kills: the writer dies on its own
        out.drain()
        proc.wait(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    timing.update(startup, recovery)
    run = _Run(mode, die_at, proc.returncode, out.lines)
    if not run.killed and not (run.returncode == 0 and run.lines[-1:] == ["done"]):
        raise AssertionError(
            f"writer failed ({mode}, {die_at}, rc={proc.returncode}):\n"
            + err.read_text(errors="replace")[-3000:]
        )
    return run


@dataclass
class _Campaign:
    store: Path
    model: Model = field(default_factory=Model)
    verified: int = 0  # epoch recovered and checked at the end of the last round

    def model_at(self, epoch: int) -> Model:
        if epoch < self.model.epoch:
            self.model = Model()  # never expected: the checks before this fail first
        return STREAM.advance(self.model, epoch)

    def digest_at(self, epoch: int) -> str:
        return self.model_at(epoch).digest()

    def check_store(self, store: statelog.StateStore, epoch: int, where: str) -> None:
        assert store.epoch == epoch, where
        assert store.recovery.epoch == epoch, where
        assert store.recovery.outcome is not statelog.Outcome.CORRUPTION, (
            f"{where}: a kill was read as corruption: {store.recovery}"
        )
        assert not store.recovery.lost_epochs, where
        assert snapshot_of(store) == self.model_at(epoch).state(), (
            f"{where}: state at epoch {epoch} differs from the model"
        )


def _campaign(store: Path, *, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    camp = _Campaign(store)
    err = store.parent / "writer.stderr"
    done_kills: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    timing = _Timing()
    round_no = 0
    opens = 0  # writer opens that completed (each starts a new segment)
    while sum(done_kills.values()) < kills:
        round_no += 1
        assert round_no <= 2 * kills + 20, f"too few kills landed: {done_kills}"
        mode = CYCLE[(round_no - 1) % len(CYCLE)]
        run = _run_writer(store, mode, rng, timing, err, runs[mode])
        runs[mode] += 1
        where = run.describe(round_no, store)
        if run.killed:
            done_kills[mode] += 1
        opens += run.opened is not None

        # The writer recovered exactly what the parent verified last round.
        if run.opened is not None:
            epoch, digest = run.opened
            assert epoch == camp.verified, f"{where}: writer recovered {epoch}, not {camp.verified}"
            assert digest == camp.digest_at(epoch), f"{where}: writer's recovered state differs"

        low = max(camp.verified, run.last_ack or 0)
        high = run.last_begin if run.last_begin is not None else camp.verified
        if run.opened is None and camp.verified == 0 and not (store / "IDENTITY").exists():
            continue  # killed before the store first existed
        with statelog.open(store, readonly=True) as ro:
            got = ro.epoch
            assert low <= got <= high, (
                f"{where}: recovered epoch {got}, acknowledged {run.last_ack}, "
                f"attempted {run.last_begin}, verified before {camp.verified}"
            )
            if mode in SELF_KILLS:
                # The writer died before its attempted commit was whole on disk.
                assert got == (run.last_ack or camp.verified), where
            camp.check_store(ro, got, where)
            outcomes[str(ro.recovery.outcome)] += 1
        camp.verified = got

        if round_no % 9 == 0:
            # A writer open in this process: recovery with repair, then a clean close.
            with statelog.open(
                store, segment_bytes=SEGMENT_BYTES, fragment_bytes=FRAGMENT_BYTES
            ) as st:
                camp.check_store(st, got, f"{where} (writer reopen)")
            opens += 1

    # The log grew across every restart; a final writer open repairs and seals it,
    # and the open after that finds a clean log replayed from the start.
    with statelog.open(store, segment_bytes=SEGMENT_BYTES, fragment_bytes=FRAGMENT_BYTES) as st:
        camp.check_store(st, camp.verified, "final writer open")
    with statelog.open(store) as st:
        camp.check_store(st, camp.verified, "final clean open")
        rep = st.recovery
        assert rep.outcome is statelog.Outcome.CLEAN
        assert rep.replayed == camp.verified
        assert rep.truncated_bytes == 0 and not rep.rejected
    opens += 2
    wal = store / "wal"
    assert not list(wal.glob("*.tmp")), "temp files survived a writer open"
    # Every writer open seals the log's last segment and starts a new one: the
    # log grew across the restarts, none of its segments was lost or merged.
    assert len(segments(store)) >= 1 + opens, (len(segments(store)), opens)
    assert sum(done_kills.values()) >= kills
    for mode in set(CYCLE):
        assert done_kills[mode] >= kills // (2 * len(CYCLE)), f"few {mode} kills: {done_kills}"
    # The campaign really exercised torn tails, and recovery kept them apart from corruption.
    assert outcomes[str(statelog.Outcome.TORN_TAIL)] >= 1, outcomes
    assert list(wal.glob("*.broken*")), "no torn tail was ever saved aside"
    assert camp.verified > kills, "the stream barely advanced"


def test_sigkill_committing_writer(tmp_path: Path) -> None:
    """60 SIGKILLs of one store's successive writers; each recovery checked against the model."""
    _campaign(tmp_path / "store", kills=60, seed=20_240_611)


@pytest.mark.stress
def test_sigkill_committing_writer_stress(tmp_path: Path) -> None:
    """500 SIGKILLs: the same campaign with a longer log and many more recoveries."""
    _campaign(tmp_path / "store", kills=500, seed=7_031_977)
