"""statelog's Quix Streams store without a broker: the store, its transactions, the gate.

| case                                           | what must hold                                 |
|------------------------------------------------|------------------------------------------------|
| a transaction flushed outside a checkpoint     | one statelog commit, readable through it       |
| several partitions' transactions, a checkpoint | nothing committed until its commit, then one   |
|                                                | record with the offsets and changelog offsets  |
| a checkpoint that raises                       | nothing committed, nothing left staged         |
| a revoking checkpoint (prepare, no flush)      | the prepared changes are still committed       |
| column families                                | one table each, apart                          |
| changelog recovery                             | batched commits, the changelog offset kept; a  |
|                                                | TTL-stamped message refused                    |
| per-key TTL                                    | refused with a typed error, nothing staged     |
| destructive recovery of a partition            | its tables and changelog offset gone, others   |
|                                                | kept                                           |
| Quix outside the supported range, or missing   | IntegrationError at import                     |
| statelog= that is not StoreOptions             | IntegrationError before anything is opened     |
| the application's stores                       | default and StatelogStore in statelog; an      |
|                                                | explicit MemoryStore stays; windows in RocksDB |
| a second application on the same state dir     | StoreLockedError                               |
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

quixstreams = pytest.importorskip("quixstreams")

from quixstreams.state.base.transaction import PartitionTransactionStatus  # noqa: E402
from quixstreams.state.memory import MemoryStore  # noqa: E402
from quixstreams.state.metadata import Marker  # noqa: E402

import statelog  # noqa: E402
from statelog.integrations import quix as sq  # noqa: E402
from statelog.integrations.quix import store as quix_store  # noqa: E402
from statelog.integrations.quix.state import CHANGELOG_TABLE, QuixState  # noqa: E402


@pytest.fixture
def state(tmp_path: Path) -> Iterator[QuixState]:
    qs = QuixState(tmp_path / "statelog", statelog.StoreOptions())
    qs.open()
    yield qs
    qs.close()


def _partition(state: QuixState, partition: int = 0) -> sq.StatelogStorePartition:
    store = sq.StatelogStore("counts", "events", state)
    return store.assign_partition(partition)  # type: ignore[return-value]


def test_a_flush_outside_a_checkpoint_is_one_commit(state: QuixState) -> None:
    part = _partition(state)
    with part.begin() as tx:
        tx.set("k", 1, prefix=b"e1")
        tx.set("k", 2, prefix=b"e2")
        tx.delete("gone", prefix=b"e1")
    assert state.store.epoch == 1
    with part.begin() as tx:
        assert tx.get("k", prefix=b"e1") == 1
        assert tx.get("k", prefix=b"e2") == 2
        assert tx.exists("k", prefix=b"e1")
        assert not tx.exists("gone", prefix=b"e1")
        tx.delete("k", prefix=b"e1")
    assert part.get(b"e1|" + b'"k"') is Marker.UNDEFINED
    assert state.store.epoch == 2


def test_a_checkpoint_commits_every_partition_once_with_offsets(state: QuixState) -> None:
    parts = [_partition(state, p) for p in range(3)]
    with state.checkpoint():
        txs = [part.begin() for part in parts]
        for i, tx in enumerate(txs):
            tx.set("n", i, prefix=b"k")
            tx.prepare(processed_offsets={"events": 10 + i})
            tx.flush(changelog_offset=100 + i)
        assert state.store.epoch == 0  # flushed, staged, not yet committed
        epoch = state.commit({("events", p): 10 + p for p in range(3)})
    assert epoch == 1 and state.store.epoch == 1
    assert state.store.offsets == {"events-0": 11, "events-1": 12, "events-2": 13}
    assert [parts[p].get_changelog_offset() for p in range(3)] == [100, 101, 102]
    assert dict(state.store.items(CHANGELOG_TABLE)) == {
        "events/counts/0": 100, "events/counts/1": 101, "events/counts/2": 102,
    }  # fmt: skip
    assert [state.resume_offset("events", p) for p in range(3)] == [11, 12, 13]


def test_a_checkpoint_that_raises_commits_nothing(state: QuixState) -> None:
    part = _partition(state)
    with pytest.raises(RuntimeError), state.checkpoint():
        tx = part.begin()
        tx.set("n", 1, prefix=b"k")
        tx.prepare()
        tx.flush(changelog_offset=5)
        raise RuntimeError("the Kafka commit failed")
    assert not state.staged
    assert state.store.epoch == 0
    assert state.commit({}) is None


def test_a_prepared_transaction_is_committed_without_its_flush(state: QuixState) -> None:
    # A revoking checkpoint skips the flush of changelog-backed stores.
    part = _partition(state)
    with state.checkpoint():
        tx = part.begin()
        tx.set("n", 7, prefix=b"k")
        tx.prepare(processed_offsets={"events": 3})
        assert tx.status is PartitionTransactionStatus.PREPARED
        state.commit({("events", 0): 3})
    with part.begin() as again:
        assert again.get("n", prefix=b"k") == 7
    assert state.store.offsets == {"events-0": 4}


def test_column_families_are_tables_apart(state: QuixState) -> None:
    part = _partition(state, 2)
    with part.begin() as tx:
        tx.set("k", "a", prefix=b"p")
        tx.set("k", "b", prefix=b"p", cf_name="other")
    assert set(state.store.tables()) - {CHANGELOG_TABLE} == {
        "quix/events/counts/2/default", "quix/events/counts/2/other",
    }  # fmt: skip
    with part.begin() as tx:
        assert tx.get("k", prefix=b"p") == "a"
        assert tx.get("k", prefix=b"p", cf_name="other") == "b"


def test_changelog_recovery_commits_in_batches(
    state: QuixState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quix_store, "RECOVERY_BATCH", 4)
    part = _partition(state)
    for offset in range(10):
        part.recover_from_changelog_message(b"k%d" % offset, b"%d" % offset, "default", offset)
    assert state.store.epoch == 2  # two batches of 4; two messages still staged
    assert part.get_changelog_offset() == 9  # the staged offset counts
    part.recover_from_changelog_message(b"k0", None, "default", 10)
    part.complete_recovery()
    assert state.store.epoch == 3
    assert part.get(b"k0") is Marker.UNDEFINED and part.get(b"k9") == b"9"
    assert part.get_changelog_offset() == 10
    with pytest.raises(statelog.IntegrationError, match="TTL"):
        part.recover_from_changelog_message(b"k", b"v", "default", 11, ttl_stamped=True)
    assert part.get_changelog_offset() == 10


def test_per_key_ttl_is_refused(state: QuixState) -> None:
    part = _partition(state)
    tx = part.begin()
    with pytest.raises(statelog.IntegrationError, match="TTL") as err:
        tx.set("k", 1, prefix=b"p", timestamp=1, ttl=timedelta(seconds=5))
    assert "RocksDB" in err.value.hint
    assert not tx.changed


def test_destroying_a_partition_drops_only_its_state(state: QuixState) -> None:
    store = sq.StatelogStore("counts", "events", state)
    for p in (0, 1):
        tx = store.assign_partition(p).begin()
        tx.set("k", p, prefix=b"x")
        tx.set("k", p, prefix=b"x", cf_name="cf")
        tx.flush(changelog_offset=7)
    assert store.destroy_partition(0) is True
    assert 0 not in store.partitions
    kept = store.assign_partition(1)
    with kept.begin() as tx:
        assert tx.get("k", prefix=b"x") == 1
    gone = store.assign_partition(0)
    assert gone.get_changelog_offset() is None
    with gone.begin() as tx:
        assert tx.get("k", prefix=b"x") is None
        assert tx.get("k", prefix=b"x", cf_name="cf") is None


@pytest.mark.parametrize("version", ["3.29.0", "3.27.9", "4.0.0"])
def test_quix_outside_the_range_is_refused_at_import(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quixstreams, "__version__", version)
    for name in [m for m in sys.modules if m.startswith("statelog.integrations.quix")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(statelog.IntegrationError, match=version) as err:
        importlib.import_module("statelog.integrations.quix")
    assert "statelog[quix]" in err.value.hint


def test_a_missing_quix_is_refused_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.startswith("statelog.integrations.quix")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "quixstreams", None)  # import raises ImportError
    monkeypatch.setattr(
        "importlib.metadata.version",
        lambda name: (_ for _ in ()).throw(importlib.metadata.PackageNotFoundError(name)),
    )
    with pytest.raises(statelog.IntegrationError, match="not installed"):
        importlib.import_module("statelog.integrations.quix")


def _app(tmp_path: Path, **kwargs: object) -> sq.Application:
    return sq.Application(
        broker_address="127.0.0.1:1", consumer_group="g", state_dir=str(tmp_path),
        auto_create_topics=False, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip


def test_statelog_options_must_be_store_options(tmp_path: Path) -> None:
    with pytest.raises(statelog.IntegrationError, match="StoreOptions"):
        _app(tmp_path, statelog={"durability": "group"})
    assert not any(tmp_path.iterdir())


def test_the_application_keeps_default_stores_in_statelog(tmp_path: Path) -> None:
    app = _app(tmp_path)
    manager = app._state_manager
    assert isinstance(manager, sq.StatelogStateManager)
    assert app._processing_context.state_manager is manager
    manager.register_store("events")
    manager.register_store("events", "explicit", store_type=sq.StatelogStore)
    manager.register_store("events", "mem", store_type=MemoryStore)
    manager.register_windowed_store("events", "window")
    kinds = {name: type(s).__name__ for name, s in manager.stores["events"].items()}
    assert kinds == {
        "default": "StatelogStore", "explicit": "StatelogStore", "mem": "MemoryStore",
        "window": "WindowedRocksDBStore",
    }  # fmt: skip
    assert manager.statelog_streams() == {"events"}


def test_a_second_application_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    first, second = _app(tmp_path), _app(tmp_path)
    first._state_manager.init()
    try:
        with pytest.raises(statelog.StoreLockedError):
            second._state_manager.init()
    finally:
        first._state_manager.close()
    assert (tmp_path / "g" / "statelog").is_dir()


def test_metrics_and_the_audit_trail_see_the_applications_store(tmp_path: Path) -> None:
    from statelog.ops import metrics
    from statelog.ops.audit import AuditTrail

    app = _app(tmp_path)
    manager = app._state_manager
    assert isinstance(manager, sq.StatelogStateManager)
    manager.register_store("events")
    manager.init()
    try:
        root = app.statelog.path
        label = {"store": metrics.store_label(root)}
        before = metrics.REGISTRY.get_sample_value("statelog_commits_total", label) or 0.0
        part = manager.get_store("events").assign_partition(0)
        for i in range(3):
            with part.begin() as tx:
                tx.set("n", i, prefix=b"k")
        after = metrics.REGISTRY.get_sample_value("statelog_commits_total", label)
        assert after == before + 3
    finally:
        manager.close()
    trail = AuditTrail(root)
    assert trail.verify().ok
    assert "recovery" in {e.kind for e in trail.entries()}
