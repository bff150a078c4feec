"""pytest-benchmark suite: scanning a high-churn table, the reconciler's in-flight buffer.

    .venv/bin/python -m pytest benchmarks/bench_reads.py

A reconciler's buffer holds a few hundred live entries at any time while
tens of thousands pass through it: each entry is put, then deleted when its
verdict is out. Until a snapshot folds them, the deleted keys stay in the
overlay's generations as delete markers. The case measured: 30,750 entries
passed through, 350 live, spread over 21 generations (one per segment),
nothing folded yet; one round is ``items()`` plus ``count()`` of the table.

``STATELOG_BENCH_CHURN`` sets how many entries pass through (default 30750: the newest
generation half full).
"""

from __future__ import annotations

import os

import pytest

from statelog.format.records import encode_value
from statelog.state.live import LiveState

CHURN = int(os.environ.get("STATELOG_BENCH_CHURN", "30750"))
LIVE = 350
PER_SEGMENT = 1500


def churned_state(churn: int = CHURN) -> LiveState:
    """A live state whose ``buffer`` table saw ``churn`` entries, ``LIVE`` still live."""
    state = LiveState()
    state.begin_generation(1)
    segment = 1
    for i in range(churn):
        dels = [f"k{i - LIVE:07d}"] if i >= LIVE else []
        state.apply(i + 1, {}, 0, [("buffer", [f"k{i:07d}"], [encode_value(i)], dels)])
        if i % PER_SEGMENT == PER_SEGMENT - 1:
            segment += 1
            state.begin_generation(segment)
    return state


@pytest.fixture(scope="module")
def state() -> LiveState:
    return churned_state()


def scan(state: LiveState) -> int:
    return sum(1 for _ in state.items("buffer")) + state.count("buffer")


def test_scan_high_churn_buffer(benchmark: pytest.FixtureRequest, state: LiveState) -> None:
    got = benchmark(scan, state)  # type: ignore[operator]
    assert got == 2 * min(LIVE, CHURN)
