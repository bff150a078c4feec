"""A recovery point in seconds: what a host loss costs when the daemon ships the store.

The writer (``tests/slow_writer.py``) and ``statelog-compactor --remote`` run as
processes against the tests' S3 server; the host is lost by SIGKILLing both.

| case                                                | what must hold                            |
|-----------------------------------------------------|-------------------------------------------|
| one small commit every 100 ms, then host loss       | the bucket restores to an epoch at least  |
|                                                     | as new as every commit acknowledged 2 s   |
|                                                     | before the loss; the state is the model's |
| a writer that goes quiet after one commit           | that commit reaches the bucket anyway     |
| a store nobody ships                                | its segment is not sealed by age          |
| commits the bucket does not have (no shipping)      | the lag gauges count them and their age   |
| ``max_ship_lag`` out of range, or not a timedelta   | InvalidOptionError, nothing opened        |
| the daemon's ship loop running                      | the GIL switch interval is 1 ms, and the  |
|                                                     | process's own again once it stops         |
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import statelog
from compactor.shipping import SHIP_SWITCH_INTERVAL, ShipLoop
from statelog.remote import LagCollector, lag, restore, ship
from statelog.storage.fileio import FileLayer
from tests.s3server import Remote, remote, s3  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def _process(
    argv: list[str], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        argv, cwd=REPO, env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def _writer(store: Path, acks: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "tests.slow_writer", str(store), "--acks", str(acks), *args]


def _daemon(store: Path, remote: Remote) -> list[str]:  # noqa: F811
    return [
        sys.executable, "-m", "compactor", "--remote", remote.url, "--interval", "1",
        "--max-ship-lag", "1s", str(store),
    ]  # fmt: skip


def _acks(path: Path) -> list[tuple[int, float]]:
    out = []
    for line in path.read_text().splitlines():
        epoch, when = line.split()
        out.append((int(epoch), float(when)))
    return out


def _wait(what: str, check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _check_restored(remote: Remote, dest: Path) -> int:  # noqa: F811
    got = restore(remote.url, dest, client=remote.client())
    with statelog.open(dest, readonly=True) as store:
        e = store.epoch
        assert e == got.epoch
        assert store.offsets == ({"p": e} if e else {})
        assert dict(store.items()) == {f"k{i}": i for i in range(1, e + 1)}
    return e


def test_host_loss_costs_at_most_seconds(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    store, acks = tmp_path / "store", tmp_path / "acks"
    with _process(_writer(store, acks, "--every", "0.1")) as writer:
        _wait("the first commit", lambda: acks.exists() and acks.read_text())
        with _process(_daemon(store, remote), env=remote.server.env()):
            time.sleep(8.0)
            lost_at = time.time()
            writer.send_signal(signal.SIGKILL)  # the host is lost: both die at once
    acked = _acks(acks)
    assert len(acked) >= 50
    restored = _check_restored(remote, tmp_path / "restored")
    before = [e for e, when in acked if when <= lost_at - 2.0]
    assert before and restored >= max(before), (restored, max(before), acked[-1])


def test_a_quiet_writers_last_commit_is_shipped(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    store, acks = tmp_path / "store", tmp_path / "acks"
    with _process(_writer(store, acks, "--count", "1")):
        _wait("the commit", lambda: acks.exists() and acks.read_text())
        with _process(_daemon(store, remote), env=remote.server.env()):
            _wait("the commit in the bucket", lambda: lag(store).epochs == 0 and
                  (store / "remote.json").exists(), timeout=15)  # fmt: skip
    assert _check_restored(remote, tmp_path / "restored") == 1


def test_a_store_nobody_ships_keeps_its_segment_whole(tmp_path: Path) -> None:
    with statelog.open(tmp_path / "s") as store:
        for i in range(1, 4):
            store.commit(offsets={"p": i}, low_watermark_ms=i, put={"k": i})
            time.sleep(0.7)
        assert store._writer is not None and store._writer.sealer is not None
        assert store._writer.sealer.seals == 0
    assert len(list((tmp_path / "s" / "wal").glob("*.wal"))) == 1


def test_the_gauges_count_what_the_bucket_lacks(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    path = tmp_path / "s"
    # Sealing by age is off here: what the active segment holds must show as lag.
    with statelog.open(path, max_ship_lag=timedelta(days=1)) as store:
        store.commit(offsets={"p": 1}, low_watermark_ms=1, put={"k": 1})
        store.close()
        ship(path, remote.url, client=remote.client())
    assert lag(path).epochs == 0
    collector = LagCollector([path])
    with statelog.open(path, max_ship_lag=timedelta(days=1)) as store:
        for i in range(2, 7):
            store.commit(offsets={"p": i}, low_watermark_ms=i, put={"k": i})
        time.sleep(1.1)
        got = {m.name: m.samples[0].value for m in collector.collect()}
        assert got["statelog_remote_lag_epochs"] == 5
        assert got["statelog_remote_lag_bytes"] > 0
        assert got["statelog_remote_lag_seconds"] >= 1.0
        store.commit(offsets={"p": 7}, low_watermark_ms=7, put={"k": 7})
        assert lag(path).epochs == 6  # still rising while nothing ships
        shown = subprocess.run(
            [sys.executable, "-m", "statelog.cli", "inspect", "--json", str(path)],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)["remote"]
        assert (doc["url"], doc["shipped_epoch"], doc["epochs"]) == (remote.url, 1, 6)


@pytest.mark.parametrize(
    "bad", [timedelta(0), timedelta(milliseconds=5), timedelta(days=2), 0.005, "1s"]
)
def test_a_bad_max_ship_lag_is_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(statelog.InvalidOptionError, match="max_ship_lag"):
        statelog.open(tmp_path / "s", max_ship_lag=bad)
    assert not (tmp_path / "s").exists()


def test_the_ship_loop_shortens_the_switch_interval_while_it_runs(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    """A ship takes the GIL back after every read, hash and request; beside a pass busy
    in Python each take-back waits up to the switch interval, so the loop shortens it
    while it runs and puts the process's own value back when it stops."""
    args = argparse.Namespace(
        max_ship_lag=timedelta(seconds=1), remote=remote.url, remote_retain=None,
        remote_retain_for=None,
    )  # fmt: skip
    before = sys.getswitchinterval()
    assert before > SHIP_SWITCH_INTERVAL
    seen: list[float] = []
    loop = ShipLoop(args, FileLayer(), remote.client(), lambda: seen.append(
        sys.getswitchinterval()) or [])  # fmt: skip
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        loop.stop()
    assert seen and seen[0] == SHIP_SWITCH_INTERVAL
    assert sys.getswitchinterval() == before


def test_a_ship_loop_that_cannot_start_leaves_the_switch_interval_alone(
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = argparse.Namespace(
        max_ship_lag=timedelta(seconds=1), remote=remote.url, remote_retain=None,
        remote_retain_for=None,
    )  # fmt: skip
    before = sys.getswitchinterval()
    loop = ShipLoop(args, FileLayer(), remote.client(), lambda: [])

    def refuse() -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(loop._thread, "start", refuse)
    with pytest.raises(RuntimeError):
        loop.start()
    assert sys.getswitchinterval() == before
    loop.stop()
    assert sys.getswitchinterval() == before
