"""Commit latency with the compaction daemon running on the same store, and without it.

Each run, in a freshly spawned interpreter: clone a template (its state in
one snapshot), open it with ``durability="commit"`` and small segments
(``segment_bytes``) so that segments seal during the run; with the daemon,
start ``python -m compactor --interval I --min-tail-bytes B --retain R STORE``
as a real subprocess and wait until it holds the store; then commit
``warmup`` + ``checkpoints`` checkpoints of the issue-2 workload, timing
each ``store.commit``. The daemon folds sealed segments into snapshots in
its own process, and the writer's watcher thread swaps each new snapshot in
as its base (verify, decompress, map: off the commit path, in the writer's
process). Without the daemon, the same writer settings and checkpoints, and
nothing compacts.

Runs alternate (without, with, without, with, ...) so both see the same
drift of the machine's load; samples are pooled by condition. Every commit
is also split into steps with :func:`benchmarks.profile_commit.instrument`
(the same dozen timers in both conditions, microseconds per commit), so the
slowest commits of each condition can be compared step by step.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from statelog.state.live import LiveState

from .measure import percentile
from .procstat import rss, thread_schedstat
from .profile_commit import _PROBES, BUCKETS, _buckets, instrument
from .stores import ROOT, clone_store, dir_bytes
from .strategies import commit_checkpoint
from .workload import DEFAULT_SEED, Workload

__all__ = ["CommitSample", "DaemonSpec", "LatencyRun", "Pass", "daemon_command", "run_latency"]

_MiB = 1 << 20
_GENERATION = "begin_generation"


class _GcClock:
    """A ``gc.callbacks`` hook summing the collector's pauses into ``total``."""

    def __init__(self) -> None:
        self.total = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._start


@dataclass(frozen=True)
class DaemonSpec:
    keys: int
    updates: int = 10_000
    checkpoints: int = 150
    warmup: int = 5
    pairs: int = 2
    """Runs per condition, alternating."""
    segment_bytes: int = 8 * _MiB
    min_tail_bytes: int = 8 * _MiB
    interval: float = 1.0
    retain: int = 2
    seed: int = DEFAULT_SEED


@dataclass(frozen=True)
class CommitSample:
    start: float
    """Wall clock (``time.time()``) when the commit started."""
    seconds: float
    cpu_seconds: float
    """CPU time of the committing thread (the watcher thread is not counted)."""
    runq_seconds: float
    """Time the committing thread was runnable but waited for a core (schedstat)."""
    buckets: dict[str, float]
    """The commit split into the steps of :data:`benchmarks.profile_commit.BUCKETS`."""
    overlay: int
    """Overlay entries after the commit."""
    generation_seconds: float = 0.0
    """Part of the ``other`` bucket: ``LiveState.begin_generation`` (on a segment roll;
    past ``MAX_GENERATIONS`` it merges the two oldest generations)."""
    gc_seconds: float = 0.0
    """Garbage-collector pauses during the commit (``gc.callbacks``)."""


@dataclass(frozen=True)
class Pass:
    """One compaction pass of the daemon, from its ``pass_done`` log line."""

    end: float
    seconds: float
    snapshot: bool

    @property
    def start(self) -> float:
        return self.end - self.seconds


@dataclass(frozen=True)
class LatencyRun:
    daemon: bool
    index: int
    samples: list[CommitSample]
    nice: int | None = None
    """The daemon ran under ``nice -n`` this (None: at the writer's priority)."""
    swaps: list[float] = field(default_factory=list)
    """Wall-clock times at which the writer swapped in a new base."""
    passes: list[Pass] = field(default_factory=list)
    rss_anon_start: int = 0
    rss_anon_peak: int = 0
    wal_bytes: int = 0
    """Log bytes written by the measured commits (without the daemon: none deleted)."""
    daemon_status: int | None = None
    daemon_errors: list[str] = field(default_factory=list)

    @property
    def condition(self) -> str:
        if not self.daemon:
            return "without"
        return "with the daemon" if self.nice is None else f"with the daemon at nice {self.nice}"

    @property
    def window(self) -> tuple[float, float]:
        if not self.samples:
            return (0.0, 0.0)
        last = self.samples[-1]
        return self.samples[0].start, last.start + last.seconds

    def p(self, q: float) -> float:
        return percentile([s.seconds for s in self.samples], q)

    def in_window(self) -> list[Pass]:
        """Passes that wrote a snapshot and overlapped the measured commits."""
        lo, hi = self.window
        return [p for p in self.passes if p.snapshot and p.end > lo and p.start < hi]

    def busy_fraction(self) -> float:
        """Share of the measured window during which the daemon was writing a snapshot."""
        lo, hi = self.window
        if hi <= lo:
            return 0.0
        busy = sum(min(p.end, hi) - max(p.start, lo) for p in self.in_window())
        return busy / (hi - lo)

    def swap_lags(self) -> list[float]:
        """For each base swap: seconds since the end of the pass that wrote the snapshot
        (the writer's poll interval plus its own verification and extraction)."""
        ends = sorted(p.end for p in self.passes if p.snapshot)
        lags = []
        for t in self.swaps:
            before = [e for e in ends if e <= t]
            if before:
                lags.append(t - before[-1])
        return lags

    def overlapping(self) -> list[CommitSample]:
        """Commits that ran while a compaction pass (one that wrote a snapshot) was running."""
        passes = self.in_window()
        return [
            s
            for s in self.samples
            if any(p.start < s.start + s.seconds and p.end > s.start for p in passes)
        ]


def daemon_command(store: Path, spec: DaemonSpec, nice: int | None = None) -> list[str]:
    """The daemon's command line (under ``nice -n NICE`` if given)."""
    prefix = [] if nice is None else ["nice", "-n", str(nice)]
    return [
        *prefix, sys.executable, "-m", "compactor", "--interval", f"{spec.interval:g}",
        "--min-tail-bytes", str(spec.min_tail_bytes), "--retain", str(spec.retain), str(store),
    ]  # fmt: skip


_LINE = re.compile(r"^ts=(\S+) level=(\w+) event=(\w+)")
_FIELD = re.compile(r"(\w+)=(\"(?:[^\"\\]|\\.)*\"|\S+)")


def _parse_log(text: str) -> tuple[list[Pass], list[str]]:
    passes: list[Pass] = []
    errors: list[str] = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        ts, level, event = m.groups()
        if level in ("ERROR", "CRITICAL"):
            errors.append(line[:300])
        if event != "pass_done":
            continue
        fields = dict(_FIELD.findall(line))
        end = dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
        passes.append(
            Pass(
                end.timestamp(),
                float(fields.get("seconds", "0")),
                fields.get("snapshot", "-") != "-",
            )
        )
    return passes, errors


class _SwapLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.swaps: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "event=base_swapped" in record.getMessage():
            self.swaps.append(record.created)


def _wait_for(path: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if needle in path.read_text():
                return
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited {proc.returncode}: {path.read_text()[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"the daemon did not log {needle!r} within {timeout} s")


def _overlay_entries(store: object) -> int:
    state = store._state  # type: ignore[attr-defined]
    return sum(len(t) for g in state.generations for t in g.tables.values())


def run_latency(
    spec: DaemonSpec,
    template: Path,
    work: Path,
    daemon: bool,
    index: int,
    nice: int | None = None,
) -> LatencyRun:
    """One run (module docstring) in ``work/run<index>``; the caller removes it afterwards."""
    import statelog

    store = work / f"run{index}"
    clone_store(template, store)
    handler = _SwapLog()
    logger = logging.getLogger("statelog.store.store")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    log_path = work / f"daemon{index}.log"
    proc: subprocess.Popen[bytes] | None = None
    samples: list[CommitSample] = []
    s = statelog.open(store, durability="commit", segment_bytes=spec.segment_bytes)
    rss_start = rss_peak = rss()["RssAnon"]
    wal_before = dir_bytes(store / "wal", ".wal")
    try:
        if daemon:
            with open(log_path, "wb") as err:
                proc = subprocess.Popen(
                    daemon_command(store, spec, nice),
                    cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            _wait_for(log_path, "event=locked_store", proc, 60.0)
        workload = Workload(spec.keys, spec.updates, seed=spec.seed)
        clock, cpu, wall = time.perf_counter, time.thread_time, time.time
        gc_pause = _GcClock()
        gc.callbacks.append(gc_pause)
        probes = (*_PROBES, (LiveState, "begin_generation", _GENERATION))
        with instrument(probes) as totals:
            for i in range(spec.warmup + spec.checkpoints):
                cp = workload.checkpoint(i)
                before = dict(totals)
                gc_pause.total = 0.0
                w0 = wall()
                _, q0 = thread_schedstat()
                c0 = cpu()
                t0 = clock()
                commit_checkpoint(s, cp)
                t1 = clock()
                c1 = cpu()
                _, q1 = thread_schedstat()
                rss_peak = max(rss_peak, rss()["RssAnon"])
                if i >= spec.warmup:
                    steps = {k: totals[k] - before[k] for k in totals}
                    samples.append(
                        CommitSample(
                            w0,
                            t1 - t0,
                            c1 - c0,
                            q1 - q0,
                            _buckets(steps, t1 - t0),
                            _overlay_entries(s),
                            steps[_GENERATION],
                            gc_pause.total,
                        )
                    )
        gc.callbacks.remove(gc_pause)
        wal_bytes = dir_bytes(store / "wal", ".wal") - wal_before
    finally:
        status: int | None = None
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                status = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                status = proc.wait()
        s.close()
        logger.removeHandler(handler)
    passes, errors = _parse_log(log_path.read_text()) if daemon else ([], [])
    return LatencyRun(
        daemon=daemon,
        index=index,
        samples=samples,
        nice=nice if daemon else None,
        swaps=handler.swaps,
        passes=passes,
        rss_anon_start=rss_start,
        rss_anon_peak=rss_peak,
        wal_bytes=wal_bytes,
        daemon_status=status,
        daemon_errors=errors,
    )


def bucket_means(samples: list[CommitSample]) -> dict[str, float]:
    """Mean seconds per bucket over ``samples``."""
    if not samples:
        return dict.fromkeys(BUCKETS, float("nan"))
    return {b: sum(s.buckets[b] for s in samples) / len(samples) for b in BUCKETS}


def slowest(samples: list[CommitSample], share: float = 0.01) -> list[CommitSample]:
    """The slowest ``share`` of ``samples`` (at least one)."""
    n = max(1, round(len(samples) * share))
    return sorted(samples, key=lambda s: s.seconds)[-n:]
