"""Retention by time: ``--retain-for`` keeps every epoch committed in its window restorable.

The stores below commit epoch ``i`` at ``T0 + 10 s * i`` (a clock set while
they write) and take a snapshot every 10 epochs with the writer closed, so
snapshot ``10k`` has exactly the time of epoch ``10k``. Retention then runs
with an explicit window end (``now_ms``) or, through the daemon and
``ship``, on the real clock with a window measured back to the same start.

| case                                      | expected                                        |
|-------------------------------------------|-------------------------------------------------|
| window from epoch 45's time, full snaps   | 40 (newest at or before it) and later kept;     |
|                                           | 10-30 and their log deleted; 40-80 open         |
|                                           | read-only as the model; epoch 39 is gone        |
| window from exactly epoch 40's time       | 40 is "at or before": it anchors, 30 goes       |
| window from 1 ms before epoch 40's time   | 30 anchors and is kept                          |
| a window and ``retain=N``                 | the union: whichever keeps more, both ways      |
| no window, ``retain=1``                   | only the newest snapshot                        |
| the anchor is a delta snapshot            | its chain (full and deltas below) is kept       |
| a store younger than its window           | every snapshot and segment kept; epoch 1 opens  |
| the only snapshot old enough is damaged   | no restore point anchors: the log is kept       |
| ``compact(retain_for=)`` while committing | every epoch from the window's start opens       |
| a snapshot meta without a commit time     | its write time (``created_ms``) stands in       |
| ``retain_for`` 0, negative, not timedelta | ``InvalidOptionError`` with a hint; nothing     |
|   (compact, retention, remote, ship)      |   deleted (ship: nothing uploaded)              |
| daemon ``--retain-for`` values            | 90s 30m 1h 1.5h 7d 30 parse; 0 -5 1w "" 1e3     |
|   (and ``--remote-retain-for``)           | 0.0001 99999999999d: usage error, exit 3, hint  |
| ``--remote-retain-for`` without remote    | refused, exit 3                                 |
| ``statelog compact --retain-for``         | keeps 40 onwards; bad: exit 3 (its usage        |
|                                           | status), nothing deleted                        |
| the daemon with ``--retain-for``          | its pass keeps snapshot 40 onwards              |
| shipping                                  | each snapshot entry's ``time_ms`` is its time   |
| remote retention with a window (S3)       | 40 onwards kept; restore of epoch 46 is the     |
|                                           | model, of epoch 39 exits 2                      |
| remote entries without ``time_ms``        | never old enough: kept, and the log with them   |
| a remote younger than its window          | nothing deleted                                 |
| the daemon with ``--remote-retain-for``   | the remote keeps snapshot 40 onwards            |
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

import statelog
from compactor.options import parse_args
from statelog.cli import main as cli_main
from statelog.compaction.fold import compact
from statelog.compaction.retention import apply_retention
from statelog.compaction.window import meta_time
from statelog.errors import EpochUnavailableError, InvalidOptionError
from statelog.kit.workload import Stream, run_commit, store_digest
from statelog.recovery.timeline import oldest_restorable
from statelog.remote import RemoteClient, apply_remote_retention, read_manifest, ship
from statelog.remote.manifest import Manifest
from statelog.remote.manifest import commit as commit_manifest
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.snapshots import SnapshotMeta, list_snapshots, verify_snapshot
from tests.s3server import Remote, remote, s3  # noqa: F401
from tests.test_remote_wiring import env  # noqa: F401

STREAM = Stream(seed=31)
STEP_MS = 10_000  # one commit every 10 s
# Two hours ago, on the real clock, so windows measured on it reach the same epochs.
T0_MS = (time.time_ns() // 1_000_000 // 1000 - 7200) * 1000
REPO = Path(__file__).resolve().parent.parent
FILES = FileLayer()


def t_ms(epoch: int) -> int:
    """When epoch ``epoch`` was committed (Unix ms)."""
    return T0_MS + STEP_MS * epoch


def since(epoch: float) -> str:
    """A ``--retain-for`` value (seconds) whose window starts at ``epoch``'s time, now."""
    return f"{(time.time_ns() // 1_000_000 - T0_MS - STEP_MS * epoch) / 1000:.3f}"


def build(root: Path, passes: int = 8, *, max_chain: int = 0) -> None:
    """Commit 1..10*passes; after every 10, close the writer and compact, keeping everything
    (a window longer than the store's life keeps the log from epoch 1 as well)."""
    with pytest.MonkeyPatch.context() as mp:
        now_ns = [T0_MS * 1_000_000]
        mp.setattr(time, "time_ns", lambda: now_ns[0])
        mp.setattr(time, "time", lambda: now_ns[0] / 1e9)
        for p in range(passes):
            with statelog.open(root, segment_bytes=16 << 10) as w:
                for i in range(10 * p + 1, 10 * p + 11):
                    now_ns[0] = t_ms(i) * 1_000_000
                    run_commit(w, STREAM.commit(i))
            compact(root, min_tail_bytes=0, max_chain=max_chain, retain_for=timedelta(days=999))


@pytest.fixture(scope="module")
def full_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Snapshots at epochs 10..80, all full."""
    root = tmp_path_factory.mktemp("full") / "s"
    build(root)
    assert snapshot_epochs(root) == list(range(10, 81, 10))
    assert oldest_restorable(root) == 1
    return root


def copy(src: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "s"
    shutil.copytree(src, dest, symlinks=True)
    return dest


def snapshot_epochs(root: Path) -> list[int]:
    return sorted(int(p.name.split("-")[0], 16) for p in (root / "snapshots").glob("*.snap"))


def sid_of(root: Path) -> uuid.UUID:
    return StoreLayout(root).read_identity(FILES)


def check(root: Path, n: int) -> None:
    """Epoch ``n`` opens read-only as the model's state."""
    with statelog.open(root, readonly=True, at=n) as v:
        assert v.epoch == n and store_digest(v) == STREAM.model(n).digest(), n


def retain_locally(
    root: Path, *, retain: int, window: timedelta | None, start_epoch: float
) -> None:
    """Retention whose window starts at the time of (fractional) epoch ``start_epoch``."""
    start = T0_MS + int(STEP_MS * start_epoch)
    now = start + (int(window.total_seconds() * 1000) if window else 0)
    apply_retention(root, FILES, sid_of(root), retain=retain, retain_for=window, now_ms=now)


WINDOW = timedelta(minutes=30)


@pytest.mark.parametrize(
    ("start_epoch", "anchor"),
    [(45, 40), (40, 40), (40 - 0.0001, 30)],  # the last: 1 ms before epoch 40's commit
)
def test_the_newest_snapshot_at_or_before_the_start_and_all_after_survive(
    full_store: Path, tmp_path: Path, start_epoch: float, anchor: int
) -> None:
    root = copy(full_store, tmp_path)
    retain_locally(root, retain=1, window=WINDOW, start_epoch=start_epoch)
    assert snapshot_epochs(root) == list(range(anchor, 81, 10))
    assert oldest_restorable(root) == anchor  # the log before the anchor went too
    for n in (anchor, int(start_epoch) + 1, 80):
        check(root, n)
    with pytest.raises(EpochUnavailableError):  # one epoch older: its snapshot is gone
        statelog.open(root, readonly=True, at=anchor - 1)


@pytest.mark.parametrize(
    ("retain", "start_epoch", "oldest"),
    [
        (1, 45, 40),  # the window alone
        (6, 75, 30),  # the count keeps more than the window (70)
        (2, 45, 40),  # the window keeps more than the count (70)
        (1, None, 80),  # no window: the count alone
    ],
)
def test_a_window_and_a_count_keep_their_union(
    full_store: Path, tmp_path: Path, retain: int, start_epoch: int | None, oldest: int
) -> None:
    root = copy(full_store, tmp_path)
    window = WINDOW if start_epoch is not None else None
    retain_locally(root, retain=retain, window=window, start_epoch=start_epoch or 80)
    assert snapshot_epochs(root) == list(range(oldest, 81, 10))
    check(root, oldest)


def test_a_delta_anchor_keeps_its_chain(tmp_path: Path) -> None:
    root = tmp_path / "s"
    build(root, 6, max_chain=8)
    metas = {
        e: verify_snapshot(FILES, path, store_id=sid_of(root))
        for e, _l, path in list_snapshots(root / "snapshots")
    }
    delta = metas[40].delta
    assert delta is not None and delta.parent.startswith(f"{30:016x}-")  # 40 is a delta on 30
    retain_locally(root, retain=1, window=WINDOW, start_epoch=45)
    assert snapshot_epochs(root) == [30, 40, 50, 60]  # 30: the anchor's chain
    assert oldest_restorable(root) == 40  # the log before 40 went
    check(root, 41)
    with pytest.raises(EpochUnavailableError):
        statelog.open(root, readonly=True, at=39)


def test_a_store_younger_than_its_window_keeps_everything(full_store: Path, tmp_path: Path) -> None:
    root = copy(full_store, tmp_path)
    retain_locally(root, retain=1, window=timedelta(hours=1), start_epoch=-10)
    assert snapshot_epochs(root) == list(range(10, 81, 10))
    assert oldest_restorable(root) == 1  # epochs 1-9 are only in the log
    check(root, 1)


def test_a_window_whose_only_old_enough_snapshot_is_damaged_keeps_the_log(
    full_store: Path, tmp_path: Path
) -> None:
    root = copy(full_store, tmp_path)
    (first,) = (root / "snapshots").glob(f"{10:016x}-*.snap")
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x40
    first.write_bytes(bytes(data))
    retain_locally(root, retain=1, window=WINDOW, start_epoch=15)
    assert snapshot_epochs(root) == list(range(10, 81, 10))  # 10 kept as evidence
    assert oldest_restorable(root) == 1  # no snapshot anchors the window: the log does
    check(root, 16)


def test_passes_with_a_window_keep_every_epoch_from_its_start(tmp_path: Path) -> None:
    """``compact(retain_for=)`` while committing: passes every 25 commits, window 20 min."""
    root = tmp_path / "s"
    with pytest.MonkeyPatch.context() as mp:
        now_ns = [T0_MS * 1_000_000]
        mp.setattr(time, "time_ns", lambda: now_ns[0])
        mp.setattr(time, "time", lambda: now_ns[0] / 1e9)
        with statelog.open(root, segment_bytes=16 << 10) as w:
            for i in range(1, 301):
                now_ns[0] = t_ms(i) * 1_000_000
                run_commit(w, STREAM.commit(i))
                if i % 25 == 0:
                    compact(root, min_tail_bytes=0, retain=1, retain_for=timedelta(minutes=20))
    start = 300 - 120  # the last pass ran at epoch 300; 20 min is 120 commits back
    oldest = oldest_restorable(root)
    assert oldest is not None and start - 50 < oldest <= start
    for n in (oldest, start + 1, 300):
        check(root, n)
    with pytest.raises(EpochUnavailableError):
        statelog.open(root, readonly=True, at=oldest - 1)


def test_snapshots_without_a_commit_time_use_their_write_time() -> None:
    meta = SnapshotMeta(uuid.uuid4(), 1, 1, 0, {}, 0, {}, 0, created_ms=5_000)
    assert meta_time(meta) == 5_000
    assert meta_time(dataclasses.replace(meta, commit_ms=4_000)) == 4_000


BAD_WINDOWS = [timedelta(0), timedelta(seconds=-5), 30, "1h"]


@pytest.mark.parametrize("bad", BAD_WINDOWS)
def test_a_bad_window_is_refused_before_anything_is_deleted(
    full_store: Path, tmp_path: Path, bad: object
) -> None:
    root = copy(full_store, tmp_path)
    for call in (
        lambda: compact(root, retain=1, retain_for=bad),
        lambda: apply_retention(root, FILES, sid_of(root), retain=1, retain_for=bad),
    ):
        with pytest.raises(InvalidOptionError) as err:
            call()
        assert err.value.hint and "timedelta" in err.value.hint
    assert snapshot_epochs(root) == list(range(10, 81, 10))


GOOD = {
    "90s": timedelta(seconds=90),
    "30m": timedelta(minutes=30),
    "1h": timedelta(hours=1),
    "1.5h": timedelta(minutes=90),
    "7d": timedelta(days=7),
    "30": timedelta(seconds=30),
}
BAD = ["0", "-5", "1w", "", "1e3", "0.0001", "99999999999d"]


@pytest.mark.parametrize("value", sorted(GOOD))
def test_daemon_parses_good_durations(value: str) -> None:
    args, _ = parse_args(["--retain-for", value, "STORE"])
    assert args.retain_for == GOOD[value] and args.remote_retain_for is None


@pytest.mark.parametrize("flag", ["--retain-for", "--remote-retain-for"])
@pytest.mark.parametrize("value", BAD)
def test_daemon_refuses_bad_durations(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--remote", "s3://bucket/p", flag, value, "STORE"])
    assert exc.value.code == 3  # the usage status of both commands
    err = capsys.readouterr().err
    assert "duration" in err and "90s" in err  # the hint: what a duration looks like


def test_remote_retain_for_needs_remote(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--remote-retain-for", "1h", "STORE"])
    assert exc.value.code == 3 and "needs --remote" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "1w", "-5"])
def test_statelog_compact_refuses_bad_durations(
    full_store: Path, tmp_path: Path, value: str
) -> None:
    root = copy(full_store, tmp_path)
    assert cli_main(["compact", str(root), "--retain", "1", "--retain-for", value]) == 3
    assert snapshot_epochs(root) == list(range(10, 81, 10))


def test_statelog_compact_applies_retain_for(full_store: Path, tmp_path: Path) -> None:
    root = copy(full_store, tmp_path)
    assert cli_main(["compact", str(root), "--retain", "1", "--retain-for", since(45)]) == 0
    assert snapshot_epochs(root) == list(range(40, 81, 10))


def daemon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compactor", "--once", "--min-tail-bytes", "0", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=dict(os.environ),
    )  # fmt: skip


def test_the_daemon_applies_retain_for(full_store: Path, tmp_path: Path) -> None:
    root = copy(full_store, tmp_path)
    bad = daemon("--retain-for", "1w", str(root))
    assert bad.returncode == 3 and "not a duration" in bad.stderr
    done = daemon("--retain", "1", "--retain-for", since(45), str(root))
    assert done.returncode == 0, done.stderr
    assert "retain_for=" in done.stderr and "event=started" in done.stderr
    assert snapshot_epochs(root) == list(range(40, 81, 10))
    check(root, 46)


# -- the remote tier ---------------------------------------------------------------------


def shipped(full_store: Path, tmp_path: Path, url: str) -> tuple[Path, RemoteClient]:
    root = copy(full_store, tmp_path)
    (root / "remote.json").unlink(missing_ok=True)
    res = ship(root, url)
    assert res.retention is None
    return root, RemoteClient.from_url(url)


def remote_epochs(client: RemoteClient, sid: uuid.UUID) -> list[int]:
    got = read_manifest(client, sid)
    assert got is not None
    return sorted(e.epoch for e in got.manifest.snapshots)


def restore_code(url: str, dest: Path, epoch: int) -> int:
    return cli_main(["restore", url, str(dest), "--epoch", str(epoch)])


def test_remote_retention_keeps_its_window(
    full_store: Path,
    tmp_path: Path,
    env: Remote,  # noqa: F811
) -> None:
    root, client = shipped(full_store, tmp_path, env.url)
    sid = sid_of(root)
    got = read_manifest(client, sid)
    assert got is not None
    assert {e.epoch: e.time_ms for e in got.manifest.snapshots} == {
        n: t_ms(n) for n in range(10, 81, 10)
    }
    res = apply_remote_retention(
        client, sid, got.manifest.generation, retain=1, retain_for=WINDOW,
        now_ms=t_ms(45) + 1_800_000,
    )  # fmt: skip
    assert res.deleted
    assert remote_epochs(client, sid) == list(range(40, 81, 10))
    assert restore_code(env.url, tmp_path / "r", 46) == 0
    with statelog.open(tmp_path / "r", readonly=True) as r:
        assert r.epoch == 46 and store_digest(r) == STREAM.model(46).digest()
    assert restore_code(env.url, tmp_path / "x", 39) == 2


@pytest.mark.parametrize(
    ("untimed_through", "start_epoch", "oldest"),
    [
        (50, 45, 10),  # 40 and 50 have no time: never old enough, so everything stays
        (30, 45, 40),  # 40 has one: it anchors, the untimed ones before it go
        (0, -10, 10),  # a remote younger than its window
    ],
)
def test_remote_snapshots_of_unknown_time_are_kept(
    full_store: Path,
    tmp_path: Path,
    env: Remote,  # noqa: F811
    untimed_through: int,
    start_epoch: int,
    oldest: int,
) -> None:
    root, client = shipped(full_store, tmp_path, env.url)
    sid = sid_of(root)
    got = read_manifest(client, sid)
    assert got is not None
    gen = got.manifest.generation

    def untimed(m: Manifest) -> Manifest:
        # As a manifest written before entries carried a time reads.
        objects = tuple(
            msgspec.structs.replace(e, time_ms=0)
            if e.kind == "snapshot" and e.epoch <= untimed_through
            else e
            for e in m.objects
        )
        return msgspec.structs.replace(m, objects=objects)

    commit_manifest(client, sid, gen, untimed)
    segments = len(got.manifest.segments)
    apply_remote_retention(
        client, sid, gen, retain=1, retain_for=WINDOW, now_ms=t_ms(start_epoch) + 1_800_000
    )
    assert remote_epochs(client, sid) == list(range(oldest, 81, 10))
    after = read_manifest(client, sid)
    assert after is not None
    assert (len(after.manifest.segments) == segments) == (oldest == 10)
    assert restore_code(env.url, tmp_path / "r", oldest + 1) == 0


@pytest.mark.parametrize("bad", BAD_WINDOWS)
def test_a_bad_remote_window_is_refused(
    tmp_path: Path,
    env: Remote,  # noqa: F811
    bad: object,
) -> None:
    root = tmp_path / "s"
    with statelog.open(root) as w:
        w.commit(offsets={"p": 1}, low_watermark_ms=0)
    client = RemoteClient.from_url(env.url)
    with pytest.raises(InvalidOptionError):
        ship(root, env.url, retain_for=bad)
    assert read_manifest(client, sid_of(root)) is None  # nothing was shipped
    with pytest.raises(InvalidOptionError):
        apply_remote_retention(client, sid_of(root), 1, retain=1, retain_for=bad)


def test_the_daemon_applies_remote_retain_for(
    full_store: Path,
    tmp_path: Path,
    env: Remote,  # noqa: F811
) -> None:
    root = copy(full_store, tmp_path)
    (root / "remote.json").unlink(missing_ok=True)
    done = daemon(
        "--retain", "64", "--remote", env.url, "--remote-retain-for", since(45), str(root)
    )
    assert done.returncode == 0, done.stderr
    assert snapshot_epochs(root) == list(range(10, 81, 10))  # local: by --retain
    assert remote_epochs(RemoteClient.from_url(env.url), sid_of(root)) == list(range(40, 81, 10))
