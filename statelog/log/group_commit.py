"""Group commit: one background fdatasync covers every commit written since the last.

With ``durability="group"`` a commit returns once its record is written to
the page cache; this flusher makes it durable within ``max_delay``. Callers
that must know (before acknowledging upstream) use ``store.wait_durable(epoch)``
or ``store.flush()``. If a sync fails, every waiter and every later commit
gets :class:`~statelog.errors.StorageError`: acknowledged work may not be
durable, and only a reopen (recovery) can say what is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from statelog.errors import StorageError

__all__ = ["GroupCommitter"]

log = logging.getLogger("statelog.wal")


class GroupCommitter:
    """Tracks written vs durable epochs and runs the flusher thread."""

    def __init__(self, sync: Callable[[], None], max_delay: float, durable_epoch: int) -> None:
        self._sync = sync
        self._delay = max_delay
        self._cond = threading.Condition()
        self.written = durable_epoch
        self.durable = durable_epoch
        self.failure: StorageError | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="statelog-group-commit", daemon=True)
        self._thread.start()

    def written_up_to(self, epoch: int) -> None:
        """Called by the commit path after a record is in the page cache."""
        with self._cond:
            self.written = epoch
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self.written == self.durable and not self._stopping:
                    self._cond.wait()
                if self._stopping and self.written == self.durable:
                    return
            # Let more commits join this sync, but never past the bound.
            time.sleep(self._delay)
            if not self.flush_now():
                return

    def flush_now(self) -> bool:
        """Sync now; returns False (and records the failure) if the sync failed."""
        with self._cond:
            if self.failure is not None:
                return False
            target = self.written
        try:
            self._sync()
        except StorageError as exc:
            log.critical("event=group_sync_failed error=%r", exc)
            with self._cond:
                self.failure = exc
                self._cond.notify_all()
            return False
        with self._cond:
            if target > self.durable:
                self.durable = target
            self._cond.notify_all()
        return True

    def wait(self, epoch: int, timeout: float | None) -> bool:
        """Block until ``epoch`` is durable; False on timeout.

        :raises StorageError: a sync failed before ``epoch`` became durable.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.durable < epoch:
                if self.failure is not None:
                    raise self.failure
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stop(self) -> None:
        """Flush what is written and stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
