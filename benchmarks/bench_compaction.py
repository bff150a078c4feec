"""The compaction engine: pass time, and commit latency with the daemon running vs not.

``test_compactor_pass`` folds a 10%-of-the-keys tail into a template store of
``daemon_keys`` keys with :func:`statelog.compaction.fold.compact` (each round
on a fresh hard-link clone with a fresh tail, made by the setup).
``test_commit_latency`` commits ``daemon_checkpoints`` durable checkpoints of
10k updates (8 MiB segments) in a fresh interpreter on a clone, with
``python -m compactor --interval 1 --min-tail-bytes 8388608 --retain 2``
running on the same store or without it; ``extra_info`` holds every commit's
wall and thread-CPU time, the snapshots the daemon wrote meanwhile, its
ERROR lines and its exit status after SIGTERM.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.compaction.fold import compact

from .conftest import Sizes
from .probe import clone_store, run_probe
from .strategies import commit_checkpoint
from .workload import Workload


@pytest.fixture(scope="module")
def template(sizes: Sizes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compaction")
    run_probe(["template", str(root / "t"), "--keys", str(sizes.daemon_keys)])
    return root / "t" / "store"


def test_compactor_pass(benchmark: Any, template: Path, sizes: Sizes) -> None:
    keys = sizes.daemon_keys
    workload = Workload(keys, max(1, keys // 100))
    clones = itertools.count()
    results: list[Any] = []

    def setup() -> tuple[tuple[Path], dict[str, Any]]:
        store = template.parent.parent / f"pass{next(clones)}"
        clone_store(template, store)
        with statelog.open(store, durability="none") as s:  # the close seals the tail
            for i in range(10):
                commit_checkpoint(s, workload.checkpoint(i))
        return (store,), {}

    benchmark.pedantic(
        lambda store: results.append(compact(store, retain=2)), setup=setup, rounds=3, iterations=1
    )
    snapshot = results[-1].snapshot
    assert snapshot is not None
    benchmark.extra_info.update(
        suite="compaction",
        keys=keys,
        tail_updates=10 * workload.updates,
        snapshot_bytes=snapshot.stat().st_size,
    )


@pytest.mark.parametrize("daemon", [False, True], ids=["without", "with-daemon"])
def test_commit_latency(benchmark: Any, daemon: bool, template: Path, sizes: Sizes) -> None:
    store = template.parent.parent / f"commits-{daemon}"
    clone_store(template, store)
    args = ["commits", str(store), "--keys", str(sizes.daemon_keys)]
    args += ["--checkpoints", str(sizes.daemon_checkpoints), *(["--daemon"] if daemon else [])]
    docs: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: docs.append(run_probe(args)), rounds=1, iterations=1)
    doc = docs[-1]
    benchmark.extra_info.update(suite="daemon", daemon=daemon, keys=sizes.daemon_keys, **doc)
    assert len(doc["walls"]) == sizes.daemon_checkpoints
    if daemon:
        assert doc["daemon_status"] == 0 and doc["errors"] == 0
