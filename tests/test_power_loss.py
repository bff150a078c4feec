"""Simulated power loss (``statelog.kit``): what a crash leaves must recover to a prefix.

Invariants (docs/architecture.md): 2, recovered state is exactly the fold of commits
1..E, never a mix; 3, with ``durability="commit"`` every acknowledged commit
survives a power loss that drops every write not yet fsynced; 7, a segment
or store that was being created never shows up half-made.

Two ways to crash:

* ``crash(into=dir)`` copies the durable image of a running store aside, so
  one run is "crashed" after every commit cheaply;
* ``cut_power(at=n)`` stops the disk just before the n-th file operation, so
  a sweep over n crashes inside every step: store creation, append, sync,
  seal, segment roll, and recovery's own repairs (a torn tail saved aside
  and cut, corruption moved aside).

Every recovered image is opened with the normal file layer.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any, get_args

import pytest

import statelog
from statelog.kit import CrashMode, FaultyFiles
from tests.helpers import (
    Commit,
    build_store,
    commit_with_model,
    flip_bit,
    frames,
    model_at,
    model_of,
    segments,
    simple_commits,
    snapshot_of,
)

Models = list[dict[str, Any]]
MODES: tuple[CrashMode, ...] = get_args(CrashMode)

# Layouts that put records across segment rolls and into several fragments.
LAYOUTS: dict[str, dict[str, Any]] = {
    "default": {},
    "small-segments": {"segment_bytes": 4096},
    "fragments": {"fragment_bytes": 64},
    "small-segments-fragments": {"segment_bytes": 4096, "fragment_bytes": 64},
}


def _empty() -> Models:
    return [{"offsets": {}, "low_watermark_ms": 0, "tables": {}}]


def _commits(n: int) -> list[Commit]:
    """Commits of ~600 bytes: a 4 KiB segment holds a handful, 64-byte fragments split each."""
    return simple_commits(n, width=4, value_size=120)


def _recovered(path: Path) -> tuple[int, dict[str, Any], statelog.RecoveryReport]:
    """Open with the normal file layer; the epoch, the whole state and the report."""
    with statelog.open(path) as store:
        return store.epoch, snapshot_of(store), store.recovery


def _assert_prefix(path: Path, models: Models, low: int, high: int) -> statelog.RecoveryReport:
    """The store at ``path`` holds exactly the model of one epoch in ``low..high``."""
    epoch, state, report = _recovered(path)
    assert low <= epoch <= high, f"recovered epoch {epoch}, expected {low}..{high}: {report}"
    assert state == model_at(models, epoch), f"state at epoch {epoch} is not its model"
    assert not report.lost_epochs, f"a crash is not corruption: {report}"
    return report


@pytest.mark.parametrize("layout", LAYOUTS)
def test_commit_mode_every_acknowledged_commit_survives(tmp_path: Path, layout: str) -> None:
    """Crash after each of 40 commits: recovery gives exactly the last acknowledged epoch."""
    path = tmp_path / "store"
    files = FaultyFiles(path)
    models = _empty()
    modes = itertools.cycle(MODES)
    store = statelog.open(path, file_layer=files, **LAYOUTS[layout])
    for i, commit in enumerate([None, *_commits(40)]):
        if commit is not None:
            assert commit_with_model(store, models, commit) == i
        image = tmp_path / f"crash-{i}"
        files.crash(next(modes), into=image, seed=i)
        epoch, state, report = _recovered(image)
        assert epoch == i, f"acknowledged epoch {i} lost: recovered {epoch} ({report})"
        assert state == model_at(models, i)
        assert report.outcome is statelog.Outcome.CLEAN, report
        if i % 10 == 5:
            # The recovered store goes on: a commit chains to the crashed log.
            with statelog.open(image, **LAYOUTS[layout]) as again:
                assert again.commit(offsets={"p0": i + 1}, low_watermark_ms=10**9) == i + 1
            assert _recovered(image)[0] == i + 1
    # Finally, in place: abandon the live store and crash its own files.
    files.abandon(store)
    files.crash("drop")
    assert _recovered(path)[:2] == (40, model_at(models, 40))


def _run_with_cut(
    path: Path, at: int | None, mode: CrashMode, n: int, **options: Any
) -> tuple[FaultyFiles, Models, int]:
    """Open and commit ``n`` times, the power going off at fault point ``at``; then crash.

    :returns: the layer, the models (one past the last acknowledged, for the
        commit in flight) and the last acknowledged epoch.
    """
    files = FaultyFiles(path)
    if at is not None:
        files.cut_power(at=at)
    models = _empty()
    commits = _commits(n)
    store = None
    with contextlib.suppress(statelog.StorageError, OSError):
        store = statelog.open(path, file_layer=files, **options)
        for c in commits:
            commit_with_model(store, models, c)
    acked = len(models) - 1
    if acked < n:
        models.append(model_of(models[-1], commits[acked], acked + 1))
    if at is not None:
        assert files.dead, "the power cut was never reached"
    if store is not None:
        files.abandon(store)
    files.crash(mode, seed=at or 0)
    return files, models, acked


CUT_OPTIONS: dict[str, Any] = {"segment_bytes": 4096, "fragment_bytes": 256}
CUT_COMMITS = 16


def _cut_points(tmp_path: Path, phase: str) -> list[int]:
    """Fault points (1-based) of one phase of a full run.

    The phases split the run: "creation" (until the first record is
    written), "roll" (each segment roll, from the SEAL frame's write to the
    first record synced into the next segment) and "steady" (the rest).
    """
    files, _, _ = _run_with_cut(tmp_path / "count", None, "drop", CUT_COMMITS, **CUT_OPTIONS)
    trace = files.trace
    first_commit = next(
        i for i, t in enumerate(trace) if t.startswith("write") and t.endswith(".wal")
    )
    creation = set(range(1, first_commit + 2))
    rolls = [i for i, t in enumerate(trace) if t.startswith("create") and i > first_commit]
    assert len(rolls) >= 2, "the run must roll segments"
    roll: set[int] = set()
    for r in rolls:
        start = r - 2  # write + sync of the SEAL frame, then create, write, sync, rename,
        assert trace[start].startswith("write") and trace[start + 1].startswith("sync")
        roll.update(range(start + 1, r + 9))  # fsync_dir, open, write, sync (1-based)
    if phase == "creation":
        return sorted(creation)
    if phase == "roll":
        return sorted(roll)
    return sorted(set(range(1, len(trace) + 1)) - creation - roll)


@pytest.mark.parametrize("mode", MODES)
def test_commit_mode_power_cut_at_every_step(tmp_path: Path, mode: CrashMode) -> None:
    """The power goes off before each append and sync; nothing acknowledged is lost.

    "drop" and "zeros" never keep an unsynced byte, so recovery gives exactly
    the last acknowledged epoch; "prefix" may keep the whole record of the
    commit in flight, which then counts (it was written, only not confirmed).
    """
    outcomes = set()
    for at in _cut_points(tmp_path, "steady"):
        path = tmp_path / f"cut-{at}"
        _, models, acked = _run_with_cut(path, at, mode, CUT_COMMITS, **CUT_OPTIONS)
        high = acked + 1 if mode == "prefix" and acked < CUT_COMMITS else acked
        outcomes.add(_assert_prefix(path, models, acked, high).outcome)
    # Unsynced bytes were really at stake: "drop" leaves none, the others a torn tail.
    torn = {statelog.Outcome.TORN_TAIL} if mode != "drop" else set()
    assert outcomes == {statelog.Outcome.CLEAN, *torn}


def test_power_cut_during_store_creation(tmp_path: Path) -> None:
    """Every cut while a new store is being made leaves a directory that opens as a store."""
    points = _cut_points(tmp_path, "creation")
    assert len(points) >= 10
    for at in points:
        path = tmp_path / f"cut-{at}"
        _run_with_cut(path, at, MODES[at % len(MODES)], 1, **CUT_OPTIONS)
        with statelog.open(path) as store:
            assert store.epoch == 0
            assert store.commit(offsets={"p0": 1}, low_watermark_ms=1, put={"a": 1}) == 1
        with statelog.open(path) as store:
            assert (store.epoch, store.get("a")) == (1, 1)
        assert not list(path.rglob("*.tmp"))


@pytest.mark.parametrize("mode", MODES)
def test_power_cut_during_segment_roll(tmp_path: Path, mode: CrashMode) -> None:
    """Cuts from the SEAL frame to the new segment's first record: reopen, nothing lost."""
    for at in _cut_points(tmp_path, "roll"):
        path = tmp_path / f"cut-{at}"
        _, models, acked = _run_with_cut(path, at, mode, CUT_COMMITS, **CUT_OPTIONS)
        high = acked + 1 if mode == "prefix" else acked
        epoch = _assert_prefix(path, models, acked, high).epoch
        with statelog.open(path, **CUT_OPTIONS) as store:
            store.commit(offsets={"p0": epoch + 1}, low_watermark_ms=10**9)
        assert _recovered(path)[0] == epoch + 1


def _run_unsynced(tmp_path: Path, durability: str, *, confirm: bool) -> None:
    """Commit with ``durability``; crash after every commit; recovery gives a prefix.

    The recovered epoch is at least the last one known durable before the
    crash (``wait_durable``/``flush`` returned, or ``durable_epoch``) and at
    most the last one written; the state is exactly that epoch's model.
    """
    path = tmp_path / "store"
    files = FaultyFiles(path)
    models = _empty()
    modes = itertools.cycle(MODES)
    store = statelog.open(
        path,
        file_layer=files,
        durability=durability,
        group_delay=timedelta(milliseconds=1),
        segment_bytes=4096,
        fragment_bytes=128,
    )
    confirmed = 0
    lost = 0
    for i, commit in enumerate(_commits(60), start=1):
        assert commit_with_model(store, models, commit) == i
        if confirm and i % 7 == 0:
            assert store.wait_durable(i, timeout=10)
            confirmed = i
        if i % 11 == 0:
            store.flush()
            confirmed = i
        floor = max(confirmed, store.durable_epoch if durability == "group" else 0)
        image = tmp_path / f"crash-{i}"
        files.crash(next(modes), into=image, seed=i)
        lost += _assert_prefix(image, models, floor, i).epoch < i
    files.abandon(store)
    files.crash("prefix", seed=99)
    _assert_prefix(path, models, confirmed, 60)
    if durability == "none":
        assert lost > 0, "no crash dropped an unsynced commit: the layer models nothing"


@pytest.mark.parametrize(
    ("durability", "confirm"),
    [("group", True), ("none", False)],
    ids=["group-recovers-a-prefix-no-older-than-confirmed", "none-recovers-a-prefix"],
)
def test_unsynced_modes_recover_a_prefix(tmp_path: Path, durability: str, confirm: bool) -> None:
    _run_unsynced(tmp_path, durability, confirm=confirm)


def test_power_cut_during_recovery_repair(tmp_path: Path) -> None:
    """Recovery cuts a torn tail (evidence saved aside first); a cut at any step of it is safe.

    Whatever the cut leaves, the next open finds the same prefix: the torn
    bytes are either still there (and cut again) or already gone.
    """
    base = tmp_path / "base"
    models = build_store(base, _commits(20), **CUT_OPTIONS)
    last = segments(base)[-1]
    last.write_bytes(last.read_bytes()[:-100])  # the seal and part of commit 20: a torn write
    counting = tmp_path / "count"
    shutil.copytree(base, counting)
    files = FaultyFiles(counting)
    store = statelog.open(counting, file_layer=files, **CUT_OPTIONS)
    trace = files.trace[: files.ops]  # the steps of the open, not of the close below
    store.close()
    repair = [i + 1 for i, t in enumerate(trace) if not t.startswith("read")]
    assert any(t.startswith("truncate") for t in trace), trace
    for n, at in enumerate(repair):
        path = tmp_path / f"cut-{at}"
        shutil.copytree(base, path)
        files = FaultyFiles(path)
        files.cut_power(at=at)
        with pytest.raises(statelog.StorageError):
            statelog.open(path, file_layer=files, **CUT_OPTIONS)
        files.crash(MODES[n % len(MODES)], seed=at)
        _assert_prefix(path, models, 19, 19)
        assert list((path / "wal").glob("*.broken*")), "the torn bytes were not kept"


@pytest.mark.parametrize("mode", ["drop", "zeros"])
def test_the_fault_layer_keeps_only_what_a_disk_would(tmp_path: Path, mode: CrashMode) -> None:
    """The model itself: unsynced bytes, unsynced renames and removals do not survive."""
    root = tmp_path / "root"
    files = FaultyFiles(root)
    files.makedirs(root / "d")
    d = root / "d"
    files.create_durable(d / "a", b"A" * 8)
    f = files.open_append(d / "a")
    f.write([b"synced"])
    f.sync()
    f.write([b"+dup"])
    h = f.dup()
    h.sync()  # fdatasync through another descriptor persists the same file
    h.close()
    f.write([b"-volatile"])
    files.create_durable(d / "b", b"B")
    files.create_durable(d / "gone", b"G")
    files.rename(d / "b", d / "c")  # no fsync of d: the rename is undone
    files.remove(d / "gone")  # no fsync of d: the file comes back
    files.crash(mode, into=tmp_path / "image")
    image = tmp_path / "image" / "d"
    lost = b"" if mode == "drop" else bytes(len(b"-volatile"))
    assert (image / "a").read_bytes() == b"A" * 8 + b"synced+dup" + lost
    assert sorted(p.name for p in image.iterdir()) == ["a", "b", "gone"]
    assert (image / "gone").read_bytes() == b"G"
    files.fsync_dir(d)  # now the rename and the removal are durable
    f.close()
    files.crash(mode)
    assert sorted(p.name for p in d.iterdir()) == ["a", "c"]
    assert (d / "a").read_bytes() == b"A" * 8 + b"synced+dup" + lost


def test_power_cut_while_recovery_moves_corruption_aside(tmp_path: Path) -> None:
    """A bit flip mid-log: recovery stops at the last good commit and moves the rest aside.

    A cut at any step of that repair changes nothing about the answer: the
    next open stops at the same commit, with the same state, and the writer
    goes on from there. The damaged bytes are never deleted.
    """
    base = tmp_path / "base"
    models = build_store(base, _commits(30), **CUT_OPTIONS)
    second = segments(base)[1]
    victim = frames(second)[2]
    flip_bit(second, victim.offset + 20)  # inside the third frame of segment 2
    damaged = second.read_bytes()[victim.offset :]
    later_segments = [p.read_bytes() for p in segments(base)[2:]]
    assert later_segments
    reference = tmp_path / "reference"
    shutil.copytree(base, reference)
    with statelog.open(reference, **CUT_OPTIONS) as store:
        good = store.epoch
        assert store.recovery.lost_epochs, store.recovery
    counting = tmp_path / "count"
    shutil.copytree(base, counting)
    files = FaultyFiles(counting)
    store = statelog.open(counting, file_layer=files, **CUT_OPTIONS)
    trace = files.trace[: files.ops]
    store.close()
    repair = [i + 1 for i, t in enumerate(trace) if not t.startswith("read")]
    assert any(t.startswith("rename") for t in trace), trace
    for n, at in enumerate(repair):
        path = tmp_path / f"cut-{at}"
        shutil.copytree(base, path)
        files = FaultyFiles(path)
        files.cut_power(at=at)
        with pytest.raises(statelog.StorageError):
            statelog.open(path, file_layer=files, **CUT_OPTIONS)
        files.crash(MODES[n % len(MODES)], seed=at)
        with statelog.open(path, **CUT_OPTIONS) as store:
            assert store.epoch == good, (at, files.trace[-1], store.recovery)
            assert snapshot_of(store) == model_at(models, good)
            store.commit(offsets={"p0": good + 1}, low_watermark_ms=10**9)
        with statelog.open(path, **CUT_OPTIONS) as store:
            assert store.epoch == good + 1, store.recovery
            assert store.recovery.outcome is statelog.Outcome.CLEAN, store.recovery
        aside = [p.read_bytes() for p in (path / "wal").glob("*.corrupt*")]
        assert any(damaged in blob for blob in aside), "the damaged bytes were not kept"
        for later in later_segments:
            assert later in aside, "a later segment was not kept whole"
