"""The daemon over several stores: sharded roots, and stores another compactor holds.

Every test runs the real ``python -m compactor`` in a subprocess.

| Situation                                   | Expected                                        |
|---------------------------------------------|-------------------------------------------------|
| ``statelog-compactor ROOT`` (sharded root)  | a snapshot in every shard, each shard once      |
| a root whose ``SHARDS`` is damaged          | ``event=shards_unreadable``, exit 1, no lock    |
| daemon, one store held by another compactor | ``event=locked`` at ERROR; the other store      |
|                                             | compacted; still running, the lock retried;     |
|                                             | the held store compacted once it is released    |
| ``--once``, one store held                  | the free store compacted, then exit 4           |
| daemon, every store held at start           | exit 4 at once, nothing written                 |
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import statelog
from compactor import CompactorLock
from statelog.sharding.sharded import ShardedStore
from statelog.storage.snapshots import list_snapshots

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv" / "bin" / "python"
PY = str(VENV_PY if VENV_PY.exists() else Path(sys.executable))
SEG = 4096  # the smallest segment size: a few dozen commits each
FAST = ("--interval", "0.2", "--min-tail-bytes", "0")


def make_store(path: Path, commits: int = 60) -> None:
    """A closed store: every segment sealed, so a pass has something to fold."""
    with statelog.open(path, segment_bytes=SEG, durability="none") as s:
        for e in range(1, commits + 1):
            s.commit(offsets={"p": e}, low_watermark_ms=e, put={f"k{e % 17}": "v" * 50})


def snapshots(store: Path) -> list[Path]:
    return [p for _, _, p in list_snapshots(store / "snapshots")]


def run_cli(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "compactor", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Daemon:
    """A running daemon and everything it wrote to stderr so far."""

    def __init__(self, *args: str | Path) -> None:
        self.proc = subprocess.Popen(
            [PY, "-m", "compactor", *map(str, args)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.text = ""

    def count(self, needle: str) -> int:
        return sum(needle in line for line in self.text.splitlines())

    def until(self, needle: str, times: int = 1, timeout: float = 30) -> None:
        """Read stderr until ``times`` lines hold ``needle`` (lines read earlier count)."""
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        deadline = time.monotonic() + timeout
        while self.count(needle) < times:
            left = deadline - time.monotonic()
            assert left > 0, f"no {needle!r} x{times} within {timeout}s: {self.text[-3000:]}"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                assert chunk, f"daemon exited ({self.proc.wait()}): {self.text[-3000:]}"
                self.text += chunk.decode()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_a_sharded_root_gets_a_snapshot_in_every_shard(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with ShardedStore(root, 3, segment_bytes=SEG, durability="none") as s:
        # One key per shard, found by routing rather than assumed.
        keys = {s.shard_for(f"k{n}"): f"k{n}" for n in range(200)}
        for e in range(1, 41):
            for i in range(3):
                s.commit_shard(i, offsets={f"src-{i}": e}, low_watermark_ms=e, put={keys[i]: e})
    shards = [root / f"shard-{i:04d}" for i in range(3)]
    # A shard also named on its own is still served once.
    daemon = Daemon(*FAST, root, shards[1])
    try:
        for shard in shards:
            daemon.until(f"event=snapshot_written store={shard} ")
        assert daemon.count("event=started") == 1 and "stores=3 " in daemon.text
        assert daemon.count("event=snapshot_written") == 3
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    with ShardedStore(root) as s:
        for i in range(3):
            assert s.recovery[i].snapshot is not None
            assert s.shard(i).epoch == 40 and s.shard(i).get(keys[i]) == 40


def test_a_root_with_a_damaged_manifest_exits_1_before_touching_a_store(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ShardedStore(root, 2).close()
    (root / "SHARDS").write_text("{not json")
    done = run_cli("--once", "--min-tail-bytes", "0", root)
    assert done.returncode == 1, done.stderr
    assert "level=ERROR event=shards_unreadable" in done.stderr
    assert not list(root.glob("shard-*/COMPACTOR.LOCK"))


def test_a_locked_store_is_retried_while_the_others_are_served(tmp_path: Path) -> None:
    held, free = tmp_path / "held", tmp_path / "free"
    make_store(held)
    make_store(free)
    other = CompactorLock(held)  # stands in for another compactor
    daemon = Daemon(*FAST, held, free)  # the held store first: it must not stop the round
    try:
        daemon.until(f"level=ERROR event=locked store={held} pid={os.getpid()} ")
        daemon.until(f"event=snapshot_written store={free} ")
        daemon.until(f"event=locked store={held} ", times=3)  # tried again every interval
        assert daemon.proc.poll() is None, daemon.text
        assert snapshots(free) and not snapshots(held)
        other.release()
        daemon.until(f"event=locked_store store={held} ")
        daemon.until(f"event=snapshot_written store={held} ")
        assert snapshots(held)
        assert daemon.stop() == 0
    finally:
        other.release()
        daemon.kill()
    assert "exiting" not in daemon.text  # no plain "exiting (status 4)" line


def test_once_with_a_locked_store_passes_the_others_then_exits_4(tmp_path: Path) -> None:
    held, free = tmp_path / "held", tmp_path / "free"
    make_store(held)
    make_store(free)
    with CompactorLock(held):
        done = run_cli("--once", "--min-tail-bytes", "0", held, free)
    assert done.returncode == 4, done.stderr
    assert snapshots(free) and not snapshots(held)
    assert f"level=ERROR event=locked store={held} pid={os.getpid()} " in done.stderr
    assert "event=once_done stores=2 failed=0 locked=1" in done.stderr
    want = f"statelog-compactor: store {held} is being compacted by process {os.getpid()}; "
    assert want + "it was not passed, the other stores were; exiting (status 4)" in done.stderr


def test_every_store_locked_at_start_exits_4(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    make_store(a)
    make_store(b)
    with CompactorLock(a), CompactorLock(b):
        # A 60 s interval: a daemon that went on waiting would time this out.
        done = run_cli("--interval", "60", "--min-tail-bytes", "0", a, b, timeout=30)
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("level=ERROR event=locked ") == 2
    for store in (a, b):
        assert f"store {store} is being compacted by process {os.getpid()}; exiting (status 4)" in (
            done.stderr
        )
        assert not snapshots(store)
