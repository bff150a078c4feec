"""ENOSPC and EIO injected into every durable step (the fault layer of ``statelog.kit``).

The contract (an I/O error is never taken for damage):

* a commit whose write or sync fails raises :class:`statelog.StorageError`
  carrying the errno, is not visible (epoch, offsets, reads unchanged) and is
  never replayed by a later open;
* once the disk has room again the same store object commits again, and its
  epochs continue without a gap;
* if even the rollback fails the writer is poisoned until a reopen, and the
  reopen recovers a prefix;
* with ``durability="group"`` a failed background sync reaches
  ``wait_durable``, ``flush`` and the next commit;
* an I/O error while recovery reads is raised, never taken for corruption:
  no file is truncated, moved aside or rewritten because of it.
"""

from __future__ import annotations

import dataclasses
import errno
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import statelog
from compactor import compact
from statelog.kit import Fail, FaultyFiles, Kind
from tests.helpers import (
    Commit,
    build_store,
    commit_with_model,
    model_at,
    model_of,
    segments,
    simple_commits,
    snapshot_of,
)

Models = list[dict[str, Any]]
FAILED = Commit(put={"failed": "must never be seen"}, delete=("k1-1",))


def _empty() -> Models:
    return [{"offsets": {}, "low_watermark_ms": 0, "tables": {}}]


def _open(path: Path, **options: Any) -> tuple[statelog.StateStore, FaultyFiles]:
    files = FaultyFiles(path)
    return statelog.open(path, file_layer=files, **options), files


def _commit_n(store: statelog.StateStore, models: Models, n: int) -> None:
    for c in simple_commits(len(models) + n - 1)[len(models) - 1 :]:
        commit_with_model(store, models, c)


def _view(store: statelog.StateStore) -> tuple[Any, ...]:
    """Everything a reader can see, to compare before and after a failed commit."""
    return (
        store.epoch,
        store.durable_epoch,
        store.offsets,
        store.low_watermark_ms,
        store.get("failed"),
        store.get("k1-1"),
        snapshot_of(store),
    )


def _fails(store: statelog.StateStore, models: Models, code: int | None) -> None:
    """A commit of ``FAILED`` raises StorageError (with ``code``) and changes nothing visible."""
    before = _view(store)
    with pytest.raises(statelog.StorageError) as err:
        commit_with_model(store, models, FAILED)
    if code is not None:
        assert err.value.errno == code, err.value
    assert _view(store) == before
    assert len(models) - 1 == store.epoch


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (the writer lock's pid file aside)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "LOCK"
    }


def _reopened(path: Path, models: Models, **options: Any) -> statelog.StateStore:
    """Reopen with the normal layer; the state must be the model at the last acknowledged epoch."""
    store = statelog.open(path, **options)
    assert store.epoch == len(models) - 1, store.recovery
    assert snapshot_of(store) == model_at(models, store.epoch)
    assert store.get("failed") is None
    return store


# -- append and sync failures in commit mode ----------------------------------

APPEND_FAULTS: dict[str, Fail] = {
    # times=None: every matching step fails until free_space()
    "write-enospc": Fail("write", errno=errno.ENOSPC, times=None),
    "write-eio": Fail("write", errno=errno.EIO, times=None),
    "short-write-enospc": Fail("write", errno=errno.ENOSPC, times=None, partial=37),
    "sync-eio": Fail("sync", errno=errno.EIO),
    "sync-enospc": Fail("sync", errno=errno.ENOSPC),
}


@pytest.mark.parametrize("name", APPEND_FAULTS)
def test_failed_append_is_invisible_and_commits_resume(tmp_path: Path, name: str) -> None:
    fault = dataclasses.replace(APPEND_FAULTS[name])  # a fresh count for every run
    code = fault.errno
    path = tmp_path / "store"
    store, files = _open(path)
    models = _empty()
    _commit_n(store, models, 5)
    files.add(fault)
    _fails(store, models, code)
    if fault.times is None:
        _fails(store, models, code)  # the disk is still full: still refused, still invisible
    # Power loss while the disk is full: the failed commit is not on disk either.
    files.crash("prefix", into=tmp_path / "crashed", seed=1)
    _reopened(tmp_path / "crashed", models).close()
    files.free_space()
    for expected in range(6, 10):  # the same store object, epochs without a gap
        assert commit_with_model(store, models, simple_commits(expected)[-1]) == expected
    assert snapshot_of(store) == model_at(models, 9)
    store.close()
    with _reopened(path, models) as again:
        assert again.recovery.outcome is statelog.Outcome.CLEAN, again.recovery
        assert again.recovery.replayed == 9


def test_short_write_then_enospc_is_cut_back_exactly(tmp_path: Path) -> None:
    """A write that lands 100 bytes and then fails is truncated away byte for byte."""
    path = tmp_path / "store"
    store, files = _open(path)
    models = _empty()
    _commit_n(store, models, 3)
    seg = segments(path)[-1]
    before = seg.read_bytes()
    files.fail("write", errno=errno.ENOSPC, partial=100)
    _fails(store, models, errno.ENOSPC)
    assert seg.read_bytes() == before
    files.crash("zeros", into=tmp_path / "crashed")
    assert _tree(tmp_path / "crashed") == _tree(path)  # the cut was synced: nothing volatile
    assert commit_with_model(store, models, simple_commits(4)[-1]) == 4
    store.close()
    _reopened(path, models).close()


# -- a failed rollback poisons the writer ------------------------------------

POISON: dict[str, tuple[tuple[Kind, int, int, int], tuple[Kind, int] | None]] = {
    # the fault that fails the commit, then the one that fails its rollback
    "short-write-then-truncate-eio": (("write", errno.ENOSPC, 1, 50), ("truncate", errno.EIO)),
    "sync-then-resync-eio": (("sync", errno.EIO, 2, 0), None),
    "sync-then-truncate-eio": (("sync", errno.EIO, 1, 0), ("truncate", errno.EIO)),
}


@pytest.mark.parametrize("case", POISON)
def test_failed_rollback_poisons_the_writer_until_reopen(tmp_path: Path, case: str) -> None:
    first, second = POISON[case]
    kind, code, times, partial = first
    path = tmp_path / "store"
    store, files = _open(path)
    models = _empty()
    _commit_n(store, models, 5)
    files.fail(kind, errno=code, times=times, partial=partial)
    if second is not None:
        files.fail(second[0], errno=second[1])
    _fails(store, models, code)
    files.free_space()
    for _ in range(3):  # space is back, but only a reopen may say what the log holds
        _fails(store, models, None)
    store.close()
    # Reopen recovers a prefix: the failed commit was reported failed, so it
    # is lost or (its record complete in the file) replayed whole, never half.
    in_flight = [*models, model_of(models[-1], FAILED, len(models))]
    with statelog.open(path) as again:
        assert again.epoch in (5, 6), again.recovery
        assert snapshot_of(again) == model_at(in_flight, again.epoch)
        assert not again.recovery.lost_epochs
        epoch = again.epoch
        assert again.commit(offsets={"p0": 99}, low_watermark_ms=10**6) == epoch + 1
    with statelog.open(path) as again:
        assert again.epoch == epoch + 1
    if case != "sync-then-truncate-eio":  # the record never got complete: not replayed
        assert epoch == 5


# -- segment roll --------------------------------------------------------------

ROLL_FAULTS: dict[str, Fail] = {
    # ENOSPC creating the new segment's temp file, writing its header, EIO on the dir fsync
    "create-enospc": Fail("create", match=".wal.tmp", errno=errno.ENOSPC, times=None),
    "header-write-enospc": Fail("write", match=".wal.tmp", errno=errno.ENOSPC, times=None),
    "dir-fsync-eio": Fail("fsync_dir", match="wal", errno=errno.EIO, times=None),
}


@pytest.mark.parametrize("name", ROLL_FAULTS)
def test_error_creating_the_next_segment_on_roll(tmp_path: Path, name: str) -> None:
    fault = dataclasses.replace(ROLL_FAULTS[name])
    code = fault.errno
    path = tmp_path / "store"
    store, files = _open(path, segment_bytes=4096)
    models = _empty()
    _commit_n(store, models, 2)
    files.add(fault)
    for _ in range(100):  # commit until one needs the next segment and cannot have it
        try:
            commit_with_model(store, models, simple_commits(len(models))[-1])
        except statelog.StorageError as exc:
            assert exc.errno == code, exc
            break
    else:
        pytest.fail("no commit needed a new segment")
    acked = len(models) - 1
    assert acked > 2 and store.epoch == acked
    _fails(store, models, code)  # still no room: still refused
    files.free_space()
    for _ in range(10):
        assert commit_with_model(store, models, simple_commits(len(models))[-1]) == acked + 1
        acked += 1
    store.close()
    with _reopened(path, models, segment_bytes=4096) as again:
        assert again.recovery.outcome is statelog.Outcome.CLEAN, again.recovery
        assert len(segments(path)) >= 2
    assert not list(path.rglob("*.tmp"))


def test_eio_on_the_seal_sync_of_a_roll(tmp_path: Path) -> None:
    """The SEAL frame's sync fails while rolling: that commit fails, later ones survive."""
    path = tmp_path / "store"
    store, files = _open(path, segment_bytes=4096)
    models = _empty()
    assert store._writer is not None
    wal = store._writer.wal
    while (f := wal.active_file) is None or f.size < 4096:  # the next append rolls
        commit_with_model(store, models, simple_commits(len(models))[-1])
    files.fail("sync", errno=errno.EIO, match=".wal")  # the first sync is the seal's
    _fails(store, models, errno.EIO)
    for _ in range(3):
        commit_with_model(store, models, simple_commits(len(models))[-1])
    store.close()
    with _reopened(path, models, segment_bytes=4096) as again:
        assert again.recovery.outcome is statelog.Outcome.CLEAN, again.recovery


# -- group commit ----------------------------------------------------------------


def test_failed_group_sync_reaches_waiters_and_later_commits(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store, files = _open(path, durability="group", group_delay=timedelta(milliseconds=1))
    models = _empty()
    _commit_n(store, models, 3)
    assert store.wait_durable(3, timeout=10)
    files.fail("sync", errno=errno.EIO, times=None, match=".wal")
    epoch = commit_with_model(store, models, simple_commits(4)[-1])
    with pytest.raises(statelog.StorageError) as err:
        store.wait_durable(epoch, timeout=10)
    assert err.value.errno == errno.EIO
    assert store.durable_epoch == 3
    _fails(store, models, errno.EIO)
    with pytest.raises(statelog.StorageError):
        store.flush()
    files.free_space()
    _fails(store, models, errno.EIO)  # sticky: only a reopen can say what is durable
    store.close()
    with statelog.open(path) as again:
        assert again.epoch in (3, 4), again.recovery
        assert snapshot_of(again) == model_at(models, again.epoch)
        assert again.get("failed") is None


# -- reads during open -------------------------------------------------------------


def _torn_store(path: Path) -> Models:
    """Three segments, the last ending in half a record (a crash mid-append)."""
    models = build_store(path, simple_commits(40, value_size=60), segment_bytes=4096)
    last = segments(path)[-1]
    last.write_bytes(last.read_bytes()[:-50])
    return models


STORES = {
    "clean": lambda p: build_store(p, simple_commits(40, value_size=60), segment_bytes=4096),
    "torn-tail": _torn_store,
}


@pytest.mark.parametrize("readonly", [False, True], ids=["writer", "readonly"])
@pytest.mark.parametrize("kind", STORES)
def test_eio_reading_the_log_on_open_changes_nothing(
    tmp_path: Path, kind: str, readonly: bool
) -> None:
    """EIO on each segment read: StorageError with the errno; every file byte-identical."""
    path = tmp_path / "store"
    models = STORES[kind](path)
    n = len(segments(path))
    assert n >= 3
    before = _tree(path)
    for nth in range(n):
        files = FaultyFiles(path)
        files.fail("read", errno=errno.EIO, after=nth, match=".wal")
        with pytest.raises(statelog.StorageError) as err:
            statelog.open(path, file_layer=files, readonly=readonly)
        assert err.value.errno == errno.EIO, err.value
        assert _tree(path) == before, f"EIO on read {nth + 1} changed files"
    with statelog.open(path) as store:  # the device works again: the real recovery
        assert snapshot_of(store) == model_at(models, store.epoch)
        assert store.epoch == (40 if kind == "clean" else 39)


def test_eio_reading_a_segment_in_a_pass_changes_nothing(tmp_path: Path) -> None:
    """EIO on each segment a compaction pass folds: the pass raises it, as an I/O error
    and never as damage; no file changes; the pass on a working device then folds all."""
    path = tmp_path / "store"
    models = build_store(path, simple_commits(40, value_size=60), segment_bytes=4096)
    n = len(segments(path))
    assert n >= 3
    (path / "COMPACTOR.LOCK").touch()  # made by the first pass, and left: not a change
    before = _tree(path)
    for nth in range(n - 1):  # the active segment is never read
        files = FaultyFiles(path)
        files.fail("read", errno=errno.EIO, after=nth, match=".wal")
        with pytest.raises((OSError, statelog.StorageError)) as err:
            compact(path, files=files)
        assert getattr(err.value, "errno", None) == errno.EIO, err.value
        assert _tree(path) == before, f"EIO on read {nth + 1} changed files"
    assert compact(path).skipped is None
    with statelog.open(path) as store:
        assert snapshot_of(store) == model_at(models, store.epoch) and store.epoch == 40


def test_eio_reading_the_identity_on_open_raises_storage_error(store_path: Path) -> None:
    """The IDENTITY file is read on every open too: its I/O error is a StorageError."""
    build_store(store_path, simple_commits(3))
    before = _tree(store_path)
    for readonly in (False, True):
        files = FaultyFiles(store_path)
        files.fail("read", errno=errno.EIO, match="IDENTITY")
        with pytest.raises(statelog.StorageError) as err:
            statelog.open(store_path, file_layer=files, readonly=readonly)
        assert err.value.errno == errno.EIO
        assert _tree(store_path) == before
