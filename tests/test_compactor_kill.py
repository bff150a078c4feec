"""SIGKILL the compaction daemon again and again while a writer commits.

A writer subprocess (``tests/compactor_stream.py writer``) commits the
kit's seeded stream with per-commit durability and small segments, so the
log rolls every few dozen commits; it prints ``ack i`` after each commit.
Meanwhile compactor daemons (real ``python -m compactor`` processes,
passing every few milliseconds with no tail trigger, ``--retain 2`` and
chains of at most two deltas) are killed, one after another, at two kinds of moments:

``timed``  SIGKILL from outside a random 0-300 ms after the daemon logged
           ``event=started``: anywhere in a fold, a snapshot write, retention,
           or between passes;
``step``   the daemon SIGKILLs itself at its K-th durable step (K random):
           the scratch directory, the snapshot's temp file, its body, its
           sync, its rename, the directory fsync, a retention unlink
           (the kit's fault layer, armed by ``tests/compactor_stream.py``).

After every kill:

* every ``*.snap`` in ``snapshots/`` verifies, and its chain (itself, for a
  full snapshot; its parents back to a full one, for a delta) restores
  exactly the fold of commits ``1..E`` for its epoch E (no partial snapshot
  is ever visible, no delta ever loses its parent);
* nothing else is taken for a snapshot (``*.tmp`` files are ignored);
* the writer keeps acknowledging epochs (it never errs or stalls).

The daemons' default chain policy writes both kinds of pass here: deltas
while the tail is small beside the full snapshot, full merges otherwise;
the test requires that at least one of each was written while daemons died.
At the end the writer stops cleanly, one ``--once`` pass folds the whole log,
the leftovers of the dead daemons (scratch directory, ``*.tmp``) are gone,
and what is left is the two newest restore points with their chains and
the log from the older one.
No store is reopened after retention deleted segments.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from compactor import SCRATCH_DIR
from statelog.kit import Model
from statelog.storage.fileio import FileLayer
from statelog.storage.snapshots import list_snapshots, verify_snapshot
from tests.compactor_stream import STREAM, snapshot_model
from tests.test_compactor import PY, REPO, run_cli, wait_for

SCRIPT = Path(__file__).with_name("compactor_stream.py")
# A full merge every third snapshot (chains of at most 2 deltas), never one forced by the
# deltas' size: the daemons killed write both kinds of pass, whatever the tails weigh.
DAEMON_ARGS = ["--interval", "0.005", "--min-tail-bytes", "0", "--retain", "2", "-v"]
DAEMON_ARGS += ["--max-chain", "2", "--full-ratio", "10"]


class Writer:
    """The committing subprocess, with a thread that follows its acknowledgements."""

    def __init__(self, store: Path, stop: Path) -> None:
        self.stop_file = stop
        self.proc = subprocess.Popen(
            [PY, str(SCRIPT), "writer", str(store), str(stop), "--segment-bytes", "4096"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.acked = 0
        self.done: int | None = None
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode().strip()
            word, _, num = line.partition(" ")
            if word == "ack":
                assert int(num) == self.acked + 1, (line, self.acked)
                self.acked = int(num)
            elif word == "done":
                self.done = int(num)
            else:
                self.lines.append(line)

    def wait_past(self, epoch: int, timeout: float = 15) -> None:
        """Fail unless the writer acknowledges an epoch above ``epoch`` in time."""
        deadline = time.monotonic() + timeout
        while self.acked <= epoch:
            assert self.proc.poll() is None, f"the writer died: {self.stderr()}"
            assert time.monotonic() < deadline, f"the writer stalled at {self.acked}"
            time.sleep(0.005)

    def finish(self) -> int:
        self.stop_file.touch()
        assert self.proc.wait(timeout=60) == 0, self.stderr()
        self._thread.join(10)
        assert self.done is not None and self.done >= self.acked
        assert "Traceback" not in self.stderr()
        return self.done

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode() if self.proc.poll() is not None else "(running)"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Checker:
    """Checks every snapshot once (by name and inode) against the model at its epoch."""

    def __init__(self, store: Path, scratch: Path) -> None:
        self.store, self.scratch = store, scratch
        self.seen: set[tuple[str, int]] = set()
        self.kinds: Counter[str] = Counter()  # snapshots checked, by kind
        self.model = Model()

    def model_at(self, epoch: int) -> dict[str, object]:
        if epoch < self.model.epoch:
            self.model = Model()
        STREAM.advance(self.model, epoch)
        return {"epoch": epoch, **self.model.state()}

    def check(self, why: str) -> int:
        snap_dir = self.store / "snapshots"
        listed = list_snapshots(snap_dir)
        assert all(p.name.endswith(".snap") for _, _, p in listed)
        fresh = 0
        for _, _, path in listed:
            key = (path.name, path.stat().st_ino)
            if key in self.seen:
                continue
            verify_snapshot(FileLayer(), path, store_id=None)
            meta, got = snapshot_model(path, self.scratch)
            assert got == self.model_at(meta.epoch), f"{why}: {path.name} is not the fold"
            self.seen.add(key)
            self.kinds["delta" if meta.delta is not None else "full"] += 1
            fresh += 1
        return fresh


def kill_loop(tmp_path: Path, rounds: int, seed: int) -> Counter[str]:
    store, stop = tmp_path / "store", tmp_path / "STOP"
    rng = random.Random(seed)
    writer = Writer(store, stop)
    checker = Checker(store, tmp_path / "extract")
    outcomes: Counter[str] = Counter()
    try:
        writer.wait_past(30)
        for n in range(rounds):
            mode = "timed" if n % 2 == 0 else "step"
            before = writer.acked
            if mode == "timed":
                proc = subprocess.Popen(
                    [PY, "-m", "compactor", *DAEMON_ARGS, str(store)],
                    cwd=REPO,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                wait_for(proc, "event=started")
                time.sleep(rng.uniform(0, 0.3))
                proc.send_signal(signal.SIGKILL)
                code = proc.wait(timeout=30)
                assert proc.stderr is not None
                log = proc.stderr.read().decode()
            else:
                k = rng.randint(1, 30)  # the first pass takes some 15-20 durable steps
                proc = subprocess.Popen(
                    [PY, str(SCRIPT), "die-at", str(k), "--", *DAEMON_ARGS, str(store)],
                    cwd=REPO,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                _, err = proc.communicate(timeout=60)
                code, log = proc.returncode, err.decode()
            assert code == -signal.SIGKILL, f"round {n} ({mode}): exit {code}\n{log[-3000:]}"
            assert "Traceback" not in log, log
            outcomes[mode] += 1
            outcomes["snapshots_checked"] += checker.check(f"round {n} ({mode})")
            last_event = (re.findall(r"event=(\w+)", log) or ["none"])[-1]
            outcomes[f"{mode}:after_{last_event}"] += 1
            writer.wait_past(max(before, writer.acked))  # never stalls, never errs
        last = writer.finish()
    finally:
        writer.kill()
    final = run_cli("--once", "--min-tail-bytes", "0", "--retain", "2", store)
    assert final.returncode == 0, final.stderr
    newest = list_snapshots(store / "snapshots")[0]
    assert newest[0] == last  # the closed log is folded completely
    checker.check("final pass")
    assert not (store / SCRATCH_DIR).exists()
    assert not list((store / "snapshots").glob("*.tmp"))
    assert_bounded(store)
    outcomes.update({f"written:{k}": n for k, n in checker.kinds.items()})
    return outcomes


def assert_bounded(store: Path) -> None:
    """Disk stays bounded: the two newest restore points and their chains, and the log
    from the older of the two (every snapshot here verifies, so both are restore points)."""
    listed = list_snapshots(store / "snapshots")
    metas = {p.name: verify_snapshot(FileLayer(), p, store_id=None) for _, _, p in listed}
    needed: set[str] = set()
    for _, _, path in listed[:2]:
        name: str | None = path.name
        while name is not None:
            needed.add(name)
            link = metas[name].delta
            name = link.parent if link is not None else None
    assert set(metas) == needed  # every parent present, nothing else left
    segs = sorted((store / "wal").glob("*.wal"))
    first = int(segs[0].name.split("-")[1].split(".")[0], 16)
    assert first == listed[1][1] + 1 or len(segs) == 1


def test_sigkill_daemon_during_compaction(tmp_path: Path) -> None:
    seed = int(os.environ.get("COMPACTOR_KILL_SEED", "20_261_129"))
    outcomes = kill_loop(tmp_path, rounds=40, seed=seed)
    print(dict(outcomes))
    assert outcomes["timed"] + outcomes["step"] == 40
    assert outcomes["snapshots_checked"] >= 10, outcomes
    # Both kinds of pass were killed around: deltas on a chain, and full merges.
    assert outcomes["written:delta"] >= 1 and outcomes["written:full"] >= 1, outcomes


@pytest.mark.stress
@pytest.mark.timeout(1500)  # 200 rounds, each a daemon start: several minutes
def test_sigkill_daemon_during_compaction_long(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    outcomes = kill_loop(tmp_path, rounds=200, seed=seed)
    print(f"seed={seed}", dict(outcomes))
    assert outcomes["snapshots_checked"] >= 60, outcomes
