"""Retention by time: ``--retain-for`` keeps every epoch of its window restorable.

| situation                                        | expected                                   |
|--------------------------------------------------|--------------------------------------------|
| passes with a window, one commit every 10 s      | every epoch from the window's start opens  |
|                                                  | as the model; what is older is deleted     |
| a window and ``--retain N`` together             | the union: the stricter keep wins          |
| snapshots whose meta names no commit time        | their write time stands in (never later)   |
| the remote, shipping with a window               | a restore of the window's first epoch      |
| ``--retain-for`` values: 90s, 30m, 1.5h, 7d, 30  | accepted; 0, -5, 1w, "" refused (usage)    |
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.cli import main as cli_main
from statelog.compaction.fold import compact
from statelog.compaction.window import meta_time
from statelog.kit.workload import Stream, run_commit, store_digest
from statelog.recovery.timeline import oldest_restorable
from statelog.storage.snapshots import SnapshotMeta
from tests.s3server import Remote, remote, s3  # noqa: F401
from tests.test_remote_wiring import env  # noqa: F401

STREAM = Stream(seed=31)
T0 = 1_796_400_000.0  # seconds
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A settable clock (seconds) behind ``time.time`` and ``time.time_ns``."""
    now = [T0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    monkeypatch.setattr(time, "time_ns", lambda: int(now[0] * 1e9))
    return now


def run(root: Path, clock: list[float], commits: int, **retention: Any) -> None:
    """Commit 1..commits, one every 10 s, a pass (with ``retention``) every 25."""
    with statelog.open(root, segment_bytes=16 << 10) as w:
        for i in range(1, commits + 1):
            clock[0] = T0 + 10 * i
            run_commit(w, STREAM.commit(i))
            if i % 25 == 0:
                compact(root, min_tail_bytes=0, **retention)


def check(root: Path, n: int) -> None:
    with statelog.open(root, readonly=True, at=n) as v:
        assert v.epoch == n and store_digest(v) == STREAM.model(n).digest(), n


def test_a_window_keeps_every_epoch_from_its_start(tmp_path: Path, clock: list[float]) -> None:
    root = tmp_path / "s"
    run(root, clock, 300, retain=1, retain_for=timedelta(minutes=20))
    start = 300 - 120  # the last pass ran at epoch 300; 20 min is 120 commits back
    oldest = oldest_restorable(root)
    assert oldest is not None and oldest <= start
    for n in (start, start + 1, 250, 300):
        check(root, n)
    assert oldest > start - 50  # what the window does not need was deleted
    with pytest.raises(statelog.EpochUnavailableError):
        statelog.open(root, readonly=True, at=oldest - 1)


def test_without_a_window_the_count_alone_decides(tmp_path: Path, clock: list[float]) -> None:
    root = tmp_path / "s"
    run(root, clock, 300, retain=1)
    oldest = oldest_restorable(root)
    assert oldest is not None and oldest > 300 - 120  # the window above is what kept more


def test_a_window_and_a_count_keep_their_union(tmp_path: Path, clock: list[float]) -> None:
    root = tmp_path / "s"
    run(root, clock, 300, retain=10, retain_for=timedelta(minutes=5))
    by_count = sorted((root / "snapshots").glob("*.snap"))
    assert len(by_count) >= 10  # the count keeps more than the 5 min window needs
    other = tmp_path / "t"
    run(other, clock, 300, retain=1, retain_for=timedelta(minutes=30))
    check(other, 300 - 180)  # the window keeps more than one snapshot


def test_snapshots_without_a_commit_time_use_their_write_time() -> None:
    meta = SnapshotMeta(uuid.uuid4(), 1, 1, 0, {}, 0, {}, 0, created_ms=5_000)
    assert meta_time(meta) == 5_000
    assert meta_time(dataclasses.replace(meta, commit_ms=4_000)) == 4_000


def test_the_remote_keeps_its_window(tmp_path: Path, env: Remote, clock: list[float]) -> None:  # noqa: F811
    from statelog.remote import ship

    root = tmp_path / "s"
    with statelog.open(root, segment_bytes=16 << 10) as w:
        for i in range(1, 301):
            clock[0] = T0 + 10 * i
            run_commit(w, STREAM.commit(i))
            if i % 25 == 0:
                compact(root, min_tail_bytes=0, retain=20)  # locally: keep everything
                ship(root, env.url, retain=1, retain_for=timedelta(minutes=20))
    start = 300 - 120
    dest = tmp_path / "r"
    assert cli_main(["restore", env.url, str(dest), "--epoch", str(start)]) == 0
    with statelog.open(dest) as r:
        assert r.epoch == start and store_digest(r) == STREAM.model(start).digest()
    assert cli_main(["restore", env.url, str(tmp_path / "x"), "--epoch", "60"]) == 2


@pytest.mark.parametrize(
    ("value", "ok"),
    [("90s", True), ("30m", True), ("1.5h", True), ("7d", True), ("30", True),
     ("0", False), ("-5", False), ("1w", False), ("", False)],
)  # fmt: skip
def test_retain_for_values(tmp_path: Path, value: str, ok: bool) -> None:
    root = tmp_path / "s"
    with statelog.open(root) as w:
        w.commit(offsets={"p": 1}, low_watermark_ms=0)
    code = cli_main(["compact", str(root), "--retain-for", value])
    assert (code == 0) == ok and (ok or code == 3)
    daemon = subprocess.run(
        [sys.executable, "-m", "compactor", "--once", "--retain-for", value, str(root)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (daemon.returncode == 0) == ok, daemon.stderr
    if not ok:
        assert daemon.returncode == 2 and "duration" in daemon.stderr
