"""pytest-benchmark suite: one durable checkpoint of each strategy, by state size.

    .venv/bin/python -m pytest benchmarks/bench_commit.py
    STATELOG_BENCH_SIZES=10000,100000,1000000 .venv/bin/python -m pytest benchmarks/bench_commit.py

Each round is one checkpoint of ``STATELOG_BENCH_UPDATES`` (default 10k)
updates, with fresh data made by the round's setup (not timed). The store
of each size is loaded once per module. ``docs/benchmarks.md`` comes from
``benchmarks/run.py``, which runs each strategy in its own process; this
suite runs them in one process, for pytest-benchmark's statistics and
``--benchmark-compare``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .strategies import JsonSnapshotStrategy, StatelogStrategy, commit_checkpoint
from .workload import Checkpoint, Workload


def _env_ints(name: str, default: str) -> list[int]:
    return [int(s) for s in os.environ.get(name, default).split(",") if s.strip()]


SIZES = _env_ints("STATELOG_BENCH_SIZES", "10000,100000")
UPDATES = _env_ints("STATELOG_BENCH_UPDATES", "10000")[0]
ROUNDS = _env_ints("STATELOG_BENCH_ROUNDS", "30")[0]
JSON_ROUNDS = _env_ints("STATELOG_BENCH_JSON_ROUNDS", "5")[0]


def _size_id(keys: int) -> str:
    return f"{keys // 1000}k" if keys >= 1000 else str(keys)


@pytest.fixture(scope="module", params=SIZES, ids=_size_id)
def workload(request: pytest.FixtureRequest) -> Workload:
    return Workload(request.param, min(UPDATES, request.param))


@pytest.fixture(scope="module")
def statelog_store(
    workload: Workload, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StatelogStrategy]:
    strategy = StatelogStrategy(tmp_path_factory.mktemp("statelog"))
    strategy.load(workload.initial_chunks())
    yield strategy
    strategy.close()


@pytest.fixture(scope="module")
def json_snapshots(
    workload: Workload, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JsonSnapshotStrategy]:
    strategy = JsonSnapshotStrategy(tmp_path_factory.mktemp("json"))
    strategy.load(workload.initial_chunks())
    yield strategy
    strategy.close()


def _setup(workload: Workload, start: int) -> Any:
    counter = itertools.count(start)

    def setup() -> tuple[tuple[Checkpoint], dict[str, Any]]:
        return (workload.checkpoint(next(counter)),), {}

    return setup


def _info(benchmark: Any, workload: Workload) -> None:
    benchmark.extra_info.update(state_keys=workload.state_keys, updates=workload.updates)


def test_statelog_commit(
    benchmark: Any, workload: Workload, statelog_store: StatelogStrategy
) -> None:
    """``store.commit`` with ``durability="commit"``: validate ... fdatasync, apply."""
    store = statelog_store.store

    def commit(cp: Checkpoint) -> int:
        return commit_checkpoint(store, cp)

    _info(benchmark, workload)
    benchmark.pedantic(commit, setup=_setup(workload, 0), rounds=ROUNDS, warmup_rounds=2)
    assert store.count() == workload.state_keys


def test_json_snapshot_checkpoint(
    benchmark: Any, workload: Workload, json_snapshots: JsonSnapshotStrategy
) -> None:
    """Apply to a dict, then the full sorted-JSON snapshot with fsync and rename."""
    _info(benchmark, workload)
    benchmark.pedantic(
        json_snapshots.checkpoint, setup=_setup(workload, 0), rounds=JSON_ROUNDS, warmup_rounds=1
    )
    assert len(json_snapshots.state) == workload.state_keys


def test_json_full_snapshot_only(
    benchmark: Any, workload: Workload, json_snapshots: JsonSnapshotStrategy
) -> None:
    """The snapshot alone (serialise, hash, write, fsync, rename, fsync dir)."""
    _info(benchmark, workload)
    benchmark.pedantic(json_snapshots.snapshot, rounds=JSON_ROUNDS, warmup_rounds=1)
    assert any(Path(json_snapshots.dir).iterdir())
