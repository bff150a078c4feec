"""A Faust table store kept in statelog: ``store="statelog:///dir?durability=group"``.

Layout: one statelog store per table partition,
``<dir>/<table>-<partition>.statelog`` (``<dir>`` from the URL, default the
app's ``tabledir``), the way Faust's RocksDB store keeps one database per
partition: a partition moves between workers whole, each store has its own
writer lock, and a revoked partition is closed while the others go on. In
each store, the table's keys and values (bytes, as Faust serialized them)
are in the statelog table ``faust``; the changelog offset Faust persists
(``set_persisted_offset``) is the statelog offset ``<changelog topic>-<partition>``,
so it moves with the data, and recovery replays the changelog from it.

Every table write (``table[k] = v``, ``del table[k]``) is one statelog
commit, since Faust has no transaction boundary of its own; the persisted
offset Faust sets once the write's changelog record is delivered rides on
the partition's next commit (or is written at close). A changelog batch
(recovery, standbys) is one commit per partition with its highest offset.
Each write also journals the changelog record it stands for until Faust
confirms it (:mod:`statelog.integrations.faust.journal`), so a recovery after
a crash never rolls the store back to an older copy of its own writes.
With the default ``durability=group`` a crash of the process loses nothing
written; a power cut may lose the last ``group_delay`` of writes,
which Faust replays from the changelog topic after the persisted offset.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from faust.stores.base import SerializedStore
from faust.streams import current_event
from faust.types import TP, AppT, CollectionT, EventT

from statelog.errors import IntegrationError, StoreLockedError
from statelog.integrations.faust import drain
from statelog.integrations.faust.journal import JOURNAL, SentJournal
from statelog.integrations.faust.positions import event_position, offset_name, seek_sources
from statelog.integrations.faust.url import StoreURL, parse_store_url
from statelog.store.store import StateStore
from statelog.store.store import open as open_store

__all__ = ["TABLE", "Store"]

log = logging.getLogger(__name__)

TABLE = "faust"
"""The statelog table holding a Faust table partition's keys and values."""

_LOCK_RETRIES = 30
"""Seconds an assignment waits for a partition's store that another worker still holds."""


class Store(SerializedStore):  # type: ignore[type-arg]
    """Faust's store API over one statelog store per table partition (module docstring).

    :raises IntegrationError: at construction, a bad ``statelog://`` URL or option.
    """

    def __init__(
        self,
        url: Any,
        app: AppT,
        table: CollectionT,
        *,
        options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.where: StoreURL = parse_store_url(str(url))  # refused before anything else
        drain.install()
        super().__init__(url, app, table, options=options, **kwargs)
        self._stores: dict[int, StateStore] = {}
        # Persisted offsets not written yet, per partition: each rides on the partition's
        # next commit (or is written at close), so a table write costs one commit, not two.
        self._pending: dict[int, dict[str, int]] = {}
        self._journals: dict[int, SentJournal] = {}
        self._journal_on: bool | None = None

    # -- where the stores are ----------------------------------------------
    @property
    def directory(self) -> Path:
        """The directory of this table's partition stores."""
        return self.where.base(Path(self.app.conf.tabledir))

    def partition_path(self, partition: int) -> Path:
        return self.directory / f"{self.table_name}-{partition}.statelog"

    def _store(self, partition: int) -> StateStore:
        store = self._stores.get(partition)
        if store is None:
            path = self.partition_path(partition)
            path.parent.mkdir(parents=True, exist_ok=True)
            options = dataclasses.replace(self.where.options, tables=(TABLE, JOURNAL))
            store = self._stores[partition] = open_store(path, options=options)
            self._journals[partition] = SentJournal(store)
        return store

    def _journaled(self) -> bool:
        """Whether writes are journaled (``journal`` module): a table whose changelog
        partition is its event's, processed at least once (with exactly once, Faust
        confirms offsets per transaction, not per record)."""
        if self._journal_on is None:
            guarantee = str(getattr(self.app.conf.processing_guarantee, "value", ""))
            self._journal_on = not (self.table.is_global or self.table.use_partitioner) and (
                guarantee != "exactly_once"
            )
        return self._journal_on

    def _event_partition(self) -> int | None:
        event = current_event()
        if event is None or self.table.is_global or self.table.use_partitioner:
            return None
        return int(event.message.partition)

    def _actives(self) -> Iterator[StateStore]:
        actives = self.app.assignor.assigned_actives()
        topic = self.table.changelog_topic_name  # type: ignore[attr-defined]
        for partition, store in list(self._stores.items()):
            if TP(topic=topic, partition=partition) in actives or self.table.is_global:
                yield store

    # -- reads ------------------------------------------------------------
    def _get(self, key: bytes) -> bytes | None:
        partition = self._event_partition()
        if partition is not None:
            value = self._store(partition).get(key, table=TABLE)
            return None if value is None else bytes(value)
        for store in list(self._stores.values()):
            value = store.get(key, table=TABLE)
            if value is not None:
                return bytes(value)
        return None

    def _contains(self, key: bytes) -> bool:
        return self._get(key) is not None

    def _iteritems(self) -> Iterator[tuple[bytes, bytes]]:
        for store in self._actives():
            for key, value in store.items(TABLE):
                assert isinstance(key, bytes)  # this table's keys are Faust's bytes
                yield key, bytes(value)

    def _iterkeys(self) -> Iterator[bytes]:
        for key, _ in self._iteritems():
            yield key

    def _itervalues(self) -> Iterator[bytes | None]:
        for _, value in self._iteritems():
            yield value

    def _size(self) -> int:
        return sum(store.count(TABLE) for store in self._actives())

    # -- writes: one commit each ----------------------------------------------
    def _write_partition(self) -> int:
        partition = self._event_partition()
        if partition is None:
            event = current_event()
            partition = int(event.message.partition) if event is not None else 0
        return partition

    def _set(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self._del(key)
            return
        self._write(self._write_partition(), key, value)

    def _del(self, key: bytes) -> None:
        if self._journaled():
            # Faust sends a tombstone for every delete: journaled, so committed, even
            # for a key the store lacks.
            self._write(self._write_partition(), key, None)
            return
        partition = self._event_partition()
        for p in [partition] if partition is not None else list(self._stores):
            if self._store(p).get(key, table=TABLE) is not None:
                self._write(p, key, None)

    def _write(self, partition: int, key: bytes, value: bytes | None) -> None:
        """One commit: the write, its journal entry, the offsets and removals due."""
        store = self._store(partition)
        with store.transaction() as tx:
            if value is None:
                tx.delete(key, table=TABLE)
            else:
                tx.put(key, value, table=TABLE)
            for name, offset in self._pending.pop(partition, {}).items():
                tx.set_offset(name, offset)
            position = event_position(current_event())
            if position is not None and position[1] > store.offsets.get(position[0], -1):
                tx.set_offset(*position)  # a replayed event (at least once) never lowers it
            journal = self._journals[partition]
            if self._journaled():
                journal.wrote(tx, key, value)
            else:
                journal.removals(tx)

    def _clear(self) -> None:
        for store in self._actives():
            keys = [key for key, _ in store.items(TABLE)]
            if keys:
                store.commit(
                    offsets={}, low_watermark_ms=store.low_watermark_ms, delete=keys, table=TABLE
                )

    # -- the changelog offset, in the same store as the data ----------------
    def persisted_offset(self, tp: TP) -> int | None:
        name = offset_name(tp)
        pending = self._pending.get(tp.partition, {}).get(name)
        return pending if pending is not None else self._store(tp.partition).offsets.get(name)

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        """Record the changelog offset the partition's data is current with.

        It is written with the partition's next commit, or when the store is
        flushed or closed: the data it vouches for was committed before it (a
        table write precedes its changelog record), and an offset not written
        yet only makes recovery replay a little more of the changelog.
        statelog's offsets never go backwards: a lower one (a changelog topic
        recreated under the table) is logged and not written.
        """
        journal = self._journals.get(tp.partition)
        if journal is not None:
            journal.delivered()  # one confirmation per record, in order
        name = offset_name(tp)
        current = self.persisted_offset(tp)
        if current is not None and offset < current:
            log.warning(
                "event=persisted_offset_kept table=%s changelog=%s kept=%d refused=%d "
                "hint='a changelog recreated under the table: reset_state() it'",
                self.table_name, name, current, offset,
            )  # fmt: skip
            return
        self._pending.setdefault(tp.partition, {})[name] = offset

    def flush_offsets(self, partition: int | None = None) -> None:
        """Write the persisted offsets and journal removals still pending (of
        ``partition``, or all), one commit each."""
        for p in [partition] if partition is not None else list(self._stores):
            offsets = self._pending.pop(p, None) or {}
            store, journal = self._stores.get(p), self._journals.get(p)
            if store is None or journal is None or not (offsets or journal.pending()):
                continue
            with store.transaction() as tx:
                for name, offset in offsets.items():
                    tx.set_offset(name, offset)
                journal.removals(tx)

    def apply_changelog_batch(
        self,
        batch: Iterable[EventT],  # type: ignore[type-arg]
        to_key: Callable[[Any], Any],
        to_value: Callable[[Any], Any],
    ) -> None:
        """Apply a changelog batch: one commit per partition, data and highest offset together.

        A record the partition's journal names as the store's own is not applied
        (module ``journal``): the store holds it or a newer write of the same key.
        """
        per: dict[int, tuple[dict[bytes, bytes | None], dict[str, int]]] = {}
        for event in batch:
            msg = event.message
            if msg.key is None:
                raise TypeError(f"Changelog entry is missing key: {msg}")
            changes, offsets = per.setdefault(msg.partition, ({}, {}))
            self._store(msg.partition)
            if not self._journals[msg.partition].own(msg.key, msg.value):
                changes[msg.key] = msg.value
            name = offset_name(msg.tp)
            offsets[name] = max(msg.offset, offsets.get(name, msg.offset))
        for partition, (changes, offsets) in per.items():
            store = self._store(partition)
            current = store.offsets
            for name, offset in self._pending.pop(partition, {}).items():
                offsets[name] = max(offset, offsets.get(name, offset))
            with store.transaction() as tx:
                for key, value in changes.items():
                    if value is None:
                        tx.delete(key, table=TABLE)
                    else:
                        tx.put(key, value, table=TABLE)
                for name, offset in offsets.items():
                    if offset >= current.get(name, -1):
                        tx.set_offset(name, offset)
                self._journals[partition].removals(tx)

    async def on_recovery_completed(self, active_tps: set[TP], standby_tps: set[TP]) -> None:
        """Drop what the journals still hold (records never delivered: ``journal``), and
        seek each active partition's source partitions to where its store's state got,
        or to their earliest offsets where it names none (``positions``; Faust then
        seeks where Kafka holds a commit)."""
        for partition in list(self._stores):
            self._journals[partition].settle()
        self.flush_offsets()
        active: dict[TP, Mapping[str, int]] = {}
        for tp in active_tps:
            store = self._stores.get(tp.partition)
            active[tp] = store.offsets if store is not None else {}
        await seek_sources(self.app, active)
        await super().on_recovery_completed(active_tps, standby_tps)

    # -- rebalance and lifecycle ------------------------------------------------
    async def on_rebalance(
        self,
        assigned: set[TP],
        revoked: set[TP],
        newly_assigned: set[TP],
        generation_id: int = 0,
    ) -> None:
        """Close the stores of revoked partitions, open those of newly assigned actives."""
        topics = self.table.changelog_topic.topics
        for tp in revoked:
            if tp.topic in topics:
                self._close(tp.partition)
        standbys = self.app.assignor.assigned_standbys()
        for tp in newly_assigned:
            if tp.topic in topics and tp not in standbys:
                await self._open_waiting(tp.partition)

    async def _open_waiting(self, partition: int) -> None:
        for attempt in range(_LOCK_RETRIES):
            try:
                self._store(partition)
                return
            except StoreLockedError:
                if attempt == _LOCK_RETRIES - 1:
                    raise
                log.info("event=partition_store_locked table=%s partition=%d retry_s=1",
                         self.table_name, partition)  # fmt: skip
                await asyncio.sleep(1.0)

    def _close(self, partition: int) -> None:
        if partition in self._stores:
            # A revoked partition's next owner writes the changelog too: the journal
            # would no longer know which records after its offset are this store's.
            self._journals[partition].clear()
            self.flush_offsets(partition)
        self._journals.pop(partition, None)
        store = self._stores.pop(partition, None)
        if store is not None:
            store.close()

    def close_all(self) -> None:
        """Close every partition's store (flushing and sealing it)."""
        for partition in list(self._stores):
            self._close(partition)

    async def stop(self) -> None:
        self.close_all()
        await super().stop()

    async def backup_partition(
        self, tp: TP | int, flush: bool = True, purge: bool = False, keep: int = 1
    ) -> None:
        """Make the partition's commits durable; statelog's snapshots and remote copy are
        its backups (``statelog-compactor``, ``statelog restore``)."""
        partition = tp if isinstance(tp, int) else tp.partition
        self.flush_offsets(partition)
        self._store(partition).flush()

    def restore_backup(self, tp: TP | int, latest: bool = True, backup_id: int = 0) -> None:
        """:raises IntegrationError: always; a partition's store is restored by statelog."""
        raise IntegrationError(
            f"table {self.table_name!r}: Faust backups are not statelog's",
            hint="restore the partition's store directory with `statelog restore` "
            "(from its remote copy or another directory), or `statelog recover --to-epoch`",
        )

    def reset_state(self) -> None:
        """Remove this table's local data (its changelog topic is untouched)."""
        self._pending.clear()
        self.close_all()
        for path in self.directory.glob(f"{self.table_name}-*.statelog"):
            shutil.rmtree(path, ignore_errors=True)
