"""The remote tier wired into the daemon, CLI, writer and recovery, as a failure-mode table.

Against the moto S3 server on loopback (``tests/s3server.py``); the code
under test reads the connection from the AWS_* environment, as in production.

| failure mode                               | expected                               |
|--------------------------------------------|----------------------------------------|
| host lost after `--once --remote`          | restore elsewhere = last shipped epoch |
| daemon's store taken over elsewhere        | exit 4 (fenced), nothing uploaded      |
| object store refuses the first ship        | failed pass (exit 5), no compaction    |
| daemon: --metrics-port and --remote        | lag gauges served, gone at exit        |
| daemon: bad --remote, lone --remote-retain | exit 3, no store touched               |
| `statelog restore`, clean remote           | exit 0, last shipped epoch             |
| `statelog restore`, damaged snapshot       | exit 1, the snapshot named             |
| `statelog restore`, nothing restorable     | exit 2, no destination                 |
| `statelog restore`, --strict bad segment   | exit 2; without --strict 1             |
| `statelog restore`, non-empty dir/bad URL  | exit 3, nothing changed                |
| `open(empty, remote=)` on a new host       | restored, taken over, goes on          |
| old host reopens after the takeover        | FencedError at open                    |
| zombie writer rolls after a takeover       | FencedError, later commits too         |
| zombie writer idle through a takeover      | fenced by the interval check           |
| segment generation below its predecessor   | corruption at its header (0)           |
| equal/higher generations, or zeros         | clean                                  |
| old store, generation 0 everywhere         | opens; bytes 52..59 stay zero          |
| store detached from its remote (0 after 1) | still opens                            |
| remote= with readonly/thread/bad URL       | refused, nothing created               |
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import crc32c
import pytest

import statelog
import statelog.cli
from compactor import compact, daemon
from statelog.errors import CorruptionError, FencedError, InvalidOptionError
from statelog.format.wal import SegmentHeader, mask
from statelog.ops import metrics
from statelog.recovery.report import Outcome
from statelog.remote import RemoteConfigError, read_manifest, restore, ship
from tests.s3server import Remote, remote, s3  # noqa: F401
from tests.test_remote import commit_range, res_id, state_of

SEG = 4096
GEN_AT = slice(52, 60)  # docs/format.md: the generation field of the segment header


@pytest.fixture
def env(remote: Remote, monkeypatch: pytest.MonkeyPatch) -> Iterator[Remote]:  # noqa: F811
    """``remote`` with its connection in the process environment, as an operator sets it."""
    for k, v in remote.server.env().items():
        monkeypatch.setenv(k, v)
    yield remote


def wal(store: Path) -> list[Path]:
    return sorted((store / "wal").glob("*.wal"))


def generation(seg: Path) -> int:
    return int(struct.unpack("<Q", seg.read_bytes()[GEN_AT])[0])


def stamp(seg: Path, gen: int) -> None:
    """Write ``gen`` into bytes 52..59 and fix the header crc (independent of the writer)."""
    data = bytearray(seg.read_bytes())
    struct.pack_into("<Q", data, 52, gen)
    struct.pack_into("<I", data, 60, mask(crc32c.crc32c(bytes(data[:60]))))
    seg.write_bytes(bytes(data))


def cli(*args: str | Path) -> int:
    return statelog.cli.main([str(a) for a in args])


# -- the daemon --------------------------------------------------------------


def test_daemon_once_remote_ships_and_restore_reaches_last_shipped_epoch(
    tmp_path: Path, env: Remote
) -> None:
    src = tmp_path / "src"
    commit_range(src, 0, 300)
    code = daemon.main(["--once", "--remote", env.url, "--min-tail-bytes", "0", str(src)])
    assert code == daemon.EXIT_OK
    want = state_of(src)
    cur = read_manifest(env.client(), res_id(src))
    assert cur is not None and cur.manifest.snapshots  # the pass's new snapshot was shipped
    shutil.rmtree(src)  # the host is gone
    res = restore(env.url, tmp_path / "elsewhere")
    assert res.epoch == res.shipped_epoch == want["epoch"] == 300
    assert res.snapshot == cur.manifest.snapshots[0].key
    assert state_of(tmp_path / "elsewhere") == want


def test_daemon_exits_4_when_its_store_was_taken_over(tmp_path: Path, env: Remote) -> None:
    a = tmp_path / "a"
    commit_range(a, 0, 150)
    ship(a, env.url)
    restore(env.url, tmp_path / "b", take_over=True)
    commit_range(a, 150, 250)  # the zombie goes on locally
    keys = env.object_keys()
    assert daemon.main(["--once", "--remote", env.url, str(a)]) == daemon.EXIT_FENCED == 4
    assert env.object_keys() == keys


def test_daemon_failed_first_ship_fails_the_pass_before_compacting(
    tmp_path: Path, env: Remote
) -> None:
    src = tmp_path / "src"
    commit_range(src, 0, 300)
    gone = "s3://statelog-no-such-bucket/shard"  # every request is refused (404), not retried
    code = daemon.main(["--once", "--remote", gone, "--min-tail-bytes", "0", str(src)])
    assert code == daemon.EXIT_FAILED == 5
    assert not list((src / "snapshots").glob("*.snap"))  # compaction never ran


def test_daemon_serves_the_lag_gauges_with_remote(tmp_path: Path, env: Remote) -> None:
    src = tmp_path / "src"
    commit_range(src, 0, 300)
    args = daemon.build_parser().parse_args(["--remote", env.url, "--metrics-port", "1", str(src)])
    args.metrics_port = 0  # any free port: the server is not what this test is about
    label = {"store": str(src.resolve())}
    with daemon._metrics_server(args) as started:
        assert started
        unshipped = metrics.REGISTRY.get_sample_value("statelog_remote_lag_bytes", label)
        assert unshipped is not None and unshipped > 0
        ship(src, env.url)
        assert metrics.REGISTRY.get_sample_value("statelog_remote_lag_bytes", label) == 0
        assert metrics.REGISTRY.get_sample_value("statelog_remote_lag_epochs", label) == 0
    assert metrics.REGISTRY.get_sample_value("statelog_remote_lag_bytes", label) is None


@pytest.mark.parametrize(
    "argv",
    [["--remote", "file://host/x"], ["--remote", "s3://Bad_Bucket/x"], ["--remote-retain", "2"]],
)
def test_daemon_bad_remote_options_exit_2_before_touching_a_store(
    tmp_path: Path, env: Remote, argv: list[str]
) -> None:
    store = tmp_path / "s"
    commit_range(store, 0, 10)
    before = sorted(p.name for p in store.iterdir())
    with pytest.raises(SystemExit) as err:
        daemon.main(["--once", *argv, str(store)])
    assert err.value.code == daemon.EXIT_BAD_OPTIONS == 3
    assert sorted(p.name for p in store.iterdir()) == before  # not even COMPACTOR.LOCK
    assert env.object_keys() == []


# -- statelog restore --------------------------------------------------------


def shipped(tmp_path: Path, env: Remote, rounds: int = 2) -> Path:
    src = tmp_path / "src"
    for r in range(rounds):
        commit_range(src, r * 150, (r + 1) * 150)
        assert daemon.main(["--once", "--remote", env.url, "--min-tail-bytes", "0", str(src)]) == 0
    return src


def test_cli_restore_clean_exits_0(
    tmp_path: Path, env: Remote, capsys: pytest.CaptureFixture[str]
) -> None:
    src = shipped(tmp_path, env)
    assert cli("restore", "--json", env.url, tmp_path / "dst") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["clean"] and doc["epoch"] == doc["shipped_epoch"] == 300
    assert doc["rejected"] == [] and doc["lost_epochs"] == []
    assert state_of(tmp_path / "dst") == state_of(src)


def test_cli_restore_past_a_damaged_snapshot_exits_1(
    tmp_path: Path, env: Remote, capsys: pytest.CaptureFixture[str]
) -> None:
    src = shipped(tmp_path, env)
    cur = read_manifest(env.client(), res_id(src))
    assert cur is not None
    newest = cur.manifest.snapshots[0].key
    env.damage(newest)
    assert cli("restore", env.url, tmp_path / "dst") == 1
    out = capsys.readouterr().out
    assert f"REJECTED   {newest}" in out and "epoch      300 (shipped epoch 300)" in out
    assert state_of(tmp_path / "dst") == state_of(src)


def test_cli_restore_nothing_restorable_exits_2(tmp_path: Path, env: Remote) -> None:
    src = tmp_path / "src"
    commit_range(src, 0, 300)
    compact(src, retain=1)  # the early log went before it was shipped: no walking back
    ship(src, env.url)
    cur = read_manifest(env.client(), res_id(src))
    assert cur is not None
    env.damage(cur.manifest.snapshots[0].key)
    assert cli("restore", env.url, tmp_path / "dst") == 2  # ResnapshotRequired
    assert not (tmp_path / "dst").exists()


def test_cli_restore_strict_damaged_segment_exits_2(tmp_path: Path, env: Remote) -> None:
    src = shipped(tmp_path, env)
    commit_range(src, 300, 400)
    ship(src, env.url)
    cur = read_manifest(env.client(), res_id(src))
    assert cur is not None
    after = [e for e in cur.manifest.segments if e.first_lsn > 300]
    env.damage(min(after, key=lambda e: e.first_lsn).key)
    assert cli("restore", "--strict", env.url, tmp_path / "dst") == 2  # RemoteIntegrityError
    assert not (tmp_path / "dst").exists()
    assert cli("restore", env.url, tmp_path / "dst") == 1  # not strict: stops before it
    assert state_of(tmp_path / "dst")["epoch"] == 300


def test_cli_restore_refuses_a_non_empty_dir_and_a_bad_url(tmp_path: Path, env: Remote) -> None:
    shipped(tmp_path, env, rounds=1)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("x")
    assert cli("restore", env.url, busy) == 3
    assert [p.name for p in busy.iterdir()] == ["keep"]
    assert cli("restore", "file://host/x", tmp_path / "new") == 3
    assert not (tmp_path / "new").exists()


# -- statelog.open(path, remote=URL) ----------------------------------------


def test_open_empty_dir_restores_takes_over_and_continues(tmp_path: Path, env: Remote) -> None:
    old = shipped(tmp_path, env)
    want = state_of(old)
    new = tmp_path / "new"
    with statelog.open(new, remote=env.url, segment_bytes=SEG) as st:
        assert st.restored is not None and st.restored.epoch == 300
        assert st.generation == 2  # the daemon's first ship took 1; the restore took over
        assert st.epoch == want["epoch"] and st.offsets == want["offsets"]
        assert st.commit(offsets={"orders-0": 10_000}, low_watermark_ms=9_000) == 301
    assert generation(wal(new)[-1]) == 2
    assert ship(new, env.url).last_epoch == 301
    with pytest.raises(FencedError) as err:  # the old host comes back
        statelog.open(old, remote=env.url)
    assert (err.value.ours, err.value.current) == (1, 2)


def test_zombie_writer_is_fenced_at_its_next_roll(tmp_path: Path, env: Remote) -> None:
    a = tmp_path / "a"
    hour = timedelta(hours=1)  # the interval check stays out of this test
    st = statelog.open(a, remote=env.url, segment_bytes=SEG, remote_check=hour)
    try:
        assert st.generation == 1
        commit_range_open(st, 0, 120)
        ship(a, env.url)
        restore(env.url, tmp_path / "b", take_over=True)  # host B takes over
        epoch, segs = st.epoch, wal(a)
        with pytest.raises(FencedError) as err:
            commit_range_open(st, 120, 10_000)  # until a roll checks the manifest
        assert (err.value.ours, err.value.current) == (1, 2)
        assert len(wal(a)) == len(segs)  # the roll never started a segment
        fenced_at = st.epoch
        assert fenced_at > epoch  # commits before the roll went through
        with pytest.raises(FencedError):
            st.commit(offsets={"orders-0": 99_999}, low_watermark_ms=99_999)
        with pytest.raises(FencedError), st.transaction() as tx:
            tx.put("x", 1)
        assert st.epoch == fenced_at
    finally:
        st.close()
    assert state_of(a)["epoch"] == fenced_at  # what was durable stays


def test_idle_zombie_is_fenced_by_the_interval_check(tmp_path: Path, env: Remote) -> None:
    a = tmp_path / "a"
    tick = timedelta(milliseconds=50)
    big = 1 << 20  # no roll can happen in this test: only the interval check can fence
    with statelog.open(a, remote=env.url, segment_bytes=big, remote_check=tick) as st:
        commit_range_open(st, 0, 5)
        ship(a, env.url)
        restore(env.url, tmp_path / "b", take_over=True)
        segs = wal(a)
        deadline = time.monotonic() + 10
        while True:
            try:
                st.commit(offsets={"orders-0": 5}, low_watermark_ms=5_000)
            except FencedError:
                break
            assert time.monotonic() < deadline, "the interval check never fenced the writer"
            time.sleep(0.05)
        assert wal(a) == segs  # no roll was needed


def commit_range_open(st: Any, start: int, stop: int) -> None:
    for i in range(start, stop):
        st.commit(offsets={"orders-0": i}, low_watermark_ms=1_000 + i, put={f"k{i % 60}": i})


# -- the generation in segment headers, and recovery -------------------------


def test_lower_generation_after_a_higher_one_is_corruption_at_its_header(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s"
    commit_range(store, 0, 200)
    segs = wal(store)
    assert len(segs) >= 4
    stamp(segs[1], 2)
    stamp(segs[2], 1)  # a zombie's segment after the takeover
    stamp(segs[3], 1)
    last_good = int(segs[2].name[17:33], 16) - 1  # the LSN before segs[2]'s first
    with pytest.raises(CorruptionError) as err:
        statelog.open(store, strict=True)
    assert (err.value.path, err.value.offset) == (segs[2], 0)
    with statelog.open(store, readonly=True) as ro:
        assert ro.recovery.outcome is Outcome.CORRUPTION and ro.epoch == last_good
        assert (ro.recovery.rejected[0].path, ro.recovery.rejected[0].offset) == (segs[2], 0)
    with statelog.open(store) as st:
        assert st.epoch == last_good and st.recovery.lost_epochs.stop == 201
    assert segs[2].with_name(segs[2].name + ".corrupt").exists()


def test_equal_or_higher_generations_and_zeros_are_not_compared(tmp_path: Path) -> None:
    store = tmp_path / "s"
    commit_range(store, 0, 200)
    segs = wal(store)
    for seg, gen in zip(segs, [0, 1, 1, 0, 3], strict=False):  # 0: no remote, never compared
        stamp(seg, gen)
    with statelog.open(store, readonly=True) as ro:
        assert ro.recovery.outcome is Outcome.CLEAN and ro.epoch == 200


def test_generation_field_is_bytes_52_to_59_little_endian() -> None:
    import uuid

    h = SegmentHeader(uuid.UUID(int=7), 3, 5, 0xAB, generation=0x0102030405060708)
    raw = h.pack()
    assert raw[GEN_AT] == bytes.fromhex("0807060504030201")
    assert SegmentHeader.crc_ok(raw) and SegmentHeader.unpack(raw) == h
    assert SegmentHeader(uuid.UUID(int=7), 3, 5, 0xAB).pack()[GEN_AT] == bytes(8)


def test_old_store_with_generation_0_opens_unchanged(tmp_path: Path) -> None:
    store = tmp_path / "s"
    commit_range(store, 0, 100)
    assert all(generation(p) == 0 for p in wal(store))
    before = {p.name: p.read_bytes() for p in wal(store)}
    with statelog.open(store, segment_bytes=SEG) as st:
        assert st.epoch == 100 and st.recovery.outcome is Outcome.CLEAN and st.generation == 0
    assert {p.name: p.read_bytes() for p in wal(store) if p.name in before} == before


def test_store_detached_from_its_remote_still_opens(tmp_path: Path, env: Remote) -> None:
    store = tmp_path / "s"
    with statelog.open(store, remote=env.url, segment_bytes=SEG) as st:
        commit_range_open(st, 0, 50)
    assert generation(wal(store)[-1]) == 1
    commit_range(store, 50, 100)  # opened without remote=: generation 0 after 1
    assert generation(wal(store)[-1]) == 0
    with statelog.open(store, remote=env.url) as st:  # and back: still generation 1
        assert st.epoch == 100 and st.recovery.outcome is Outcome.CLEAN
        assert st.generation == 1


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"readonly": True}, InvalidOptionError),
        ({"compactor": "thread"}, InvalidOptionError),
        ({"remote_check": timedelta(0)}, InvalidOptionError),
        ({"remote": 7}, InvalidOptionError),
        ({"remote": "file://host/x"}, RemoteConfigError),
    ],
)
def test_bad_remote_options_are_refused_before_anything_is_created(
    tmp_path: Path, env: Remote, options: dict[str, Any], error: type[Exception]
) -> None:
    path = tmp_path / "new"
    with pytest.raises(error):
        statelog.open(path, **{"remote": env.url, **options})
    assert not path.exists()
    assert env.object_keys() == []
