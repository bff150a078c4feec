"""The benchmark code, run once on tiny sizes so that it cannot rot. No timing is asserted."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import run
from benchmarks.measure import RunSpec, measure, percentile
from benchmarks.profile_commit import _PROBES, BUCKETS, profile_commits
from benchmarks.strategies import JsonSnapshotStrategy, StatelogStrategy
from benchmarks.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
KEYS, UPDATES = 200, 50


def test_workload_is_deterministic_and_dirties_existing_keys() -> None:
    w = Workload(KEYS, UPDATES)
    state = {k: v for chunk in w.initial_chunks(chunk=64) for k, v in chunk.items()}
    assert len(state) == KEYS
    cp = w.checkpoint(3)
    assert cp == Workload(KEYS, UPDATES).checkpoint(3)
    assert cp != w.checkpoint(4)
    assert cp.updates == UPDATES and set(cp.put) <= set(state)
    assert w.checkpoint(4).low_watermark_ms >= cp.low_watermark_ms
    assert all(w.checkpoint(4).offsets[p] >= off for p, off in cp.offsets.items())
    with pytest.raises(ValueError):
        Workload(10, 11)


def test_both_strategies_reach_the_same_state(tmp_path: Path) -> None:
    w = Workload(KEYS, UPDATES)
    sl = StatelogStrategy(tmp_path / "sl")
    js = JsonSnapshotStrategy(tmp_path / "js")
    try:
        for strategy in (sl, js):
            strategy.load(w.initial_chunks(chunk=64))
            for i in range(2):
                sample = strategy.checkpoint(w.checkpoint(i))
                assert sample.bytes_written > 0
        assert {k: sl.store.get(k) for k in js.state} == js.state
        assert sl.store.offsets == js.offsets
        assert sl.store.epoch == 4 + 2  # load: one commit per 64-key chunk (200 keys)
    finally:
        sl.close()
        js.close()

    newest = sorted(js.dir.glob("snapshot-*.json"))
    assert len(newest) == 2 and not list(js.dir.glob("*.tmp"))
    doc = json.loads(newest[-1].read_bytes())
    body = json.dumps(doc["checkpoint"], sort_keys=True, separators=(",", ":")).encode()
    assert hashlib.sha256(body).hexdigest() == doc["sha256"]
    assert doc["checkpoint"]["epoch"] == 2 and len(doc["checkpoint"]["state"]) == KEYS


def test_measure_returns_one_sample_per_measured_checkpoint(tmp_path: Path) -> None:
    spec = RunSpec("statelog", KEYS, UPDATES, checkpoints=2, warmup=1, base_dir=str(tmp_path))
    result = measure(spec)
    assert len(result.samples) == 2
    s = result.summary()
    assert s.bytes_per_checkpoint > 0 and s.p99 >= s.p50 > 0
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert list(tmp_path.iterdir()) == []  # the temporary store is gone


def test_profile_pass_puts_statelog_back(tmp_path: Path) -> None:
    before = [owner.__dict__[attr] for owner, attr, _ in _PROBES]
    b = profile_commits(KEYS, UPDATES, 2, warmup=1, base_dir=str(tmp_path))
    assert [owner.__dict__[attr] for owner, attr, _ in _PROBES] == before
    assert set(b.buckets) == set(BUCKETS)
    assert b.steps["fdatasync"] > 0 and b.steps["apply"] > 0 and b.steps["table_delta"] > 0


def test_runner_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    argv = ["--quick", "--sizes", f"{KEYS}", "--updates", f"{UPDATES}", "--checkpoints", "2"]
    argv += ["--json-checkpoints", "2", "--warmup", "1", "--profile-commits", "2"]
    argv += ["--out", str(out), "--dir", str(tmp_path)]
    assert run.main(argv) == 0
    text = out.read_text()
    for needle in (
        "## Targets (issue 2)",
        "| 200 | json |",
        "| 200 | statelog |",
        "## Ratios",
        "## Where statelog's commit time goes",
        "| fdatasync |",
        "crc32c.hardware_based",
        "benchmarks/run.py --quick --sizes 200",
    ):
        assert needle in text, needle


def test_pytest_benchmark_suite_runs_once(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "STATELOG_BENCH_SIZES": str(KEYS),
        "STATELOG_BENCH_UPDATES": str(UPDATES),
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["benchmarks/bench_commit.py", "--benchmark-disable", f"--basetemp={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout
