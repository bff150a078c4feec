"""The events recovery, the compactor, retention and the base watcher emit.

| what happens                                  | events expected                                  |
|-----------------------------------------------|--------------------------------------------------|
| a clean open                                  | recovery (outcome clean, replay range)           |
| a read-only open                              | recovery with writable=False, readonly=True      |
| a torn tail cut by the writer                 | truncation (torn, saved_as .broken), recovery    |
| newest snapshot damaged, walked past on open  | walk_back + integrity_mismatch (recovery)        |
| a compaction pass that writes a snapshot      | compaction (epoch, segments, records)            |
| the compactor meets a damaged snapshot twice  | walk_back + integrity_mismatch once, not per pass|
| retention deletes                             | one retention_delete per pass, every file listed |
| the writer swaps in a new base                | base_swap                                        |
| an unknown kind                               | ValueError (a programming error)                 |
| a listener that raises                        | the others still run; the emitter never sees it  |
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import statelog
from statelog import events
from statelog.compaction.fold import compact
from statelog.events import Event
from tests.helpers import build_store, flip_bit, segments, simple_commits


@pytest.fixture
def seen() -> Iterator[list[Event]]:
    got: list[Event] = []
    unsubscribe = events.subscribe(got.append)
    yield got
    unsubscribe()


def kinds(seen: list[Event]) -> list[str]:
    return [e.kind for e in seen]


def one(seen: list[Event], kind: str) -> Event:
    found = [e for e in seen if e.kind == kind]
    assert len(found) == 1, (kind, kinds(seen))
    return found[0]


def test_clean_open_emits_one_recovery_with_its_replay_range(
    store_path: Path, seen: list[Event]
) -> None:
    build_store(store_path, simple_commits(7))
    seen.clear()
    with statelog.open(store_path):
        pass
    ev = one(seen, "recovery")
    assert ev.writable and ev.store == store_path
    assert ev.fields["epoch"] == 7 and ev.fields["outcome"] == "clean"
    assert (ev.fields["replay_from"], ev.fields["replay_to"]) == (1, 7)
    assert ev.fields["records_replayed"] == 7 and ev.fields["snapshot"] is None
    assert "integrity_mismatch" not in kinds(seen)


def test_readonly_open_emits_recovery_marked_not_writable(
    store_path: Path, seen: list[Event]
) -> None:
    build_store(store_path, simple_commits(3))
    seen.clear()
    with statelog.open(store_path, readonly=True):
        pass
    ev = one(seen, "recovery")
    assert not ev.writable and ev.fields["readonly"] is True


def test_torn_tail_cut_emits_a_truncation_naming_the_evidence(
    store_path: Path, seen: list[Event]
) -> None:
    build_store(store_path, simple_commits(5))
    last = segments(store_path)[-1]
    with open(last, "ab") as fh:
        fh.write(b"\x07" * 11)  # an unfinished frame header
    seen.clear()
    with statelog.open(store_path):
        pass
    cut = one(seen, "truncation")
    assert cut.fields["file"] == last.name and cut.fields["reason"] == "torn"
    assert cut.fields["saved_as"].startswith(last.name + ".broken")
    assert cut.fields["bytes_dropped"] == 11
    assert one(seen, "recovery").fields["outcome"] == "torn-tail"


def test_damaged_snapshot_walked_past_on_open_is_a_walk_back_and_a_mismatch(
    store_path: Path, seen: list[Event]
) -> None:
    build_store(store_path, simple_commits(6), segment_bytes=4096)
    assert compact(store_path).snapshot is not None
    build_more(store_path, 4)
    newest = compact(store_path).snapshot
    assert newest is not None
    flip_bit(newest, newest.stat().st_size // 2)
    seen.clear()
    with statelog.open(store_path) as store:
        assert store.recovery.snapshot != newest
    back = one(seen, "walk_back")
    assert back.fields == {**back.fields, "file": newest.name, "source": "recovery"}
    mm = one(seen, "integrity_mismatch")
    assert mm.fields["file"] == newest.name and mm.fields["source"] == "recovery"
    assert one(seen, "recovery").fields["rejected"][0]["file"] == newest.name


def test_compaction_emits_what_it_folded(store_path: Path, seen: list[Event]) -> None:
    build_store(store_path, simple_commits(9))
    seen.clear()
    result = compact(store_path)
    assert result.snapshot is not None
    ev = one(seen, "compaction")
    assert ev.fields["snapshot"] == result.snapshot.name
    assert ev.fields["epoch"] == 9 and ev.fields["records"] == 9
    assert ev.fields["segments"] == len(result.segments) and ev.fields["base"] is None


def test_compactor_reports_the_same_damaged_snapshot_once(
    store_path: Path, seen: list[Event]
) -> None:
    build_store(store_path, simple_commits(4))
    snap = compact(store_path).snapshot
    assert snap is not None
    build_more(store_path, 3)
    flip_bit(snap, snap.stat().st_size - 5)  # the footer
    seen.clear()
    compact(store_path)
    build_more(store_path, 2)
    compact(store_path)
    assert kinds(seen).count("walk_back") == 1
    mm = [e for e in seen if e.kind == "integrity_mismatch"]
    assert len(mm) == 1 and mm[0].fields["file"] == snap.name
    assert mm[0].fields["source"] == "compactor"


def test_retention_emits_one_event_per_pass_listing_every_file(
    store_path: Path, seen: list[Event]
) -> None:
    build_store(store_path, simple_commits(3))
    for _ in range(3):
        compact(store_path, retain=1)
        build_more(store_path, 2)
    seen.clear()
    result = compact(store_path, retain=1)
    (ev,) = [e for e in seen if e.kind == "retention_delete"]
    assert len(result.deleted) > 1 and ev.fields["count"] == len(result.deleted)
    names = [f["file"].split("/")[-1] for f in ev.fields["files"]]
    assert names == [p.name for p in result.deleted]
    assert all(f["reason"] for f in ev.fields["files"])


def test_base_swap_is_emitted_by_the_writer(store_path: Path, seen: list[Event]) -> None:
    with statelog.open(store_path, segment_bytes=4096) as store:
        for i in range(40):  # several rolls at 4 KiB: sealed segments to fold
            store.commit(offsets={"p": i + 1}, low_watermark_ms=i, put={f"k{i}": "v" * 200})
        assert compact(store_path).snapshot is not None
        assert store._writer is not None and store._writer.watcher is not None
        assert store._writer.watcher.check() is not None
    ev = one(seen, "base_swap")
    assert ev.store == store_path and ev.fields["epoch"] > 0


def test_unknown_kind_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown event kind"):
        events.emit(Path("."), "recoverd")


def test_failing_listener_never_reaches_the_emitter(seen: list[Event]) -> None:
    def broken(_e: Event) -> None:
        raise RuntimeError("listener bug")

    unsubscribe = events.subscribe(broken)
    try:
        events.emit(Path("s"), "base_swap", snapshot="x.snap", epoch=1)
    finally:
        unsubscribe()
    assert kinds(seen) == ["base_swap"]


def build_more(store: Path, n: int) -> None:
    """Commit ``n`` more records and close (which seals the segment)."""
    with statelog.open(store) as s:
        for i in range(n):
            s.commit(
                offsets={"more": s.epoch + 1},
                low_watermark_ms=s.low_watermark_ms,
                put={f"more-{s.epoch}-{i}": os.urandom(8).hex()},
            )
