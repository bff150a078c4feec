"""Sustained checkpoints with the compactor running: bytes written, throughput, writer memory.

For each ``(keys, seconds, bound, interval)`` of ``sustained``, a template store of that many keys
(``probe template``) is cloned and ``python -m benchmarks.sustained`` runs on the
clone in a fresh interpreter: 1%-of-1M-sized checkpoints (10,000 updates each)
back to back for that long, the compactor a child process
(:mod:`benchmarks.sustained`), the writer's ``max_overlay_bytes`` set to ``bound`` MiB
(None: unbounded), its compactor's interval ``interval`` seconds (which a
sealed segment cuts short). ``extra_info`` holds what it measured: the log's
bytes (the writer's own writes), the compactor's, updates per second on wall
time and on the writer's CPU, the seconds commits stalled, and RssAnon sampled
through the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import SIZES, Sizes, size_id
from .probe import _ENV, ROOT, clone_store, run_probe


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" in metafunc.fixturenames:
        cells = SIZES[str(metafunc.config.getoption("--bench-size"))].sustained
        ids = [
            f"{size_id(k)}-{'unbounded' if b is None else f'{b}MiB'}-{i:g}s"
            for k, _s, b, i in cells
        ]
        metafunc.parametrize("cell", cells, ids=ids)


def test_sustained(
    benchmark: Any, cell: tuple[int, float, int | None, float], sizes: Sizes, tmp_path: Path
) -> None:
    keys, seconds, bound, interval = cell
    run_probe(["template", str(tmp_path / "t"), "--keys", str(keys)], timeout=4 * 3600)
    store = tmp_path / "run"
    clone_store(tmp_path / "t" / "store", store)
    docs: list[dict[str, Any]] = []
    args = [sys.executable, "-m", "benchmarks.sustained", str(store), "--keys", str(keys)]
    args += ["--seconds", f"{seconds:g}", "--sample", f"{max(1.0, seconds / 60):g}"]
    args += ["--interval", f"{interval:g}"]
    if bound is not None:
        args += ["--max-overlay-mib", str(bound)]

    def run() -> None:
        out = subprocess.run(
            args, cwd=ROOT, env=_ENV, capture_output=True, text=True, check=True,
            timeout=seconds + 3600,
        )  # fmt: skip
        docs.append(json.loads(out.stdout.strip().splitlines()[-1]))

    benchmark.pedantic(run, rounds=1, iterations=1)
    doc = docs[-1]
    benchmark.extra_info.update(suite="sustained", **doc)
    assert doc["checkpoints"] > 0 and doc["writer_bytes"] > 0
