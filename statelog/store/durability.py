"""When a commit is durable: ``flush``, ``wait_durable`` and ``durable_epoch`` of a store.

The three modes of ``statelog.open(durability=...)``:

* ``"commit"``: the commit path fdatasyncs the segment before ``commit``
  returns; ``flush`` has nothing to do.
* ``"group"``: a :class:`~statelog.log.group_commit.GroupCommitter` thread syncs
  within ``group_delay`` of a commit; :meth:`StoreDurability.wait_durable`
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
from typing import Literal

from statelog.errors import StorageError
from statelog.log.group_commit import GroupCommitter
from statelog.log.writer import WalWriter
from statelog.ops.metrics import StoreMetrics
from statelog.state.live import LiveState

__all__ = ["Durability", "StoreDurability"]

Durability = Literal["commit", "group", "none"]


class StoreDurability:
    """Mixed into StateStore, which sets every attribute declared here."""

    _lock: threading.Lock
    _state: LiveState
    _durability: Durability
    _closed: bool
    _wal: WalWriter | None
    _group: GroupCommitter | None
    _synced_epoch: int
    _metrics: StoreMetrics

    def _group_sync(self) -> None:
        """The group flusher's sync of the active segment (run in its thread).

        Takes ``_lock`` only to duplicate the active file's handle and syncs
        outside it, so commits go on appending while the sync is in flight;
        the duplicate keeps the file open even if a roll closes it meanwhile.

        :raises StorageError: the sync failed, or the log writer is poisoned.
        """
        with self._lock:
            f = self._wal.active_file if self._wal is not None else None
            handle = f.dup() if f is not None and not f.closed else None
        if handle is None:
            if self._wal is not None and self._wal.poisoned:
                raise StorageError(f"the log writer failed: {self._wal.poisoned}")
            return  # rolled or closed: sealing synced it
        try:
            synced = time.perf_counter()
            handle.sync()
            self._metrics.fsync_seconds.observe(time.perf_counter() - synced)
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
        if self._group is not None:
            if not self._group.flush_now():
                assert self._group.failure is not None
                raise self._group.failure
        elif self._durability == "none" and self._wal is not None:
            with self._lock:
                if not self._closed:  # close() sealed, and so synced, what it could
                    self._wal.sync()
                    self._synced_epoch = self._state.epoch

    def wait_durable(self, epoch: int, timeout: timedelta | float | None = None) -> bool:
        """Block until commit ``epoch`` is durable; False if ``timeout`` passed first.

        :raises StorageError: a background sync failed before ``epoch`` was durable.
        """
        if self._group is None:
            if self._durability == "none":
                self.flush()
            return epoch <= self._state.epoch
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        return self._group.wait(epoch, secs)

    @property
    def durable_epoch(self) -> int:
        """The highest epoch known to be synced to disk (for a read-only store: its epoch)."""
        if self._group is not None:
            return self._group.durable
        return self._synced_epoch
