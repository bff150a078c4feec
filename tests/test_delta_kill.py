"""SIGKILL a real compactor at every durable step of a delta pass, a rebase and a full merge.

Each store starts from the same template: a full snapshot and, for the
merge and the rebase, a delta on it; then a sealed tail that the daemon's
default policy (``max_chain`` 8, ``full_ratio`` 0.5) writes as a delta (a
small tail) or as a full merge of the chain (a tail heavier than half the
full body), or that ``--max-chain 1`` merges with the delta into one delta
on the full snapshot (a rebase), or that ``--max-chain 2`` on a heavy delta and
a light one merges with the light one only, into a delta on the heavy one (a
size-tiered rebase). A
``python -m compactor --once`` process is killed by the kit's fault layer
at its K-th durable step, for K = 1, 2, ... until a pass runs to its end.
After every kill:

* every snapshot verifies, and its chain restores exactly the model at its
  epoch (no partial snapshot, no delta whose parent is gone);
* a read-only open reads exactly the newest state;
* the next pass (in this process) succeeds: it writes the snapshot of the
  expected kind, or finds nothing new if the killed one had written it;
  afterwards no scratch is left and the writer opens on the newest snapshot.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

import statelog
from compactor import SCRATCH_DIR
from statelog.compaction.fold import compact
from statelog.storage.fileio import FileLayer
from statelog.storage.snapshots import list_snapshots, verify_snapshot
from tests.compactor_stream import snapshot_model
from tests.delta_stores import SEG, Model, commit_round, contents, passed
from tests.test_compactor import PY, REPO

SCRIPT = Path(__file__).with_name("compactor_stream.py")
ARGS = ["--once", "--min-tail-bytes", "0", "--retain", "2"]
POLICY: dict[str, dict[str, Any]] = {
    "delta": {}, "full": {}, "rebase": {"max_chain": 1, "full_ratio": 10.0},
    "tiered": {"max_chain": 2, "full_ratio": 10.0},
}  # fmt: skip
"""The chain settings of the killed pass and of the one after it, per kind."""
DEPTH = {"delta": 1, "full": 0, "rebase": 1, "tiered": 2}
"""The depth of the snapshot the pass writes, per kind."""


def _heavy_round(root: Path, model: Model) -> None:
    """A tail that rewrites every key with a larger value: over half the full body."""
    with statelog.open(root, segment_bytes=SEG) as store:
        for i in range(0, 240, 20):
            model.commit(store, {f"k{j}": {"v": -j, "pad": "z" * 80} for j in range(i, i + 20)})


def _template(root: Path, kind: str) -> tuple[Model, dict[int, Any]]:
    """The store before the pass that is killed; the model at each snapshot's epoch."""
    model = Model()
    states: dict[int, Any] = {}
    commit_round(root, model, 0)
    assert passed(root).full
    states[model.epoch] = model.state()
    if kind == "delta":
        commit_round(root, model, 1)
    elif kind == "tiered":
        commit_round(root, model, 1, width=60)
        assert passed(root).depth == 1
        states[model.epoch] = model.state()
        commit_round(root, model, 2, width=3)
        assert passed(root).depth == 2
        states[model.epoch] = model.state()
        commit_round(root, model, 3, width=3)
    else:
        commit_round(root, model, 1)
        assert passed(root).depth == 1
        states[model.epoch] = model.state()
        if kind == "full":
            _heavy_round(root, model)
        else:
            commit_round(root, model, 2)
    states[model.epoch] = model.state()
    return model, states


def _die_at(store: Path, k: int, kind: str) -> int:
    policy = [f"--{n.replace('_', '-')}={v}" for n, v in POLICY[kind].items()]
    done = subprocess.run(
        [PY, str(SCRIPT), "die-at", str(k), "--", *ARGS, *policy, str(store)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (0, -signal.SIGKILL), (k, done.returncode, done.stderr[-2000:])
    return done.returncode


def _check_after_kill(root: Path, model: Model, states: dict[int, Any], scratch: Path) -> None:
    for _e, _l, path in list_snapshots(root / "snapshots"):
        meta, got = snapshot_model(path, scratch)
        assert got["tables"] == states[meta.epoch], path.name
        assert got["epoch"] == meta.epoch
    with statelog.open(root, readonly=True) as ro:
        assert ro.epoch == model.epoch and contents(ro) == model.state()


@pytest.mark.parametrize("kind", ["delta", "full", "rebase", "tiered"])
def test_sigkill_at_every_step_of_a_pass_leaves_the_model(tmp_path: Path, kind: str) -> None:
    template = tmp_path / "template"
    model, states = _template(template, kind)
    killed = 0
    for k in range(1, 80):
        root = tmp_path / f"k{k}"
        shutil.copytree(template, root, symlinks=True)
        code = _die_at(root, k, kind)
        _check_after_kill(root, model, states, tmp_path / "x")
        newest = list_snapshots(root / "snapshots")[0][2]
        wrote = verify_snapshot(FileLayer(), newest, store_id=None)
        if wrote.epoch == model.epoch:  # the killed pass wrote its snapshot: of that kind
            assert wrote.depth == DEPTH[kind], (k, wrote)
        result = compact(root, retain=2, **POLICY[kind])
        if wrote.epoch == model.epoch:
            assert result.skipped == "nothing_new", (k, result)
        else:
            assert result.snapshot is not None, (k, result.skipped)
            assert result.full == (kind == "full"), (k, result)
        assert not (root / SCRATCH_DIR).exists()
        assert not list((root / "snapshots").glob("*.tmp"))
        with statelog.open(root) as store:
            assert store.recovery.snapshot is not None
            assert store.recovery.snapshot.name == list_snapshots(root / "snapshots")[0][2].name
            assert store.epoch == model.epoch and contents(store) == model.state()
        shutil.rmtree(root)
        if code == 0:
            break
        killed += 1
    else:
        pytest.fail("the pass never ran to its end")
    print(kind, "killed at", killed, "steps")
    assert killed >= 8, killed  # a pass takes many durable steps: each one was hit
