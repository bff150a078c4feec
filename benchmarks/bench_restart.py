"""Restart after SIGKILL: newest snapshot + log tail, vs the whole log replayed, vs JSON.

Set-up, once per size of ``restart_keys`` (not timed): a template store of that
many keys and ``restart_history`` updates of history, compacted into one snapshot, its
whole log kept aside (``probe template``); a clone of it into which a writer
commits a ``restart_tail``-update tail and is killed with SIGKILL; a copy of
that store without snapshots, holding every segment from epoch 1; the JSON
snapshot of the same state (up to ``json_keys`` keys). Each restore runs
``repeats`` times, each in a fresh interpreter that leaves with ``os._exit`` (``probe open``): the
pytest-benchmark time includes the interpreter's start, ``extra_info`` holds
the restore alone (wall and CPU seconds) and RssAnon after it.

``test_memory`` opens a template (its overlay empty: the state is all in the
file-backed base) in a fresh interpreter and reports RssAnon before and after
the open and after rewriting existing keys.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import SIZES, Sizes, parametrize_keys, size_id
from .probe import clone_store, run_probe, start_probe, stop_group
from .strategies import JsonSnapshot
from .workload import Workload


@dataclass(frozen=True)
class Scenario:
    keys: int
    acked_epoch: int
    paths: dict[str, Path]
    """Restore kind -> what ``probe open`` opens."""
    info: dict[str, Any]


def _write_json(directory: Path, keys: int, updates: int, commits: int, epoch: int) -> Path:
    """The JSON snapshot of the load followed by checkpoints ``0 .. commits - 1``."""
    workload = Workload(keys, updates)
    js = JsonSnapshot(directory)
    js.load(workload.initial_chunks())
    for i in range(commits):
        js.apply(workload.checkpoint(i))
    js.epoch = epoch
    return js.snapshot()


def _segments(wal: Path) -> list[Path]:
    return sorted(wal.glob("*.wal"))


@pytest.fixture(scope="module")
def scenario(restart_keys: int, sizes: Sizes, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    root = tmp_path_factory.mktemp(f"restart{restart_keys}")
    keys, updates = restart_keys, min(10_000, sizes.restart_tail)
    args = ["--keys", str(keys), "--updates", str(updates)]
    template = run_probe(
        ["template", str(root / "t"), *args, "--history", str(sizes.restart_history)]
    )
    store = root / "store"
    clone_store(root / "t" / "store", store)
    start, commits = template["history_commits"], max(1, sizes.restart_tail // updates)
    tail = ["tail", str(store), *args, "--commits", str(commits), "--start", str(start)]
    proc, acked = start_probe(tail)
    stop_group(proc)
    replay = root / "replay"
    (replay / "snapshots").mkdir(parents=True)
    (replay / "wal").mkdir()
    os.link(store / "IDENTITY", replay / "IDENTITY")
    kept = {p.name: p for p in _segments(root / "t" / "log")}
    for seg in _segments(root / "t" / "log"):
        os.link(seg, replay / "wal" / seg.name)
    for seg in _segments(store / "wal"):
        if seg.name not in kept:  # written by the killed writer; it may still grow
            shutil.copyfile(seg, replay / "wal" / seg.name)
    json_path: Path | None = None
    if keys <= sizes.json_keys:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            json_path = pool.submit(
                _write_json, root / "json", keys, updates, start + commits, acked["epoch"]
            ).result()
    tail_bytes = sum(p.stat().st_size for p in _segments(store / "wal") if p.name not in kept)
    info = {
        **template,
        "tail_updates": commits * updates,
        "history_updates": start * updates,
        "log_bytes": sum(p.stat().st_size for p in _segments(replay / "wal")),
        "tail_bytes": tail_bytes,
        "json_bytes": None if json_path is None else json_path.stat().st_size,
    }
    paths = {"snapshot": store, "replay": replay}
    if json_path is not None:
        paths["json"] = json_path
    return Scenario(keys, acked["epoch"], paths, info)


@pytest.mark.parametrize("kind", ["snapshot", "replay", "json"])
def test_restart(benchmark: Any, kind: str, scenario: Scenario, sizes: Sizes) -> None:
    if kind not in scenario.paths:
        pytest.skip(f"no JSON restore above {sizes.json_keys:,} keys")
    args = ["open", str(scenario.paths[kind]), *(["--json"] if kind == "json" else [])]
    docs: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: docs.append(run_probe(args)), rounds=sizes.repeats, iterations=1)
    benchmark.extra_info.update(
        suite="restart",
        kind=kind,
        keys=scenario.keys,
        seconds=[d["seconds"] for d in docs],
        cpu_seconds=[d["cpu_seconds"] for d in docs],
        rss_anon=max(d["rss_anon"] for d in docs),
        replayed_commits=docs[0]["replayed_commits"],
        **scenario.info,
    )
    assert all(d["count"] == scenario.keys for d in docs)
    assert all(d["epoch"] == scenario.acked_epoch for d in docs)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_keys(metafunc, "memory_keys", "memory_keys")
    if "restart_keys" in metafunc.fixturenames:
        keys = SIZES[str(metafunc.config.getoption("--bench-size"))].restart_keys
        metafunc.parametrize("restart_keys", keys, ids=[size_id(k) for k in keys], scope="module")


def test_memory(benchmark: Any, memory_keys: int, sizes: Sizes, tmp_path: Path) -> None:
    template = run_probe(["template", str(tmp_path / "t"), "--keys", str(memory_keys)])
    updates = min(memory_keys, 100_000)
    docs: list[dict[str, Any]] = []

    def measure() -> None:
        store = tmp_path / f"clone{len(docs)}"
        clone_store(tmp_path / "t" / "store", store)
        docs.append(
            run_probe(["memory", str(store), "--keys", str(memory_keys), "--updates", str(updates)])
        )

    benchmark.pedantic(measure, rounds=1, iterations=1)
    doc = docs[-1]
    benchmark.extra_info.update(suite="memory", keys=memory_keys, **template, **doc)
    assert doc["count"] == memory_keys
    assert doc["rss_anon_open"] > 0 and doc["rss_anon_updated"] >= doc["rss_anon_open"]
