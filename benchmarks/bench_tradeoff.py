"""Every strategy side by side on the same seeded workload: checkpoints, SIGKILL, recovery.

For each strategy and state size a worker process (``probe worker``) loads the
state, measures back-to-back checkpoints at each dirty fraction (bytes written
from ``/proc/<pid>/io`` of the worker and its compactor child), then takes a
1%-dirty checkpoint every 250 ms for ``settle`` seconds and acknowledges the
last one. The test SIGKILLs the worker's process group, measures the disk the
crash left, and times the recovery in a fresh interpreter (the pytest-benchmark
time includes that interpreter's start; ``extra_info["recovery"]["seconds"]``
is the recovery alone). Recovery must find the acknowledged offsets and
watermark and every key. Above ``json_keys`` only the strategies of
:data:`~benchmarks.conftest.LARGE` run.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from .conftest import LARGE, SIZES, Sizes, size_id
from .probe import dir_footprint, run_probe, start_probe, stop_group
from .strategies import STRATEGIES


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "keys" in metafunc.fixturenames and "name" in metafunc.fixturenames:
        run = SIZES[str(metafunc.config.getoption("--bench-size"))]
        cells = [
            (name, keys)
            for keys in run.tradeoff_keys
            for name in STRATEGIES
            if keys <= run.json_keys or name in LARGE
        ]
        ids = [f"{name}-{size_id(keys)}" for name, keys in cells]
        metafunc.parametrize(("name", "keys"), cells, ids=ids)


def test_sigkill_and_recover(
    benchmark: Any, name: str, keys: int, sizes: Sizes, tmp_path: Path
) -> None:
    work = tmp_path / name
    args = ["worker", name, str(work), "--keys", str(keys)]
    args += ["--fractions", ",".join(f"{f:g}" for f in sizes.fractions)]
    args += ["--budget", f"{sizes.budget:g}", "--max-checkpoints", str(sizes.max_checkpoints)]
    args += ["--settle", f"{sizes.settle:g}"]
    proc, acked = start_probe(args)
    status = stop_group(proc)
    disk = dir_footprint(work)
    found: list[dict[str, Any]] = []
    benchmark.pedantic(
        lambda: found.append(run_probe(["recover", name, str(work)])), rounds=1, iterations=1
    )
    recovery = found[-1]
    benchmark.extra_info.update(
        suite="tradeoff", strategy=name, keys=keys, worker=acked, recovery=recovery, disk=disk
    )
    assert status == -signal.SIGKILL
    assert recovery["count"] == keys
    assert recovery["offsets"] == acked["offsets"]
    assert recovery["low_watermark_ms"] == acked["low_watermark_ms"]
