"""The recovery ladder and the base swap, as a table of failure modes.

| snapshots found                             | expected                                  |
|---------------------------------------------|-------------------------------------------|
| one that verifies and links (format 2 or 1) | used; only the log after it is replayed   |
| newest damaged (header, meta, body, footer) | rejected, kept; older one, longer replay  |
| newest does not link to the log (chain)     | rejected; walk back                       |
| all damaged, early log still there          | full replay from epoch 1; all rejected    |
| all damaged, early log gone                 | ResnapshotRequired naming every file      |
| a new one while the writer runs             | swapped in, generations dropped, reads whole |

Snapshots are built here from a read-only view of the store (the compactor
has its own tests); each is cut at the end of a sealed segment, as the
compactor cuts them.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

import statelog
from statelog.log.reader import scan_segment
from statelog.log.segments import list_segments
from statelog.storage.builder import ImageBuilder
from statelog.storage.fileio import FileLayer
from statelog.storage.snapshots import SnapshotMeta, list_snapshots, write_snapshot
from tests.helpers import build_store, flip_bit, model_at, simple_commits, snapshot_of


def make_snapshot(
    store: Path, upto_segment: int | None = None, *, chain: int | None = None, version: int = 2
) -> Path:
    """Snapshot the state at the end of sealed segment ``upto_segment`` (default: the last).

    ``version=1`` writes the format an older store holds (the body a raw LMDB image).
    """
    segs = list_segments(store / "wal")
    if upto_segment is not None:
        segs = [s for s in segs if s[0] <= upto_segment]
    _seq, _lsn, last = segs[-1]
    scan = scan_segment(last, last.read_bytes(), store_id=None, prev_crc=None, is_last=False)
    assert scan.sealed_lsn is not None, "snapshots are cut at sealed segment ends"
    lsn = scan.sealed_lsn
    # The state at lsn: replay a copy of the log cut after that segment.
    view = store.parent / f"view-{lsn}"
    (view / "wal").mkdir(parents=True)
    (view / "IDENTITY").write_bytes((store / "IDENTITY").read_bytes())
    for _s, _l, p in segs:
        (view / "wal" / p.name).write_bytes(p.read_bytes())
    with statelog.open(view, readonly=True) as ro:
        assert ro.epoch == lsn
        image = store.parent / f"image-{lsn}.mdb"
        with ImageBuilder.create(image.with_suffix(".work")) as b:
            for t in ro.tables():
                rows = list(ro._state.items(t))
                b.apply(t, [k for k, _ in rows], [v for _, v in rows], [])
            size = b.finish(image)
        meta = SnapshotMeta(
            store_id=ro.store_id,
            epoch=lsn,
            lsn=lsn,
            chain=scan.end_crc if chain is None else chain,
            offsets=ro.offsets,
            low_watermark_ms=ro.low_watermark_ms,
            tables={t: ro.count(t) for t in ro.tables()},
            body_bytes=size,
            created_ms=0,
        )
    path, written = write_snapshot(
        FileLayer(), store / "snapshots", meta, image, level=1, version=version
    )
    assert written.tables == {t: n for t, n in meta.tables.items() if n}
    if version == 1:
        assert written.body_bytes == size  # the image itself
    return path


@pytest.mark.parametrize("version", [2, 1])
def test_snapshot_that_links_is_used_and_only_the_tail_replayed(
    store_path: Path, version: int
) -> None:
    models = build_store(store_path, simple_commits(10))
    snap = make_snapshot(store_path, version=version)
    assert snap.read_bytes()[8] == version
    models = build_store_more(store_path, models, 5)
    with statelog.open(store_path) as store:
        r = store.recovery
        assert r.snapshot == snap and r.rejected == ()
        assert r.replayed == 5 and store.epoch == 15
        assert snapshot_of(store) == model_at(models, 15)


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("where", ["header", "meta", "body", "footer"])
def test_damaged_newest_snapshot_is_walked_past(store_path: Path, where: str, version: int) -> None:
    models = build_store(store_path, simple_commits(8))
    older = make_snapshot(store_path, version=3 - version)
    models = build_store_more(store_path, models, 4)
    newest = make_snapshot(store_path, version=version)
    models = build_store_more(store_path, models, 3)
    size = newest.stat().st_size
    offset = {"header": 33, "meta": 70, "body": size // 2, "footer": size - 20}[where]
    flip_bit(newest, offset)
    damaged = newest.read_bytes()
    with statelog.open(store_path) as store:
        r = store.recovery
        assert r.snapshot == older
        assert [x.path for x in r.rejected] == [newest] and r.rejected[0].reason
        assert r.replayed == 7 and store.epoch == 15
        assert snapshot_of(store) == model_at(models, 15)
    assert newest.read_bytes() == damaged  # evidence stays


def test_snapshot_that_does_not_link_is_rejected(store_path: Path) -> None:
    """A snapshot that verifies but names another chain value is not this log's."""
    models = build_store(store_path, simple_commits(6))
    bad = make_snapshot(store_path, chain=0xDEADBEEF)
    models = build_store_more(store_path, models, 2)
    with statelog.open(store_path) as store:
        r = store.recovery
        assert r.snapshot is None and r.replayed == 8
        assert [x.path for x in r.rejected] == [bad]
        assert "links to" in r.rejected[0].reason
        assert snapshot_of(store) == model_at(models, 8)
    assert bad.exists()


def test_every_snapshot_damaged_but_log_complete_replays_everything(store_path: Path) -> None:
    models = build_store(store_path, simple_commits(5))
    snap = make_snapshot(store_path)
    flip_bit(snap, 100)
    with statelog.open(store_path) as store:
        assert store.recovery.snapshot is None and store.recovery.replayed == 5
        assert snapshot_of(store) == model_at(models, 5)


def test_every_snapshot_damaged_and_early_log_gone_requires_resnapshot(store_path: Path) -> None:
    models = build_store(store_path, simple_commits(5))
    snap = make_snapshot(store_path)
    build_store_more(store_path, models, 3)
    for _seq, lsn, p in list_segments(store_path / "wal"):
        if lsn <= 5:
            p.unlink()  # retention removed what the snapshot covered
    flip_bit(snap, 40)
    with pytest.raises(statelog.ResnapshotRequired) as err:
        statelog.open(store_path)
    names = [p for p, _ in err.value.tried]
    assert snap in names and err.value.hint
    assert snap.name in str(err.value)


def test_writer_swaps_in_a_new_snapshot_and_reads_stay_whole(store_path: Path) -> None:
    """Reads during the swap see one consistent state: the invariant sum never changes."""
    fast = timedelta(milliseconds=20)
    with statelog.open(store_path, segment_bytes=4096, base_refresh=fast) as store:
        store.commit(offsets={"p": 0}, low_watermark_ms=0, put={f"a{i}": 10 for i in range(10)})
        stop = threading.Event()
        torn: list[int] = []

        def reader() -> None:
            while not stop.is_set():
                total = sum(v for _, v in store.items())
                if total != 100:
                    torn.append(total)

        t = threading.Thread(target=reader)
        t.start()
        swaps = 0
        try:
            # Move one unit between keys: every commit keeps the sum at 100.
            for i in range(1, 200):
                src, dst = f"a{i % 10}", f"a{(i + 3) % 10}"
                a, b = store.get(src), store.get(dst)
                with store.transaction() as tx:
                    tx.put(src, a - 1)
                    tx.put(dst, b + 1)
                    tx.put("pad", "x" * 400, table="padding")  # rolls a 4 KiB segment often
                    tx.set_offset("p", i)
                if i % 50 == 0:
                    sealed = [seq for seq, _, _ in list_segments(store_path / "wal")][:-1]
                    before = store._state.base_epoch
                    make_snapshot(store_path, upto_segment=sealed[-1])
                    deadline = time.monotonic() + 5
                    while store._state.base_epoch == before and time.monotonic() < deadline:
                        time.sleep(0.01)
                    swaps += store._state.base_epoch != before
        finally:
            stop.set()
            t.join()
        assert torn == []
        assert swaps == 3, "the writer did not swap in every snapshot"
        assert len(store._state.generations) < len(list_segments(store_path / "wal"))
        assert sum(v for _, v in store.items()) == 100
        final = dict(store.items())
    with statelog.open(store_path) as again:
        assert again.recovery.snapshot is not None
        assert dict(again.items()) == final


def build_store_more(path: Path, models: list[dict], n: int) -> list[dict]:
    """Continue a store built by build_store with ``n`` more simple commits."""
    start = len(models) - 1
    more = simple_commits(start + n)[start:]
    with statelog.open(path) as store:
        for i, c in enumerate(more, start=start + 1):
            store.commit(offsets={"p0": i}, low_watermark_ms=i * 10, put=c.put, delete=c.delete)
            prev = models[-1]
            tables = {t: dict(kv) for t, kv in prev["tables"].items()}
            t = tables.setdefault("default", {})
            for k in c.delete:
                t.pop(k, None)
            t.update(c.put)
            models.append({"offsets": {"p0": i}, "low_watermark_ms": i * 10, "tables": tables})
    return models


def test_list_snapshots_sees_what_make_snapshot_wrote(store_path: Path) -> None:
    build_store(store_path, simple_commits(3))
    snap = make_snapshot(store_path)
    assert [p for _, _, p in list_snapshots(store_path / "snapshots")] == [snap]
