"""Reads and merges of the writer's overlay, against how many generations it holds.

The overlay (:mod:`statelog.state.live`) holds one generation per log segment
written since the base in use; a read walks them newest first, and above
``MAX_GENERATIONS`` a read first merges the adjacent sealed pair holding the
fewest entries. Both sides of that limit, for each ``(keys, entries, generations)`` of
``overlay``: a :class:`~statelog.state.live.LiveState` over an empty base,
holding that many generations of ``entries`` random keys of the workload's
``keys`` each (one 8 MiB segment of the sustained load holds about 60,000),
then

* the benchmark's rounds: a ``get`` of each of 100,000 random keys of the
  ``keys`` (most found in some generation, the rest walking every one);
* ``absent_ns``: a ``get`` of a key in no generation (the walk before a base read);
* ``merge_ms``: one merge of the smallest pair, as the first read after a roll
  past the limit pays it (the median of three in a row): two generations of
  ``entries`` each, whatever their count.
"""

from __future__ import annotations

import random
from statistics import median
from typing import Any

import pytest

from statelog.state.live import LiveState

from .conftest import SIZES
from .probe import timed
from .workload import Workload

PROBES = 100_000
TABLE = "buffer"
_VALUE = b"\x88" + b"v" * 105  # with 4 more bytes, about a workload value's encoded size


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" in metafunc.fixturenames:
        keys, entries, counts = SIZES[str(metafunc.config.getoption("--bench-size"))].overlay
        cells = [(keys, entries, g) for g in counts]
        metafunc.parametrize("cell", cells, ids=[f"{g}-generations" for g in counts])


def _values(n: int) -> list[bytes]:
    # Distinct objects, as a commit's are: a merge frees each value it replaces.
    return [_VALUE + i.to_bytes(4, "little") for i in range(n)]


def _fill(state: LiveState, keys: list[str], entries: int, rng: random.Random) -> None:
    """One commit of ``entries`` random keys into the newest generation."""
    state.apply(state.epoch + 1, {}, 0, [(TABLE, rng.sample(keys, entries), _values(entries), [])])


def _overlay(keys: list[str], entries: int, generations: int, rng: random.Random) -> LiveState:
    state = LiveState()
    for g in range(generations):
        state.begin_generation(g + 1, limit=generations + 1)
        _fill(state, keys, entries, rng)
    return state


def _best_ns(calls: int, run: Any, repeats: int = 3) -> float:
    best = min(timed(run)[1] for _ in range(repeats))
    return best / calls * 1e9


def test_overlay(benchmark: Any, cell: tuple[int, int, int]) -> None:
    n_keys, entries, generations = cell
    rng = random.Random(7)
    keys = [Workload.key(i) for i in range(n_keys)]
    state = _overlay(keys, entries, generations, rng)
    assert len(state.generations) == generations
    get = state.get
    # Fresh str objects, as a caller's are: none is the very key a generation holds.
    probes = [Workload.key(i) for i in rng.sample(range(n_keys), min(PROBES, n_keys))]
    absent = [f"absent:{i:010d}" for i in range(len(probes))]

    def reads() -> None:
        for k in probes:
            get(TABLE, k)

    benchmark.pedantic(reads, rounds=5, warmup_rounds=1)
    found = sum(get(TABLE, k) is not None for k in probes) / len(probes)

    def misses() -> None:
        for k in absent:
            get(TABLE, k)

    absent_ns = _best_ns(len(absent), misses)
    merges = []
    for i in range(3):
        state.begin_generation(generations + 1 + i, limit=generations, hold=generations + 1)
        _fill(state, keys, entries, rng)
        merges.append(timed(lambda: get(TABLE, probes[0]))[1])  # one over: one merge
    assert len(state.generations) == generations
    benchmark.extra_info.update(
        suite="overlay", keys=n_keys, entries=entries, generations=generations,
        probes=len(probes), found=found, absent_ns=absent_ns,
        merge_ms=median(merges) * 1e3, merges_ms=[m * 1e3 for m in merges],
    )  # fmt: skip
