"""statelog's Faust store without a broker: the URL, the store's operations, the gate.

| case                                                | what must hold                            |
|-----------------------------------------------------|-------------------------------------------|
| `statelog://` URLs: absolute, relative, bare,       | the directory and typed options they name |
| with options                                        |                                           |
| an unknown option, a bad value, a repeated option   | IntegrationError naming it, nothing       |
|                                                     | written                                   |
| set, get, contains, delete, iterate, size           | as a dict, one commit per write           |
| the persisted changelog offset                      | in the partition's statelog offsets, with |
|                                                     | its next write or at close; never lowered |
| a changelog batch over two partitions               | one commit per partition, data and the    |
|                                                     | highest offset together                   |
| a crash, then the changelog replayed from the       | the store's own records (in the journal)  |
| persisted offset: its own records, some never       | not applied over newer writes; another    |
| delivered, then another writer's                    | writer's applied; the rest dropped        |
| a revoked partition, exactly-once processing        | nothing journaled or matched              |
| writes with an event, then recovery completes       | the source offset in the same commit;     |
|                                                     | assigned source partitions sought to it   |
| a partition recovered from another worker's         | its source partition sought to its        |
| changelog, no source offset in the store            | earliest offset (reset policy earliest)   |
| Faust's producer buffer slow to send                | its flush (before a source commit) waits  |
|                                                     | until empty, bounded, then logs           |
| close and reopen                                    | the data and offsets are still there      |
| a rebalance                                         | revoked partitions closed, assigned ones  |
|                                                     | opened                                    |
| reset_state                                         | the table's partition stores removed      |
| Faust outside the supported range                   | IntegrationError at import                |
| a partition's store                                 | counted by the metrics, audited           |
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import shutil
import sys
import weakref
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

faust = pytest.importorskip("faust")

from faust.streams import _current_event  # noqa: E402
from faust.types import TP  # noqa: E402

import statelog  # noqa: E402
from statelog.integrations.faust import TABLE, Store, parse_store_url  # noqa: E402


@pytest.mark.parametrize(
    ("url", "directory", "durability", "delay_ms", "compactor"),
    [
        ("statelog:///srv/t", "/srv/t", "group", 10, "thread"),
        ("statelog://tables/x", "tables/x", "group", 10, "thread"),
        ("statelog://", None, "group", 10, "thread"),
        ("statelog:///t?durability=commit&compactor=none", "/t", "commit", 10, "none"),
        ("statelog:///t?group_delay=5ms&compactor=process", "/t", "group", 5, "process"),
        ("statelog:///t?group_delay=0.5", "/t", "group", 0.5, "thread"),
    ],
)
def test_store_urls(
    url: str, directory: str | None, durability: str, delay_ms: float, compactor: str
) -> None:
    got = parse_store_url(url)
    assert got.directory == (None if directory is None else Path(directory))
    assert got.options.durability == durability
    assert got.options.group_delay == timedelta(milliseconds=delay_ms)
    assert got.options.compactor == compactor


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("statelog:///t?durabilty=group", "durabilty"),
        ("statelog:///t?durability=sometimes", "sometimes"),
        ("statelog:///t?compactor=daemon", "daemon"),
        ("statelog:///t?group_delay=soon", "soon"),
        ("statelog:///t?group_delay=0", "group_delay"),
        ("statelog:///t?durability=group&durability=commit", "twice"),
        ("rocksdb:///t", "statelog://"),
    ],
)
def test_bad_store_urls_are_refused(url: str, named: str, tmp_path: Path) -> None:
    with pytest.raises(statelog.IntegrationError, match=named) as err:
        parse_store_url(url)
    assert "statelog://" in err.value.hint
    app = faust.App("bad", broker="kafka://127.0.0.1:1", datadir=str(tmp_path))
    if url.startswith("statelog"):
        with pytest.raises(statelog.IntegrationError):
            _ = app.Table("t", partitions=2, store=url.replace("/t", str(tmp_path / "t"))).data
    assert not (tmp_path / "t").exists()


def _store(tmp_path: Path, **table: Any) -> Store:
    app = faust.App(
        "t", broker="kafka://127.0.0.1:1", datadir=str(tmp_path),
        store=f"statelog://{tmp_path}/tables?durability=commit&compactor=none",
    )  # fmt: skip
    data = app.Table("counts", partitions=2, **table).data
    assert isinstance(data, Store)
    return data


def test_a_table_partition_reads_and_writes(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store._set(b"a", b"1")
    store._set(b"b", b"2")
    store._set(b"a", b"3")
    store._del(b"b")
    store._del(b"absent")
    disk = store._store(0)
    # A commit each, the absent key's too: Faust sends its tombstone, which is journaled.
    assert disk.epoch == 5
    assert store._get(b"a") == b"3" and store._get(b"b") is None
    assert store._contains(b"a") and not store._contains(b"b")
    assert dict(disk.items(TABLE)) == {b"a": b"3"}
    assert store.partition_path(0) == tmp_path / "tables" / "counts-0.statelog"


def test_the_persisted_offset_lives_with_the_data(tmp_path: Path) -> None:
    store = _store(tmp_path)
    tp, other = TP("t-counts-changelog", 0), TP("t-counts-changelog", 1)
    assert store.persisted_offset(tp) is None
    store.set_persisted_offset(tp, 41)
    store.set_persisted_offset(tp, 40)  # lower: kept at 41, not an error
    assert store.persisted_offset(tp) == 41
    assert store._store(0).offsets == {}  # pending: it rides on the partition's next commit
    store._set(b"k", b"v")
    assert store._store(0).offsets == {"t-counts-changelog-0": 41}
    assert store._store(0).epoch == 1  # one commit: the write and the offset together
    store._store(1)
    store.set_persisted_offset(other, 7)
    store.close_all()  # written at close
    again = _store(tmp_path)
    assert (again.persisted_offset(tp), again.persisted_offset(other)) == (41, 7)


def _event(partition: int, offset: int, key: bytes, value: bytes | None) -> Any:
    tp = TP("t-counts-changelog", partition)
    msg = SimpleNamespace(key=key, value=value, partition=partition, offset=offset, tp=tp)
    return SimpleNamespace(message=msg)


def test_a_changelog_batch_is_one_commit_per_partition(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store._store(0)
    store._store(1)
    batch = [
        _event(0, 10, b"x", b"1"), _event(1, 5, b"y", b"2"), _event(0, 11, b"x", b"3"),
        _event(0, 12, b"z", b"4"), _event(0, 13, b"z", None),
    ]  # fmt: skip
    store.apply_changelog_batch(batch, lambda k: k, lambda v: v)
    p0, p1 = store._store(0), store._store(1)
    assert (p0.epoch, p1.epoch) == (1, 1)
    assert dict(p0.items(TABLE)) == {b"x": b"3"} and dict(p1.items(TABLE)) == {b"y": b"2"}
    assert p0.offsets == {"t-counts-changelog-0": 13}
    assert p1.offsets == {"t-counts-changelog-1": 5}


def test_a_rebalance_closes_revoked_and_opens_assigned(tmp_path: Path) -> None:
    store = _store(tmp_path)
    topic = store.table.changelog_topic.get_topic_name()
    store._set(b"k", b"v")
    first = store._store(0)
    asyncio.run(store.on_rebalance({TP(topic, 1)}, {TP(topic, 0)}, {TP(topic, 1)}))
    assert first.closed and set(store._stores) == {1}
    asyncio.run(store.on_rebalance({TP(topic, 0)}, {TP(topic, 1)}, {TP(topic, 0)}))
    assert set(store._stores) == {0} and store._get(b"k") == b"v"


def test_reset_state_removes_the_tables_stores(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store._set(b"k", b"v")
    store._store(1)
    store.reset_state()
    assert not list((tmp_path / "tables").glob("counts-*.statelog"))
    assert store._get(b"k") is None


@pytest.mark.parametrize("version", ["0.16.0", "0.14.9"])
def test_faust_outside_the_range_is_refused_at_import(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(faust, "__version__", version)
    for name in [m for m in sys.modules if m.startswith("statelog.integrations.faust")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(statelog.IntegrationError, match=version) as err:
        importlib.import_module("statelog.integrations.faust")
    assert "statelog[faust]" in err.value.hint


def test_metrics_and_the_audit_trail_see_a_partitions_store(tmp_path: Path) -> None:
    from statelog.ops import metrics
    from statelog.ops.audit import AuditTrail

    store = _store(tmp_path)
    path = store.partition_path(0)
    store._set(b"k0", b"v")  # opens the store
    label = {"store": metrics.store_label(path)}
    before = metrics.REGISTRY.get_sample_value("statelog_commits_total", label) or 0.0
    for i in range(1, 4):
        store._set(b"k%d" % i, b"v")
    assert metrics.REGISTRY.get_sample_value("statelog_commits_total", label) == before + 3
    store.close_all()
    trail = AuditTrail(path)
    assert trail.verify().ok
    assert "recovery" in {e.kind for e in trail.entries()}


class _Consumer:
    """Faust's consumer as the store meets it when recovery completes."""

    def __init__(self, assigned: set[TP]) -> None:
        self.assigned = assigned
        self.seeks: dict[TP, int] = {}

    def assignment(self) -> set[TP]:
        return self.assigned

    async def earliest_offsets(self, *partitions: TP) -> dict[TP, int]:
        return dict.fromkeys(partitions, 0)

    async def seek_wait(self, partitions: dict[TP, int]) -> None:
        self.seeks.update(partitions)


def _recovered(store: Store, actives: set[TP], assigned: set[TP] = frozenset()) -> _Consumer:
    consumer = _Consumer(set(assigned))
    store.app.consumer = consumer  # type: ignore[assignment]
    asyncio.run(store.on_recovery_completed(actives, set()))
    return consumer


class _Event:
    def __init__(self, message: Any) -> None:
        self.message = message


@contextlib.contextmanager
def _processing(topic: str, partition: int, offset: int) -> Iterator[None]:
    """Inside an agent, processing one event of the source topic."""
    tp = TP(topic, partition)
    msg = SimpleNamespace(topic=topic, partition=partition, offset=offset, tp=tp)
    event = _Event(msg)
    token = _current_event.set(weakref.ref(event))  # type: ignore[arg-type]
    try:
        yield
    finally:
        _current_event.reset(token)


def test_a_stores_source_offsets_decide_where_a_partition_without_commits_resumes(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    for offset in (7, 8, 9):
        with _processing("t-events", 1, offset):
            store._set(b"k%d" % offset, b"v")
    with _processing("t-events", 1, 3):  # an event again (at least once): never lowers it
        store._set(b"k3", b"v")
    disk = store._store(1)
    assert disk.offsets == {"t-events-1": 10}
    changelog, source = TP("t-counts-changelog", 1), TP("t-events", 1)
    consumer = _recovered(store, {changelog}, {changelog, source, TP("t-events", 0)})
    assert consumer.seeks == {source: 10}  # Faust then seeks where Kafka holds a commit


def test_a_partition_recovered_from_another_workers_changelog_resumes_at_its_start(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    store.app.topics.acking_topics.add("t-events")  # an agent's topic: Faust commits it
    _replay(store, (0, b"k", b"1"))  # the state another worker's events made, no source offset
    changelog = TP("t-counts-changelog", 0)
    source, other, internal = TP("t-events", 0), TP("t-events", 1), TP("t-__leader", 0)
    consumer = _recovered(store, {changelog}, {changelog, source, other, internal})
    # The consumer's position is not trusted: Faust dropped what it fetched while
    # recovering, and seeks nowhere without a commit.
    assert consumer.seeks == {source: 0}
    store.app.conf.consumer_auto_offset_reset = "latest"
    assert _recovered(store, {changelog}, {changelog, source}).seeks == {}


def _replay(store: Store, *records: tuple[int, bytes, bytes | None]) -> None:
    batch = [_event(0, offset, key, value) for offset, key, value in records]
    store.apply_changelog_batch(batch, lambda k: k, lambda v: v)


def _crash(tmp_path: Path) -> Path:
    """A SIGKILL: the stores' files as they are now (every commit durable), copied
    to a new data directory; nothing pending in memory reaches them."""
    after = tmp_path / "after-crash"
    shutil.copytree(tmp_path / "tables", after / "tables")
    return after


def test_a_replay_after_a_crash_skips_the_stores_own_records(tmp_path: Path) -> None:
    store = _store(tmp_path)
    tp = TP("t-counts-changelog", 0)
    for value in (b"1", b"2", b"3", b"4"):
        store._set(b"k", value)  # changelog offsets 10, 11, 12, 13 once delivered
    store._set(b"j", b"9")  # offset 14: never delivered
    store.set_persisted_offset(tp, 10)
    store._set(b"other", b"x")  # carries offset 10 and the first removal
    store.set_persisted_offset(tp, 11)  # confirmed in memory only: the crash loses it
    assert len(store._journals[0]) == 4
    again = _store(_crash(tmp_path))
    assert again.persisted_offset(tp) == 10 and len(again._journals[0]) == 5
    with _processing("t-events", 0, 40):  # a write while recovery runs: this run's own
        again._set(b"new", b"n")
    # Faust replays from offset 11: the store's own records, not applied over its
    # newer writes (13 matched past 12, compacted away), then another writer's.
    _replay(again, (11, b"k", b"2"))
    assert again._get(b"k") == b"4"
    _replay(again, (13, b"k", b"4"), (20, b"j", b"new"), (21, b"k", b"3"))
    disk = again._store(0)
    assert dict(disk.items(TABLE)) == {b"k": b"3", b"j": b"new", b"other": b"x", b"new": b"n"}
    assert disk.offsets == {"t-counts-changelog-0": 21, "t-events-0": 41}
    _recovered(again, {tp})
    # The crashed run's entries dropped; this run's write waits for its confirmation.
    assert len(again._journals[0]) == 1 and len(list(disk.items("faust.sent"))) == 1
    again.set_persisted_offset(tp, 22)
    again.flush_offsets()
    assert not list(disk.items("faust.sent"))


def test_a_replay_of_only_the_stores_own_records_keeps_its_newest_writes(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    store._set(b"k", b"1")
    store._set(b"k", b"2")  # never delivered; Kafka's commit passed its event
    again = _store(_crash(tmp_path))
    _replay(again, (0, b"k", b"1"))
    assert again._get(b"k") == b"2"  # not rolled back to the delivered copy


def test_the_journal_ends_with_the_partition_or_under_exactly_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    topic = store.table.changelog_topic.get_topic_name()
    store._set(b"k", b"1")
    asyncio.run(store.on_rebalance(set(), {TP(topic, 0)}, set()))  # revoked: dropped
    again = _store(tmp_path)
    again._store(0)
    assert len(again._journals[0]) == 0
    _replay(again, (0, b"k", b"0"))  # the next owner's records are applied
    assert again._get(b"k") == b"0"

    once = faust.App(
        "e", broker="kafka://127.0.0.1:1", datadir=str(tmp_path / "e"),
        processing_guarantee="exactly_once",
        store=f"statelog://{tmp_path}/e?durability=commit&compactor=none",
    )  # fmt: skip
    data = once.Table("counts", partitions=1).data
    assert isinstance(data, Store)
    data._set(b"k", b"1")
    assert len(data._journals[0]) == 0


class _SlowBuffer:
    """A producer buffer whose sender takes several of Faust's 0.1 s waits per record."""

    def __init__(self, records: int, *, stuck: bool = False) -> None:
        self.size, self.waits, self.stuck = records, 0, stuck
        self.app = SimpleNamespace(conf=SimpleNamespace(broker_request_timeout=0.3))

    async def flush_atmost(self, max_messages: int | None) -> int:
        self.waits += 1
        if self.waits % 3 == 0 and not self.stuck:
            self.size -= 1
            return 1
        await asyncio.sleep(0.01)
        return 0  # Faust's flush gives up here: 0.1 s without a send


def test_a_source_commit_waits_until_the_changelog_records_left(tmp_path: Path) -> None:
    from faust.transport.producer import ProducerBuffer

    _store(tmp_path)  # a statelog store installs the drain
    slow = _SlowBuffer(4)
    asyncio.run(ProducerBuffer.flush(slow))  # type: ignore[arg-type]
    assert slow.size == 0 and slow.waits == 12
    stuck = _SlowBuffer(2, stuck=True)  # a broker that takes nothing: bounded, then logged
    asyncio.run(ProducerBuffer.flush(stuck))  # type: ignore[arg-type]
    assert stuck.size == 2 and stuck.waits > 3
