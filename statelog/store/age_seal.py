"""Sealing the active segment by age, so that shipping can take a commit within a bound.

The remote tier ships sealed segments only: an unsealed one is still being
appended to, and an object in the bucket never changes. A segment is sealed
when it reaches ``segment_bytes``, so a writer committing a few kilobytes a
second could keep its commits on the host for hours. :class:`AgeSealer`
bounds that time: a thread beside the writer seals the active segment once
its oldest unsealed record is half ``max_ship_lag`` old (the next commit
starts a new segment), and the shipper, which runs every quarter of its own
bound, uploads it. The other half of the bound is the shipper's period and
one upload, so an acknowledged commit reaches the bucket within about
``max_ship_lag`` (``docs/remote.md``, "A recovery point in seconds").

With ``max_ship_lag=None`` (the default) the bound applies only to a store
that is shipped: opened with ``remote=``, or found to hold the shipper's
record (``remote.json``), looked for every second; then it is
:data:`DEFAULT_MAX_SHIP_LAG`. A store nobody ships keeps its segments whole.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from pathlib import Path

from statelog.errors import StatelogError
from statelog.log.writer import WalWriter
from statelog.storage.layout import REMOTE_RECORD

__all__ = ["DEFAULT_MAX_SHIP_LAG", "SEAL_AT", "AgeSealer"]

log = logging.getLogger("statelog.wal")

DEFAULT_MAX_SHIP_LAG = timedelta(seconds=1)
"""The bound of a shipped store opened without ``max_ship_lag``."""

SEAL_AT = 0.5
"""The fraction of the bound at which the active segment is sealed: the rest
is left to the shipper's period (a quarter of its bound) and the upload."""

_LOOK_FOR_SHIPPER = 1.0
"""Seconds between looks for the shipper's record when the bound is automatic."""


class AgeSealer:
    """A daemon thread sealing ``wal``'s active segment once its records are half ``bound`` old.

    ``bound`` None: automatic (module docstring). It takes ``commits`` (the
    store's commit lock) for each check, so a seal never interleaves with an
    append; a failed seal is logged and tried again at the next check (the
    next append's roll retries it too).
    """

    def __init__(
        self,
        root: Path,
        wal: WalWriter,
        commits: threading.Lock,
        bound: timedelta | None,
        *,
        shipped: bool = False,
    ) -> None:
        self._root = root
        self._wal = wal
        self._commits = commits
        self._explicit = bound
        self._shipped = shipped or bound is not None
        self._looked = 0.0
        self.seals = 0
        """Segments this thread sealed (for tests and the log)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="statelog-age-seal", daemon=True)
        self._thread.start()

    @property
    def bound(self) -> timedelta | None:
        """The bound in force now: None while the store is not known to be shipped."""
        if self._explicit is not None:
            return self._explicit
        return DEFAULT_MAX_SHIP_LAG if self._shipped else None

    def _look_for_shipper(self) -> None:
        now = time.monotonic()
        if self._shipped or now - self._looked < _LOOK_FOR_SHIPPER:
            return
        self._looked = now
        self._shipped = (self._root / REMOTE_RECORD).exists()

    def _run(self) -> None:
        while True:
            self._look_for_shipper()
            bound = self.bound
            period = 0.25 if bound is None else min(0.25, bound.total_seconds() * SEAL_AT / 4)
            if self._stop.wait(period):
                return
            if bound is not None:
                try:
                    self.check(bound.total_seconds() * SEAL_AT)
                except StatelogError as exc:
                    log.warning("event=age_seal_failed error=%r", exc.message)
                except Exception as exc:  # a bug must not end the sealing silently
                    log.error("event=age_seal_failed error=%r", exc, exc_info=True)

    def check(self, bound: float) -> bool:
        """Seal now if the active segment's oldest unsealed record is ``bound`` seconds old.

        :returns: whether it sealed.
        :raises StorageError: the seal's write or sync failed (the segment stays open).
        """
        wal = self._wal
        with self._commits:
            since = wal.unsealed_since
            if since is None or time.monotonic() - since < bound:
                return False
            if wal.poisoned or wal.fenced is not None or wal.active_file is None:
                return False
            wal.seal()
        self.seals += 1
        return True

    def stop(self) -> None:
        """End the thread (a check in flight finishes first)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
