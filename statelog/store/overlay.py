"""The writer's bound on its overlay: a commit waits while the compactor catches up.

The overlay holds every commit no snapshot has folded yet (``LiveState``'s
generations), in memory. Without a bound it grows as long as the compactor
lags, and with it the writer's memory and the log a restart replays. With
``max_overlay_bytes`` set, a commit that finds the overlay at the bound
waits, before anything is written, until the base watcher swaps in a
snapshot that folds enough of it (the watcher is asked to look at once),
and raises :class:`~statelog.errors.WriteStallError` after ``overlay_wait``:
the stall of an LSM tree whose level 0 is full, made visible instead of
growing without end. The count is the log bytes of the records applied, a
fixed fraction of what the overlay's dicts hold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from statelog.errors import WriteStallError
from statelog.ops.metrics import StoreMetrics
from statelog.state.live import LiveState

__all__ = ["OverlayBound"]

log = logging.getLogger("statelog.store.store")

_POLL = 0.05  # seconds between looks at the overlay while a commit waits


class OverlayBound:
    """Blocks commits while ``state.overlay_bytes`` is at or past ``limit``."""

    def __init__(
        self, store: Path, state: LiveState, metrics: StoreMetrics, limit: int, wait: float
    ) -> None:
        self._store = store
        self._state = state
        self._metrics = metrics
        self.limit = limit
        self._wait = wait
        self._folded = threading.Condition()
        self.poke: Callable[[], None] = lambda: None  # set once the base watcher runs

    def full(self) -> bool:
        """Whether the next commit must wait (read without a lock: an int, set atomically)."""
        return self._state.overlay_bytes >= self.limit

    def folded(self, _snapshot: Path, _epoch: int) -> None:
        """The base watcher's callback after a swap: wake the waiting commit."""
        with self._folded:
            self._folded.notify_all()

    def wait(self) -> float:
        """Wait until the overlay is under the limit; the seconds waited.

        Called with the store's commit lock held, so later commits queue
        behind this one; the swap takes only the view lock.

        :raises WriteStallError: still at the limit after ``overlay_wait``;
            nothing was written.
        """
        started = time.monotonic()
        deadline = started + self._wait
        with self._folded:
            while self.full():
                left = deadline - time.monotonic()
                if left <= 0:
                    held = self._state.overlay_bytes
                    self._count(time.monotonic() - started)
                    log.error(
                        "store=%s event=write_stall_failed overlay_bytes=%d limit=%d seconds=%g",
                        self._store, held, self.limit, self._wait,
                    )  # fmt: skip
                    raise WriteStallError(
                        f"the overlay holds {held} log bytes no snapshot has folded "
                        f"(max_overlay_bytes={self.limit}), and no compactor pass "
                        f"folded any within {self._wait:g} s; nothing was written"
                    )
                self.poke()
                self._folded.wait(min(left, _POLL))
        waited = time.monotonic() - started
        self._count(waited)
        return waited

    def _count(self, seconds: float) -> None:
        self._metrics.stalls.inc()
        self._metrics.stall_seconds.inc(seconds)
