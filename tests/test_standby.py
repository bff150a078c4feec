"""Standbys: ``statelog.open(path, follow=SOURCE)``, its lag, and ``promote()``.

| situation                                       | the standby                                  |
|-------------------------------------------------|----------------------------------------------|
| the source commits, compacts, deletes old files | each look: the model at the source's epoch   |
| reads while it applies and swaps in snapshots   | whole commits only (a conserved sum)         |
| the source's writer is SIGKILLed                | promote(): every acknowledged commit, then on |
| the source's writer still runs                  | promote() refused, nothing changed, follows on |
| a damaged segment in the source                 | the last good epoch, says so, lag > 0        |
| bad options, a second standby, a commit         | a typed error with a hint                    |
"""

from __future__ import annotations

import json
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
from statelog.kit.faults import FaultyFiles
from statelog.kit.workload import Stream, run_commit, store_digest
from statelog.ops import metrics
from statelog.sharding.partition import read_manifest
from tests.helpers import flip_bit, frames, segments

STREAM = Stream(seed=5)
SMALL: dict[str, Any] = {"segment_bytes": 16 << 10}
MANUAL = timedelta(hours=1)  # no look of its own: the test calls catch_up()
REPO = Path(__file__).resolve().parent.parent


def commit_range(store: statelog.StateStore, start: int, stop: int) -> None:
    for i in range(start, stop):
        assert run_commit(store, STREAM.commit(i)) == i


def test_the_standby_is_the_model_after_each_look(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    rng = random.Random(3)
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 20)
        with statelog.open(copy, follow=src, follow_poll=MANUAL) as sb:
            assert sb.standby and sb.epoch == 19
            assert store_digest(sb) == STREAM.model(19).digest()
            epoch = 19
            for _ in range(12):
                n = rng.randrange(1, 25)
                commit_range(w, epoch + 1, epoch + 1 + n)
                epoch += n
                if rng.random() < 0.4:
                    compact(src, retain=1, min_tail_bytes=0)
                lag = sb.catch_up()
                assert lag == statelog.Lag(0, 0, 0.0)
                assert sb.epoch == epoch
                assert store_digest(sb) == STREAM.model(epoch).digest()
            # the copy's log follows the source's retention, never further back
            assert min(p.name for p in segments(copy)) >= min(p.name for p in segments(src))


def test_reads_see_whole_commits_while_the_standby_applies_and_swaps(tmp_path: Path) -> None:
    """Every commit moves one unit between two keys: any whole state sums to 1000."""
    src, copy = tmp_path / "src", tmp_path / "copy"
    keys = [f"k{i}" for i in range(20)]
    with statelog.open(src, **SMALL) as w:
        w.commit(offsets={"p": 0}, low_watermark_ms=0, put={k: 50 for k in keys})
        sb = statelog.open(copy, follow=src, follow_poll=timedelta(milliseconds=5))
        stop, bad = threading.Event(), []

        def reader() -> None:
            last = 0
            while not stop.is_set():
                epoch = sb.epoch
                total = sum(v for _k, v in sb.items())
                if total != 1000 or epoch < last:
                    bad.append((epoch, total))
                last = epoch

        t = threading.Thread(target=reader)
        t.start()
        rng = random.Random(1)
        values = dict.fromkeys(keys, 50)
        for i in range(1, 301):
            a, b = rng.sample(keys, 2)
            values[a] -= 1
            values[b] += 1
            w.commit(offsets={"p": i}, low_watermark_ms=i, put={a: values[a], b: values[b]})
            if i % 60 == 0:
                compact(src, retain=1, min_tail_bytes=0)
        sb.catch_up()
        stop.set()
        t.join()
        assert bad == []
        assert sb.epoch == w.epoch and dict(sb.items()) == values
        sb.close()


def test_promotion_after_the_source_writer_is_killed(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 5)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "crash_writer.py"), str(src), "--seed", "5",
         "--count", "100000"],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    sb = statelog.open(copy, follow=src, follow_poll=timedelta(milliseconds=20))
    acked = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ack "):
            acked = int(line.split()[1])
            if acked >= 150:
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    acked = max([acked] + [int(ln.split()[1]) for ln in proc.stdout if ln.startswith("ack ")])
    promoted = sb.promote()
    assert not sb.standby and not sb.readonly and sb.lag is None
    assert promoted.epoch >= acked and promoted.epoch == sb.epoch
    model = STREAM.model(promoted.epoch)
    assert promoted.offsets == model.offsets and promoted.low_watermark_ms == model.low_watermark_ms
    assert store_digest(sb) == model.digest()
    commit_range(sb, promoted.epoch + 1, promoted.epoch + 30)  # the new writer goes on
    sb.close()
    with statelog.open(copy, readonly=True) as again:
        assert store_digest(again) == STREAM.model(promoted.epoch + 29).digest()


def test_promotion_is_refused_while_the_source_writer_runs(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 30)
        with statelog.open(copy, follow=src, follow_poll=MANUAL) as sb:
            before = sorted(p.name for p in (copy / "wal").iterdir())
            with pytest.raises(statelog.StoreLockedError) as err:
                sb.promote()
            assert "promot" in err.value.hint and str(w.path) in str(err.value)
            assert sb.standby and sb.readonly
            assert sorted(p.name for p in (copy / "wal").iterdir()) == before
            commit_range(w, 30, 40)
            sb.catch_up()
            assert sb.epoch == 39  # it follows on
            with pytest.raises(statelog.ReadOnlyStoreError) as ro:
                sb.commit(offsets={}, low_watermark_ms=0, put={"x": 1})
            assert "promote" in ro.value.hint


def test_a_damaged_source_segment_stops_the_standby_at_the_last_good_epoch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 60)
    seg = segments(src)[2]
    first = int(seg.name.split("-")[1].split(".")[0], 16)
    flip_bit(seg, frames(seg)[0].offset + 30, 2)
    label = {"store": metrics.store_label(copy)}
    with statelog.open(copy, follow=src, follow_poll=MANUAL) as sb:
        assert sb.epoch == first - 1
        assert store_digest(sb) == STREAM.model(first - 1).digest()
        assert sb.lag is not None and sb.lag.epochs > 0
        assert sb.recovery.outcome is not statelog.Outcome.CLEAN
        scraped = metrics.REGISTRY.get_sample_value("statelog_standby_lag_epochs", label)
        assert scraped == sb.lag.epochs
        assert metrics.REGISTRY.get_sample_value("statelog_standby_lag_seconds", label) > 0
    assert metrics.REGISTRY.get_sample_value("statelog_standby_lag_epochs", label) is None


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"follow": "ftp://bucket/shard-0"}, statelog.RemoteError, "s3://bucket"),
        ({"follow": "SELF"}, statelog.InvalidOptionError, "itself"),
        ({"follow": "SRC", "remote": "s3://bucket/p"}, statelog.InvalidOptionError, "remote"),
        ({"follow": "SRC", "follow_poll": timedelta(0)}, statelog.InvalidOptionError, "poll"),
        ({"follow": "NOWHERE"}, statelog.StoreNotFoundError, "no statelog store"),
    ],
    ids=["url", "itself", "with-remote", "zero-poll", "no-source"],
)
def test_bad_standby_options(
    tmp_path: Path, options: dict[str, Any], error: type[Exception], says: str
) -> None:
    with statelog.open(tmp_path / "src") as w:
        w.commit(offsets={}, low_watermark_ms=0, put={"a": 1})
    names = {"SELF": tmp_path / "copy", "SRC": tmp_path / "src", "NOWHERE": tmp_path / "nope"}
    opts = {k: names.get(v, v) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(error) as err:
        statelog.open(tmp_path / "copy", **opts)
    assert says in str(err.value)
    assert not (tmp_path / "copy" / "IDENTITY").exists()


def test_one_standby_per_copy(tmp_path: Path) -> None:
    with statelog.open(tmp_path / "src") as w:
        w.commit(offsets={}, low_watermark_ms=0, put={"a": 1})
    with statelog.open(tmp_path / "copy", follow=tmp_path / "src", follow_poll=MANUAL):
        with pytest.raises(statelog.StoreLockedError):
            statelog.open(tmp_path / "copy", follow=tmp_path / "src")
        with pytest.raises(statelog.StoreLockedError):
            statelog.open(tmp_path / "copy")
    with statelog.open(tmp_path / "src", readonly=True) as ro, pytest.raises(
        statelog.InvalidOptionError
    ):
        ro.promote()


def test_the_copy_holds_whole_records_only_and_the_promoted_writer_continues(
    tmp_path: Path,
) -> None:
    """A source writer killed half-way through a record: the copy stops before it."""
    src, copy = tmp_path / "src", tmp_path / "copy"
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "crash_writer.py"), str(src), "--seed", "5",
         "--count", "40", "--die-at", "torn:30:0.5"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    last = segments(src)[-1]
    whole = [f for f in frames(last) if f.end <= last.stat().st_size]
    with statelog.open(copy, follow=src, follow_poll=MANUAL) as sb:
        mine = copy / "wal" / last.name
        assert mine.stat().st_size < last.stat().st_size  # the torn bytes stayed behind
        assert mine.read_bytes() == last.read_bytes()[: mine.stat().st_size]
        assert mine.stat().st_size in {f.end for f in whole}
        epoch = sb.epoch
        assert store_digest(sb) == STREAM.model(epoch).digest()
        promoted = sb.promote()
        assert promoted.epoch == epoch
        commit_range(sb, epoch + 1, epoch + 5)
        assert store_digest(sb) == STREAM.model(epoch + 4).digest()


def test_statelog_promote_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A copy whose standby process is gone: `statelog promote COPY --source SRC`."""
    from statelog.cli import main as cli_main

    src, copy = tmp_path / "src", tmp_path / "copy"
    w = statelog.open(src, **SMALL)
    commit_range(w, 1, 20)
    with statelog.open(copy, follow=src, follow_poll=MANUAL):
        pass  # a standby that ran once, at epoch 19
    commit_range(w, 20, 25)
    assert cli_main(["promote", str(copy), "--source", str(src)]) == 4  # the writer runs
    out, err = capsys.readouterr()
    assert "StoreLockedError" in err and "promot" in err and out == ""
    w.close()
    assert cli_main(["promote", str(copy), "--source", str(src), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    model = STREAM.model(24)
    assert doc["epoch"] == 24 and doc["offsets"] == model.offsets
    with statelog.open(copy) as promoted:
        assert store_digest(promoted) == model.digest()


def test_a_source_that_cannot_be_read_refuses_promotion_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The source's host is gone: nothing can tell a dead writer from an unreachable one."""
    from statelog.cli import main as cli_main

    src, copy, away = tmp_path / "src", tmp_path / "copy", tmp_path / "away"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 30)
    with statelog.open(copy, follow=src, follow_poll=MANUAL) as sb:
        src.rename(away)
        with pytest.raises(statelog.PromotionRefusedError) as err:
            sb.promote()
        assert "force=True" in err.value.hint and sb.standby and sb.epoch == 29
        away.rename(src)
        with statelog.open(src, **SMALL) as w:
            commit_range(w, 30, 35)
        assert sb.catch_up().epochs == 0 and sb.epoch == 34  # it still follows
        src.rename(away)
        promoted = sb.promote(force=True)
        assert promoted.epoch == 34 and not sb.standby
        commit_range(sb, 35, 37)
    away.rename(src)
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 35, 40)
    other = tmp_path / "copy2"
    with statelog.open(other, follow=src, follow_poll=MANUAL):
        pass
    src.rename(away)
    assert cli_main(["promote", str(other), "--source", str(src)]) == 5
    assert "PromotionRefusedError" in capsys.readouterr().err
    assert cli_main(["promote", str(other), "--source", str(src), "--force"]) == 0
    assert "at epoch 39" in capsys.readouterr().out


def test_reads_go_on_while_the_standby_is_promoted(tmp_path: Path) -> None:
    """Readers keep reading the standby's state during the writer's open, then the writer's."""
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 60)
        compact(src, retain=2, min_tail_bytes=0)
        commit_range(w, 60, 80)
    sb = statelog.open(copy, follow=src, follow_poll=MANUAL)
    stop, seen, errors = threading.Event(), [], []

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append((sb.epoch, sum(1 for _ in sb.items(table="orders"))))
            except Exception as exc:  # any error here is the defect under test
                errors.append(exc)
                return

    t = threading.Thread(target=reader)
    t.start()
    try:
        promoted = sb.promote()
    finally:
        stop.set()
        t.join()
    assert errors == [] and seen and promoted.epoch == 79
    assert store_digest(sb) == STREAM.model(79).digest()
    sb.close()


def test_two_promotions_of_one_source_exactly_one_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loser changes nothing and follows on; the source refuses its old writer after."""
    from statelog.cli import main as cli_main
    from statelog.replica.promoted import read_promoted

    src = tmp_path / "src"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 40)
    standbys = [
        statelog.open(tmp_path / f"copy{i}", follow=src, follow_poll=MANUAL) for i in (1, 2)
    ]
    outcomes: list[Any] = [None, None]
    go = threading.Barrier(2)

    def promote(i: int) -> None:
        go.wait()
        try:
            outcomes[i] = standbys[i].promote()
        except statelog.PromotionLostError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=promote, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [i for i in (0, 1) if isinstance(outcomes[i], statelog.Promotion)]
    assert len(won) == 1, outcomes
    winner, loser = standbys[won[0]], standbys[1 - won[0]]
    assert isinstance(outcomes[1 - won[0]], statelog.PromotionLostError)
    assert loser.standby and loser.epoch == 39
    doc = read_promoted(src)
    assert doc is not None and doc["copy"] == str(winner.path.resolve()) and doc["epoch"] == 39
    with pytest.raises(statelog.StorePromotedError) as err:
        statelog.open(src)  # the old writer, restarted on its old host
    assert str(winner.path.resolve()) in str(err.value) and "PROMOTED" in err.value.hint
    with statelog.open(src, readonly=True) as ro:
        assert ro.epoch == 39  # reads of the old directory go on
    assert cli_main(["inspect", str(src), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["promoted"]
    assert shown["copy"] == str(winner.path.resolve()) and shown["epoch"] == 39
    winner.close()
    loser.close()
    with pytest.raises(statelog.StorePromotedError) as err:  # a new standby of the old source
        statelog.open(tmp_path / "copy3", follow=src)
    assert "follow the promoted copy" in err.value.hint
    with pytest.raises(statelog.StorePromotedError) as err:  # the winner, as a standby again
        statelog.open(winner.path, follow=src)
    assert "without follow" in err.value.hint
    loser_path = loser.path
    assert cli_main(["promote", str(loser_path), "--source", str(src)]) == 4
    assert "StorePromotedError" in capsys.readouterr().err


def test_a_sharded_root_follows_and_promotes_shard_by_shard(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    model: dict[str, int] = {}
    with statelog.ShardedStore(src, shards=3, **SMALL) as w:
        for i in range(90):
            key = f"order:{i % 40}"
            model[key] = i
            w.commit(offsets={"orders-0": i}, low_watermark_ms=i, put={key: i})
        sb = statelog.ShardedStore(copy, follow=src, follow_poll=MANUAL)
        assert sb.readonly and sb.standbys == [0, 1, 2]
        assert dict(sb.items()) == model and sb.epochs == w.epochs
        with pytest.raises(statelog.ReadOnlyStoreError):
            sb.commit_shard(0, low_watermark_ms=100)
        for i in range(90, 120):
            model[f"order:{i % 40}"] = i
            w.commit(offsets={"orders-0": i}, low_watermark_ms=i, put={f"order:{i % 40}": i})
        for i in range(3):
            sb.shard(i).catch_up()
        assert dict(sb.items()) == model
        epochs = w.epochs
    assert read_manifest(copy) == read_manifest(src)  # its time of creation aside
    one = sb.promote(1)  # shard by shard: shard 1 alone first
    assert list(one) == [1] and one[1].epoch == epochs[1] and sb.standbys == [0, 2]
    key = next(k for k in (f"new:{n}" for n in range(100)) if sb.shard_for(k) == 1)
    assert sb.commit_shard(1, low_watermark_ms=200, put={key: 1}) == epochs[1] + 1
    with pytest.raises(statelog.ReadOnlyStoreError):
        sb.shard(0).commit(offsets={}, low_watermark_ms=200)
    rest = sb.promote()
    assert sorted(rest) == [0, 2] and sb.standbys == [] and not sb.readonly
    sb.close()
    with statelog.ShardedStore(copy) as again:  # an ordinary root now
        assert again.epochs == {0: epochs[0], 1: epochs[1] + 1, 2: epochs[2]}
    with pytest.raises(statelog.ShardOpenError) as err:
        statelog.ShardedStore(src)  # every shard of the old root was claimed
    assert isinstance(err.value.cause, statelog.StorePromotedError)


def test_a_sharded_standby_root_refuses_what_it_cannot_follow(tmp_path: Path) -> None:
    src = tmp_path / "src"
    statelog.ShardedStore(src, shards=2).close()
    with pytest.raises(statelog.InvalidOptionError, match="sharded root directory"):
        statelog.ShardedStore(tmp_path / "a", follow="s3://bucket/p")
    with pytest.raises(statelog.InvalidOptionError, match="lazy"):
        statelog.ShardedStore(tmp_path / "b", follow=src, lazy=True)
    with pytest.raises(statelog.StoreNotFoundError):
        statelog.ShardedStore(tmp_path / "c", follow=tmp_path / "nothing")
    statelog.ShardedStore(tmp_path / "d", shards=3).close()
    with pytest.raises(statelog.ShardMismatchError):
        statelog.ShardedStore(tmp_path / "d", follow=src)
    with (
        statelog.ShardedStore(tmp_path / "e", shards=2) as plain,
        pytest.raises(statelog.InvalidOptionError, match="not a standby root"),
    ):
        plain.promote()


def test_statelog_promote_cli_on_a_sharded_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from statelog.cli import main as cli_main

    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.ShardedStore(src, shards=3, **SMALL) as w:
        for i in range(30):
            w.commit(offsets={f"orders-{i % 3}": i}, low_watermark_ms=i, put={f"k{i}": i})
        epochs = w.epochs
    statelog.ShardedStore(copy, follow=src).close()  # its standby process is gone
    assert cli_main(["promote", str(copy), "--source", str(src), "--shard", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["shards"]) == ["2"] and doc["shards"]["2"]["epoch"] == epochs[2]
    with statelog.ShardedStore(copy, follow=src) as half:  # shard 2 opens as a writer now
        assert half.standbys == [0, 1] and not half.readonly
    assert cli_main(["promote", str(copy), "--source", str(src)]) == 0
    out = capsys.readouterr().out
    assert f"shard 0 at epoch {epochs[0]}" in out and f"shard 1 at epoch {epochs[1]}" in out
    assert "shard 2" not in out
    plain = ["promote", str(tmp_path / "plain"), "--source", str(src / "x"), "--shard", "1"]
    assert cli_main(plain) == 3


def _failover_chain(tmp_path: Path, rounds: int, seed: int) -> None:
    """Kill the writer at a random commit, promote its standby, run the writer on the
    promoted copy with a new standby of it, again and again: the final state is the
    crash-free run's, and no promotion ever loses an acknowledged commit."""
    rng = random.Random(seed)
    primary = tmp_path / "store-0"
    with statelog.open(primary, **SMALL) as w:
        commit_range(w, 1, 5)
    for r in range(rounds):
        sb = statelog.open(tmp_path / f"store-{r + 1}", follow=primary, follow_poll=timedelta(
            milliseconds=rng.choice([5, 20, 50])))  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "crash_writer.py"), str(primary), "--seed",
             "5", "--count", "100000"],
            stdout=subprocess.PIPE, text=True, cwd=REPO,
        )  # fmt: skip
        assert proc.stdout is not None
        opened, acked = 0, 0
        kill_after = rng.randrange(1, 200)
        for line in proc.stdout:
            if line.startswith("open "):
                opened = int(line.split()[1])
            elif line.startswith("ack "):
                acked = int(line.split()[1])
                if acked - opened >= kill_after:
                    break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        acked = max([acked] + [int(ln.split()[1]) for ln in proc.stdout if ln.startswith("ack ")])
        if rng.random() < 0.3:
            compact(
                primary, retain=1, min_tail_bytes=0
            )  # the dead writer's compactor ran once more
        promoted = sb.promote()
        assert promoted.epoch >= acked, (r, promoted.epoch, acked)
        model = STREAM.model(promoted.epoch)
        assert promoted.offsets == model.offsets and store_digest(sb) == model.digest()
        sb.close()
        with pytest.raises(statelog.StorePromotedError):
            statelog.open(primary)  # the dead writer's directory is claimed for good
        primary = sb.path
    with statelog.open(primary, readonly=True) as last:
        assert store_digest(last) == STREAM.model(last.epoch).digest()


def test_a_chain_of_failovers_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    _failover_chain(tmp_path, rounds=3, seed=1)


@pytest.mark.stress
def test_a_long_chain_of_failovers_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    _failover_chain(tmp_path, rounds=25, seed=2)


def test_a_look_reads_only_what_the_live_segment_gained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statelog.replica import mirror as mirror_module

    src, copy = tmp_path / "src", tmp_path / "copy"
    whole: list[Path] = []
    real = mirror_module.scan_segment

    def counting(path: Path, *args: Any, **kwargs: Any) -> Any:
        whole.append(path)
        return real(path, *args, **kwargs)

    copied: list[Path] = []
    real_copy = mirror_module._copy_whole

    def copying(source: Path, *args: Any) -> int:
        copied.append(source)
        return real_copy(source, *args)

    w = statelog.open(src, segment_bytes=64 << 20)
    commit_range(w, 1, 50)
    with statelog.open(copy, follow=src, follow_poll=MANUAL) as sb:
        monkeypatch.setattr(mirror_module, "scan_segment", counting)
        monkeypatch.setattr(mirror_module, "_copy_whole", copying)
        for n in range(5):
            commit_range(w, 50 + 10 * n, 60 + 10 * n)
            assert sb.catch_up().epochs == 0 and sb.epoch == 59 + 10 * n
            assert store_digest(sb) == STREAM.model(sb.epoch).digest()
        w.close()  # seals the live segment: the copy gets only the SEAL frame
        sb.catch_up()
        assert whole == [] and copied == []  # each look verified only what it had not seen
        for p in segments(src):
            assert (copy / "wal" / p.name).read_bytes() == p.read_bytes()


@pytest.mark.parametrize("seal", [False, True], ids=["live", "sealed-since"])
def test_a_source_that_lost_its_unsynced_tail_replaces_the_copy(
    tmp_path: Path, seal: bool
) -> None:
    """Power loss took the source's last records after the standby copied them; its writer
    then committed others in their place: the copy takes the source's log, never a mix."""
    from statelog.log.reader import scan_segment

    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, segment_bytes=1 << 20) as w:
        commit_range(w, 1, 5)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "crash_writer.py"), str(src), "--seed", "5",
         "--count", "100000", "--segment-bytes", str(1 << 20)],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ack ") and int(line.split()[1]) >= 40:
            break
    sb = statelog.open(copy, follow=src, follow_poll=MANUAL)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    sb.catch_up()
    assert sb.epoch >= 40
    live = max((src / "wal").glob("*.wal"))
    scan = scan_segment(live, live.read_bytes(), store_id=None, prev_crc=None, is_last=True)
    first = int(live.name.split("-")[1].split(".")[0], 16)
    keep = 30 - first + 1  # records of epochs first..30
    with open(live, "r+b") as fh:
        fh.truncate(scan.records[keep - 1].end)
    other = Stream(seed=99)
    rolled = len(segments(src))
    # sealed-since: the writer fills and seals that segment before the standby looks again
    with statelog.open(src, segment_bytes=4096 if seal else 1 << 20) as w:
        assert w.epoch == 30
        i = 31
        while i <= 35 or (seal and (len(segments(src)) <= rolled or i <= sb.epoch + 3)):
            assert run_commit(w, other.commit(i)) == i
            i += 1
        want = store_digest(w)
        with pytest.raises(AssertionError):
            assert want == STREAM.model(w.epoch).digest()
        result = sb.catch_up()
        assert result.epochs == 0 and sb.epoch == w.epoch and store_digest(sb) == want
    sb.close()


def test_a_live_segment_rewritten_to_the_same_length_is_taken_whole(tmp_path: Path) -> None:
    """The source lost its last records and wrote others of the same sizes: nothing follows
    the copy's end, yet the copy is not the source's log; the next look takes it."""
    src, copy = tmp_path / "src", tmp_path / "copy"

    def commits(w: statelog.StateStore, start: int, stop: int, value: str) -> None:
        for i in range(start, stop):
            w.commit(offsets={"p": 1000 + i}, low_watermark_ms=1000 + i, put={"k": value * 8})

    layer = FaultyFiles()
    w = statelog.open(src, segment_bytes=1 << 20, file_layer=layer)
    commits(w, 1, 21, "a")
    sb = statelog.open(copy, follow=src, follow_poll=MANUAL)
    assert sb.epoch == 20 and sb.get("k") == "a" * 8
    layer.abandon(w)  # died without sealing its live segment
    live = max((src / "wal").glob("*.wal"))
    size = live.stat().st_size
    records = frames(live)
    with open(live, "r+b") as fh:
        fh.truncate(records[9].end)  # epochs 11..20 lost
    with statelog.open(src, segment_bytes=1 << 20, file_layer=FaultyFiles()) as w2:
        assert w2.epoch == 10
        commits(w2, 11, 21, "b")
        assert live.stat().st_size == size  # the same length, other records
        sb.catch_up()
        assert sb.epoch == 20 and sb.get("k") == "b" * 8
    sb.close()


def test_the_standby_keeps_each_key_once_however_many_segments_it_applies(
    tmp_path: Path,
) -> None:
    """No snapshot folds a standby's overlay by segment: it holds one generation of
    everything sealed and the newest, so its memory follows the keys, not the updates."""
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, segment_bytes=4096) as w:
        commit_range(w, 1, 10)
        with statelog.open(copy, follow=src, follow_poll=MANUAL) as sb:
            for n in range(10):
                commit_range(w, 10 + 30 * n, 40 + 30 * n)
                sb.catch_up()
            assert len(segments(src)) > 20
            generations = sb._state.generations
            assert len(generations) <= 2
            entries = sum(len(t) for g in generations for t in g.tables.values())
            keys = {k for g in generations for t in g.tables.values() for k in t}
            assert entries <= 2 * len(keys)  # each key at most once per generation
            assert store_digest(sb) == STREAM.model(309).digest()


@pytest.mark.parametrize("where", ["writer", "standby", "inspect"])
def test_a_fifo_named_promoted_is_refused_not_waited_on(tmp_path: Path, where: str) -> None:
    """Someone else's file in the store directory: never blocks an open."""
    import os

    from statelog.cli import main as cli_main

    src = tmp_path / "src"
    with statelog.open(src) as w:
        w.commit(offsets={}, low_watermark_ms=0, put={"a": 1})
    os.mkfifo(src / "PROMOTED")
    if where == "inspect":
        assert cli_main(["inspect", str(src)]) == 0
        return
    with pytest.raises(statelog.StorePromotedError, match="unreadable"):
        if where == "writer":
            statelog.open(src)
        else:
            statelog.open(tmp_path / "copy", follow=src)


def test_a_restarted_standby_settles_the_images_it_checked_whole(tmp_path: Path) -> None:
    """The standby owns its copy's ``base/``: an image it checked whole on a restart has
    its stamp settled, so the next restart reads neither the image nor its snapshot."""
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 30)
    compact(src, retain=1, min_tail_bytes=0)
    with statelog.open(copy, follow=src, follow_poll=MANUAL) as sb:
        assert sb.epoch == 29
    with statelog.open(copy, follow=src, follow_poll=MANUAL) as sb:  # checks them whole
        assert store_digest(sb) == STREAM.model(29).digest()
    stamps = sorted((copy / "base").glob("*.mdb.ok"))
    assert stamps
    for stamp in stamps:
        body = json.loads(json.loads(stamp.read_bytes())["body"])
        assert "settled" in body, stamp.name
