"""A pass hashes, beside its fold, the full snapshots retention is about to read again.

| case                                                        | read ahead | retention reads |
|-------------------------------------------------------------|------------|-----------------|
| first delta pass after a full snapshot, log before it to go | yes        | no              |
| later delta pass, nothing older than its full snapshot left | no         | no              |
| a pass skipped below its trigger                            | no         | no              |
| the full snapshot damaged (bit rot, mtime set back)         | yes        | yes: reported   |
| the read-ahead fails (I/O error)                            | tried      | yes             |
| read back by an earlier pass, not by this one               | -          | yes             |
| a full pass, retain 1: the old full snapshot goes unread    | no         | the new one     |
| the pass is stopped while the read-ahead runs               | abandoned  | no retention    |

A wrong guess costs a read, never safety: only a hash that matched is noted, and
only a note made during the pass counts.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.compaction import fold, read_ahead
from statelog.compaction.fold import compact
from statelog.compaction.read_ahead import HashAhead, likely_rereads
from statelog.storage import snapshot_read
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.whole_checks import forget_all
from tests.delta_stores import Model, commit_round, contents, passed
from tests.helpers import flip_bit

DELTAS = {"max_chain": 8, "full_ratio": 10.0, "retain": 1}
AHEAD = "statelog-hash-ahead"


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    forget_all()
    yield
    forget_all()


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every whole read of a snapshot's body: (file name, thread name)."""
    seen: list[tuple[str, str]] = []
    body = snapshot_read._check_body

    def counted(path: Path, *a: Any) -> Any:
        seen.append((path.name, threading.current_thread().name))
        return body(path, *a)

    monkeypatch.setattr(snapshot_read, "_check_body", counted)
    return seen


def _full_with_log_before(root: Path, model: Model) -> Path:
    """A store whose newest snapshot is a full one and whose log before it is still
    there (retain 5 kept an older full snapshot and its log), plus a tail to fold."""
    commit_round(root, model, 0)
    passed(root, max_chain=0, retain=5)
    commit_round(root, model, 1)
    full = passed(root, max_chain=0, retain=5).snapshot
    assert full is not None
    commit_round(root, model, 2)
    forget_all()  # as a compactor started now would find it
    return full


def test_the_first_pass_after_a_full_snapshot_reads_it_beside_the_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, model = tmp_path / "store", Model()
    full = _full_with_log_before(root, model)
    assert likely_rereads(root, retain=1, retain_for=None, full=False) == [full]
    reads = _reads(monkeypatch)
    result = passed(root, **DELTAS)
    assert not result.full and result.deleted, result  # the older full one and its log went
    assert [r for r in reads if r[0] == full.name] == [(full.name, AHEAD)], reads
    with statelog.open(root, readonly=True) as ro:
        assert contents(ro) == model.state()


def test_later_passes_and_skipped_ones_read_nothing_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, model = tmp_path / "store", Model()
    full = _full_with_log_before(root, model)
    reads = _reads(monkeypatch)
    assert likely_rereads(root, retain=1, retain_for=None, full=False) == [full]
    skipped = compact(root, **DELTAS, min_tail_bytes=1 << 30)
    assert skipped.skipped == "below_trigger", skipped
    assert not [r for r in reads if r[1] == AHEAD], reads
    passed(root, **DELTAS)
    reads.clear()
    for r in (3, 4):  # only deltas and the segments after the full snapshot go
        commit_round(root, model, r)
        assert likely_rereads(root, retain=1, retain_for=None, full=False) == []
        assert passed(root, **DELTAS).deleted
    assert not [r for r in reads if r[1] == AHEAD], reads


def test_damage_the_read_ahead_meets_is_reported_by_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, model = tmp_path / "store", Model()
    full = _full_with_log_before(root, model)
    older = sorted((root / "snapshots").glob("*.snap"))[0]
    st = full.stat()
    flip_bit(full, st.st_size // 2)
    os.utime(full, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot: the inode looks untouched
    reads = _reads(monkeypatch)
    result = passed(root, **DELTAS)
    assert (full.name, AHEAD) in reads, reads
    assert full in result.damaged and full.exists() and older.exists(), result
    with statelog.open(root, readonly=True) as ro:
        assert contents(ro) == model.state()


def test_a_failed_read_ahead_leaves_the_read_to_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, model = tmp_path / "store", Model()
    full = _full_with_log_before(root, model)
    tried: list[Path] = []

    def failing(_files: Any, path: Path, _store_id: Any) -> None:
        tried.append(path)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(read_ahead, "read_back", failing)
    reads = _reads(monkeypatch)
    result = passed(root, **DELTAS)
    assert tried == [full] and result.deleted and not result.damaged, result
    assert [r for r in reads if r[0] == full.name and r[1] != AHEAD], reads


def test_a_read_back_before_the_pass_does_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, model = tmp_path / "store", Model()
    full = _full_with_log_before(root, model)
    files = FileLayer()
    early = HashAhead(files, StoreLayout(root).read_identity(files))
    early.start([full])
    early.wait()
    monkeypatch.setattr(fold, "likely_rereads", lambda *_a, **_k: [])  # no read-ahead
    reads = _reads(monkeypatch)
    passed(root, **DELTAS)
    assert [r[0] for r in reads].count(full.name) == 1, reads  # retention's own


def test_a_full_pass_that_keeps_only_itself_reads_nothing_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, model = tmp_path / "store", Model()
    old = _full_with_log_before(root, model)
    assert likely_rereads(root, retain=1, retain_for=None, full=True) == []
    reads = _reads(monkeypatch)
    new = passed(root, max_chain=0, retain=1).snapshot
    assert new is not None and not old.exists()
    assert not [r for r in reads if r[1] == AHEAD], reads  # the old one goes unread by it
    assert [r for r in reads if r[0] == new.name] == [(new.name, "MainThread")], reads


def test_a_stopped_pass_does_not_wait_for_its_read_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, model = tmp_path / "store", Model()
    _full_with_log_before(root, model)
    started = threading.Event()
    real_read, real_start = read_ahead.read_back, HashAhead.start

    def slow(*a: Any) -> None:
        time.sleep(3.0)
        real_read(*a)

    def start(self: HashAhead, paths: Any) -> None:
        real_start(self, paths)
        started.set()  # then the operator stops the pass

    monkeypatch.setattr(read_ahead, "read_back", slow)
    monkeypatch.setattr(HashAhead, "start", start)
    t = time.monotonic()
    result = compact(root, **DELTAS, stop=started.is_set)
    assert result.skipped == "interrupted" and not result.deleted, result
    assert time.monotonic() - t < 2.5
