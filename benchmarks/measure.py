"""Measure one strategy at one state size, in this process or in a fresh one.

The runner measures every (strategy, size) pair in its own spawned process,
one after the other: a strategy never pays for another's heap (a 1M-key JSON
state is about a million Python dicts), its garbage collector or its page
cache warm-up, and each starts from an empty temporary directory.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .strategies import Sample, make_strategy
from .workload import DEFAULT_SEED, Workload

__all__ = ["RunResult", "RunSpec", "Summary", "measure", "measure_isolated", "percentile"]


@dataclass(frozen=True)
class RunSpec:
    """What to measure: ``checkpoints`` durable checkpoints after ``warmup`` unmeasured ones."""

    strategy: str
    state_keys: int
    updates: int
    checkpoints: int
    warmup: int = 2
    seed: int = DEFAULT_SEED
    base_dir: str | None = None
    """Parent of the temporary store directory (None: the system temp dir)."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between order statistics."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """Headline numbers of one run (seconds, bytes, updates per second)."""

    updates_per_s: float
    """Sustained: all updates over the summed checkpoint time."""
    updates_per_s_p50: float
    """At the median checkpoint latency."""
    p50: float
    p99: float
    cpu_p50: float
    bytes_per_checkpoint: float
    parts_p50: dict[str, float]


@dataclass(frozen=True)
class RunResult:
    spec: RunSpec
    load_seconds: float
    samples: list[Sample] = field(default_factory=list)

    def summary(self) -> Summary:
        secs = [s.seconds for s in self.samples]
        n_updates = self.spec.updates * len(secs)
        names = dict.fromkeys(k for s in self.samples for k in s.parts)
        p50 = percentile(secs, 50)
        return Summary(
            updates_per_s=n_updates / sum(secs) if secs else math.nan,
            updates_per_s_p50=self.spec.updates / p50 if secs else math.nan,
            p50=p50,
            p99=percentile(secs, 99),
            cpu_p50=percentile([s.cpu_seconds for s in self.samples], 50),
            bytes_per_checkpoint=(
                sum(s.bytes_written for s in self.samples) / len(secs) if secs else math.nan
            ),
            parts_p50={
                k: percentile([s.parts[k] for s in self.samples if k in s.parts], 50) for k in names
            },
        )


def measure(spec: RunSpec) -> RunResult:
    """Load the state, run the warm-up and measured checkpoints, return every sample.

    Checkpoint data is generated outside the timed span.
    """
    workload = Workload(spec.state_keys, spec.updates, seed=spec.seed)
    with tempfile.TemporaryDirectory(prefix=f"bench-{spec.strategy}-", dir=spec.base_dir) as d:
        strategy = make_strategy(spec.strategy, Path(d))
        try:
            t0 = time.perf_counter()
            strategy.load(workload.initial_chunks())
            load_seconds = time.perf_counter() - t0
            gc.collect()
            samples: list[Sample] = []
            for i in range(spec.warmup + spec.checkpoints):
                sample = strategy.checkpoint(workload.checkpoint(i))
                if i >= spec.warmup:
                    samples.append(sample)
        finally:
            strategy.close()
    return RunResult(spec, load_seconds, samples)


def measure_isolated(spec: RunSpec) -> RunResult:
    """:func:`measure` in a freshly spawned interpreter (clean heap, no inherited state)."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(measure, spec).result()
