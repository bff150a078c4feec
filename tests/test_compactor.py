"""The compactor: folds, triggers, walk-back, retention, pins and the daemon's command line.

Every snapshot written is checked against the model (``tests/compactor_stream.py``,
the kit's seeded stream):
the plain-dict fold of commits ``1..E`` with the offsets and watermark of
epoch E, str and bytes keys kept apart, deletes applied. No store is
reopened after retention deleted segments.
"""

from __future__ import annotations

import logging
import os
import re
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest

import statelog
from compactor import SCRATCH_DIR, CompactionResult, CompactorLock, compact
from statelog.errors import CompactorLockedError, InvalidOptionError, StoreNotFoundError
from statelog.format.wal import mask
from statelog.log.segments import list_segments
from statelog.recovery.ladder import check_link
from statelog.storage.fileio import FileLayer, ReadBuffer
from statelog.storage.pins import pin
from statelog.storage.snapshots import list_snapshots, verify_snapshot
from tests.compactor_stream import assert_snapshot_is_model, commit, snapshot_model
from tests.helpers import flip_bit, frames, segments, truncate

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv" / "bin" / "python"
PY = str(VENV_PY if VENV_PY.exists() else Path(sys.executable))
SEG = 4096  # the smallest segment size: a few dozen commits each
LINE = re.compile(r"^ts=\S+Z level=(DEBUG|INFO|WARNING|ERROR|CRITICAL) \w+=")


@pytest.fixture
def writer(store_path: Path) -> Iterator[statelog.StateStore]:
    """A store left open: its last segment is the writer's active one."""
    s = statelog.open(store_path, segment_bytes=SEG, durability="none")
    yield s
    s.close()


def commits(store: statelog.StateStore, first: int, last: int) -> None:
    for i in range(first, last + 1):
        assert commit(store, i) == i


def state_of(store: statelog.StateStore) -> dict[str, Any]:
    """The store's visible state in the model's shape (through the public API)."""
    return {
        "epoch": store.epoch,
        "offsets": store.offsets,
        "low_watermark_ms": store.low_watermark_ms,
        # An image lists every table ever written: compare the non-empty ones.
        "tables": {t: dict(store.items(t)) for t in store.tables() if store.count(t)},
    }


def snap_of(result: CompactionResult) -> Path:
    assert result.skipped is None, result
    assert result.snapshot is not None
    return result.snapshot


def first_lsn(seg: Path) -> int:
    return int(seg.name.split("-")[1].split(".")[0], 16)


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"event={event} " in r.getMessage()]


# -- folding ------------------------------------------------------------------


def test_closed_store_is_folded_completely(store_path: Path, tmp_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 150)
        live = state_of(s)
        sid = s.store_id
    segs = segments(store_path)
    assert len(segs) >= 4
    r = compact(store_path, retain=5)
    path = snap_of(r)
    assert r.base is None and r.epochs == range(1, 151)
    assert r.segments == tuple(segs)  # close() sealed the last one: everything is foldable
    meta = assert_snapshot_is_model(path, tmp_path / "x", sid)
    _, got = snapshot_model(path, tmp_path / "x", sid)
    assert got == live  # and it is what the store itself showed at that epoch
    assert any(isinstance(k, bytes) for t in got["tables"].values() for k in t)
    assert any(isinstance(k, str) for t in got["tables"].values() for k in t)
    assert check_link(store_path / "wal", meta) is None
    assert not (store_path / SCRATCH_DIR).exists()


def test_second_pass_folds_only_new_sealed_segments(
    writer: statelog.StateStore, store_path: Path, tmp_path: Path
) -> None:
    commits(writer, 1, 100)
    r1 = compact(store_path, retain=5)
    e1 = r1.epochs[-1]
    assert r1.base is None and e1 < 100  # the active segment is not folded
    assert_snapshot_is_model(snap_of(r1), tmp_path / "x")
    commits(writer, 101, 250)
    r2 = compact(store_path, retain=5)
    assert r2.base == r1.snapshot  # built with ImageBuilder.open_copy from the first
    assert r2.epochs.start == e1 + 1 and r2.epochs[-1] < 250
    assert not set(r2.segments) & set(r1.segments)
    assert first_lsn(r2.segments[0]) == e1 + 1
    assert_snapshot_is_model(snap_of(r2), tmp_path / "x")
    writer.close()
    r3 = compact(store_path, retain=5)
    assert r3.base == r2.snapshot and r3.epochs[-1] == 250
    assert_snapshot_is_model(snap_of(r3), tmp_path / "x")


class RecordingFiles(FileLayer):
    def __init__(self) -> None:
        self.reads: list[Path] = []

    def read(self, path: Path) -> bytes:
        self.reads.append(path)
        return super().read(path)

    def read_reusing(self, path: Path, reads: ReadBuffer) -> memoryview:
        self.reads.append(path)
        return super().read_reusing(path, reads)


def test_active_segment_is_never_read(
    writer: statelog.StateStore, store_path: Path, tmp_path: Path
) -> None:
    commits(writer, 1, 120)
    active = segments(store_path)[-1]
    assert first_lsn(active) <= 120  # it holds acknowledged commits
    files = RecordingFiles()
    r = compact(store_path, files=files, retain=5)
    assert active not in files.reads and active not in r.segments
    assert r.epochs[-1] == first_lsn(active) - 1  # stops at the last sealed segment
    assert writer.epoch == 120
    assert_snapshot_is_model(snap_of(r), tmp_path / "x")
    assert active.exists()


def test_trailing_empty_segment_is_not_the_snapshot_end(store_path: Path, tmp_path: Path) -> None:
    """Open and close without a commit: a sealed segment with no record follows."""
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 60)
    with statelog.open(store_path, segment_bytes=SEG):
        pass
    segs = segments(store_path)
    assert first_lsn(segs[-1]) == 61  # the empty one
    r = compact(store_path)
    meta = assert_snapshot_is_model(snap_of(r), tmp_path / "x")
    assert meta.epoch == 60 and r.segments[-1] == segs[-2]
    # The chain is the seal of the segment holding epoch 60: the log continues
    # in the segment after it, which the recovery ladder checks.
    assert check_link(store_path / "wal", meta) is None
    assert compact(store_path).skipped == "nothing_new"


def test_triggers_skip(store_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 100)
    assert compact(store_path, min_tail_bytes=1 << 30).skipped == "below_trigger"
    assert compact(store_path, min_tail_records=101).skipped == "below_trigger"
    assert list_snapshots(store_path / "snapshots") == []
    r = compact(store_path, min_tail_bytes=1 << 30, min_tail_records=100)  # any trigger fires
    assert r.skipped is None and r.epochs[-1] == 100
    assert compact(store_path).skipped == "nothing_new"


def test_damaged_newest_snapshot_is_walked_past_and_kept(
    writer: statelog.StateStore, store_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="statelog")
    commits(writer, 1, 80)
    r1 = compact(store_path, retain=3)
    commits(writer, 81, 160)
    r2 = compact(store_path, retain=3)
    bad = snap_of(r2)
    flip_bit(bad, bad.stat().st_size // 2)  # in the body
    commits(writer, 161, 240)
    r3 = compact(store_path, retain=3)
    assert r3.base == r1.snapshot and bad in r3.damaged
    assert r3.epochs.start == r1.epochs[-1] + 1
    assert_snapshot_is_model(snap_of(r3), tmp_path / "x")
    assert bad.exists()  # evidence, never deleted
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("event=snapshot_damaged" in r.getMessage() and bad.name in r.getMessage()
               for r in errors)  # fmt: skip


def test_damaged_segment_folds_the_clean_prefix(
    store_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 150)
    segs = segments(store_path)
    first = frames(segs[2])[0]
    flip_bit(segs[2], first.offset + 16 + 3)  # a payload byte of its first record
    r = compact(store_path, retain=5)
    assert r.segments == tuple(segs[:2]) and r.damaged == (segs[2],)
    assert r.epochs[-1] == first_lsn(segs[2]) - 1
    assert_snapshot_is_model(snap_of(r), tmp_path / "x")
    assert events(caplog, "segment_damaged")
    assert segs[2].exists()


@pytest.mark.parametrize("damage", ["unsealed", "missing"])
def test_fold_stops_before_an_unsealed_or_missing_segment(
    store_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    caplog.set_level(logging.INFO, logger="statelog")
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 150)
    segs = segments(store_path)
    if damage == "unsealed":  # as the writer leaves one after a failed sync
        truncate(segs[2], -24)
    else:
        segs[2].unlink()
    r = compact(store_path, retain=5)
    assert r.segments == tuple(segs[:2]) and r.epochs[-1] == first_lsn(segs[2]) - 1
    assert_snapshot_is_model(snap_of(r), tmp_path / "x")
    assert events(caplog, "unsealed_segment_blocks" if damage == "unsealed" else "log_gap")
    assert all(p.exists() for p in segs[3:])


def test_no_verified_snapshot_and_log_gone_skips(
    writer: statelog.StateStore, store_path: Path
) -> None:
    commits(writer, 1, 100)
    only = snap_of(compact(store_path, retain=1))
    assert first_lsn(segments(store_path)[0]) > 1  # retention removed the early log
    flip_bit(only, 70)
    commits(writer, 101, 200)
    r = compact(store_path, retain=1)
    assert r.skipped == "no_base" and only in r.damaged
    assert list_snapshots(store_path / "snapshots") == [(*_name(only), only)]


def _name(p: Path) -> tuple[int, int]:
    e, lsn = p.name.removesuffix(".snap").split("-")
    return int(e, 16), int(lsn, 16)


def test_stop_abandons_the_pass(store_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 50)
    r = compact(store_path, stop=lambda: True)
    assert r.skipped == "interrupted" and r.snapshot is None
    assert list(store_path.joinpath("snapshots").iterdir()) == []
    assert not (store_path / SCRATCH_DIR).exists()


def test_leftovers_of_a_dead_compactor_are_cleared(store_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 50)
    (store_path / SCRATCH_DIR).mkdir()
    (store_path / SCRATCH_DIR / "work.mdb").write_bytes(b"junk")
    stray = store_path / "snapshots" / "0000000000000032-0000000000000032.snap.tmp"
    stray.write_bytes(b"half a snapshot")
    assert list_snapshots(store_path / "snapshots") == []  # a .tmp is never a snapshot
    r = compact(store_path)
    assert not stray.exists() and not (store_path / SCRATCH_DIR).exists()
    verify_snapshot(FileLayer(), snap_of(r), store_id=None)


def test_one_compactor_per_store(store_path: Path, tmp_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 10)
    with CompactorLock(store_path) as held:
        with pytest.raises(CompactorLockedError, match=f"process {os.getpid()}") as e:
            compact(store_path)
        assert "hint:" in str(e.value)
        assert compact(store_path, lock=held).skipped is None  # the holder may compact
    with pytest.raises(StoreNotFoundError):
        compact(tmp_path / "nowhere")
    with pytest.raises(InvalidOptionError):
        compact(store_path, retain=0)


# -- retention and pins -----------------------------------------------------------


def test_retention_keeps_n_and_deletes_covered_segments(
    writer: statelog.StateStore, store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="statelog")
    files = FileLayer()
    for round_ in range(5):
        commits(writer, round_ * 60 + 1, round_ * 60 + 60)
        before = set(list_segments(store_path / "wal"))
        r = compact(store_path, retain=2)
        snaps = list_snapshots(store_path / "snapshots")
        assert len(snaps) == min(round_ + 1, 2)
        oldest = verify_snapshot(files, snaps[-1][2], store_id=writer.store_id)
        left = list_segments(store_path / "wal")
        # The log left starts exactly where replay from the oldest kept snapshot starts.
        assert left[0][1] == oldest.lsn + 1, (left[0], oldest.lsn)
        gone = [s for s in before if s not in left]
        assert all(lsn <= oldest.lsn for _, lsn, _ in gone)
        assert {p for _, _, p in gone} <= set(r.deleted)
        for p in r.deleted:
            assert events(caplog, "deleted") and any(
                f"file={p.parent.name}/{p.name} " in m for m in events(caplog, "deleted")
            ), p
    assert writer.epoch == 300


def test_pinned_files_survive_retention_until_released(
    writer: statelog.StateStore, store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="statelog")
    commits(writer, 1, 60)
    first = snap_of(compact(store_path, retain=1))
    commits(writer, 61, 160)
    segs = segments(store_path)
    names = [f"snapshots/{first.name}", f"wal/{segs[0].name}"]
    with pin(store_path, names, purpose="test restore") as p:
        assert not p.missing
        r = compact(store_path, retain=1)
        assert r.skipped is None
        assert first.exists() and segs[0].exists() and segs[1].exists()  # no hole after a pin
        assert first not in r.deleted and segs[0] not in r.deleted
        assert len(events(caplog, "deletion_deferred")) == 2
    r = compact(store_path, retain=1)
    assert r.skipped == "nothing_new"
    assert not first.exists() and not segs[0].exists() and not segs[1].exists()
    assert first in r.deleted and segs[0] in r.deleted


# -- the daemon ---------------------------------------------------------------------


def run_cli(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "compactor", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_daemon(*args: str | Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PY, "-m", "compactor", *map(str, args)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_for(proc: subprocess.Popen[bytes], needle: str, timeout: float = 30) -> str:
    """Read ``proc``'s stderr until a line contains ``needle``; return everything read."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while needle.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {needle!r} within {timeout}s: {seen.decode()[-2000:]}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"daemon exited ({proc.wait()}) before {needle!r}: {seen.decode()}"
            seen += chunk
    return seen.decode()


def test_once_exit_codes_and_log_lines(store_path: Path, tmp_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 80)
    done = run_cli("--once", "--min-tail-bytes", "0", store_path)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines and all(LINE.match(line) for line in lines), done.stderr
    assert any("event=snapshot_written" in line and f"store={store_path}" in line for line in lines)
    assert_snapshot_is_model(list_snapshots(store_path / "snapshots")[0][2], tmp_path / "x")
    below = run_cli("--once", store_path)  # default trigger: 64 MiB, far above this tail
    assert below.returncode == 0 and "reason=nothing_new" in below.stderr
    missing = run_cli("--once", tmp_path / "nowhere")
    assert missing.returncode == 3 and "event=store_missing" in missing.stderr
    assert "holds no statelog store" in missing.stderr
    bad = run_cli("--once", "--retain", "0", store_path)
    assert bad.returncode == 3 and "--retain" in bad.stderr
    helped = run_cli("--help")
    assert helped.returncode == 0 and "4  a store is being compacted" in helped.stdout


def test_a_round_that_folded_is_followed_at_once_and_an_idle_one_sleeps(
    store_path: Path,
) -> None:
    """After a pass that wrote a snapshot the daemon looks again at once (the writer
    may have sealed more meanwhile); after one that folded nothing it sleeps."""
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 40)
    daemon = start_daemon("--interval", "60", "--min-tail-bytes", "0", store_path)
    try:
        started = time.monotonic()
        seen = wait_for(daemon, "reason=nothing_new", timeout=20)
        assert time.monotonic() - started < 20  # not a 60 s sleep after the folding pass
        assert seen.index("event=snapshot_written") < seen.index("reason=nothing_new")
        assert daemon.stderr is not None
        time.sleep(2.0)
        ready, _, _ = select.select([daemon.stderr.fileno()], [], [], 0)
        more = os.read(daemon.stderr.fileno(), 65536).decode() if ready else ""
        assert "event=compaction_skipped" not in more  # asleep for its interval: no third pass
        assert "event=snapshot_written" not in more and seen.count("event=snapshot_written") == 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=10) == 0


def test_sigusr1_starts_the_next_round_now_and_sigterm_still_stops(store_path: Path) -> None:
    """The wake signal ends the interval's sleep (a writer sends it on each seal); it
    neither stops the daemon nor is taken for a stop, and one that arrives while a
    stop is pending does not hide the stop."""
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 40)
    daemon = start_daemon("--interval", "600", "--min-tail-bytes", "0", store_path)
    try:
        wait_for(daemon, "reason=nothing_new")  # folded, looked again, now asleep
        with statelog.open(store_path, segment_bytes=SEG) as s:
            commits(s, 41, 80)
        daemon.send_signal(signal.SIGUSR1)
        seen = wait_for(daemon, "reason=nothing_new", timeout=20)
        assert "event=snapshot_written" in seen  # the woken round folded the new segments
        assert daemon.poll() is None
        daemon.send_signal(signal.SIGUSR1)
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=10) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_second_daemon_exits_4_and_sigterm_stops_gracefully(store_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 40)
    first = start_daemon("--interval", "60", "--min-tail-bytes", "0", store_path)
    try:
        wait_for(first, "event=pass_done")
        second = run_cli("--once", store_path)
        assert second.returncode == 4, second.stderr
        assert f"being compacted by process {first.pid}" in second.stderr
        started = time.monotonic()
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=10) == 0
        assert time.monotonic() - started < 3  # woke from its 60 s sleep at once
        assert first.stderr is not None and b"event=stopped" in first.stderr.read()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    after = run_cli("--once", store_path)  # the lock went with the daemon
    assert after.returncode == 0, after.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_passes_exits_0_promptly(
    writer: statelog.StateStore, store_path: Path, sig: signal.Signals, tmp_path: Path
) -> None:
    commits(writer, 1, 200)
    proc = start_daemon("--interval", "0.01", "--min-tail-bytes", "0", "--retain", "2", store_path)
    try:
        wait_for(proc, "event=pass_done")
        for i in range(201, 260):  # keep it folding while the signal lands
            commit(writer, i)
        started = time.monotonic()
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for _, _, p in list_snapshots(store_path / "snapshots"):
        assert_snapshot_is_model(p, tmp_path / "x")
    CompactorLock(store_path).release()  # released: nothing holds it


def test_progress_reports_every_segment_folded_and_the_end(store_path: Path) -> None:
    from tests.helpers import build_store, simple_commits

    build_store(store_path, simple_commits(60, value_size=200), segment_bytes=4096)
    calls: list[tuple[str, int, int]] = []
    result = compact(
        store_path, progress=lambda item, done, total: calls.append((item, done, total))
    )
    assert result.snapshot is not None and len(result.segments) > 2
    *each, last = calls
    assert [item.split("/")[-1] for item, _d, _t in each] == [p.name for p in result.segments]
    total = last[2]
    assert last == ("folded", total, total) and total > 0
    assert [d for _i, d, _t in each] == sorted(d for _i, d, _t in each)


# -- rule H5: a fenced writer's segment is never folded -------------------------
#
# | zombie's segment                         | expected                                   |
# |------------------------------------------|--------------------------------------------|
# | after a higher generation in the tail    | fold stops before it; retention keeps the  |
# |                                          | higher-generation segment; next pass skips |
# | after the base snapshot's last segment   | nothing folded; that segment kept          |
# | recovery moved it aside                  | the writer's new segments fold again       |


def stamp(seg: Path, generation: int) -> None:
    """Write the writer generation into header bytes 52..59 (docs/format.md) and fix its crc."""
    data = bytearray(seg.read_bytes())
    struct.pack_into("<Q", data, 52, generation)
    struct.pack_into("<I", data, 60, mask(crc32c.crc32c(bytes(data[:60]))))
    seg.write_bytes(bytes(data))


def test_zombie_segment_stops_the_fold_and_survives_retention(
    store_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 150)
    segs = segments(store_path)
    stamp(segs[1], 2)
    stamp(segs[2], 1)  # written by the fenced generation after the takeover
    r = compact(store_path, retain=1)
    assert r.segments == tuple(segs[:2]) and r.damaged == (segs[2],)
    assert r.epochs[-1] == first_lsn(segs[2]) - 1
    assert_snapshot_is_model(snap_of(r), tmp_path / "x")
    assert any("fenced writer" in m for m in events(caplog, "segment_damaged"))
    assert r.deleted == ()  # segs[1] names generation 2: recovery's evidence stays
    again = compact(store_path, retain=1)
    assert again.skipped == "damaged" and again.deleted == () and segs[1].exists()
    with statelog.open(store_path, segment_bytes=SEG) as s:  # recovery sets the zombie aside
        assert s.epoch == first_lsn(segs[2]) - 1
        commits(s, s.epoch + 1, s.epoch + 60)
        epoch = s.epoch
    r = compact(store_path, retain=1)
    assert r.epochs[-1] == epoch and r.damaged == ()
    assert_snapshot_is_model(snap_of(r), tmp_path / "y")


def test_zombie_segment_right_after_the_base_snapshot_is_not_folded(
    store_path: Path, tmp_path: Path
) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 1, 150)
    assert compact(store_path, retain=1).snapshot is not None
    (covered,) = segments(store_path)  # retention kept the last segment the snapshot covers
    stamp(covered, 2)
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commits(s, 151, 250)
    zombie = segments(store_path)[1]
    stamp(zombie, 1)
    r = compact(store_path, retain=1)
    assert r.skipped == "damaged" and r.damaged == (zombie,) and r.deleted == ()
    assert covered.exists()
    with statelog.open(store_path, readonly=True) as ro:  # recovery agrees: cut at the zombie
        assert ro.epoch == 150 and (
            ro.recovery.rejected[0].path,
            ro.recovery.rejected[0].offset,
        ) == (
            zombie,
            0,
        )
