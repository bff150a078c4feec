"""A Hypothesis state machine: delta passes, full merges and reopens against a dict model.

Rules: commits of random puts and deletes over a small key space (str and
bytes keys, three tables, values big enough that segments roll); a
compaction pass with a random ``max_chain`` (0..4), ``full_ratio`` and
``retain``, so passes write deltas, merge chains by length and by bytes,
and retention deletes old chains; the writer's watcher swapping the newest
snapshot in; a clean reopen (which seals the segment, so the next pass has
a tail); a read-only open. After every step the writer, and any read-only
open, hold exactly the model: ``get``, ``items`` and ``count`` agree, and
a key deleted in a delta never comes back from a level below it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import statelog
from statelog.compaction.fold import compact
from statelog.storage.snapshots import list_snapshots
from tests.delta_stores import SEG, Model, contents

KEYS = [f"k{i}" for i in range(12)] + [b"b%d" % i for i in range(6)]
TABLES = ("default", "other", "third")
tables = st.sampled_from(TABLES)
keys = st.sampled_from(KEYS)
SEEN: Counter[str] = Counter()  # what the passes of every run wrote, and the swaps
values = st.one_of(
    st.integers(-5, 5), st.text(max_size=4), st.integers(100, 400).map(lambda n: "v" * n)
)


class DeltaMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="statelog-delta-"))
        self.path = self.dir / "store"
        self.store = statelog.open(self.path, segment_bytes=SEG, tables=TABLES)
        self.model = Model()

    @rule(
        batch=st.lists(
            st.tuples(tables, st.dictionaries(keys, values, max_size=5), st.sets(keys, max_size=4)),
            min_size=1,
            max_size=12,
        )
    )
    def commit(self, batch: list[tuple[str, dict[Any, Any], set[Any]]]) -> None:
        for table, put, delete in batch:
            gone = tuple(sorted((k for k in delete if k not in put), key=repr))
            if put or gone:
                self.model.commit(self.store, put, gone, table=table)

    @rule(
        seal=st.booleans(),
        max_chain=st.sampled_from([0, 1, 2, 3, 4, 4, 4]),  # mostly chains that may grow
        full_ratio=st.sampled_from([0.01, 0.5, 2.0, 10.0, 10.0]),
        retain=st.integers(1, 3),
    )
    def compact(self, seal: bool, max_chain: int, full_ratio: float, retain: int) -> None:
        if seal:
            self.reopen()  # closing seals the writer's segment: the pass has all of the log
        result = compact(self.path, max_chain=max_chain, full_ratio=full_ratio, retain=retain)
        if result.snapshot is not None:
            SEEN["full" if result.full else f"delta-{result.depth}"] += 1
            assert result.depth <= max_chain
        else:
            assert result.skipped == "nothing_new", result.skipped

    @rule()
    def swap(self) -> None:
        writer = self.store._writer
        assert writer is not None and writer.watcher is not None
        writer.watcher.check()
        newest = list_snapshots(self.path / "snapshots")
        # Its background thread may have swapped first: count the base, not the call.
        if newest and writer.state.base_epoch == newest[0][1]:
            SEEN["swap"] += 1

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = statelog.open(self.path, segment_bytes=SEG, tables=TABLES)
        assert self.store.recovery.rejected == ()
        assert self.store.epoch == self.model.epoch

    @rule()
    def read_only(self) -> None:
        with statelog.open(self.path, readonly=True) as ro:
            assert ro.epoch == self.model.epoch
            assert contents(ro) == self.model.state()

    @invariant()
    def holds_the_model(self) -> None:
        assert self.store.epoch == self.model.epoch
        assert contents(self.store) == self.model.state()
        for table in TABLES:
            for k in KEYS:
                assert self.store.get(k, table=table) == self.model.tables.get(table, {}).get(k)

    def teardown(self) -> None:
        try:
            self.store.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
# Derandomized: `make test` runs the same examples each time, so its coverage check holds.
_QUICK = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=_HEALTH,
)
_STRESS = settings(
    max_examples=500, stateful_step_count=80, deadline=None, suppress_health_check=_HEALTH
)


@pytest.fixture
def same_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a derandomized run the same run whatever ran before it in this process.

    Hypothesis also draws values from constants it finds in the project's modules
    imported so far; which those are depends on the tests pytest-xdist gave this
    worker earlier, so the same seed made other examples, and some runs never
    reached a delta pass. Without those constants the examples follow the seed alone.
    """
    from hypothesis.internal.conjecture import providers

    if hasattr(providers, "_get_local_constants"):  # absent from older versions
        monkeypatch.setattr(providers, "_get_local_constants", providers.Constants)


@pytest.mark.usefixtures("same_run")
def test_delta_chains_against_model() -> None:
    SEEN.clear()
    run_state_machine_as_test(DeltaMachine, settings=_QUICK)
    # The runs reached what they are for: deltas, merges, swaps.
    assert SEEN["full"] and SEEN["delta-1"] and SEEN["swap"], SEEN


@pytest.mark.stress
@pytest.mark.timeout(1800)  # 500 runs of up to 80 steps, each a few store opens
@pytest.mark.usefixtures("same_run")
def test_delta_chains_against_model_stress() -> None:
    SEEN.clear()
    run_state_machine_as_test(DeltaMachine, settings=_STRESS)
    assert SEEN["delta-2"] and SEEN["delta-3"], SEEN  # chains grew past one delta
