"""Where statelog's commit time goes: an instrumented pass over the commit path.

Wraps the steps of ``StateStore._append`` and its callers with timers
(module attributes and methods are swapped for the duration of the pass and
put back afterwards; nothing in ``statelog/`` is edited), runs commits of the
benchmark workload, and splits the mean commit into::

    validate   check_offsets + check_watermark + key checks (_strict_keys)
    encode     value encoding (table_delta minus key checks) + encode_record
    frame+crc  WalWriter._frames (headers, chained masked crc32c)
    write      AppendFile.write (writev into the page cache; seal+roll included)
    fdatasync  AppendFile.sync
    apply      LiveState.apply (the in-memory overlay)
    other      the rest of commit(): locks, roll check, bookkeeping

The pass is separate from the measured runs: a dozen wrapped calls per
commit cost microseconds against milliseconds, but the headline numbers are
taken without them.

``python -m benchmarks.profile_commit --keys 1000000`` prints the table.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import statelog.store.store
import statelog.store.validate
from statelog.log.writer import WalWriter
from statelog.state.live import LiveState
from statelog.storage.fileio import AppendFile

from .strategies import StatelogStrategy, commit_checkpoint
from .workload import DEFAULT_SEED, Workload

__all__ = ["BUCKETS", "Breakdown", "Probe", "instrument", "profile_commits", "profile_isolated"]

# (owner, attribute, step name). Nested: _strict_keys runs inside table_delta.
_PROBES: tuple[tuple[Any, str, str], ...] = (
    (statelog.store.store, "check_offsets", "check_offsets"),
    (statelog.store.store, "check_watermark", "check_watermark"),
    (statelog.store.store, "table_delta", "table_delta"),
    (statelog.store.validate, "_strict_keys", "key_checks"),
    (statelog.store.store, "encode_record", "encode_record"),
    (WalWriter, "_frames", "frame+crc"),
    (AppendFile, "write", "write"),
    (AppendFile, "sync", "fdatasync"),
    (LiveState, "apply", "apply"),
)

BUCKETS = ("validate", "encode", "frame+crc", "write", "fdatasync", "apply", "other")


Probe = tuple[Any, str, str]
"""(owner, attribute, step name): a module or class attribute to wrap with a timer."""


@contextmanager
def instrument(probes: Sequence[Probe] = _PROBES) -> Iterator[dict[str, float]]:
    """Time every probe while the block runs; yields step name -> total seconds.

    Each ``owner.attribute`` is replaced by a timing wrapper and put back on
    exit; ``probes`` defaults to the steps of the commit path.
    """
    totals = {name: 0.0 for _, _, name in probes}
    saved: list[tuple[Any, str, Any]] = []

    def timed(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        clock = time.perf_counter

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += clock() - t0

        return wrapper

    try:
        for owner, attr, name in probes:
            original = owner.__dict__[attr]
            saved.append((owner, attr, original))
            setattr(owner, attr, timed(original, name))
        yield totals
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


@dataclass(frozen=True)
class Breakdown:
    """Mean seconds per commit, by step and by bucket (see the module docstring)."""

    state_keys: int
    updates: int
    commits: int
    total: float
    steps: dict[str, float]
    buckets: dict[str, float]

    def share(self, bucket: str) -> float:
        return self.buckets[bucket] / self.total if self.total else 0.0


def _buckets(steps: dict[str, float], total: float) -> dict[str, float]:
    values = steps["table_delta"] - steps["key_checks"]
    out = {
        "validate": steps["check_offsets"] + steps["check_watermark"] + steps["key_checks"],
        "encode": values + steps["encode_record"],
        "frame+crc": steps["frame+crc"],
        "write": steps["write"],
        "fdatasync": steps["fdatasync"],
        "apply": steps["apply"],
    }
    out["other"] = total - sum(out.values())
    return out


def profile_commits(
    state_keys: int,
    updates: int,
    commits: int,
    *,
    warmup: int = 3,
    seed: int = DEFAULT_SEED,
    base_dir: str | None = None,
) -> Breakdown:
    """Load ``state_keys`` keys, then time ``commits`` instrumented durable commits."""
    workload = Workload(state_keys, updates, seed=seed)
    with tempfile.TemporaryDirectory(prefix="bench-profile-", dir=base_dir) as d:
        strategy = StatelogStrategy(Path(d))
        try:
            strategy.load(workload.initial_chunks())
            gc.collect()
            for i in range(warmup):
                strategy.checkpoint(workload.checkpoint(i))
            store = strategy.store
            total = 0.0
            with instrument() as totals:
                for i in range(warmup, warmup + commits):
                    cp = workload.checkpoint(i)
                    t0 = time.perf_counter()
                    commit_checkpoint(store, cp)
                    total += time.perf_counter() - t0
        finally:
            strategy.close()
    steps = {k: v / commits for k, v in totals.items()}
    mean = total / commits
    return Breakdown(state_keys, updates, commits, mean, steps, _buckets(steps, mean))


def profile_isolated(
    state_keys: int, updates: int, commits: int, *, seed: int = DEFAULT_SEED, base_dir: str | None
) -> Breakdown:
    """:func:`profile_commits` in a freshly spawned interpreter."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(
            profile_commits, state_keys, updates, commits, seed=seed, base_dir=base_dir
        ).result()


def format_table(b: Breakdown) -> str:
    """A Markdown table of the buckets: ms per commit and share of the commit."""
    lines = ["| step | ms per commit | share |", "|---|---:|---:|"]
    for name in BUCKETS:
        lines.append(f"| {name} | {b.buckets[name] * 1e3:.2f} | {b.share(name):.0%} |")
    lines.append(f"| **total** | **{b.total * 1e3:.2f}** | 100% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--updates", type=int, default=10_000)
    ap.add_argument("--commits", type=int, default=50)
    ap.add_argument("--dir", default=None, help="parent of the temporary store")
    args = ap.parse_args(argv)
    b = profile_commits(args.keys, args.updates, args.commits, base_dir=args.dir)
    print(f"{b.commits} commits of {b.updates} updates into {b.state_keys} keys")
    print(format_table(b))
    print("\nsteps (ms per commit): " + ", ".join(f"{k}={v * 1e3:.2f}" for k, v in b.steps.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
