"""A Quix Streams ``Application`` whose stateful functions keep their state in statelog.

Three of Quix's pieces are replaced, each by a small subclass:

- :class:`StatelogStateManager` registers :class:`StatelogStore` for the
  stores that Quix would put in RocksDB by default (windows, joins and
  timestamped stores stay in RocksDB: they need its range scans), opens the
  application's statelog store with the manager, and, when a partition is
  assigned, tells the changelog recovery statelog's offsets instead of
  Kafka's committed ones;
- :class:`StatelogCheckpoint` commits one statelog record per checkpoint,
  after Quix's own steps (changelog produced, Kafka offsets committed), and
  nothing when Quix aborted the checkpoint;
- :class:`Application` positions the consumer from statelog's offsets on
  every assignment, so a crash between Kafka's commit and statelog's neither
  loses nor double-counts: statelog's state and offsets move together.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from quixstreams import Application as QuixApplication
from quixstreams.checkpointing import Checkpoint
from quixstreams.checkpointing.deadline import Deadline
from quixstreams.models.topics import TopicConfig
from quixstreams.processing import ProcessingContext
from quixstreams.state import StateStoreManager
from quixstreams.state.base import StorePartition
from quixstreams.state.manager import DEFAULT_STATE_STORE_NAME, StoreTypes

from statelog.errors import IntegrationError
from statelog.integrations.quix.state import QuixState
from statelog.integrations.quix.store import StatelogPartitionTransaction, StatelogStore
from statelog.store.options import StoreOptions

__all__ = [
    "DEFAULT_OPTIONS",
    "Application",
    "StatelogCheckpoint",
    "StatelogProcessingContext",
    "StatelogStateManager",
]

logger = logging.getLogger(__name__)

DEFAULT_OPTIONS = StoreOptions(compactor="process")
"""One fsync per checkpoint, and a compactor process that dies with the application."""


class StatelogStateManager(StateStoreManager):
    """Quix's state manager, with statelog as the default store.

    ``store_type=None`` (what ``StreamingDataFrame``'s stateful functions
    ask for) and ``StatelogStore`` get a statelog store; an explicit
    ``RocksDBStore`` or ``MemoryStore`` keeps Quix's own.
    """

    def __init__(self, state: QuixState, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.statelog = state

    def register_store(
        self,
        stream_id: str | None,
        store_name: str = DEFAULT_STATE_STORE_NAME,
        store_type: StoreTypes | type[StatelogStore] | None = None,
        changelog_config: TopicConfig | None = None,
    ) -> None:
        if store_type is not None and store_type is not StatelogStore:
            super().register_store(stream_id, store_name, store_type, changelog_config)  # type: ignore[arg-type]
            return
        if self._stores.get(stream_id, {}).get(store_name) is not None:
            return
        factory = self._setup_changelogs(stream_id, store_name, topic_config=changelog_config)
        store = StatelogStore(store_name, stream_id, self.statelog, factory)
        self._stores.setdefault(stream_id, {})[store_name] = store

    def statelog_streams(self) -> set[str | None]:
        """The stream ids with at least one store kept in statelog."""
        return {
            stream_id
            for stream_id, stores in self._stores.items()
            if any(isinstance(store, StatelogStore) for store in stores.values())
        }

    def on_partition_assign(
        self, stream_id: str | None, partition: int, committed_offsets: dict[str, int]
    ) -> dict[str, StorePartition]:
        # The recovery replays changelog messages of processing up to the
        # committed offsets; statelog's, not Kafka's, say where that is.
        if stream_id in self.statelog_streams():
            committed_offsets = dict(committed_offsets)
            for topic in committed_offsets:
                offset = self.statelog.resume_offset(topic, partition)
                if offset is not None:
                    committed_offsets[topic] = offset
        return super().on_partition_assign(stream_id, partition, committed_offsets)

    def init(self) -> None:
        super().init()
        self.statelog.open()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.statelog.close()


class StatelogCheckpoint(Checkpoint):
    """Quix's checkpoint, then one statelog record with every staged change and offset."""

    def __init__(self, *args: Any, statelog: QuixState, **kwargs: Any) -> None:
        self._statelog = statelog
        self._aborted = False
        super().__init__(*args, **kwargs)

    def commit(self, *, revoking: bool = False) -> None:
        """Run Quix's checkpoint; unless it aborted, commit statelog's record.

        :raises StatelogError: statelog's commit failed; Quix treats it as a
            failed checkpoint (its messages are processed again after a restart).
        """
        state = self._statelog
        self._aborted = False
        with state.checkpoint():
            super().commit(revoking=revoking)
            if self._aborted:
                state.discard()
                return
            produced = self._producer.offsets
            for tx in self._store_transactions.values():
                if not isinstance(tx, StatelogPartitionTransaction) or not tx.changed:
                    continue
                tp = tx.changelog_topic_partition
                offset = produced.get(tp) if tp is not None else None
                part = tx._partition
                part.write_changelog_offset_staged(offset)
            state.commit(self._tp_offsets)

    def _abort_transaction_if_eos(
        self, *, revoking: bool, deadline: Deadline | None = None
    ) -> None:
        # Every early return of Quix's commit passes here: nothing was committed.
        self._aborted = True
        super()._abort_transaction_if_eos(revoking=revoking, deadline=deadline)


@dataclasses.dataclass
class StatelogProcessingContext(ProcessingContext):
    """Quix's processing context, making :class:`StatelogCheckpoint` checkpoints."""

    statelog: QuixState | None = None

    def init_checkpoint(self) -> None:
        assert self.statelog is not None
        self._checkpoint = StatelogCheckpoint(
            commit_interval=self.commit_interval,
            commit_every=self.commit_every,
            state_manager=self.state_manager,
            producer=self.producer,
            consumer=self.consumer,
            sink_manager=self.sink_manager,
            dataframe_registry=self.dataframe_registry,
            exactly_once=self.exactly_once,
            revoke_flush_timeout=self.revoke_flush_timeout,
            statelog=self.statelog,
        )


class Application(QuixApplication):
    """``quixstreams.Application``, keeping its stores in statelog.

    Takes Quix's arguments unchanged, plus ``statelog``: the
    :class:`statelog.StoreOptions` of the application's statelog store
    (default :data:`DEFAULT_OPTIONS`), kept in ``<state_dir>/<consumer
    group>/statelog``. One application process owns that directory; a
    second one with the same ``state_dir`` and group gets
    ``StoreLockedError``.
    """

    def __init__(self, *args: Any, statelog: StoreOptions | None = None, **kwargs: Any) -> None:
        if statelog is not None and not isinstance(statelog, StoreOptions):
            raise IntegrationError(
                f"statelog= takes a statelog.StoreOptions, not {statelog.__class__.__name__}",
                hint="statelog=statelog.StoreOptions(durability='commit', compactor='process')",
            )
        super().__init__(*args, **kwargs)
        quix = self._state_manager
        state_dir = quix._state_dir
        if state_dir is None:
            raise IntegrationError("the application has no state directory")
        self.statelog = QuixState(Path(state_dir) / "statelog", statelog or DEFAULT_OPTIONS)
        self._state_manager = StatelogStateManager(
            self.statelog,
            state_dir=state_dir,
            rocksdb_options=quix._rocksdb_options,
            producer=quix._producer,
            recovery_manager=quix._recovery_manager,
            migration_producer=quix._migration_producer,
            stop_event=quix._stop_event,
            open_deadline=quix._open_deadline,
        )
        ctx = self._processing_context
        fields = {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx) if f.init}
        fields["state_manager"] = self._state_manager
        self._processing_context = StatelogProcessingContext(**fields, statelog=self.statelog)

    def _assign_partitions(self, topic_partitions: list[TopicPartition]) -> None:
        # Start each source partition of a statelog-kept stream where statelog's
        # last checkpoint left off; Kafka's committed offset is only a fallback.
        manager = self._state_manager
        assert isinstance(manager, StatelogStateManager)
        topics: set[str] = set()
        for stream_id in manager.statelog_streams():
            if stream_id is not None:
                topics.update(self._dataframe_registry.get_topics_for_stream_id(stream_id))
        for tp in topic_partitions:
            if tp.topic in topics:
                offset = self.statelog.resume_offset(tp.topic, tp.partition)
                if offset is not None:
                    tp.offset = offset
        super()._assign_partitions(topic_partitions)
