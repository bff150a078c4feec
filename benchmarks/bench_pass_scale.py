"""What one compaction pass costs against the size of the state, for the same tail.

For each size of ``pass_keys`` a template store is built once (``probe template``:
that many keys loaded, then compacted into one full snapshot). Each round clones
it (hard links), commits ``pass_tail`` random updates of the reconciler workload
in 10 checkpoints, closes the writer (which seals the tail), and runs one pass of
:func:`statelog.compaction.fold.compact`:

* ``delta``: the default chain policy, so the pass writes a delta snapshot of the
  keys the tail changed on top of the template's full snapshot;
* ``full``: ``max_chain=0``, so the pass rewrites the whole state as a full
  snapshot (what every pass did before delta snapshots);
* ``delta-later``: as ``delta``, but the round first folds another tail of the
  same size in an untimed pass of the same process, as a daemon's passes follow
  one another. The first pass after a full snapshot also deletes the log
  before it, so it hashes that full snapshot again (retention's rule, read
  in a thread beside the fold): a read of the state's size, paid once per
  full snapshot, which the later
  pass does not pay.

``extra_info`` holds each round's wall and CPU seconds (``time.process_time``,
all threads of this process), the snapshot bytes written, the bytes the pass
read, and the log bytes it folded.
"""

from __future__ import annotations

import itertools
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.compaction.fold import compact

from .conftest import Sizes, parametrize_keys
from .probe import clone_store, run_probe
from .strategies import commit_checkpoint
from .workload import Workload

KINDS = {"delta": 8, "full": 0, "delta-later": 8}  # kind -> max_chain
_templates: dict[int, Path] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_keys(metafunc, "keys", "pass_keys")


def _template(keys: int, factory: pytest.TempPathFactory) -> Path:
    """The template store of ``keys`` keys (built once per run)."""
    if keys not in _templates:
        root = factory.mktemp(f"pass{keys}")
        run_probe(["template", str(root / "t"), "--keys", str(keys)], timeout=4 * 3600)
        _templates[keys] = root / "t" / "store"
    return _templates[keys]


@pytest.mark.parametrize("kind", list(KINDS))
def test_pass_cost(
    benchmark: Any, keys: int, kind: str, sizes: Sizes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    template = _template(keys, tmp_path_factory)
    updates = max(1, min(sizes.pass_tail, keys) // 10)
    workload = Workload(keys, updates, seed=7)
    clones = itertools.count()
    rounds: list[dict[str, Any]] = []
    made: list[Path] = []

    def setup() -> tuple[tuple[Path], dict[str, Any]]:
        for old in made:  # one clone on disk at a time: a 10M-key one is gigabytes
            shutil.rmtree(old, ignore_errors=True)
        store = template.parent.parent / f"{kind}{next(clones)}"
        made.append(store)
        clone_store(template, store)
        first = 0
        if kind == "delta-later":  # an earlier tail, folded by an untimed pass
            with statelog.open(store, durability="none") as s:
                for i in range(10):
                    commit_checkpoint(s, workload.checkpoint(i))
            assert compact(store, retain=2, max_chain=KINDS[kind]).snapshot is not None
            first = 10
        with statelog.open(store, durability="none") as s:  # the close seals the tail
            for i in range(first, first + 10):
                commit_checkpoint(s, workload.checkpoint(i))
        return (store,), {}

    def one_pass(store: Path) -> None:
        cpu = time.process_time()
        wall = time.perf_counter()
        r = compact(store, retain=2, max_chain=KINDS[kind])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert r.snapshot is not None and r.full == (kind == "full"), r
        rounds.append(
            {
                "seconds": wall,
                "cpu_seconds": cpu,
                "written_bytes": r.written_bytes,
                "bytes_read": r.bytes_read,
                "log_bytes": sum(p.stat().st_size for p in r.segments if p.exists()),
                "depth": r.depth,
            }
        )

    benchmark.pedantic(one_pass, setup=setup, rounds=3, iterations=1)
    for old in made:
        shutil.rmtree(old, ignore_errors=True)
    benchmark.extra_info.update(
        suite="pass-scale", keys=keys, kind=kind, tail_updates=10 * updates, rounds=rounds
    )
