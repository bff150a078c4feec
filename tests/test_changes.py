"""The changes feed: ``store.changes(since)`` against the seeded workload's model.

Folding the feed's changes 1..E must give the model of commits 1..E exactly,
offsets and watermark included, across segment rolls, compaction and
retention; each failure mode has its own outcome (table below).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.cli import main as cli_main
from statelog.compaction.fold import compact
from statelog.format.wal import FRAME_HEADER_SIZE, FrameType
from statelog.kit.workload import Model, Stream, run_commit
from tests.helpers import flip_bit, frames, segments

STREAM = Stream(seed=11)
SMALL = {"segment_bytes": 16 << 10, "durability": "commit"}


def fold(model: Model, change: statelog.Change) -> None:
    """Apply one change to ``model`` as the store applied its record."""
    assert change.epoch == model.epoch + 1, (change.epoch, model.epoch)
    for name, t in change.tables.items():
        table = model.tables.setdefault(name, {})
        for k in t.deletes:
            table.pop(k, None)
        table.update(t.puts)
    model.offsets.update(change.offsets)
    model.low_watermark_ms = change.low_watermark_ms
    model.epoch = change.epoch


def check_feed(changes: Any, since: int, until: int) -> None:
    """The feed from ``since`` folds, epoch by epoch, into the model up to ``until``."""
    model = STREAM.model(since)
    expected = STREAM.model(since)
    for change in changes:
        fold(model, change)
        STREAM.advance(expected, change.epoch)
        assert model.state() == expected.state(), change.epoch
    assert model.epoch == until


def write(path: Path, n: int, start: int = 1, **options: Any) -> None:
    with statelog.open(path, **{**SMALL, **options}) as s:
        for i in range(start, start + n):
            assert run_commit(s, STREAM.commit(i)) == i


def test_feed_equals_the_commits_across_segment_rolls(tmp_path: Path) -> None:
    write(tmp_path / "s", 120)
    assert len(segments(tmp_path / "s")) > 5
    with statelog.open(tmp_path / "s", readonly=True) as ro:
        check_feed(ro.changes(), 0, 120)
        for since in (1, 37, 119):
            check_feed(ro.changes(since=since), since, 120)
        assert list(ro.changes(since=120)) == [] == list(ro.changes(since=500))


def test_a_writer_feed_reads_its_own_commits_and_after_compaction(tmp_path: Path) -> None:
    store = tmp_path / "s"
    write(store, 80)
    assert compact(store, retain=1).snapshot is not None
    with statelog.open(store, **SMALL) as s:
        for i in range(81, 101):
            run_commit(s, STREAM.commit(i))
        first = int(segments(store)[0].name.split("-")[1].split(".")[0], 16)
        assert first > 1  # retention deleted the folded log
        check_feed(s.changes(since=first - 1), first - 1, 100)
        with pytest.raises(statelog.ChangesUnavailableError) as err:
            next(iter(s.changes(since=first - 2)))
        assert err.value.earliest == first and err.value.since == first - 2
        assert "since >=" in str(err.value) and "snapshot" in err.value.hint


def test_a_writer_feed_stops_at_the_durable_epoch(tmp_path: Path) -> None:
    with statelog.open(tmp_path / "s", durability="none") as s:
        for i in range(1, 11):
            run_commit(s, STREAM.commit(i))
        assert s.durable_epoch < 10
        assert [c.epoch for c in s.changes()] == list(range(1, s.durable_epoch + 1))
        s.flush()
        check_feed(s.changes(), 0, 10)


def test_follow_yields_commits_made_while_it_waits(tmp_path: Path) -> None:
    store = tmp_path / "s"
    write(store, 5)
    seen: list[int] = []
    with statelog.open(store, readonly=True) as ro:
        feed = ro.changes(since=0, follow=True, poll=0.01)
        reader = threading.Thread(target=lambda: seen.extend(c.epoch for c in feed))
        reader.start()
        write(store, 60, start=6)  # rolls segments while the feed waits on them
        deadline = threading.Event()
        for _ in range(500):
            if len(seen) >= 65:
                break
            deadline.wait(0.01)
    reader.join(timeout=10)  # closing the store stops the feed
    assert not reader.is_alive()
    assert seen == list(range(1, 66))


def test_a_pinned_feed_keeps_its_segment_through_retention(tmp_path: Path) -> None:
    store = tmp_path / "s"
    write(store, 60)
    with statelog.open(store, readonly=True) as ro:
        feed = iter(ro.changes())
        assert next(feed).epoch == 1
        assert compact(store, retain=1).snapshot is not None
        assert segments(store)[0].name.startswith("0000000000000001-")  # pinned: kept
        rest = [c.epoch for c in feed]
    assert rest == list(range(2, 61))


def _flip_a_record(store: Path, index: int) -> Path:
    seg = segments(store)[index]
    fr = next(f for f in frames(seg) if f.ftype != FrameType.SEAL)
    flip_bit(seg, fr.offset + FRAME_HEADER_SIZE + 1, 3)
    return seg


def _flip_in_sealed_segment(store: Path) -> Path:
    return _flip_a_record(store, 1)


def _flip_in_last_segment(store: Path) -> Path:
    """Records follow the damage in the newest segment: corruption, not a torn tail."""
    last = segments(store)[-1]
    assert len([f for f in frames(last) if f.ftype != FrameType.SEAL]) >= 2
    return _flip_a_record(store, -1)


def _cut_last_record(store: Path) -> Path:
    """A writer killed inside its last record: the segment unsealed, the record half there."""
    last = segments(store)[-1]
    fr = [f for f in frames(last) if f.ftype != FrameType.SEAL][-1]
    with last.open("r+b") as f:
        f.truncate(fr.offset + FRAME_HEADER_SIZE + fr.length // 2)
    return last


def _zero_tail(store: Path) -> Path:
    last = segments(store)[-1]
    seal = frames(last)[-1]
    assert seal.ftype == FrameType.SEAL
    with last.open("r+b") as f:  # the seal not written, zeros where it would be
        f.truncate(seal.offset)
        f.seek(seal.offset)
        f.write(bytes(4096))
    return last


@pytest.mark.parametrize(
    ("damage", "outcome"),
    [
        (_flip_in_sealed_segment, "corrupt: the changes before, then CorruptionError"),
        (_flip_in_last_segment, "corrupt: the changes before, then CorruptionError"),
        (_cut_last_record, "torn: every whole record, then the end"),
        (_zero_tail, "torn: every record, then the end"),
    ],
    ids=[
        "bit-flip-in-sealed-segment",
        "bit-flip-in-last-segment",
        "torn-last-record",
        "zero-filled-tail",
    ],
)
def test_damage_outcomes(tmp_path: Path, damage: Any, outcome: str) -> None:
    store = tmp_path / "s"
    write(store, 40)
    damaged = damage(store)
    epochs: list[int] = []
    with statelog.open(store, readonly=True) as ro:
        feed = ro.changes()
        if outcome.startswith("torn"):
            epochs = [c.epoch for c in feed]
            assert epochs == list(range(1, epochs[-1] + 1))
            assert epochs[-1] == (39 if damage is _cut_last_record else 40)
            return
        with pytest.raises(statelog.CorruptionError) as err:
            epochs.extend(c.epoch for c in feed)
    assert epochs == list(range(1, len(epochs) + 1)) and 0 < len(epochs) < 40
    assert err.value.path == damaged and "verify" in err.value.hint


@pytest.mark.parametrize("since", [-1, True, 1.5, "3"])
def test_bad_since_is_refused(tmp_path: Path, since: Any) -> None:
    write(tmp_path / "s", 3)
    with (
        statelog.open(tmp_path / "s", readonly=True) as ro,
        pytest.raises(statelog.InvalidOptionError),
    ):
        next(iter(ro.changes(since=since)))


# -- statelog tail ------------------------------------------------------------


def tail(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = cli_main(["tail", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_tail_prints_every_epoch_and_json_carries_every_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "s"
    write(store, 30)
    code, out, err = tail(capsys, store, "--since", "25")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert [ln.split()[1] for ln in lines] == ["26", "27", "28", "29", "30"]
    assert all("watermark" in ln and "offsets" in ln for ln in lines)
    code, out, _ = tail(capsys, store, "--json")
    model = Model()
    for line in out.splitlines():
        doc = json.loads(line)
        change = statelog.Change(
            doc["epoch"],
            doc["offsets"],
            doc["low_watermark_ms"],
            {
                name: statelog.TableChange(
                    {_unjson(k): _unjson(v) for k, v in t["puts"]},
                    tuple(map(_unjson, t["deletes"])),
                )
                for name, t in doc["tables"].items()
            },
        )
        fold(model, change)
    assert model.state() == STREAM.model(30).state()


def _unjson(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"bytes"}:
        return bytes.fromhex(v["bytes"])
    if isinstance(v, dict):
        return {k: _unjson(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_unjson(x) for x in v]
    return v


@pytest.mark.parametrize(
    ("setup", "code", "says"),
    [
        ("folded", 2, "ChangesUnavailableError"),
        ("damaged", 1, "CorruptionError"),
        ("not a store", 3, "StoreNotFoundError"),
    ],
)
def test_tail_failures_exit_with_their_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: str, code: int, says: str
) -> None:
    store = tmp_path / "s"
    if setup != "not a store":
        write(store, 60)
    if setup == "folded":
        assert compact(store, retain=1).snapshot is not None
    elif setup == "damaged":
        _flip_in_sealed_segment(store)
    got, out, err = tail(capsys, store)
    assert got == code, err
    assert err.startswith(f"statelog: {says}") and "hint:" in err and len(err.splitlines()) == 1
    if setup == "folded":
        assert "since >=" in err and out == ""


def test_tail_follow_prints_new_commits_until_interrupted(tmp_path: Path) -> None:
    store = tmp_path / "s"
    write(store, 3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "statelog.cli", "tail", str(store), "--follow", "--poll", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A test worker may ignore SIGINT, and a child inherits that: give it back
        # the default, as a shell does, so that Ctrl-C reaches the command.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        assert [proc.stdout.readline().split()[1] for _ in range(3)] == ["1", "2", "3"]
        write(store, 2, start=4)
        assert [proc.stdout.readline().split()[1] for _ in range(2)] == ["4", "5"]
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in err
    assert not list((store / "pins").glob("*.pin"))  # the feed's pin went with it
