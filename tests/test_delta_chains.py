"""Delta chains over a store's life: deletes that stay deleted, retention, format-1 bases.

| case                                           | must                                        |
|------------------------------------------------|---------------------------------------------|
| a key put below a delta, deleted in the delta  | stay deleted for get/items/count in the     |
|   (its tombstone), for each key kind and       |   live writer after its base swap, a        |
|   where the put lives (full or delta level)    |   reopened writer, a read-only open, and    |
|                                                |   after a full merge; a re-put is visible   |
| retain 1..3 over delta passes and full merges  | every kept chain complete, exactly the kept |
|                                                |   chains left, the log from the oldest kept |
|                                                |   restore point, pinned files kept until    |
|                                                |   unpinned                                  |
| a store whose snapshot is format 1             | opens; its next pass writes a full snapshot |
|                                                |   (no delta on format 1), the next a delta  |
"""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

import statelog
from statelog.compaction.delta import ChainPolicy
from statelog.compaction.fold import compact
from statelog.log.segments import list_segments
from statelog.recovery.ladder import check_link
from statelog.storage.fileio import FileLayer
from statelog.storage.pins import pin
from statelog.storage.snapshots import (
    SnapshotMeta,
    extract_snapshot,
    list_snapshots,
    verify_snapshot,
    write_snapshot,
)
from tests.compactor_stream import snapshot_model
from tests.delta_stores import DELTA, FULL, SEG, Model, commit_round, contents, passed

FILES = FileLayer()

# -- resurrection ----------------------------------------------------------------------------


def _filler(store: statelog.StateStore, model: Model, tag: str, n: int = 30) -> None:
    """Commits enough to roll the writer's segment a few times (so a pass has a tail)."""
    for i in range(n):
        model.commit(store, {f"{tag}{i % 7}": {"i": i, "pad": "y" * 200}})


def _views(
    root: Path, model: Model, live: statelog.StateStore | None, key: Any, table: str
) -> None:
    """The state through every way a store is read; ``key`` must agree with the model."""
    want = model.state()
    if live is not None:
        assert contents(live) == want
        assert live.get(key, table=table) == model.tables.get(table, {}).get(key)
    for readonly in (True,) if live is not None else (True, False):
        with statelog.open(root, readonly=readonly) as store:
            assert contents(store) == want
            assert store.get(key, table=table) == model.tables.get(table, {}).get(key)


def _swapped(store: statelog.StateStore, **options: Any) -> SnapshotMeta:
    """A pass, then the writer's watcher swaps its snapshot in; the snapshot's meta."""
    result = passed(store.path, **options)
    assert result.snapshot is not None
    writer = store._writer
    assert writer is not None and writer.watcher is not None
    writer.watcher.check()  # its background thread may have swapped it in already
    meta = verify_snapshot(FILES, result.snapshot, store_id=None)
    assert writer.state.base_epoch == meta.lsn
    return meta


@pytest.mark.parametrize("table", ["default", "other"])
@pytest.mark.parametrize("key", ["ghost", b"ghost"], ids=["str", "bytes"])
@pytest.mark.parametrize("put_in", ["full", "delta"])
def test_a_key_deleted_in_a_delta_stays_deleted(
    tmp_path: Path, put_in: str, key: Any, table: str
) -> None:
    root, model = tmp_path / "store", Model()
    with statelog.open(root, segment_bytes=SEG) as store:
        model.commit(store, {key: "alive", "neighbour": 1}, table=table)
        _filler(store, model, "a")
        assert _swapped(store, **FULL).depth == 0
        if put_in == "delta":
            model.commit(store, {key: "alive again"}, table=table)
            _filler(store, model, "b")
            assert _swapped(store, **DELTA).depth == 1
        model.commit(store, {}, delete=(key,), table=table)
        _filler(store, model, "c")
        meta = _swapped(store, **DELTA)
        assert meta.delta is not None and meta.delta.changes.get(table, 0) >= 1
        assert key not in model.tables[table]
        _views(root, model, store, key, table)  # the live writer on its swapped base
    _views(root, model, None, key, table)  # reopened: the base from the chain
    with statelog.open(root, segment_bytes=SEG) as store:
        _filler(store, model, "d")
        merged = _swapped(store, max_chain=1, retain=3)
        assert merged.delta is None  # the chain was merged into a full snapshot
        _views(root, model, store, key, table)
        model.commit(store, {key: "back"}, table=table)
        _filler(store, model, "e")
        assert _swapped(store, **DELTA).depth == 1
        _views(root, model, store, key, table)
    _views(root, model, None, key, table)
    assert model.tables[table][key] == "back"


# -- retention ---------------------------------------------------------------------------------


def _chains(root: Path) -> tuple[list[tuple[Path, SnapshotMeta]], dict[str, set[str]]]:
    """Every snapshot (newest first) verified, and each one's chain of names; every parent
    must be present."""
    listed = [
        (p, verify_snapshot(FILES, p, store_id=None))
        for _e, _l, p in list_snapshots(root / "snapshots")
    ]
    by_name = {p.name: m for p, m in listed}
    chains: dict[str, set[str]] = {}
    for path, meta in listed:
        names, m = {path.name}, meta
        while m.delta is not None:
            assert m.delta.parent in by_name, f"{path.name}: parent {m.delta.parent} missing"
            assert by_name[m.delta.parent].sha256 == m.delta.parent_sha256
            names.add(m.delta.parent)
            m = by_name[m.delta.parent]
        chains[path.name] = names
    return listed, chains


def _check_retained(root: Path, retain: int, pinned: set[str]) -> None:
    listed, chains = _chains(root)
    kept = listed[:retain]
    needed = set().union(*(chains[p.name] for p, _m in kept))
    assert {p.name for p, _m in listed} == needed | (pinned & set(chains))
    oldest = kept[-1][1]
    assert check_link(root / "wal", oldest) is None
    segs = list_segments(root / "wal")
    covered = [p.name for (_s, _f, p), nxt in itertools.pairwise(segs)
               if nxt[1] - 1 <= oldest.lsn]  # fmt: skip
    # Segments go oldest first and stop at a pinned one, so the log left is one run.
    assert covered == [] or covered[0] in pinned, covered


# -- which deltas a rebase merges: size-tiered ---------------------------------------------------

# (body bytes of the chain, full snapshot first; max_chain; snapshots kept below the new delta)
REBASE_KEEP = [
    ([100, 10, 10, 10], 3, 1),  # equal deltas: all merged onto the full snapshot
    ([100, 50, 10, 5], 3, 3),  # each older delta heavier: only the newest merged
    ([100, 50, 10, 12], 3, 2),  # the newest outweighs the one below: both merged
    ([100, 50, 40, 30, 5], 2, 1),  # a chain longer than max_chain: merged down to fit
    ([100, 50, 40, 30, 5], 3, 3),  # longer than max_chain, the rest heavier: just fits
    ([100, 20], 1, 1),
]


@pytest.mark.parametrize(("bodies", "max_chain", "keep"), REBASE_KEEP)
def test_a_rebase_merges_the_newest_deltas_until_an_older_one_outweighs_them(
    bodies: list[int], max_chain: int, keep: int
) -> None:
    metas = cast(Any, [SimpleNamespace(body_bytes=b) for b in bodies])
    got = ChainPolicy(max_chain, 10.0).rebase_keep(metas)
    assert got == keep
    assert 1 <= got <= len(bodies) - 1 and got <= max_chain  # the new delta's depth fits


# (max_chain, full_ratio) of each pass: deltas, chains at their length with their newest
# deltas merged into one (a rebase: onto a kept delta, or onto the full snapshot, depth 1
# again), full merges by bytes
PASSES = [(0, 0.5), (3, 10.0), (3, 10.0), (3, 10.0), (3, 10.0), (3, 10.0), (8, 0.01),
          (8, 10.0), (8, 10.0), (1, 10.0), (1, 10.0), (0, 0.5), (4, 10.0), (4, 10.0)]  # fmt: skip


@pytest.mark.parametrize("retain", [1, 2, 3])
def test_retention_keeps_whole_chains_and_the_log_from_the_oldest_restore_point(
    tmp_path: Path, retain: int
) -> None:
    root, model = tmp_path / "store", Model()
    kinds = []
    pinned: set[str] = set()
    with contextlib.ExitStack() as held:
        for n, (max_chain, ratio) in enumerate(PASSES):
            commit_round(root, model, n)
            result = passed(root, max_chain=max_chain, full_ratio=ratio, retain=retain)
            kinds.append(result.depth)
            if n == 2:  # pin the first chain's full snapshot and a segment, across merges
                first = list_snapshots(root / "snapshots")[-1][2]
                seg = list_segments(root / "wal")[0][2]
                pinned = {first.name, seg.name}
                names = [f"snapshots/{first.name}", f"wal/{seg.name}"]
                held.enter_context(pin(root, names, purpose="test"))
            if n == 9:  # long unneeded, kept only by the pin: gone once it is released
                assert first.exists() and seg.exists()
                held.close()
                pinned = set()
                assert compact(root, retain=retain).skipped == "nothing_new"
                assert not first.exists() and not seg.exists()
            _check_retained(root, retain, pinned)
            with statelog.open(root, readonly=True) as ro:
                assert contents(ro) == model.state() and ro.epoch == model.epoch
    # Pass 4 merges only the newest delta (the older two are heavier: size-tiered),
    # pass 5 then the whole chain onto the full snapshot.
    assert kinds == [0, 1, 2, 3, 3, 1, 0, 1, 2, 1, 1, 0, 1, 2]


# -- format 1 -------------------------------------------------------------------------------------


def test_a_format_1_base_keeps_opening_and_is_followed_by_a_full_snapshot(tmp_path: Path) -> None:
    root, model = tmp_path / "store", Model()
    commit_round(root, model, 0)
    old = passed(root, **FULL).snapshot
    assert old is not None
    meta = verify_snapshot(FILES, old, store_id=None)
    image = tmp_path / "old.mdb"
    extract_snapshot(FILES, old, image, store_id=None)
    old.unlink()
    for p in (root / "base").iterdir():
        p.unlink()  # an older store's derived images: none of this format
    write_snapshot(FILES, old.parent, meta, image, version=1)
    assert old.read_bytes()[8] == 1
    commit_round(root, model, 1)
    for readonly in (True, False):
        with statelog.open(root, readonly=readonly) as store:
            assert store.recovery.snapshot == old and store.recovery.rejected == ()
            assert contents(store) == model.state()
    result = passed(root, **DELTA)
    assert result.full and result.depth == 0 and result.base == old
    assert result.snapshot is not None and result.snapshot.read_bytes()[8] == 2
    _, got = snapshot_model(result.snapshot, tmp_path / "x")
    assert got["tables"] == model.state()
    commit_round(root, model, 2)
    after = passed(root, **DELTA)
    assert not after.full and after.depth == 1 and after.base == result.snapshot
    with statelog.open(root) as store:
        assert store.recovery.snapshot == after.snapshot
        assert contents(store) == model.state()


# -- rebase: a chain at its length merged into one delta on its full snapshot -----------------


def test_a_chain_at_its_length_is_merged_into_one_delta_on_the_full_snapshot(
    tmp_path: Path,
) -> None:
    """A key of the full snapshot deleted in delta 1, one put in delta 1 and deleted in
    delta 2, one put in delta 2 and re-put by the tail: after the rebase the state is the
    model's in every view, the delta rests on the full snapshot, and holds no more than
    the deltas and the tail did."""
    root, model = tmp_path / "store", Model()
    chain = {"max_chain": 2, "full_ratio": 10.0, "retain": 10}
    with statelog.open(root, segment_bytes=SEG) as store:
        model.commit(store, {"in-full": 1, "kept": 2}, table="default")
        _filler(store, model, "a")
        full = _swapped(store, **FULL)
        model.commit(store, {"born-in-1": 3}, delete=("in-full",))
        _filler(store, model, "b")
        first = _swapped(store, **chain)
        model.commit(store, {"born-in-2": 4}, delete=("born-in-1",))
        _filler(store, model, "c")
        second = _swapped(store, **chain)
        assert (first.depth, second.depth) == (1, 2)
        model.commit(store, {"born-in-2": 5, "tail": 6})
        _filler(store, model, "d")
        result = passed(root, **chain)
        rebased = verify_snapshot(FILES, result.snapshot, store_id=None)
        assert rebased.delta is not None and rebased.depth == 1
        assert rebased.delta.parent == list_snapshots(root / "snapshots")[-1][2].name
        assert rebased.delta.parent_sha256 == full.sha256
        assert rebased.body_bytes <= first.body_bytes + second.body_bytes + 64 * 1024
        assert rebased.tables == {t: len(kv) for t, kv in model.state().items()}
        writer = store._writer
        assert writer is not None and writer.watcher is not None
        writer.watcher.check()
        assert writer.state.base_epoch == rebased.lsn
        for key in ("in-full", "born-in-1", "born-in-2", "tail", "kept"):
            _views(root, model, store, key, "default")
    _views(root, model, None, "born-in-2", "default")
    with statelog.open(root, segment_bytes=SEG) as store:  # more deltas on the rebased one
        model.commit(store, {"in-full": 7})
        _filler(store, model, "e")
        assert _swapped(store, **chain).depth == 2
        _views(root, model, store, "in-full", "default")


def test_a_retention_cut_short_never_leaves_a_delta_without_its_parent(tmp_path: Path) -> None:
    """Retention unlinks a delta before the parent it names: an unlink that fails (or a
    crash) after the first leaves older restore points with whole chains, never an
    orphaned delta."""
    from statelog.compaction.retention import apply_retention
    from statelog.kit.faults import FaultyFiles
    from statelog.storage.snapshots import verify_snapshot

    root, model = tmp_path / "store", Model()
    for n in range(4):  # a full snapshot and three deltas on it
        commit_round(root, model, n)
        passed(root, **DELTA)
    commit_round(root, model, 4)
    passed(root, **FULL)  # a newer restore point: the whole first chain is now unneeded
    layer = FaultyFiles()
    layer.fail("remove", errno=5, after=1, match=".snap")  # the second unlink fails
    sid = statelog.open(root, readonly=True).store_id
    with pytest.raises(OSError):
        apply_retention(root, layer, sid, retain=1)
    left = {
        p.name: verify_snapshot(FileLayer(), p, store_id=None)
        for p in (root / "snapshots").glob("*.snap")
    }
    assert len(left) >= 2  # something was cut short
    for meta in left.values():
        assert meta.delta is None or meta.delta.parent in left
