"""Reusing an extracted base image across restarts (``statelog.storage.image_cache``).

| what the restart finds in ``base/``                | expected                                 |
|----------------------------------------------------|------------------------------------------|
| the image and stamp of the chosen snapshot, intact | reused (same inode), nothing extracted   |
| a stamp not yet settled (the first restart)        | both files checked whole, stamp settled  |
| a settled stamp, both files unchanged              | reused without reading either file       |
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
from statelog.compaction.logfmt import LOGGER
from statelog.storage import image_cache
from statelog.storage.fileio import FileLayer
from statelog.storage.image_cache import reusable_image
from statelog.storage.image_stamp import STAMP_SUFFIX, stamp_of
from statelog.storage.whole_checks import forget_all
from tests.helpers import build_store, flip_bit, model_at, simple_commits, snapshot_of


def prepared(store: Path) -> tuple[list[dict[str, object]], Path]:
    """A store with a snapshot its writer has extracted and stamped, then settled, closed."""
    models = build_store(store, simple_commits(12))
    snap = compact(store).snapshot
    assert snap is not None
    for p in (store / "base").iterdir():  # the compactor's image: the writer extracts its own
        p.unlink()
    with statelog.open(store) as s:  # the open extracts the snapshot and stamps the image
        assert s.recovery.snapshot == snap
    (image,) = images(store)
    assert "settled" not in stamp_body(image)
    with statelog.open(store) as s:  # checks both files whole, then settles the stamp
        assert s.recovery.snapshot == snap
    assert "settled" in stamp_body(image)
    forget_all()  # a restart is a new process: nothing checked yet
    return models, snap


def stamp_body(image: Path) -> dict[str, object]:
    body: dict[str, object] = json.loads(json.loads(stamp_of(image).read_bytes())["body"])
    return body


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


def test_a_settled_restart_reads_neither_file(
    store_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    models, snap = prepared(store_path)

    def whole_read(*_args: object) -> object:
        raise AssertionError("a settled restart read a whole file")

    monkeypatch.setattr(image_cache, "image_crc", whole_read)
    monkeypatch.setattr(image_cache, "_hashes_to_footer", whole_read)
    report, reused = reopen(store_path, caplog)
    assert reused and report.snapshot == snap and report.epoch == 12
    with statelog.open(store_path) as s:
        assert snapshot_of(s) == model_at(models, 12)


class _Recording(FileLayer):
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def fsync_file(self, path: Path) -> None:
        self.calls.append(f"fsync {path.name}")
        super().fsync_file(path)

    def rename(self, src: Path, dst: Path) -> None:
        self.calls.append(f"rename {dst.name}")
        super().rename(src, dst)


def test_a_stamp_is_settled_only_after_the_image_is_fsynced(store_path: Path) -> None:
    build_store(store_path, simple_commits(12))
    snap = compact(store_path).snapshot
    assert snap is not None
    for p in (store_path / "base").iterdir():
        p.unlink()
    with statelog.open(store_path) as s:
        store_id = s.store_id
    (image,) = images(store_path)
    # Without a layer to write with (verify, a compactor looking at the writer's base/),
    # nothing is settled or written.
    before = stamp_of(image).read_bytes()
    assert reusable_image(image.parent, snap, store_id=store_id) is not None
    assert stamp_of(image).read_bytes() == before and "settled" not in stamp_body(image)
    calls: list[str] = []
    found = reusable_image(image.parent, snap, store_id=store_id, files=_Recording(calls))
    assert found is not None and found[0] == image
    assert calls == [f"fsync {image.name}", f"rename {stamp_of(image).name}"]
    assert stamp_body(image)["settled"] == {
        "image": {"ino": image.stat().st_ino, "size": image.stat().st_size,
                  "mtime_ns": image.stat().st_mtime_ns},
        "snapshot": {"ino": snap.stat().st_ino, "size": snap.stat().st_size,
                     "mtime_ns": snap.stat().st_mtime_ns},
    }  # fmt: skip


@pytest.mark.parametrize("kind", ["full", "delta", "merge"])
def test_a_compactor_seals_its_image_before_the_snapshot_appears(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """Once a snapshot is renamed into place, publishing its image is a rename and a
    stamp: the image was fsynced and its CRC-32C taken before. Done after, at 10M keys
    those take seconds, and a writer that sees the snapshot for that long without its
    image builds the whole image again itself."""
    build_store(store_path, simple_commits(12))
    if kind != "full":  # a delta on the first snapshot, or a merge of it with the tail
        assert compact(store_path).snapshot is not None
        with statelog.open(store_path) as s:
            s.commit(offsets={"p": 99}, low_watermark_ms=s.low_watermark_ms, put={"late": 1})
    calls: list[str] = []
    real_crc = image_cache.image_crc

    def crc(image: Path) -> int:
        calls.append(f"crc {image.name}")
        return real_crc(image)

    monkeypatch.setattr(image_cache, "image_crc", crc)
    # On the pass's own logger: a test before may have set a level above DEBUG on a parent.
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    chain = 0 if kind == "merge" else 8
    result = compact(store_path, files=_Recording(calls), max_chain=chain)
    snap = result.snapshot
    assert snap is not None and result.full == (kind != "delta")
    if kind != "delta":  # the image is finished when the pass says it writes the snapshot
        (said,) = [r.getMessage() for r in caplog.records if "event=snapshot_writing" in r.message]
        (image,) = (store_path / "base").glob(f"{snap.stem}.*.mdb")
        assert f"image_bytes={image.stat().st_size}" in said, said
    made = calls.index(f"rename {snap.name}")
    before, after = calls[:made], calls[made + 1 :]
    assert any(c.startswith("fsync ") and c.endswith(".mdb") for c in before), calls
    assert any(c.startswith("crc ") for c in before), calls
    assert not any(c.startswith("crc ") for c in after), calls
