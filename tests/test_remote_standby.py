"""Standbys of a remote: ``statelog.open(path, follow="s3://...")`` and its promotion.

| situation                                         | expected                                     |
|---------------------------------------------------|----------------------------------------------|
| the writer ships, compacts, retention deletes     | each look: the model at the shipped epoch;   |
|                                                   | the copy's disk follows the remote's         |
| a shipped segment damaged                         | stops before it, says so, never re-fetches;  |
|                                                   | a snapshot past it carries the standby on    |
| the newest shipped snapshot damaged               | walks back to an older restore point         |
| promote() stopped short at a damaged segment      | refused, generation untaken, follows on;     |
|                                                   | promotes once a snapshot passes the damage   |
| the writer SIGKILLed, its shipping host lost      | promote(): the model at the last shipped     |
|                                                   | epoch; the new writer continues and ships    |
| two standbys promoted at the same moment          | exactly one wins; the other changes nothing  |
| the old writer still runs after a promotion       | its commits and its ships are refused        |
| ``statelog promote COPY --source URL``            | exit 0 and the resume point; a later one     |
|                                                   | fences the writer promoted before it         |
| a standby restarted on its copy                   | nothing downloaded again; a copy file of the |
|                                                   | right name and size but other bytes is       |
|                                                   | downloaded again                             |
"""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.errors import FencedError, PromotionLostError, PromotionRefusedError
from statelog.kit.workload import Stream, run_commit, store_digest
from statelog.remote import read_manifest, restore, ship
from statelog.remote.record import load_record
from statelog.replica.remote_mirror import RemoteSource
from tests.s3server import Remote, remote, s3  # noqa: F401
from tests.test_remote_wiring import env  # noqa: F401

STREAM = Stream(seed=11)
SMALL: dict[str, Any] = {"segment_bytes": 16 << 10}
MANUAL = timedelta(hours=1)  # no look of its own: the test calls catch_up()
REPO = Path(__file__).resolve().parent.parent


def commit_range(store: statelog.StateStore, start: int, stop: int) -> None:
    for i in range(start, stop):
        assert run_commit(store, STREAM.commit(i)) == i


def shipped_epoch(env: Remote, store: statelog.StateStore) -> int:  # noqa: F811
    cur = read_manifest(env.client(), store.store_id)
    assert cur is not None
    return cur.manifest.last_epoch


def test_a_restarted_standby_downloads_only_what_its_copy_lacks(
    tmp_path: Path,
    env: Remote,  # noqa: F811
) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 60)
    ship(src, env.url)
    first = RemoteSource(env.url).mirror(copy)
    assert first.copied_bytes > 0 and first.segments
    again = RemoteSource(env.url).mirror(copy)  # a new process: it knows nothing it fetched
    assert again.copied_bytes == 0 and not again.segments
    victim = copy / first.segments[-1]
    good = victim.read_bytes()
    other = bytearray(good)
    other[len(other) // 2] ^= 1  # same name and size, other bytes
    victim.write_bytes(bytes(other))
    third = RemoteSource(env.url).mirror(copy)
    assert third.segments == [first.segments[-1]] and victim.read_bytes() == good


def test_the_standby_is_the_model_at_each_shipped_epoch(tmp_path: Path, env: Remote) -> None:  # noqa: F811
    src, copy = tmp_path / "src", tmp_path / "copy"
    rng = random.Random(4)
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 60)
        ship(src, env.url)
        with statelog.open(copy, follow=env.url, follow_poll=MANUAL) as sb:
            assert sb.standby and sb.epoch == shipped_epoch(env, w) > 0
            assert store_digest(sb) == STREAM.model(sb.epoch).digest()
            epoch = 59
            for _ in range(10):
                n = rng.randrange(5, 60)
                commit_range(w, epoch + 1, epoch + 1 + n)
                epoch += n
                if rng.random() < 0.5:
                    compact(src, retain=1, min_tail_bytes=0)
                ship(src, env.url)  # retention of the remote follows the local one
                lag = sb.catch_up()
                want = shipped_epoch(env, w)
                assert sb.epoch == want and lag.epochs == 0
                assert store_digest(sb) == STREAM.model(want).digest()
                assert sb.offsets == STREAM.model(want).offsets
            cur = read_manifest(env.client(), w.store_id)
            assert cur is not None
            listed = {e.name for e in cur.manifest.objects}
            held = {p.name for d in ("wal", "snapshots") for p in (copy / d).iterdir()}
            assert held <= listed  # the copy never keeps what the remote dropped


def test_a_damaged_segment_stops_the_standby_until_a_snapshot_passes_it(
    tmp_path: Path,
    env: Remote,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 40)
        ship(src, env.url)
        sb = statelog.open(copy, follow=env.url, follow_poll=MANUAL)
        good = sb.epoch
        before = {e.key for e in _manifest(env, w).objects}
        commit_range(w, 40, 120)
        ship(src, env.url)
        new = [e for e in _manifest(env, w).segments if e.key not in before]
        assert len(new) >= 2
        env.damage(new[1].key)  # the second new segment: the first still applies
        with caplog.at_level(logging.ERROR, logger="statelog.replica.standby"):
            lag = sb.catch_up()
        assert sb.epoch == new[0].last_lsn > good
        assert store_digest(sb) == STREAM.model(sb.epoch).digest()
        assert lag.epochs == shipped_epoch(env, w) - sb.epoch > 0
        assert any("event=standby_damage" in r.message for r in caplog.records)
        assert not (copy / "wal" / new[1].name).exists()  # nothing unverified is kept
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="statelog.replica.standby"):
            sb.catch_up()  # refused once: not downloaded again
        assert not [r for r in caplog.records if "standby_damage" in r.message]
        compact(src, retain=1, min_tail_bytes=0)  # a snapshot past the damage
        ship(src, env.url)
        sb.catch_up()
        assert sb.epoch == shipped_epoch(env, w) > new[1].last_lsn
        assert store_digest(sb) == STREAM.model(sb.epoch).digest()
        sb.close()


def test_a_standby_stopped_short_of_the_remote_is_not_promoted(
    tmp_path: Path,
    env: Remote,  # noqa: F811
) -> None:
    """Promoted there, its writer would continue from an older epoch than the bucket's:
    the acknowledged epochs after the damage would be discarded and shipped over."""
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 40)
        ship(src, env.url)
        sb = statelog.open(copy, follow=env.url, follow_poll=MANUAL)
        before = {e.key for e in _manifest(env, w).objects}
        commit_range(w, 40, 120)
        ship(src, env.url)
        new = [e for e in _manifest(env, w).segments if e.key not in before]
        env.damage(new[1].key)
        sb.catch_up()
        short, listed = sb.epoch, shipped_epoch(env, w)
        assert short < listed
        generation = _manifest(env, w).generation
        with pytest.raises(PromotionRefusedError) as err:
            sb.promote()
        assert f"through {short}" in str(err.value) and new[1].key in str(err.value)
        assert "nothing was changed" in err.value.hint
        assert sb.standby and sb.epoch == short
        assert _manifest(env, w).generation == generation  # the writer is not fenced
        assert load_record(copy) is None or not load_record(copy).generation
        commit_range(w, 120, 130)
        compact(src, retain=1, min_tail_bytes=0)  # a snapshot past the damage
        ship(src, env.url)
        listed = shipped_epoch(env, w)
    assert listed > new[1].last_lsn
    promoted = sb.promote()
    assert promoted.epoch == listed and promoted.offsets == STREAM.model(listed).offsets
    assert store_digest(sb) == STREAM.model(listed).digest()
    sb.close()


def test_a_damaged_newest_snapshot_is_walked_past(tmp_path: Path, env: Remote) -> None:  # noqa: F811
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 60)
        compact(src, retain=3, min_tail_bytes=0)
        commit_range(w, 60, 120)
        compact(src, retain=3, min_tail_bytes=0)
        commit_range(w, 120, 130)
    ship(src, env.url)
    with statelog.open(src, readonly=True) as ro:
        m = read_manifest(env.client(), ro.store_id)
    assert m is not None and len(m.manifest.snapshots) >= 2
    env.damage(m.manifest.snapshots[0].key)
    with statelog.open(copy, follow=env.url, follow_poll=MANUAL) as sb:
        assert sb.epoch == 129
        assert store_digest(sb) == STREAM.model(129).digest()
        assert not (copy / "snapshots" / m.manifest.snapshots[0].name).exists()


def _manifest(env: Remote, w: statelog.StateStore) -> Any:  # noqa: F811
    cur = read_manifest(env.client(), w.store_id)
    assert cur is not None
    return cur.manifest


def _ship_loop(src: Path, url: str, stop: threading.Event, failed: list[Exception]) -> None:
    """The shipping daemon's job, every 20 ms, until ``stop`` (its host is lost)."""
    while not stop.wait(0.02):
        try:
            ship(src, url)
        except Exception as exc:  # the test fails on any
            failed.append(exc)
            return


def test_promotion_after_the_writer_and_its_shipping_are_lost(
    tmp_path: Path,
    env: Remote,  # noqa: F811
) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 5)
    ship(src, env.url)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "crash_writer.py"), str(src), "--seed", "11",
         "--count", "100000", "--segment-bytes", "8192"],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    stop, failed = threading.Event(), []
    shipper = threading.Thread(target=_ship_loop, args=(src, env.url, stop, failed))
    shipper.start()
    sb = statelog.open(copy, follow=env.url, follow_poll=timedelta(milliseconds=20))
    assert proc.stdout is not None
    kill_at = random.Random(7).randrange(150, 400)
    for line in proc.stdout:
        if line.startswith("ack ") and int(line.split()[1]) >= kill_at:
            break
    proc.send_signal(signal.SIGKILL)
    stop.set()  # the host is lost: its shipping ends with it
    proc.wait()
    shipper.join()
    assert failed == []
    m = read_manifest(env.client(), sb.store_id)
    assert m is not None
    promoted = sb.promote()
    assert promoted.epoch == m.manifest.last_epoch > 5  # every shipped epoch, none other
    model = STREAM.model(promoted.epoch)
    assert promoted.offsets == model.offsets and store_digest(sb) == model.digest()
    assert sb.generation == m.manifest.generation + 1
    commit_range(sb, promoted.epoch + 1, promoted.epoch + 20)
    sb.close()
    assert ship(copy, env.url).last_epoch == promoted.epoch + 19  # it ships as the writer
    res = restore(env.url, tmp_path / "elsewhere")
    assert res.epoch == promoted.epoch + 19
    with statelog.open(tmp_path / "elsewhere", readonly=True) as again:
        assert store_digest(again) == STREAM.model(promoted.epoch + 19).digest()


def test_two_promotions_at_once_exactly_one_wins(tmp_path: Path, env: Remote) -> None:  # noqa: F811
    src = tmp_path / "src"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 80)
    ship(src, env.url)
    standbys = [
        statelog.open(tmp_path / f"copy{i}", follow=env.url, follow_poll=MANUAL) for i in (1, 2)
    ]
    outcomes: list[Any] = [None, None]
    go = threading.Barrier(2)

    def promote(i: int) -> None:
        go.wait()
        try:
            outcomes[i] = standbys[i].promote()
        except PromotionLostError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=promote, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [i for i in (0, 1) if isinstance(outcomes[i], statelog.Promotion)]
    assert len(won) == 1, outcomes
    winner, loser = standbys[won[0]], standbys[1 - won[0]]
    assert isinstance(outcomes[1 - won[0]], PromotionLostError)
    assert winner.generation == 2 and not winner.standby
    assert loser.standby and loser.readonly  # it goes on following, unchanged
    assert load_record(loser.path) is None  # no claim was written in its copy
    assert _manifest(env, winner).generation == 2
    winner.commit(offsets={"x": 1}, low_watermark_ms=winner.low_watermark_ms)
    winner.close()
    ship(winner.path, env.url)
    loser.catch_up()
    assert loser.epoch == 80  # it follows the winner's shipped log
    loser.close()


def test_the_old_writer_is_fenced_after_a_promotion(tmp_path: Path, env: Remote) -> None:  # noqa: F811
    src, copy = tmp_path / "src", tmp_path / "copy"
    zombie = statelog.open(src, remote=env.url, remote_check=timedelta(milliseconds=50), **SMALL)
    try:
        commit_range(zombie, 1, 60)
        ship(src, env.url)
        with statelog.open(copy, follow=env.url, follow_poll=MANUAL) as sb:
            promoted = sb.promote()
            keys = set(env.object_keys())
            with pytest.raises(FencedError):
                for i in range(60, 2_000):  # refused at the next fence check or roll
                    run_commit(zombie, STREAM.commit(i))
            with pytest.raises(FencedError):
                ship(src, env.url)
            assert {k for k in env.object_keys() if "/pins/" not in k} <= keys
            assert _manifest(env, sb).generation == sb.generation == 2
            sb.commit(offsets={"x": 1}, low_watermark_ms=sb.low_watermark_ms)
            assert sb.epoch == promoted.epoch + 1
    finally:
        zombie.close()


def test_statelog_promote_cli_from_a_remote(
    tmp_path: Path,
    env: Remote,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = tmp_path / "src"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 50)
    ship(src, env.url)
    statelog.open(tmp_path / "copy", follow=env.url).close()  # a standby whose process is gone
    statelog.open(tmp_path / "other", follow=env.url).close()
    cli = statelog.cli.main
    assert cli(["promote", str(tmp_path / "copy"), "--source", env.url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["epoch"] == 49 and doc["offsets"] == STREAM.model(49).offsets
    with pytest.raises(statelog.StorePromotedError) as err:  # never a standby again
        statelog.open(tmp_path / "copy", follow=env.url)
    assert "remote=" in err.value.hint
    # A later promotion is a takeover like any other: it fences the writer promoted before.
    assert statelog.cli.main(["promote", str(tmp_path / "other"), "--source", env.url]) == 0
    capsys.readouterr()
    with pytest.raises(FencedError):
        statelog.open(tmp_path / "copy", remote=env.url)


def test_a_takeover_from_an_earlier_epoch_rebuilds_the_standby(
    tmp_path: Path,
    env: Remote,  # noqa: F811
) -> None:
    """The remote restored to epoch 30 and taken over; its new writer commits other
    values: the standby serves the new history, never a mix of both."""
    src, copy, new = tmp_path / "src", tmp_path / "copy", tmp_path / "new"
    with statelog.open(src, segment_bytes=4096) as w:
        for i in range(1, 61):
            w.commit(
                offsets={"p": i}, low_watermark_ms=i, put={f"k{i % 5}": ["old", i], f"o{i}": i}
            )
    ship(src, env.url)
    sb = statelog.open(copy, follow=env.url, follow_poll=MANUAL)
    assert sb.epoch == 60
    restore(env.url, new, upto=30, take_over=True)
    with statelog.open(new, segment_bytes=4096, remote=env.url) as w2:
        for i in range(31, 76):
            w2.commit(offsets={"p": i}, low_watermark_ms=i, put={f"k{i % 5}": ["new", i]})
    ship(new, env.url)
    sb.catch_up()
    with statelog.open(new, readonly=True, at=sb.epoch) as truth:
        assert sb.epoch > 30 and dict(sb.items()) == dict(truth.items())
    sb.close()
