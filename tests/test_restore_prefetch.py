"""A restore downloads segments ahead of its checks, and what it fetched for nothing never
reaches the copy.

| case                                              | the restored copy holds                    |
|---------------------------------------------------|--------------------------------------------|
| every segment good                                | all of them; downloads ran in the thread   |
| a segment in the middle damaged                   | the segments before it, none after it      |
| a segment after the damaged one missing           | the same: its error was never asked for    |
| restored to an epoch                              | no segment after the one holding the epoch |
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from statelog.remote import restore, ship
from statelog.remote import staging as staging_mod
from tests.helpers import flip_bit
from tests.test_remote import commit_range, state_of

pytestmark = pytest.mark.timeout(120)


def _shipped(tmp_path: Path) -> tuple[str, Path, list[Path]]:
    """A store of 300 commits shipped to a directory: its url, and the segment objects in
    log order (no snapshot: the restore replays every one)."""
    url, src = f"file://{tmp_path / 'replica'}", tmp_path / "src"
    commit_range(src, 0, 300)
    ship(src, url)
    objects = sorted((tmp_path / "replica").rglob("*.wal"), key=lambda p: p.name)
    assert len(objects) >= 6, objects
    return url, src, objects


def _segments(dest: Path) -> list[str]:
    return sorted(p.name for p in (dest / "wal").iterdir())


def _downloads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    real = staging_mod.download

    def spied(client: Any, root: Any, files: Any, e: Any) -> Path:
        seen.append((e.name, threading.current_thread().name))
        return real(client, root, files, e)

    monkeypatch.setattr(staging_mod, "download", spied)
    return seen


def test_every_segment_good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, src, objects = _shipped(tmp_path)
    seen = _downloads(monkeypatch)
    got = restore(url, tmp_path / "dst")
    assert got.epoch == 300 and state_of(tmp_path / "dst") == state_of(src)
    assert _segments(tmp_path / "dst") == [p.name for p in objects]
    wal = [(n, t) for n, t in seen if n.endswith(".wal")]
    assert wal and all(t.startswith("statelog-fetch") for _n, t in wal), wal


@pytest.mark.parametrize("also", ["nothing", "the next one missing"])
def test_a_damaged_segment_leaves_none_after_it(
    tmp_path: Path, also: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _src, objects = _shipped(tmp_path)
    bad = len(objects) // 2
    flip_bit(objects[bad], objects[bad].stat().st_size // 2)
    if also == "the next one missing":
        objects[bad + 1].unlink()
    seen = _downloads(monkeypatch)
    got = restore(url, tmp_path / "dst")
    assert got.epoch < 300 and got.lost_epochs
    assert _segments(tmp_path / "dst") == [p.name for p in objects[:bad]]
    ahead = {n for n, _t in seen} & {p.name for p in objects[bad + 1 :]}
    assert ahead, seen  # fetched ahead, then removed
    assert not list((tmp_path / "dst" / "wal").glob("*.tmp"))


def test_a_restore_to_an_epoch_leaves_no_later_segment(tmp_path: Path) -> None:
    url, _src, objects = _shipped(tmp_path)
    got = restore(url, tmp_path / "dst", upto=40)
    assert got.epoch == 40
    names = _segments(tmp_path / "dst")
    last_first_lsn = int(names[-1].split("-")[1].split(".")[0], 16)
    assert last_first_lsn <= 40
    assert names == [p.name for p in objects[: len(names)]]
