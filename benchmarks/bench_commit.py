"""Durable checkpoint latency and throughput of every strategy, by state size.

Each round is one checkpoint of ``commit_updates`` updates (10k, capped at the
state size) into a state loaded once per test; the round's data is made by
its setup, outside the timed span. statelog runs without a compactor here
(the trade-off suite runs it with one). ``extra_info`` adds the CPU time of
each checkpoint and the bytes the process wrote (``/proc/self/io``) per
checkpoint, warm-up included. For ``statelog-group`` a round ends before the
fsync (the final flush is not timed); for ``zstd-interval`` and ``none`` a
round is mostly the in-memory apply: their cost moves to recovery.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Sizes, parametrize_keys
from .probe import io_write_bytes, percentile
from .strategies import STRATEGIES
from .workload import Checkpoint, Workload

WARMUP = 2


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_keys(metafunc, "keys", "commit_keys")


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_checkpoint(benchmark: Any, name: str, keys: int, sizes: Sizes, tmp_path: Path) -> None:
    workload = Workload(keys, min(sizes.commit_updates, keys))
    strategy = STRATEGIES[name](tmp_path)
    strategy.load(workload.initial_chunks())
    strategy.loaded(0)
    strategy.finish()
    counter = itertools.count()
    cpus: list[float] = []

    def setup() -> tuple[tuple[Checkpoint], dict[str, Any]]:
        return (workload.checkpoint(next(counter)),), {}

    def checkpoint(cp: Checkpoint) -> None:
        c0 = time.process_time()
        strategy.checkpoint(cp)
        cpus.append(time.process_time() - c0)

    io0 = io_write_bytes([os.getpid()])
    rounds = sizes.json_rounds if name == "json" else sizes.rounds
    benchmark.pedantic(checkpoint, setup=setup, rounds=rounds, warmup_rounds=WARMUP)
    strategy.finish()
    written = io_write_bytes([os.getpid()]) - io0
    strategy.close()
    measured = cpus[WARMUP:] or cpus
    info = {"suite": "commit", "strategy": name, "keys": keys, "updates": workload.updates}
    info["bytes_per_checkpoint"] = written / len(cpus)
    benchmark.extra_info.update(info, cpu_p50=percentile(measured, 50))
    assert next(counter) == len(cpus) > 0  # every round took exactly one checkpoint
    if name not in ("none", "zstd-interval"):
        assert written >= workload.updates * 50  # durable: about 110 B of msgpack per record
