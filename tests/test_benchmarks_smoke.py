"""The benchmark suites and their renderer, run on tiny sizes so that they cannot rot.

No timing is asserted: the suites run once with ``--benchmark-disable``, the
strategies must recover what they made durable, and the renderer must judge
targets from the numbers it is given.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.anchor_slatedb import slatedb_installed
from benchmarks.conftest import SIZES
from benchmarks.plots import PLOTS
from benchmarks.render import KEEP_END, KEEP_START, render
from benchmarks.strategies import STRATEGIES, JsonSnapshot
from benchmarks.workload import Workload

ROOT = Path(__file__).resolve().parent.parent


# Its own bound is the subprocess's: every suite once, with the optional anchors
# installed, runs past the default per-test timeout on two cores.
@pytest.mark.timeout(660)
def test_every_suite_runs_once_at_tiny_sizes(tmp_path: Path) -> None:
    tiny = SIZES["tiny"]
    expected = len(STRATEGIES) * (len(tiny.commit_keys) + len(tiny.tradeoff_keys))
    expected += 3 + len(tiny.memory_keys) + 3 + 2  # restart kinds, memory, compaction, remote
    # snapshot build: three ways per size, and a restore at the sizes up to 1M keys
    expected += 3 * len(tiny.build_keys) + sum(k <= 1_000_000 for k in tiny.build_keys)
    expected += 3 * len(tiny.pass_keys)  # pass cost: a delta pass, a later one, a full one
    expected += len(tiny.sustained)  # sustained load with the compactor
    expected += len(tiny.overlay[2])  # the overlay's reads and merges
    expected += len(tiny.standby_keys) + 1 + 2  # failover per size, the changes feed, lag x2
    expected += 3  # point in time: views, and the retention window (local, s3)
    expected += 2 + 3  # stream processors: Quix throughput (with, without changelogs), recovery
    expected += 1 + 3  # and Faust's throughput, recovery
    # The anchors: statelog, shipped (with the lag sampler and without) and not; Litestream
    # (with the sampler and without), and SlateDB on S3 and on its local store, when the
    # `anchors` extra installed them.
    lite = shutil.which("litestream", path=str(Path(sys.executable).parent)) is not None
    expected += 3 + 2 * lite
    expected += 2 * slatedb_installed()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    cmd += ["benchmarks/", "--bench-size", "tiny", "--benchmark-disable", f"--basetemp={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"{expected} passed" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_strategy_recovers_its_last_checkpoint(name: str, tmp_path: Path) -> None:
    workload = Workload(300, 30)
    strategy = STRATEGIES[name](tmp_path)
    source = None
    if strategy.uses_source:
        from benchmarks.strategies import SourceLog

        source = SourceLog(tmp_path / "source.log")
    pos = 0
    for chunk in workload.initial_chunks(chunk=100):
        pos = source.append({}, 0, chunk) if source else 0
        strategy.load([chunk])
    strategy.loaded(pos)
    for i in range(12):
        cp = workload.checkpoint(i)
        pos = source.append(cp.offsets, cp.low_watermark_ms, cp.put) if source else 0
        strategy.checkpoint(cp, pos)
    strategy.finish()
    strategy.close()
    found = type(strategy).recover(tmp_path)
    assert found.offsets == cp.offsets and found.low_watermark_ms == cp.low_watermark_ms
    assert found.count() == 300


def test_json_restore_verifies_the_hash(tmp_path: Path) -> None:
    js = JsonSnapshot(tmp_path)
    js.load(Workload(200, 20).initial_chunks())
    js.apply(Workload(200, 20).checkpoint(0))
    path = js.snapshot()
    assert JsonSnapshot.restore(path)["state"] == js.state
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        JsonSnapshot.restore(path)


def _phase(seconds: float, cpu: float, updates: int = 1000) -> dict[str, Any]:
    return {
        "fraction": 0.01,
        "updates": updates,
        "walls": [seconds] * 4,
        "cpus": [cpu] * 4,
        "finish": 0.0,
        "checkpoints_total": 4,
        "bytes_written": 4096 * 4,
        "disk_growth": 0,
    }


def _bench(info: dict[str, Any], median: float = 0.01) -> dict[str, Any]:
    stats = {"median": median, "min": median, "max": median, "mean": median, "rounds": 3}
    return {"name": "x", "stats": stats, "extra_info": info}


def _results(size: str = "quick") -> dict[str, Any]:
    """Per checkpoint of 1,000 updates: statelog 1 ms; rocksdb 5 ms; sqlite 20 ms; json 400 ms
    of wall time but only 250 ms of CPU (so its ratio is 400x on wall, 250x on CPU)."""
    cells = {
        "statelog": (0.001, 0.001),
        "rocksdb": (0.005, 0.005),
        "sqlite": (0.02, 0.02),
        "json": (0.4, 0.25),
        "none": (0.001, 0.001),
    }
    bench = [
        _bench(
            {
                "suite": "tradeoff",
                "strategy": n,
                "keys": 100_000,
                "disk": 1 << 20,
                "worker": {"phases": [_phase(w, c)], "peak_rss": 50 << 20},
                "recovery": {
                    "seconds": 0.1,
                    "cpu_seconds": 0.1,
                    "replayed": 0,
                    "peak_rss": 40 << 20,
                    "detail": "",
                },
            }
        )
        for n, (w, c) in cells.items()
    ]
    restart = {
        "keys": 100_000,
        "history_updates": 10,
        "tail_updates": 1,
        "log_bytes": 100,
        "tail_bytes": 10,
        "json_bytes": 50,
        "rss_anon": 1 << 20,
        "replayed_commits": 1,
    }
    for kind, s in (("snapshot", 0.02), ("replay", 0.5), ("json", 0.3)):
        bench.append(
            _bench(
                {
                    "suite": "restart",
                    "kind": kind,
                    "seconds": [s, s],
                    "cpu_seconds": [s, s],
                    **restart,
                }
            )
        )
    bench.append(
        _bench(
            {
                "suite": "commit",
                "strategy": "statelog",
                "keys": 10_000,
                "updates": 1000,
                "cpu_p50": 0.001,
                "bytes_per_checkpoint": 2048,
            }
        )
    )
    bench.append(
        _bench(
            {
                "suite": "daemon",
                "daemon": True,
                "walls": [0.01, 0.03],
                "cpus": [0.01],
                "snapshots": 2,
                "daemon_status": 0,
                "errors": 0,
            }
        )
    )
    machine = {"loadavg": [0.5, 0.4, 0.3], "cpu_pressure": [1.5, 1.0]}
    run = {
        "command": "python -m pytest benchmarks/",
        "started": "2026-01-02T03:04:05+00:00",
        "seconds": 99.0,
        "size": size,
        "sizes": {"fractions": [0.01], "budget": 1, "settle": 1},
        "cpu": "Test CPU",
        "cores": 2,
        "usable_cores": 2,
        "memory_bytes": 8 << 30,
        "kernel": "Linux 6",
        "python": "CPython 3.11",
        "versions": {"statelog": "0.1.0"},
        "before": machine,
        "after": {**machine, "loadavg": [1.25, 0.5, 0.3]},
    }
    return {"benchmarks": bench, "statelog": run}


def test_renderer_computes_sections_and_verdicts(tmp_path: Path) -> None:
    kept = f"{KEEP_START}\n## Full-size results from the previous harness\n{KEEP_END}"
    text = render(_results(), tmp_path, kept)
    for needle in (
        "## Targets",
        "| statelog commit vs rocksdb | >= 3x the updates/s at 1M keys, 1% dirty | 5.0x",
        "| statelog commit vs sqlite | >= 30x the updates/s at 1M keys, 1% dirty | 20.0x",
        "| restart vs full replay, 100k keys | >= 20x faster than replaying the whole log | 25.0x",
        "## Durability strategy trade-off (100k keys, 1% dirty)",
        "| 100k | (5) SQLite WAL, `synchronous=FULL` | 0.100 s, nothing replayed | 20.00 / 20.00",
        "### Every size and dirty fraction",
        "### Recovery after SIGKILL",
        "## Checkpoint cost by state size",
        "## Restart after SIGKILL",
        "### Commit latency with the compaction daemon",
        "## Machine",
        "| CPU | Test CPU |",
        "0.50 / 0.40 / 0.30 at the start, 1.25 / 0.50 / 0.30 at the end",
        "1.5% / 1% at the start",
        "`python -m pytest benchmarks/` (`--bench-size quick`) on 2026-01-02 03:04 UTC in 99 s",
        "## Full-size results from the previous harness",
    ):
        assert needle in text, needle
    verdicts = re.findall(
        r"^\| (statelog commit vs \w+|restart [^|]*) \|.*\| \*\*(\w+)\*\*", text, re.M
    )
    assert verdicts == [
        ("statelog commit vs rocksdb", "met"),
        ("statelog commit vs sqlite", "missed"),
        ("statelog commit vs json", "inconclusive"),
        ("restart vs full replay, 100k keys", "met"),
    ]
    assert "## Remote tier" not in text and "## Memory" not in text  # not in these results
    assert all(
        (tmp_path / name).read_bytes().startswith(b"\x89PNG")
        for name in (PLOTS["bytes"], PLOTS["recovery"], PLOTS["commit"])
    )
    slower = copy.deepcopy(_results("full"))
    slower["benchmarks"][1]["extra_info"]["worker"]["phases"] = [_phase(0.0025, 0.0025)]
    text = render(slower, tmp_path, kept)
    assert "| statelog commit vs rocksdb | >= 3x the updates/s at 1M keys, 1% dirty | 2.5x" in text
    assert "previous harness" not in text  # a full-size run replaces those results


def test_no_tracker_names_in_the_benchmarks() -> None:
    files = [*sorted((ROOT / "benchmarks").glob("*.py")), ROOT / "docs" / "benchmarks.md"]
    for path in files:
        text = path.read_text()
        assert not re.search(r"\bissue[ _-]?\d|design brief|/tmp/|/work/", text, re.I), path


def _sized(doc: dict[str, Any], keys: int, restart_s: float) -> list[dict[str, Any]]:
    """The statelog, rocksdb and restart results of ``doc`` again, at ``keys`` keys."""
    out = []
    for b in copy.deepcopy(doc["benchmarks"]):
        info = b["extra_info"]
        if info.get("strategy") in ("statelog", "rocksdb") and info["suite"] == "tradeoff":
            out.append({**b, "extra_info": {**info, "keys": keys}})
        elif info["suite"] == "restart" and info["kind"] != "json":
            s = restart_s if info["kind"] == "snapshot" else 10.0
            info.update(keys=keys, seconds=[s], cpu_seconds=[s], json_bytes=None)
            out.append(b)
    return out


def test_renderer_judges_targets_at_1m_and_the_restart_at_the_largest_size(
    tmp_path: Path,
) -> None:
    """Above ``json_keys`` only the large strategies run: the throughput targets are still
    judged at 1M keys, the summary shows 1M and 10M, and the 10M restart is held to 2x."""
    doc = _results("full")
    doc["statelog"]["sizes"]["json_keys"] = 1_000_000
    doc["benchmarks"] = _sized(doc, 1_000_000, 0.1) + _sized(doc, 10_000_000, 0.25)
    text = render(doc, tmp_path)
    assert "## Durability strategy trade-off (1M and 10M keys, 1% dirty)" in text
    assert "| statelog commit vs rocksdb | >= 3x the updates/s at 1M keys, 1% dirty | 5.0x" in text
    assert "Above 1,000,000 keys only statelog" in text
    assert "### 10M keys" in text and "(no JSON restore at this size)" in text
    verdicts = re.findall(r"^\| (restart [^|]*) \|.*\| \*\*(\w+)\*\*", text, re.M)
    assert verdicts == [
        ("restart vs full replay, 1M keys", "met"),
        ("restart vs full replay, 10M keys", "met"),
        ("restart at 10M keys vs at 1M keys", "missed"),
    ]
    doc["benchmarks"] = _sized(doc, 1_000_000, 0.1) + _sized(doc, 10_000_000, 0.15)
    verdicts = re.findall(
        r"^\| (restart at [^|]*) \|.*\| \*\*(\w+)\*\*", render(doc, tmp_path), re.M
    )
    assert verdicts == [("restart at 10M keys vs at 1M keys", "met")]


def _anchor(system: str, per_s: float, lag_p99: float, restore_s: float) -> dict[str, Any]:
    info = {"suite": "anchor_replication", "system": system, "keys": 1_000_000}
    info |= {"updates_per_s": per_s, "checkpoints": 100, "lag_samples": 10, "lag_p50": lag_p99}
    info |= {"lag_p99": lag_p99, "lag_max": lag_p99, "bucket_bytes": 1 << 20}
    info |= {"bucket_objects": 5, "objects_per_hour": 60.0, "restore_seconds": restore_s}
    return _bench(info)


def test_the_anchors_get_a_table_the_winners_and_a_plot(tmp_path: Path) -> None:
    doc = _results()
    doc["benchmarks"] += [
        _anchor("statelog", 600_000.0, 1.2, 0.7),
        _anchor("litestream", 60_000.0, 9.0, float("nan")),  # a restore that was not timed
        _anchor("slatedb", 20_000.0, 0.0, 150.0),
        _anchor("statelog-unsampled", 900_000.0, float("nan"), 0.9),
        _anchor("litestream-unsampled", 75_000.0, float("nan"), 2.0),
    ]
    text = render(doc, tmp_path)
    assert "- durable updates/s: statelog wins with 600.0 k/s" in text
    assert "statelog's durable updates/s were 12.0x Litestream's" in text
    assert "(*statelog* and *Litestream*), 10.0x, in this run" in text
    assert "- lag p99 s: SlateDB wins with 0.00" in text
    assert "![bench-anchors.png](bench-anchors.png)" in text
    assert (tmp_path / "bench-anchors.png").read_bytes().startswith(b"\x89PNG")
