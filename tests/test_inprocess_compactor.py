"""``statelog.open(..., compactor="thread" | "process")``: compaction started by the writer.

Each mode must fold sealed segments into snapshots while commits go on, the
writer must swap them in as its base, close must stop the compactor, and a
reopen must recover from a snapshot to exactly the committed state.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

import statelog
from statelog.compaction.lock import CompactorLock
from statelog.storage.snapshots import list_snapshots


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_writer_started_compactor_folds_and_swaps(store_path: Path, mode: str) -> None:
    opts = {
        "segment_bytes": 4096,
        "compactor": mode,
        "compactor_interval": timedelta(milliseconds=100),
        "min_tail_bytes": 0,
        "retain": 2,
        "base_refresh": timedelta(milliseconds=50),
    }
    model: dict[str, int] = {}
    with statelog.open(store_path, **opts) as store:
        deadline = time.monotonic() + 30
        i = 0
        while store._state.base_epoch == 0 and time.monotonic() < deadline:
            i += 1
            put = {f"k{i % 37}": i, f"pad{i % 5}": "x" * 300}
            store.commit(offsets={"p": i}, low_watermark_ms=i, put=put)
            model.update(put)
            time.sleep(0.005)
        assert store._state.base_epoch > 0, "no snapshot was swapped in"
        assert dict(store.items()) == model
        epoch = store.epoch
    # close() stopped the compactor: its lock is free again.
    CompactorLock(store_path).release()
    assert list_snapshots(store_path / "snapshots")
    with statelog.open(store_path) as again:
        assert again.recovery.snapshot is not None
        assert again.epoch == epoch and dict(again.items()) == model


def test_unknown_compactor_mode_is_refused_before_anything_is_created(store_path: Path) -> None:
    with pytest.raises(statelog.InvalidOptionError) as err:
        statelog.open(store_path, compactor="daemon")
    assert err.value.hint and not store_path.exists()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_compactor_process_dies_with_a_writer_killed_by_sigkill(store_path: Path) -> None:
    import signal
    import subprocess
    import sys

    script = (
        "import sys, time, statelog\n"
        "s = statelog.open(sys.argv[1], compactor='process')\n"
        "print(s._writer.compactor._proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", script, str(store_path)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None
    child = int(writer.stdout.readline())
    assert _alive(child)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    deadline = time.monotonic() + 20
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the compactor outlived its writer"


def test_compactor_process_that_finds_a_daemon_is_reported(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    statelog.open(store_path).close()
    daemon_lock = CompactorLock(store_path)  # stands in for a running daemon
    try:
        with (
            caplog.at_level("WARNING", logger="statelog.store.store"),
            statelog.open(store_path, compactor="process") as store,
        ):
            assert store._writer is not None
            compactor = store._writer.compactor
            proc = compactor._proc  # type: ignore[union-attr]
            proc.wait(timeout=30)
            compactor._watch.join(timeout=5)  # type: ignore[union-attr]
        assert proc.returncode == 4  # busy: another compactor holds the store
        assert "event=compactor_process_exited code=4" in caplog.text
    finally:
        daemon_lock.release()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_sealed_segment_wakes_the_compactor_before_its_interval(
    store_path: Path, mode: str
) -> None:
    """With a one-hour interval, only the wake on each seal can make a snapshot while
    the writer runs: the child's first round, at its start, finds nothing sealed to
    fold (the commits begin once it holds the lock and has had time to pass), and
    the thread's first pass waits an interval."""
    opts = {
        "segment_bytes": 4096,
        "compactor": mode,
        "compactor_interval": timedelta(hours=1),
        "min_tail_bytes": 0,
        "base_refresh": timedelta(milliseconds=50),
    }
    with statelog.open(store_path, **opts) as store:
        if mode == "process":
            held = time.monotonic() + 30
            lock = store_path / "COMPACTOR.LOCK"
            while not (lock.exists() and lock.read_text().strip()) and time.monotonic() < held:
                time.sleep(0.05)
            time.sleep(1.0)  # its first round, over nothing sealed, is over
        deadline = time.monotonic() + 30
        i = 0
        while not list_snapshots(store_path / "snapshots") and time.monotonic() < deadline:
            i += 1
            store.commit(offsets={"p": i}, put={f"k{i % 7}": "x" * 600})
            time.sleep(0.01)
        assert list_snapshots(store_path / "snapshots"), "no pass ran before the interval"


def test_a_wake_sent_as_the_compactor_process_starts_never_kills_it(store_path: Path) -> None:
    """SIGUSR1's default action is to terminate: the child starts with it blocked, so a
    wake that arrives before the daemon has blocked it itself waits for its first sleep."""
    statelog.open(store_path).close()
    with statelog.open(store_path, compactor="process") as store:
        assert store._writer is not None
        compactor = store._writer.compactor
        assert compactor is not None
        for _ in range(50):
            compactor.wake()
        proc = compactor._proc  # type: ignore[attr-defined]
        time.sleep(2)
        assert proc.poll() is None, f"the compactor exited with {proc.returncode}"
    assert proc.returncode == 0
