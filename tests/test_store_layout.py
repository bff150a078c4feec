"""The store directory: creation order, crash during creation, and a missing log.

Failure modes pinned here:

| state found on open                          | outcome                            |
|----------------------------------------------|------------------------------------|
| empty segments, no IDENTITY (creation crash) | store created again, epoch 0       |
| segments with records, no IDENTITY           | CorruptionError, nothing changed   |
| IDENTITY, no segments                        | ResnapshotRequired, nothing changed|
| IDENTITY, no wal/ directory                  | ResnapshotRequired                 |
| stray *.tmp from a writer that died          | removed on the next writer open    |
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import statelog
from tests.helpers import build_store, segments, simple_commits


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_new_store_has_segment_one_before_identity(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        assert store.epoch == 0
        assert [p.name for p in segments(store_path)] == ["0000000000000001-0000000000000001.wal"]
    assert (store_path / "IDENTITY").exists()
    assert (store_path / "snapshots").is_dir()


def test_crash_before_identity_creates_store_again(store_path: Path) -> None:
    with statelog.open(store_path):
        pass
    (store_path / "IDENTITY").unlink()  # as if the crash came before the identity landed
    for seg in segments(store_path):
        seg.write_bytes(seg.read_bytes()[:64])  # header only: the creation left it empty
    with statelog.open(store_path) as store:
        assert store.epoch == 0
        store.commit(offsets={"p": 1}, low_watermark_ms=1, put={"a": 1})
    with statelog.open(store_path) as store:
        assert store.get("a") == 1


def test_records_without_identity_are_refused(store_path: Path) -> None:
    build_store(store_path, simple_commits(3))
    (store_path / "IDENTITY").unlink()
    before = _files(store_path)
    with pytest.raises(statelog.CorruptionError) as err:
        statelog.open(store_path)
    assert "identity" in str(err.value)
    after = _files(store_path)
    assert after == before


def test_identity_without_log_requires_resnapshot(store_path: Path) -> None:
    build_store(store_path, simple_commits(3))
    for seg in segments(store_path):
        seg.unlink()
    before = _files(store_path)
    with pytest.raises(statelog.ResnapshotRequired) as err:
        statelog.open(store_path)
    assert "missing" in str(err.value) and err.value.hint
    with pytest.raises(statelog.ResnapshotRequired):
        statelog.open(store_path, readonly=True)
    after = _files(store_path)
    assert after == before


def test_identity_without_wal_directory_requires_resnapshot(store_path: Path) -> None:
    build_store(store_path, simple_commits(2))
    shutil.rmtree(store_path / "wal")
    with pytest.raises(statelog.ResnapshotRequired):
        statelog.open(store_path)


def test_stray_temp_files_are_removed_by_the_writer(store_path: Path) -> None:
    build_store(store_path, simple_commits(2))
    stray = store_path / "wal" / "0000000000000009-0000000000000009.wal.tmp"
    stray.write_bytes(b"half a segment")
    with statelog.open(store_path, readonly=True) as ro:
        assert ro.epoch == 2
    assert stray.exists()  # a reader never changes the store
    with statelog.open(store_path) as store:
        assert store.epoch == 2
    assert not stray.exists()
