"""Reusing an extracted base image across restarts (``statelog.storage.image_cache``).

| what the restart finds in ``base/``                | expected                                 |
|----------------------------------------------------|------------------------------------------|
| the image and stamp of the chosen snapshot, intact | reused (same inode), nothing extracted   |
| the image with one bit flipped                     | not reused: extracted again, state exact |
| a torn or edited stamp                             | not reused: extracted again              |
| a stamp of other snapshot bytes under the name     | not reused                               |
| the snapshot damaged since the stamp was written   | snapshot refused, the ladder walks back  |
| no stamp (an extraction killed before it)          | extracted again                          |
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.storage.image_cache import STAMP_SUFFIX
from tests.helpers import build_store, flip_bit, model_at, simple_commits, snapshot_of


def prepared(store: Path) -> tuple[list[dict[str, object]], Path]:
    """A store with a snapshot its writer has extracted (and stamped), closed."""
    models = build_store(store, simple_commits(12))
    snap = compact(store).snapshot
    assert snap is not None
    with statelog.open(store) as s:  # the open extracts the snapshot and stamps the image
        assert s.recovery.snapshot == snap
    return models, snap


def images(store: Path) -> list[Path]:
    return sorted((store / "base").glob("*.mdb"))


def reopen(store: Path, caplog: pytest.LogCaptureFixture) -> tuple[statelog.RecoveryReport, bool]:
    caplog.clear()
    replay_log = "statelog.recovery.replay"
    with caplog.at_level(logging.INFO, logger=replay_log), statelog.open(store) as s:
        report = s.recovery
        state = snapshot_of(s)
    reused = "event=image_reused" in caplog.text
    return report, reused and bool(state)


def test_intact_image_is_reused_without_extracting(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    models, snap = prepared(store_path)
    (image,) = images(store_path)
    inode = image.stat().st_ino
    report, reused = reopen(store_path, caplog)
    assert reused and report.snapshot == snap and report.epoch == 12
    assert [p.stat().st_ino for p in images(store_path)] == [inode]
    with statelog.open(store_path, readonly=True) as ro:
        assert snapshot_of(ro) == model_at(models, 12)


@pytest.mark.parametrize("damage", ["image bit", "stamp torn", "stamp edited", "stamp gone"])
def test_anything_doubtful_is_extracted_again(
    store_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    models, snap = prepared(store_path)
    (image,) = images(store_path)
    stamp = image.with_name(image.name + STAMP_SUFFIX)
    if damage == "image bit":
        flip_bit(image, image.stat().st_size // 3)
    elif damage == "stamp torn":
        stamp.write_bytes(stamp.read_bytes()[:40])
    elif damage == "stamp edited":
        outer = json.loads(stamp.read_bytes())
        edited = outer["body"].replace('"lsn":12', '"lsn":11')
        assert edited != outer["body"]
        stamp.write_text(json.dumps({**outer, "body": edited}))
    else:
        stamp.unlink()
    report, reused = reopen(store_path, caplog)
    assert not reused and report.snapshot == snap and report.epoch == 12
    with statelog.open(store_path) as s:
        assert snapshot_of(s) == model_at(models, 12)


def test_stamp_of_other_bytes_under_the_same_name_is_not_trusted(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _models, snap = prepared(store_path)
    # The same snapshot name with other (valid) bytes: the footer hash differs.
    other = store_path.parent / "other"
    build_store(other, simple_commits(12, value_size=9))
    other_snap = compact(other).snapshot
    assert other_snap is not None and other_snap.name == snap.name
    (image,) = images(store_path)
    stamp = image.with_name(image.name + STAMP_SUFFIX)
    doc = stamp.read_bytes()
    snap.write_bytes(other_snap.read_bytes())  # foreign: refused by its store id anyway
    stamp.write_bytes(doc)
    report, reused = reopen(store_path, caplog)
    assert not reused
    assert [r.path for r in report.rejected][:1] == [snap]


def test_snapshot_damaged_since_is_refused_even_with_a_matching_stamp(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _models, snap = prepared(store_path)
    flip_bit(snap, 40)  # the header: the footer (and so the stamp's record of it) unchanged
    report, reused = reopen(store_path, caplog)
    assert not reused
    assert [r.path for r in report.rejected] == [snap]
    assert report.snapshot is None and report.epoch == 12
