"""The writer's bound on its overlay (``max_overlay_bytes``): what it counts, when a
commit waits, and that a stalled commit writes nothing.

* the count: the log bytes of every commit applied since the base, on the
  commit path and on a replay at open, and what a swapped-in snapshot folds
  comes off it;
* no compactor: a commit at the bound raises ``WriteStallError`` after
  ``overlay_wait``, with a hint, and the store is as it was (epoch, state,
  log bytes);
* a compactor catching up: the waiting commit goes through once a snapshot
  folds the overlay, and the wait is counted in the metrics;
* the base watcher leaves a fresh snapshot without a published image to its
  compactor for a while instead of building the image itself.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.ops import metrics
from statelog.store import base_watcher
from statelog.store.base_watcher import PUBLISH_GRACE
from tests.helpers import segments

SEGMENT = 4096
BOUND = 2 * SEGMENT
FAST = timedelta(milliseconds=20)


def _payload(i: int) -> dict[str, str]:
    return {f"k{i}": "x" * 600}


def _fill(store: statelog.StateStore, start: int = 0) -> int:
    """Commit until the overlay reaches the bound; the next index."""
    i = start
    while store._state.overlay_bytes < BOUND:
        store.commit(offsets={"p": i + 1}, low_watermark_ms=i, put=_payload(i))
        i += 1
    return i


def _log_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in segments(path))


def test_the_overlay_counts_the_log_bytes_of_what_no_snapshot_folded(store_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=SEGMENT, base_refresh=FAST) as store:
        assert store._state.overlay_bytes == 0
        store.commit(offsets={"p": 1}, low_watermark_ms=0, put=_payload(0))
        one = store._state.overlay_bytes
        assert 600 < one < 800  # the record: a 600-byte value, its key, offsets, framing aside
        for i in range(1, 20):
            store.commit(offsets={"p": i + 1}, low_watermark_ms=i, put=_payload(i))
        before = store._state.overlay_bytes
        assert before > 10 * one
    with statelog.open(store_path, segment_bytes=SEGMENT, base_refresh=FAST) as store:
        assert store._state.overlay_bytes == before  # a replay counts what it applies
        compact(store_path)
        deadline = time.monotonic() + 10
        while store._state.overlay_bytes >= before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store._state.overlay_bytes < before  # the swap took the folded part off
        assert store._state.overlay_bytes == sum(
            g.record_bytes for g in store._state.generations
        )


def test_a_commit_at_the_bound_without_a_compactor_stalls_and_writes_nothing(
    store_path: Path,
) -> None:
    wait = timedelta(milliseconds=300)
    with statelog.open(
        store_path, segment_bytes=SEGMENT, max_overlay_bytes=BOUND, overlay_wait=wait
    ) as store:
        i = _fill(store)
        epoch, logged = store.epoch, _log_bytes(store_path)
        started = time.monotonic()
        with pytest.raises(statelog.WriteStallError) as err:
            store.commit(offsets={"p": i + 1}, low_watermark_ms=i, put=_payload(i))
        assert time.monotonic() - started >= wait.total_seconds()
        assert "max_overlay_bytes" in str(err.value) and "statelog-compactor" in err.value.hint
        assert store.epoch == epoch and store.get(f"k{i}") is None
        assert _log_bytes(store_path) == logged
    with statelog.open(store_path, readonly=True) as view:
        assert view.epoch == epoch


def test_a_stalled_commit_goes_through_once_a_snapshot_folds_the_overlay(
    store_path: Path,
) -> None:
    label = metrics.store_label(store_path)
    stalls0 = metrics.REGISTRY.get_sample_value("statelog_write_stalls_total", {"store": label})
    with statelog.open(
        store_path,
        segment_bytes=SEGMENT,
        max_overlay_bytes=BOUND,
        overlay_wait=timedelta(seconds=30),
        base_refresh=timedelta(seconds=30),  # only the stalled commit's poke looks in time
    ) as store:
        i = _fill(store)
        timer = threading.Timer(0.3, compact, args=(store_path,))
        timer.start()
        try:
            epoch = store.commit(offsets={"p": i + 1}, low_watermark_ms=i, put=_payload(i))
        finally:
            timer.join()
        assert epoch == store.epoch and store.get(f"k{i}") == _payload(i)[f"k{i}"]
        assert store._state.overlay_bytes < BOUND
    stalls = metrics.REGISTRY.get_sample_value("statelog_write_stalls_total", {"store": label})
    waited = metrics.REGISTRY.get_sample_value(
        "statelog_write_stall_seconds_total", {"store": label}
    )
    assert stalls is not None and stalls >= (stalls0 or 0) + 1
    assert waited is not None and waited >= 0.25


def test_the_watcher_waits_for_the_compactor_to_publish_a_fresh_snapshot(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with statelog.open(store_path, segment_bytes=SEGMENT, base_refresh=timedelta(hours=1)) as s:
        for i in range(20):
            s.commit(offsets={"p": i + 1}, low_watermark_ms=i, put=_payload(i))
        watcher = s._writer.watcher
        assert watcher is not None
        result = compact(store_path)
        assert result.snapshot is not None
        published = list((store_path / "base").glob(f"{result.snapshot.stem}.c*.mdb.ok"))
        for stamp in published:  # as if the compactor had not published yet
            stamp.unlink()
        assert watcher.check() is None  # fresh and unpublished: left to its compactor
        # An old mtime does not end the grace: a large snapshot's mtime is its last
        # write, before its fsync and rename; the grace runs from first sight.
        old = time.time() - PUBLISH_GRACE - 1
        os.utime(result.snapshot, (old, old))
        assert watcher.check() is None
        later = time.monotonic() + PUBLISH_GRACE + 1
        monkeypatch.setattr(base_watcher, "time", SimpleNamespace(monotonic=lambda: later))
        assert watcher.check() == result.snapshot  # past the grace: built here
