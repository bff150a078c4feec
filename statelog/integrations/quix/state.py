"""The one statelog store behind every statelog-backed store of a Quix application.

Quix Streams checkpoints in steps: each store partition's transaction is
*prepared* (its changes produced to the changelog topic), the producer is
flushed, the consumer offsets are committed to Kafka, and then each
transaction is *flushed* to its store. :class:`QuixState` turns that into one
statelog record per checkpoint: every flushed transaction stages its changes
here (:meth:`QuixState.stage`), and the checkpoint, once Kafka has its
offsets, commits them all at once with the processed offsets and the
changelog offsets (:meth:`QuixState.commit`). A crash anywhere before that
record is durable leaves statelog at the previous checkpoint, state and
offsets together, and the application resumes from statelog's offsets
(:meth:`QuixState.resume_offset`), not from Kafka's.

Layout inside the statelog store:

- a Quix column family is a table named
  ``quix/<stream id>/<store name>/<partition>/<column family>``;
- the next offset to consume of a source topic partition is the statelog
  offset ``<topic>-<partition>``;
- the changelog offset a store partition is current with is in the table
  ``quix/changelog``, keyed ``<stream id>/<store name>/<partition>`` (a table,
  not an offset: a changelog topic recreated by an operator restarts its
  offsets, which statelog's never-backwards offsets would refuse).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from statelog.errors import StoreClosedError
from statelog.store.options import StoreOptions
from statelog.store.store import StateStore
from statelog.store.store import open as open_store

__all__ = ["CHANGELOG_TABLE", "QuixState", "offset_name", "table_name"]

CHANGELOG_TABLE = "quix/changelog"
"""Where each store partition's changelog offset is kept."""


def offset_name(topic: str, partition: int) -> str:
    """The statelog offset of a source topic partition: ``"orders-3"``."""
    return f"{topic}-{partition}"


def table_name(stream_id: str | None, store: str, partition: int, cf_name: str) -> str:
    """The statelog table of one column family of one store partition."""
    return f"quix/{stream_id or ''}/{store}/{partition}/{cf_name}"


def _changelog_key(stream_id: str | None, store: str, partition: int) -> str:
    return f"{stream_id or ''}/{store}/{partition}"


class QuixState:
    """Stages the store partitions' changes of one checkpoint and commits them as one record.

    Opened when the application's state manager starts (:meth:`open`) and
    closed with it. Not thread-safe beyond what Quix needs: the processing
    thread stages and commits; a lock only guards against a close racing them.
    """

    def __init__(self, path: Path, options: StoreOptions) -> None:
        self.path = path
        self.options = options
        self._store: StateStore | None = None
        self._staged: dict[str, dict[bytes, bytes | None]] = {}
        self._changelog: dict[str, int] = {}
        self._lock = threading.Lock()
        self._deferred = 0

    # -- lifecycle -------------------------------------------------------
    def open(self) -> StateStore:
        """Open (creating or recovering) the statelog store; idempotent.

        :raises StatelogError: the store cannot be opened (locked by another
            process, damaged beyond recovery, ...), as :func:`statelog.open` raises.
        """
        if self._store is None:
            self.path.mkdir(parents=True, exist_ok=True)
            options = self.options
            if CHANGELOG_TABLE not in options.tables:
                options = dataclasses.replace(options, tables=(*options.tables, CHANGELOG_TABLE))
            self._store = open_store(self.path, options=options)
        return self._store

    @property
    def store(self) -> StateStore:
        """The open statelog store.

        :raises StoreClosedError: :meth:`open` has not run, or :meth:`close` has.
        """
        if self._store is None:
            raise StoreClosedError(
                f"the statelog store of this application ({self.path}) is not open",
                hint="run the application (app.run()) or open its state manager first",
            )
        return self._store

    def close(self) -> None:
        """Drop whatever is staged and close the store (flushing and sealing it)."""
        with self._lock:
            self._staged.clear()
            self._changelog.clear()
            store, self._store = self._store, None
        if store is not None:
            store.close()

    # -- reads -----------------------------------------------------------
    def get(self, table: str, key: bytes) -> bytes | None:
        """The committed value of ``key`` in ``table``; None if absent."""
        st = self.store
        if not st.has_table(table):  # a column family nothing was written to yet
            return None
        value = st.get(key, table=table)
        return None if value is None else bytes(value)

    def changelog_offset(self, stream_id: str | None, store: str, partition: int) -> int | None:
        """The changelog offset the store partition is current with, staged or committed."""
        key = _changelog_key(stream_id, store, partition)
        staged = self._changelog.get(key)
        if staged is not None:
            return staged
        value = self.store.get(key, table=CHANGELOG_TABLE)
        return None if value is None else int(value)

    def resume_offset(self, topic: str, partition: int) -> int | None:
        """The next offset to consume of a source partition, per statelog; None if unknown."""
        return self.store.offsets.get(offset_name(topic, partition))

    # -- one checkpoint --------------------------------------------------
    def stage(
        self, table: str, updates: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes]
    ) -> None:
        """Stage one column family's changes for the next :meth:`commit`."""
        staged = self._staged.setdefault(table, {})
        for key, value in updates:
            staged[key] = value
        for key in deletes:
            staged[key] = None

    def stage_changelog_offset(
        self, stream_id: str | None, store: str, partition: int, offset: int
    ) -> None:
        """Stage the changelog offset a store partition will be current with."""
        self._changelog[_changelog_key(stream_id, store, partition)] = offset

    @property
    def staged(self) -> bool:
        """Whether anything waits for :meth:`commit`."""
        return bool(self._staged or self._changelog)

    def commit(self, processed: Mapping[tuple[str, int], int]) -> int | None:
        """Commit everything staged and ``processed`` as one record; the epoch, or None.

        ``processed`` maps each source ``(topic, partition)`` to the last
        offset processed in the checkpoint; statelog keeps the next one to
        consume. Nothing staged and nothing processed writes nothing.

        :raises InvalidCommitError: an offset went backwards (a source topic
            recreated under the store); nothing was written.
        :raises StorageError: the write or sync failed; nothing is visible.
        """
        with self._lock:
            store = self.store
            if not (self._staged or self._changelog or processed):
                return None
            try:
                with store.transaction() as tx:
                    for (topic, partition), offset in processed.items():
                        tx.set_offset(offset_name(topic, partition), offset + 1)
                    for table, changes in self._staged.items():
                        for key, value in changes.items():
                            if value is None:
                                tx.delete(key, table=table)
                            else:
                                tx.put(key, value, table=table)
                    for name, offset in self._changelog.items():
                        tx.put(name, offset, table=CHANGELOG_TABLE)
                return tx.epoch
            finally:
                self._staged.clear()
                self._changelog.clear()

    @property
    def deferred(self) -> bool:
        """Whether a checkpoint is open: flushed transactions wait for its one commit."""
        return self._deferred > 0

    @contextmanager
    def checkpoint(self) -> Iterator[None]:
        """Defer commits for the ``with`` block; discard what it staged if it raises.

        The block commits (:meth:`commit`) or discards (:meth:`discard`)
        itself; an exception means the checkpoint did not happen, and Quix
        processes its messages again.
        """
        self._deferred += 1
        try:
            yield
        except BaseException:
            self.discard()
            raise
        finally:
            self._deferred -= 1

    def flushed(self) -> None:
        """A transaction was flushed outside a checkpoint: commit it now, on its own."""
        if not self.deferred:
            self.commit({})

    def drop(self, stream_id: str | None, store: str, partition: int) -> bool:
        """Delete every table and the changelog offset of one store partition, in one commit.

        For Quix's destructive recovery (a committed offset below the
        source's retention). Whether anything was deleted.
        """
        prefix = table_name(stream_id, store, partition, "")
        st = self.store
        with self._lock, st.transaction() as tx:
            found = False
            for table in st.tables():
                if table.startswith(prefix):
                    for stored, _ in st.items(table):
                        tx.delete(stored, table=table)
                        found = True
            tx.delete(_changelog_key(stream_id, store, partition), table=CHANGELOG_TABLE)
        return found

    def discard(self) -> None:
        """Drop what is staged: the checkpoint was aborted and will be processed again."""
        self._staged.clear()
        self._changelog.clear()
