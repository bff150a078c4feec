"""The benchmark code, run once on tiny sizes so that it cannot rot. No timing is asserted.

Issue 3's parts (restart after SIGKILL, the daemon's effect on commit latency, memory)
run through the runner at 200 keys; their building blocks are checked on their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import statelog
from benchmarks import run
from benchmarks.daemon_latency import _parse_log
from benchmarks.measure import RunSpec, measure, percentile
from benchmarks.memory import measure_memory
from benchmarks.profile_commit import _PROBES, BUCKETS, profile_commits
from benchmarks.report_tradeoff import PLOTS
from benchmarks.stores import build_template, clone_store
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


ISSUE3_TINY = ["--restart-keys", f"{KEYS}", "--restart-tail", f"{UPDATES}", "--restart-repeats"]
ISSUE3_TINY += ["1", "--daemon-keys", f"{KEYS}", "--daemon-checkpoints", "3", "--daemon-pairs"]
ISSUE3_TINY += ["1", "--memory-keys", f"{KEYS}", "--memory-updates", f"{UPDATES}"]
ISSUE3_TINY += ["--restart-history", f"{2 * UPDATES}"]
TRADEOFF_TINY = ["--tradeoff-sizes", "1000", "--tradeoff-budget", "0.01"]
TRADEOFF_TINY += ["--tradeoff-checkpoints", "2", "--tradeoff-settle", "0.1"]
TRADEOFF_TINY += ["--remote-keys", "2000", "--remote-seconds", "1"]


def test_runner_writes_the_report(tmp_path: Path) -> None:
    """Every part once, issues 6, 2 and 3, at tiny sizes: the whole report and plots render."""
    out = tmp_path / "benchmarks.md"
    argv = ["--quick", "--sizes", f"{KEYS}", "--updates", f"{UPDATES}", "--checkpoints", "2"]
    argv += ["--json-checkpoints", "2", "--warmup", "1", "--profile-commits", "2"]
    argv += [*ISSUE3_TINY, *TRADEOFF_TINY, "--out", str(out), "--dir", str(tmp_path)]
    assert run.main(argv) == 0
    text = out.read_text()
    for needle in (
        "## Durability strategy trade-off, measured (1k keys, 1% dirty)",
        "| (1) JSON full snapshot every checkpoint, atomic rename |",
        "| (2) zstd full snapshot every 10 checkpoints + source replay |",
        '| (3) statelog `durability="group"` + compactor |',
        "| (4) no checkpoint: replay the source from the start |",
        "| (5) SQLite WAL, `synchronous=FULL` |",
        "| (5) LMDB, synced commit per checkpoint |",
        "| (5) RocksDB (rocksdict), synced WriteBatch |",
        "## Targets (issue 6)",
        "| statelog commit vs rocksdb |",
        "## Remote tier (issue 7): shipping lag, restore, bytes per checkpoint",
        "| restore + open vs local restart |",
        "| recovery vs no checkpoint |",
        "![bench-commit-latency.png](bench-commit-latency.png)",
        "| 1k | 10.0% | sqlite |",
        "## Targets (issue 2)",
        "| 200 | json |",
        "| 200 | statelog |",
        "## Ratios",
        "## Where statelog's commit time goes",
        "| fdatasync |",
        "crc32c.hardware_based",
        "benchmarks/run.py --quick --sizes 200",
        "## Targets (issue 3)",
        "| restart vs full replay |",
        "| restart vs the floor |",
        "| p99 commit with the daemon |",
        "| RssAnon, 1M-key base |",
        "| overlay memory per update |",
        "## Restart after SIGKILL",
        "(d) floor: read + decompress the snapshot, read the tail",
        "- Same state: (a), (b) and (c) restored 200, 200, 200 keys",
        "| replay the log tail |",
        "## Commit latency with the compaction daemon",
        "| with the daemon | 3 |",
        "Daemon exit status after SIGTERM: 0;",
        "## Memory: a file-backed base, and the overlay",
        "overlay entries  <=  (T + S) / w  +  u * (2 P + I + L)",
    ):
        assert needle in text, needle
    assert "STATE MISMATCH" not in text and "MISMATCH**" not in text and "**NO**" not in text
    assert "Failed cells" not in text
    plots = {tmp_path / name for name in PLOTS.values()}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in plots)
    assert set(tmp_path.iterdir()) == {out, *plots}  # every temporary store is gone


def test_issue3_parts_alone_skip_issue2(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    argv = ["--quick", "--parts", "memory", "--memory-keys", f"{KEYS}", "--memory-updates", "20"]
    argv += ["--out", str(out), "--dir", str(tmp_path)]
    assert run.main(argv) == 0
    text = out.read_text()
    assert "Issue 2's measurements were not part of this invocation" in text
    assert "## Targets (issue 2)" not in text and "## Restart after SIGKILL" not in text
    assert "| RssAnon, 10M-key base |" in text and "not measured" in text
    with pytest.raises(SystemExit):
        run.main(["--quick", "--parts", "restart,nonsense"])


def test_template_clone_and_memory_probe(tmp_path: Path) -> None:
    t = build_template(tmp_path / "template", KEYS)
    assert t.snapshot.exists() and t.image_bytes > 0 and t.epoch == 1  # one 50k-key chunk
    # The kept log reaches back to epoch 1; the store's own log may have been trimmed.
    assert sorted(p.name for p in t.log.iterdir())[0].endswith("0000000000000001.wal")
    clone = tmp_path / "clone"
    clone_store(t.path, clone)
    m = measure_memory(clone, KEYS, t.image_bytes, UPDATES)
    assert m.base == t.snapshot.name and m.count == KEYS
    assert m.overlay_entries_open == 0 and m.overlay_entries_updated == UPDATES
    assert m.rss_anon_open > 0 and m.wal_bytes_updated > 0
    # The clone shares the template's immutable files and never wrote into them.
    assert (clone / "IDENTITY").stat().st_ino == (t.path / "IDENTITY").stat().st_ino
    with statelog.open(t.path, readonly=True) as template_store:
        assert template_store.count() == KEYS


def test_json_restore_verifies_the_hash(tmp_path: Path) -> None:
    js = JsonSnapshotStrategy(tmp_path)
    js.load(Workload(KEYS, UPDATES).initial_chunks(chunk=64))
    js.apply(Workload(KEYS, UPDATES).checkpoint(0))
    js.snapshot()
    path = js.newest()
    assert path is not None
    doc, parts = JsonSnapshotStrategy.restore(path)
    assert doc["state"] == js.state and doc["epoch"] == 1
    assert set(parts) == {"read", "verify sha256", "json.loads"}
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        JsonSnapshotStrategy.restore(path)


def test_daemon_log_lines_parse() -> None:
    text = (
        "ts=2026-01-02T03:04:05.500Z level=INFO event=pass_done store=/s snapshot=- "
        "skipped=nothing_new folded=0 deleted=0 bytes_read=0 seconds=0.010\n"
        'ts=2026-01-02T03:04:07.000Z level=ERROR event=pass_failed store=/s error="x y"\n'
        "ts=2026-01-02T03:04:09.250Z level=INFO event=pass_done store=/s "
        "snapshot=0000000000000002-0000000000000002.snap skipped=- seconds=1.250\n"
        "not a log line\n"
    )
    passes, errors = _parse_log(text)
    assert [p.snapshot for p in passes] == [False, True]
    assert passes[1].seconds == 1.25 and passes[1].end - passes[0].end == pytest.approx(3.75)
    assert passes[1].start == pytest.approx(passes[1].end - 1.25)
    assert len(errors) == 1 and "pass_failed" in errors[0]


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


def test_tradeoff_profile_renders_a_merged_tree() -> None:
    from benchmarks.tradeoff_profile import profile_checkpoints, render_profile

    doc = profile_checkpoints("sqlite", KEYS, 0.1, 2)
    text = "\n".join(render_profile([doc]))
    assert "**sqlite**, 200 keys, 20 updates per checkpoint: 2 checkpoints" in text
