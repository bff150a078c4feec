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
| the daemon's ship loop                              | ships in a child process: a pass's ship   |
|                                                     | and, each round, every store it shipped   |
| a takeover the loop meets                           | kept in ``fenced``; ``ship`` raises it    |
| the ship process killed                             | the next ``ship`` starts it again         |
| a ship that fails                                   | ShipFailedError with its exit status      |
| the daemon SIGKILLed                                | its ship process ends by itself           |
| the daemon running with ``--nice 10``, ``--nice 3`` | its passes' thread that many steps nicer  |
|   or no ``--nice`` (``PASS_NICE`` steps)            |   its ship process at the daemon's        |
|                                                     | priority, one started again too           |
| the daemon running with ``--nice 0``                | the passes at the daemon's priority       |
| the ship process lost between passes                | started again at once, and it ships every |
|                                                     | store the lost one shipped                |
| a round ship of store B meets a takeover            | the daemon exits 4 naming B, not the      |
|                                                     | store it was passing                      |
| a store with nothing new on the host                | not shipped every round, but every        |
|                                                     | IDLE_RECHECK bounds; a commit at once     |
| a writer committing into its open segment           | not shipped every round: at its seal      |
|                                                     | (close, age or size)                      |
| a takeover of a store with nothing new              | noticed by those ships                    |
| one store's files unreadable (a symlink loop)       | its ship fails alone; the other store's   |
|                                                     | commit is shipped by the next round       |
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import statelog
from compactor.daemon import nicer
from compactor.idle import local_state
from compactor.options import PASS_NICE
from compactor.shipping import IDLE_RECHECK, ShipFailedError, ShipLoop
from statelog.remote import LagCollector, lag, restore, ship
from statelog.remote.record import RECORD
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
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


def _daemon(store: Path, remote: Remote, *more: str) -> list[str]:  # noqa: F811
    return [
        sys.executable, "-m", "compactor", "--remote", remote.url, "--interval", "1",
        "--max-ship-lag", "1s", *more, str(store),
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


def _ship_loop(remote: Remote, monkeypatch: pytest.MonkeyPatch) -> ShipLoop:  # noqa: F811
    for name, value in remote.server.env().items():
        monkeypatch.setenv(name, value)  # the child's environment is this process's
    args = argparse.Namespace(
        max_ship_lag=timedelta(seconds=1), remote=remote.url, remote_retain=None,
        remote_retain_for=None, log_level="WARNING",
    )  # fmt: skip
    return ShipLoop(args)


@contextlib.contextmanager
def _running(loop: ShipLoop) -> Iterator[ShipLoop]:
    """``loop`` started, and stopped on the way out whatever happened."""
    loop.start()
    try:
        yield loop
    finally:
        loop.stop()


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (the ship process is spawned by one of its
    own)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie nobody reaps has ended too


def _commit(path: Path, epoch: int) -> None:
    with statelog.open(path, max_ship_lag=timedelta(days=1)) as store:
        store.commit(offsets={"p": epoch}, low_watermark_ms=epoch, put={f"k{epoch}": epoch})


def test_the_ship_loop_ships_in_a_process_of_its_own(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full merge keeps the daemon's interpreter busy for seconds: a ship beside it
    in the same process would wait for the GIL after every request."""
    path = tmp_path / "s"
    _commit(path, 1)
    loop = _ship_loop(remote, monkeypatch)
    with _running(loop):
        loop.ship(path)  # a pass's ship: done when it returns
        assert loop._proc is not None and loop._proc.pid != os.getpid()
        assert lag(path).epochs == 0
        _commit(path, 2)  # sealed at close: the loop's next round ships it unasked
        _wait("the round's ship", lambda: lag(path).epochs == 0, timeout=15)
        assert restore(remote.url, tmp_path / "r", client=remote.client()).epoch == 2
    assert loop._proc is None


def test_a_takeover_the_ship_loop_meets_is_kept_for_the_daemon(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, other = tmp_path / "s", tmp_path / "other"
    _commit(path, 1)
    _commit(other, 1)
    loop = _ship_loop(remote, monkeypatch)
    with _running(loop):
        loop.ship(other)
        loop.ship(path)
        sid = StoreLayout(path).read_identity(FileLayer())
        restore(remote.url, tmp_path / "b", store_id=sid, take_over=True, client=remote.client())
        _commit(path, 2)  # the zombie goes on; its loop meets the new owner
        _wait("the fence", lambda: loop.fenced is not None, timeout=15)
        assert loop.fenced is not None and loop.fenced[0] == path
        assert (loop.fenced[1].ours, loop.fenced[1].current) == (1, 2)
        assert str(loop.fenced[1]).count("our generation") == 1
        with pytest.raises(statelog.FencedError):
            loop.ship(other)  # another store's pass: the fence still names its own store
        assert loop.fenced is not None and loop.fenced[0] == path


def test_a_lost_ship_process_is_started_again(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "s"
    _commit(path, 1)
    loop = _ship_loop(remote, monkeypatch)
    with _running(loop):
        assert loop._proc is not None and loop._proc.pid is not None
        first = loop._proc.pid
        os.kill(first, signal.SIGKILL)
        loop._proc.wait(10)
        loop.ship(path)  # started again, then shipped
        assert loop._proc.pid != first and lag(path).epochs == 0


def test_a_failed_ship_says_its_exit_status(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    remote: Remote,  # noqa: F811
) -> None:
    path = tmp_path / "s"
    _commit(path, 1)
    loop = _ship_loop(remote, monkeypatch)
    loop._args.remote = "s3://statelog-no-such-bucket/shard"  # every request refused
    with _running(loop):
        with pytest.raises(ShipFailedError) as caught:
            loop.ship(path)
        assert caught.value.status == 5
        assert loop.fenced is None and not (path / "remote.json").exists()


def test_the_ship_process_ends_with_a_killed_daemon(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    store = tmp_path / "store"
    _commit(store, 1)
    with _process(_daemon(store, remote), env=remote.server.env()) as daemon:
        _wait("the ship process", lambda: _children(daemon.pid))
        (child,) = _children(daemon.pid)
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
    _wait("the ship process to end", lambda: _ended(child), timeout=15)


def _nice(pid: int, tid: int | None = None) -> int:
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of proc(5): nice


@pytest.mark.parametrize(
    ("args", "steps"),
    [(["--nice", "10"], 10), ([], PASS_NICE), (["--nice", "3"], 3), (["--nice", "0"], 0)],
)
def test_the_passes_run_nicer_than_the_shipping(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    args: list[str],
    steps: int,
) -> None:
    """With ``--nice`` (:data:`PASS_NICE` unless set), a pass takes what the writers leave; the ship
    process keeps the daemon's priority."""
    store = tmp_path / "store"
    _commit(store, 1)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    with _process(_daemon(store, remote, *args), env=remote.server.env()) as daemon:
        _wait("the ship process", lambda: _children(daemon.pid))
        # a pass asks for the first ship, so the record exists once the passes run
        _wait("a pass's ship", lambda: (store / RECORD).exists())
        assert _nice(daemon.pid) == min(19, own + steps)
        (child,) = _children(daemon.pid)
        assert _nice(child) == own


def test_nicer_puts_the_priority_back() -> None:
    seen: list[int] = []

    def run() -> None:  # a thread of its own: a nicer one cannot always be put back
        tid = threading.get_native_id()
        seen.append(os.getpriority(os.PRIO_PROCESS, tid))
        with nicer(2):
            seen.append(os.getpriority(os.PRIO_PROCESS, tid))
        seen.append(os.getpriority(os.PRIO_PROCESS, tid))
        with nicer(0):
            seen.append(os.getpriority(os.PRIO_PROCESS, tid))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    before, inside, after, unchanged = seen
    assert inside == min(19, before + 2) and unchanged == after
    if os.geteuid() == 0:  # raising a priority again needs privilege
        assert after == before


def test_a_ship_process_started_again_takes_the_daemons_priority(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "s"
    _commit(path, 1)
    own: list[int] = []
    children: list[int] = []
    spawned: list[int] = []  # the new child's priority as soon as it exists

    def run() -> None:  # as the daemon: the loop made, then the passes' thread made nicer
        loop = _ship_loop(remote, monkeypatch)
        own.append(loop._nice)
        with _running(loop), nicer(5):
            loop.ship(path)
            assert loop._proc is not None
            first = loop._proc.pid
            os.kill(first, signal.SIGKILL)
            _wait("a new ship process", lambda: loop.fenced is None and loop._proc is not None
                  and loop._proc.pid != first)  # fmt: skip
            assert loop._proc is not None
            children.append(loop._proc.pid)
            # spawned at the daemon's priority, not the passes': an unprivileged child
            # could not raise its own, and even with privilege it never has to
            spawned.append(_nice(children[0]))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert children and own and spawned == own


def test_a_lost_ship_process_goes_on_shipping_every_store(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    """Started again by the daemon's round wait, not by the next pass, and told every
    store the lost one shipped."""
    store = tmp_path / "store"
    _commit(store, 1)
    argv = _daemon(store, remote)
    argv[argv.index("--interval") + 1] = "600"  # no pass after the first one
    with _process(argv, env=remote.server.env()) as daemon:
        _wait("the first ship", lambda: lag(store).epochs == 0 and _children(daemon.pid))
        (first,) = _children(daemon.pid)
        os.kill(first, signal.SIGKILL)
        _wait("a new ship process", lambda: [c for c in _children(daemon.pid) if c != first])
        _commit(store, 2)  # sealed at close: only a round ship can take it
        _wait("the commit in the bucket", lambda: lag(store).epochs == 0, timeout=15)
    assert _check_restored(remote, tmp_path / "restored") == 2


def test_a_takeover_found_by_a_round_ship_names_its_store(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _commit(a, 1)
    _commit(b, 1)
    argv = [*_daemon(a, remote), str(b)]
    argv[argv.index("--interval") + 1] = "600"
    with subprocess.Popen(
        argv, cwd=REPO, env={**os.environ, **remote.server.env()},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    ) as daemon:  # fmt: skip
        try:
            _wait("both shipped", lambda: lag(a).epochs == 0 and lag(b).epochs == 0)
            sid = StoreLayout(b).read_identity(FileLayer())
            restore(remote.url, tmp_path / "elsewhere", store_id=sid, take_over=True,
                    client=remote.client())  # fmt: skip
            _commit(b, 2)  # the zombie's next round ship meets the new owner
            _, err = daemon.communicate(timeout=60)
        finally:
            if daemon.poll() is None:
                daemon.kill()
    assert daemon.returncode == 4, err
    assert f"{b} was taken over" in err and f"{a} was taken over" not in err


def _idle_loop(remote: Remote, monkeypatch: pytest.MonkeyPatch, bound: float) -> ShipLoop:  # noqa: F811
    loop = _ship_loop(remote, monkeypatch)
    loop._args.max_ship_lag, loop._args.log_level = timedelta(seconds=bound), "INFO"
    return loop


def test_an_idle_store_is_shipped_every_recheck_not_every_round(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Each ship of an idle store asks the bucket for its manifest: every quarter bound,
    for every shard of a host, that is a bill of requests for nothing."""
    path, bound = tmp_path / "s", 0.2
    _commit(path, 1)
    loop = _idle_loop(remote, monkeypatch, bound)
    with _running(loop):
        loop.ship(path)
        time.sleep(2.2 * IDLE_RECHECK * bound)
        ships = capfd.readouterr().err.count("event=shipped")
        # The asked ship, the first round's, then one each recheck: about 4, where a
        # ship every round (every 50 ms) would be dozens.
        assert 2 <= ships <= 6, ships
        _commit(path, 2)  # sealed at close: the next round ships it
        _wait("the new commit in the bucket", lambda: lag(path).epochs == 0, timeout=5)
    assert restore(remote.url, tmp_path / "r", client=remote.client()).epoch == 2


def test_a_busy_writer_is_shipped_at_its_seals_not_every_round(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Commits only grow the newest segment, which nothing ships before its seal: the
    rounds between two seals ask the bucket nothing. Its seal ships it at once."""
    path, bound = tmp_path / "s", 0.2
    _commit(path, 1)
    loop = _idle_loop(remote, monkeypatch, bound)
    with _running(loop):
        with statelog.open(path, max_ship_lag=timedelta(days=1)) as store:
            epoch = 2
            store.commit(offsets={"p": epoch}, low_watermark_ms=epoch, put={"k": epoch})
            loop.ship(path)  # the segment that commit made is there: a round ships it
            time.sleep(0.3)
            capfd.readouterr()
            deadline = time.monotonic() + 1.6 * IDLE_RECHECK * bound
            while time.monotonic() < deadline:  # about 64 rounds
                epoch += 1
                store.commit(offsets={"p": epoch}, low_watermark_ms=epoch, put={"k": epoch})
                time.sleep(0.02)
            ships = capfd.readouterr().err.count("event=shipped")
            # At most the recheck's ship (one every IDLE_RECHECK bounds), where a ship
            # every round of a growing segment would be dozens.
            assert ships <= 3, ships
            assert lag(path).epochs == epoch - 1  # none shipped: the segment is open
        _wait("the segment sealed at close in the bucket", lambda: lag(path).epochs == 0, 5)
    assert restore(remote.url, tmp_path / "r", client=remote.client()).epoch == epoch


def test_the_local_state_changes_at_every_seal_and_not_at_a_commit(tmp_path: Path) -> None:
    """What a round compares: commits into the open segment leave it as it was; every
    way a segment becomes shippable changes it (a seal at close, by age, by size)."""
    path = tmp_path / "s"
    _commit(path, 1)
    with statelog.open(path, max_ship_lag=timedelta(days=1), segment_bytes=4096) as store:
        store.commit(offsets={"p": 2}, low_watermark_ms=2, put={"k": 2})
        before = local_state(path)
        store.commit(offsets={"p": 3}, low_watermark_ms=3, put={"k": 3})
        assert local_state(path) == before  # a commit: nothing new to ship
        store.commit(offsets={"p": 4}, low_watermark_ms=4, put={"k": "x" * 5000})
        store.commit(offsets={"p": 5}, low_watermark_ms=5, put={"k": 5})
        assert local_state(path) != before  # sealed by size, and rolled
        before = local_state(path)
    assert local_state(path) != before  # sealed at close, no segment after it
    with statelog.open(path, max_ship_lag=timedelta(milliseconds=40)) as store:
        store.commit(offsets={"p": 6}, low_watermark_ms=6, put={"k": 6})
        before = local_state(path)
        _wait("the seal by age", lambda: local_state(path) != before, timeout=5)


def test_a_takeover_of_an_idle_store_is_noticed_by_its_recheck(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, bound = tmp_path / "s", 0.2
    _commit(path, 1)
    loop = _idle_loop(remote, monkeypatch, bound)
    with _running(loop):
        loop.ship(path)
        time.sleep(0.5)  # a round has shipped it: from now on it is idle
        sid = StoreLayout(path).read_identity(FileLayer())
        restore(remote.url, tmp_path / "b", store_id=sid, take_over=True, client=remote.client())
        _wait("the fence", lambda: loop.fenced is not None, timeout=4 * IDLE_RECHECK * bound + 5)
        assert loop.fenced is not None and loop.fenced[0] == path


def test_a_store_that_cannot_be_read_holds_no_other_store_back(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A failing disk under one shard (EIO, EACCES, ESTALE; here ELOOP) fails that shard's
    ships, each logged, and never ends the ship process the others depend on."""
    a, b = tmp_path / "a", tmp_path / "b"
    _commit(a, 1)
    _commit(b, 1)
    loop = _idle_loop(remote, monkeypatch, 1.0)
    with _running(loop):
        loop.ship(a)
        loop.ship(b)
        shutil.rmtree(a / "wal")
        os.symlink("wal", a / "wal")
        _commit(b, 2)  # sealed at close: the next round ships it
        _wait("b's commit in the bucket", lambda: loop.fenced is None and lag(b).epochs == 0, 10)
        err = capfd.readouterr().err
        assert "event=ship_failed" in err and "ship_process_lost" not in err
