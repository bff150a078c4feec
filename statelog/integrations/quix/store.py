"""The Quix Streams store, store partition and transaction kept in statelog.

:class:`StatelogStore` is what a ``StreamingDataFrame``'s stateful functions
get when the application runs on statelog (:mod:`.app`). Every partition of
every such store lives in the application's one statelog store
(:class:`~statelog.integrations.quix.state.QuixState`); a transaction reads
through to it and, inside a checkpoint, stages its changes there so that
the checkpoint commits them all as one record.

What is not supported, and says so instead of silently ignoring it: per-key
TTL (``state.set(..., ttl=...)``) and changelogs written by a TTL-stamped
RocksDB store. Windows, joins and timestamped stores stay on Quix's RocksDB
store (they need its range scans).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Literal

from quixstreams.state.base import PartitionTransaction, Store, StorePartition
from quixstreams.state.base.transaction import PartitionTransactionCache
from quixstreams.state.exceptions import InvalidChangelogOffset
from quixstreams.state.metadata import Marker
from quixstreams.state.recovery import ChangelogProducer, ChangelogProducerFactory
from quixstreams.state.serialization import DumpsFunc, LoadsFunc
from quixstreams.utils.json import dumps as json_dumps
from quixstreams.utils.json import loads as json_loads

from statelog.errors import IntegrationError
from statelog.integrations.quix.state import QuixState, table_name

__all__ = ["StatelogPartitionTransaction", "StatelogStore", "StatelogStorePartition"]

logger = logging.getLogger(__name__)

RECOVERY_BATCH = 10_000
"""Changelog messages restored per statelog commit while a partition recovers."""

_TTL_HINT = (
    "keep this store on Quix's RocksDB store (store_type=RocksDBStore), which implements TTL"
)


def _changes(cache: PartitionTransactionCache, cf_name: str) -> Iterator[tuple[bytes, bytes]]:
    for by_key in cache.get_updates(cf_name=cf_name).values():
        yield from by_key.items()


class StatelogStorePartition(StorePartition):
    """One partition of one store: its column families are tables of the application's store."""

    def __init__(
        self,
        state: QuixState,
        stream_id: str | None,
        store_name: str,
        partition: int,
        changelog_producer: ChangelogProducer | None,
    ) -> None:
        super().__init__(dumps=json_dumps, loads=json_loads, changelog_producer=changelog_producer)
        self.state = state
        self.stream_id = stream_id
        self.store_name = store_name
        self.partition = partition
        self._recovered = 0

    def table(self, cf_name: str) -> str:
        """The statelog table of column family ``cf_name`` of this partition."""
        return table_name(self.stream_id, self.store_name, self.partition, cf_name)

    def begin(self) -> StatelogPartitionTransaction:
        return StatelogPartitionTransaction(
            partition=self, dumps=self._dumps, loads=self._loads,
            changelog_producer=self._changelog_producer,
        )  # fmt: skip

    def close(self) -> None:
        """Nothing of its own to close: the application's statelog store outlives partitions."""

    # -- reads -----------------------------------------------------------
    def get(self, key: bytes, cf_name: str = "default") -> bytes | Literal[Marker.UNDEFINED]:
        value = self.state.get(self.table(cf_name), key)
        return Marker.UNDEFINED if value is None else value

    def exists(self, key: bytes, cf_name: str = "default") -> bool:
        return self.state.get(self.table(cf_name), key) is not None

    def get_changelog_offset(self) -> int | None:
        return self.state.changelog_offset(self.stream_id, self.store_name, self.partition)

    # -- writes ----------------------------------------------------------
    def stage(self, cache: PartitionTransactionCache) -> None:
        """Stage a transaction's changes with the application's next statelog commit."""
        for cf_name in cache.get_column_families():
            self.state.stage(
                self.table(cf_name), _changes(cache, cf_name), cache.get_deletes(cf_name=cf_name)
            )

    def write(self, cache: PartitionTransactionCache, changelog_offset: int | None) -> None:
        """Stage ``cache`` and the changelog offset; committed now unless a checkpoint is open."""
        self.stage(cache)
        self.write_changelog_offset_staged(changelog_offset)
        self.state.flushed()

    def write_changelog_offset_staged(self, offset: int | None) -> None:
        if offset is not None:
            self.state.stage_changelog_offset(
                self.stream_id, self.store_name, self.partition, offset
            )

    def write_changelog_offset(self, offset: int) -> None:
        self.write_changelog_offset_staged(offset)
        self._recovered_one()

    def recover_from_changelog_message(
        self,
        key: bytes,
        value: bytes | None,
        cf_name: str,
        offset: int,
        ttl_stamped: bool = False,
    ) -> None:
        """Apply one changelog message; committed in batches of :data:`RECOVERY_BATCH`.

        :raises IntegrationError: the message carries a TTL stamp (the
            changelog was written by a TTL store); nothing of it is applied.
        """
        if ttl_stamped:
            raise IntegrationError(
                f"changelog message at offset {offset} of store {self.store_name!r} carries a "
                "TTL stamp, which statelog's Quix store does not implement",
                hint=_TTL_HINT,
            )
        table = self.table(cf_name)
        if value is None:
            self.state.stage(table, (), (key,))
        else:
            self.state.stage(table, ((key, value),), ())
        self.write_changelog_offset(offset)

    def _recovered_one(self) -> None:
        self._recovered += 1
        if self._recovered >= RECOVERY_BATCH:
            self.complete_recovery()

    def complete_recovery(self) -> None:
        """Commit what recovery staged (an interrupted recovery resumes from its offset)."""
        self._recovered = 0
        if self.state.staged:
            self.state.commit({})


class StatelogPartitionTransaction(PartitionTransaction[Any, Any]):
    """Quix's transaction, staging into statelog; per-key TTL is refused, not ignored."""

    _partition: StatelogStorePartition

    def __init__(
        self,
        partition: StatelogStorePartition,
        dumps: DumpsFunc,
        loads: LoadsFunc,
        changelog_producer: ChangelogProducer | None = None,
    ) -> None:
        super().__init__(
            partition=partition, dumps=dumps, loads=loads, changelog_producer=changelog_producer
        )
        self._staged = False

    def _set_bytes(
        self,
        key: Any,
        value: bytes,
        prefix: bytes,
        cf_name: str = "default",
        timestamp: int | None = None,
        ttl: timedelta | None = None,
    ) -> None:
        if ttl is not None:
            raise IntegrationError(
                "statelog's Quix store does not implement per-key TTL", hint=_TTL_HINT
            )
        super()._set_bytes(key, value, prefix, cf_name=cf_name, timestamp=timestamp)

    def _prepare(self, processed_offsets: dict[str, int] | None) -> None:
        super()._prepare(processed_offsets)
        state = self._partition.state
        # Inside a checkpoint the changes are staged now: a revoking checkpoint
        # skips the flush of changelog-backed stores, yet commits the offsets.
        if state.deferred and not self._update_cache.is_empty():
            self._partition.stage(self._update_cache)
            self._staged = True

    def _flush(self, changelog_offset: int | None) -> None:
        if self._update_cache.is_empty():
            return
        partition = self._partition
        if changelog_offset is not None:
            current = partition.get_changelog_offset()
            if current is not None and changelog_offset < current:
                raise InvalidChangelogOffset(
                    "Cannot set changelog offset lower than already saved one"
                )
        if not self._staged:
            partition.stage(self._update_cache)
            self._staged = True
        partition.write_changelog_offset_staged(changelog_offset)
        partition.state.flushed()


class StatelogStore(Store):
    """A Quix store whose partitions live in the application's statelog store."""

    def __init__(
        self,
        name: str,
        stream_id: str | None,
        state: QuixState,
        changelog_producer_factory: ChangelogProducerFactory | None = None,
    ) -> None:
        super().__init__(name, stream_id)
        self.state = state
        self._changelog_producer_factory = changelog_producer_factory

    def create_new_partition(self, partition: int) -> StatelogStorePartition:
        producer = None
        if self._changelog_producer_factory is not None:
            producer = self._changelog_producer_factory.get_partition_producer(partition)
        return StatelogStorePartition(self.state, self.stream_id, self.name, partition, producer)

    def destroy_partition(self, partition: int) -> bool:
        """Delete the partition's state (Quix's destructive recovery); whether any was kept."""
        self.revoke_partition(partition)
        return self.state.drop(self.stream_id, self.name, partition)
