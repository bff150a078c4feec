"""The writing half of a store: the log, its lock, the threads beside it, and durability.

A :class:`StoreWriter` exists only in a store opened for writing
(:func:`statelog.store.writer_open.open_writer` builds it); a read-only
store has none. It owns what a writer holds: the log writer, the store's
writer lock (``STORE/LOCK``), the group flusher, the base watcher, the
fence watch and an in-process compactor; and it answers when a commit is
durable, in the three modes of ``statelog.open(durability=...)``:

* ``"commit"``: the commit path fdatasyncs the segment before ``commit``
  returns; ``flush`` has nothing to do.
* ``"group"``: a :class:`~statelog.log.group_commit.GroupCommitter` thread syncs
  within ``group_delay`` of a commit; :meth:`StoreWriter.wait_durable`
  blocks until an epoch is synced, and a failed sync is sticky: every later
  commit, flush and wait raises it.
* ``"none"``: nothing is synced until ``flush`` or ``close`` (tests and
  benchmarks only: a power cut loses recent commits).

A sync makes durable every record appended before it. A segment that
rolled or closed is already synced: sealing it synced it.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

from statelog.errors import StorageError
from statelog.log.group_commit import GroupCommitter
from statelog.log.writer import FenceWatch, WalWriter
from statelog.ops import metrics
from statelog.ops.metrics import StoreMetrics
from statelog.state.live import LiveState
from statelog.storage.lock import StoreLock
from statelog.store.age_seal import AgeSealer
from statelog.store.base_watcher import BaseWatcher
from statelog.store.inproc import InProcessCompactor
from statelog.store.options import Durability
from statelog.store.overlay import OverlayBound

__all__ = ["StoreWriter"]


class StoreWriter:
    """What a writing store holds beside its state; the store's commit path reads it.

    ``commits`` is the store's commit lock: it serialises commits, the
    writer's syncs of the active file and close. ``sync_each`` is True with
    ``durability="commit"``. ``synced_epoch`` is written under ``commits``.
    """

    __slots__ = (
        "_finished",
        "commits",
        "compactor",
        "durability",
        "fence",
        "file_lock",
        "group",
        "max_record",
        "metrics",
        "overlay",
        "path",
        "sealer",
        "state",
        "sync_each",
        "synced_epoch",
        "wal",
        "watcher",
    )

    def __init__(
        self,
        *,
        path: Path,
        wal: WalWriter,
        file_lock: StoreLock,
        commits: threading.Lock,
        state: LiveState,
        durability: Durability,
        group_delay: timedelta,
        max_record: int,
        store_metrics: StoreMetrics,
    ) -> None:
        """Take over ``wal`` and ``file_lock``; with ``durability="group"``, start the flusher.

        The watchers and the compactor are attached afterwards by the open.
        """
        self.path = path
        self.wal = wal
        self.file_lock = file_lock
        self.commits = commits
        self.state = state
        self.durability = durability
        self.sync_each = durability == "commit"
        self.max_record = max_record
        self.metrics = store_metrics
        self.synced_epoch = epoch = state.epoch
        self.group: GroupCommitter | None = None
        if durability == "group":
            self.group = GroupCommitter(self.group_sync, group_delay.total_seconds(), epoch)
        self.watcher: BaseWatcher | None = None
        self.overlay: OverlayBound | None = None
        self.fence: FenceWatch | None = None
        self.compactor: InProcessCompactor | None = None
        self.sealer: AgeSealer | None = None
        self._finished = False

    def group_sync(self) -> None:
        """The group flusher's sync of the active segment (run in its thread).

        Takes ``commits`` only to duplicate the active file's handle and syncs
        outside it, so commits go on appending while the sync is in flight;
        the duplicate keeps the file open even if a roll closes it meanwhile.

        :raises StorageError: the sync failed, or the log writer is poisoned.
        """
        with self.commits:
            f = self.wal.active_file
            handle = f.dup() if f is not None and not f.closed else None
        if handle is None:
            if self.wal.poisoned:
                raise StorageError(f"the log writer failed: {self.wal.poisoned}")
            return  # rolled or closed: sealing synced it
        try:
            synced = time.perf_counter()
            handle.sync()
            self.metrics.fsync_seconds.observe(time.perf_counter() - synced)
        except OSError as exc:
            raise StorageError(
                f"group sync of {handle.path.name} failed: {exc}", errno=exc.errno
            ) from exc
        finally:
            handle.close()

    def flush(self) -> None:
        """Make every commit so far durable now (a no-op with ``durability="commit"``).

        :raises StorageError: the sync failed.
        """
        if self.group is not None:
            if not self.group.flush_now():
                assert self.group.failure is not None
                raise self.group.failure
        elif self.durability == "none":
            with self.commits:
                if not self._finished:  # close sealed, and so synced, what it could
                    self.wal.sync()
                    self.synced_epoch = self.state.epoch

    def wait_durable(self, epoch: int, timeout: timedelta | float | None) -> bool:
        """Block until commit ``epoch`` is durable; False if ``timeout`` passed first.

        :raises StorageError: a background sync failed before ``epoch`` was durable.
        """
        if self.group is None:
            if self.durability == "none":
                self.flush()
            return epoch <= self.state.epoch
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        return self.group.wait(epoch, secs)

    @property
    def durable_epoch(self) -> int:
        """The highest epoch known to be synced to disk."""
        if self.group is not None:
            return self.group.durable
        return self.synced_epoch

    def stop(self) -> None:
        """First step of a close: stop the threads beside the writer, and the scrape-time metrics.

        The store refuses commits before this; the flusher takes ``commits``
        to find the file it syncs, so the caller must not hold it.
        """
        metrics.unwatch(self.path)
        if self.group is not None:
            self.group.stop()
        if self.compactor is not None:
            self.compactor.stop()
        if self.watcher is not None:
            self.watcher.stop()
        if self.fence is not None:
            self.fence.stop()
        if self.sealer is not None:
            self.sealer.stop()

    def finish(self) -> None:
        """Last step of a close: seal the active segment, then release the writer lock.

        The caller holds ``commits``. After a failed sync the segment is
        closed unsealed instead: a seal could vouch for records the kernel
        dropped, so it is left to the next open's recovery.

        :raises StorageError: sealing failed; the lock is released anyway.
        """
        self._finished = True
        try:
            if self.wal.poisoned or (self.group is not None and self.group.failure):
                self.wal.close()
            else:
                self.wal.seal()
                self.synced_epoch = self.state.epoch
        finally:
            self.file_lock.release()
