"""The daemon's shipping: one store to ``--remote``, and shipping between passes.

Shipping runs in a thread of its own every quarter ``--max-ship-lag``, beside
the passes (which stay ``--interval`` apart): the writers seal by age at
half their bound, so what they commit reaches the bucket within about
``--max-ship-lag`` even while a long pass runs.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from compactor.options import EXIT_FENCED
from statelog.compaction.logfmt import LOGGER, kv
from statelog.errors import FencedError, StatelogError
from statelog.remote import RemoteClient, ship
from statelog.storage.fileio import FileLayer

__all__ = [
    "SHIP_SWITCH_INTERVAL",
    "STOP_SIGNALS",
    "ShipLoop",
    "fenced_exit",
    "ship_store",
    "wait_for_round",
]

log = logging.getLogger(LOGGER)

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""The signals that stop the daemon (blocked, and waited for with ``sigtimedwait``)."""
SHIP_SWITCH_INTERVAL = 0.001
"""The GIL switch interval while the ship loop runs (Python's default: 0.005 s)."""


class ShipLoop:
    """Ships every store the daemon holds every quarter ``--max-ship-lag``, in a thread of its own.

    A compaction pass can take seconds; shipping beside it, not between
    passes, keeps what the writers seal by age reaching the bucket within the
    bound. Each store's shipping is serialised by a lock the pass's own
    ships take too. A failed ship is logged and tried again; a takeover
    (:class:`FencedError`) ends the loop and is kept in :attr:`fenced` for
    the daemon to act on.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        files: FileLayer,
        client: RemoteClient,
        stores: Callable[[], list[Path]],
    ) -> None:
        self._args, self._files, self._client, self._stores = args, files, client, stores
        self._locks: dict[Path, threading.Lock] = {}
        self._guard = threading.Lock()
        self.fenced: tuple[Path, FencedError] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="statelog-ship", daemon=True)
        self._interval: float | None = None  # the switch interval before start()

    def start(self) -> None:
        """Start the loop, and shorten the process's GIL switch interval while it runs.

        A ship spends its time in calls that let the GIL go (reads, hashing,
        compression, requests) and must take it back after each; beside a pass
        thread busy in Python, each take-back waits up to the switch interval,
        which bounds how soon a sealed segment reaches the bucket.
        """
        if self._interval is None:
            self._interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._interval, SHIP_SWITCH_INTERVAL))
        try:
            self._thread.start()
        except BaseException:  # no loop runs: the process keeps its own interval
            sys.setswitchinterval(self._interval)
            self._interval = None
            raise

    def ship(self, store: Path) -> None:
        """Ship ``store`` now (serialised with the loop's ships of it).

        :raises FencedError: the store was taken over by another host.
        """
        with self._guard:
            lock = self._locks.setdefault(store, threading.Lock())
        with lock:
            ship_store(store, self._args, self._files, self._client)

    def _run(self) -> None:
        period = self._args.max_ship_lag.total_seconds() / 4
        while not self._stop.wait(period):
            for store in self._stores():
                if self._stop.is_set():
                    return
                try:
                    self.ship(store)
                except FencedError as exc:
                    self.fenced = (store, exc)
                    return
                except (StatelogError, OSError) as exc:
                    log.error("%s", kv(event="ship_failed", store=store, error=str(exc)))
                except Exception as exc:  # a bug must not end the shipping silently
                    log.error("%s", kv(event="ship_failed", store=store, error=repr(exc)),
                              exc_info=True)  # fmt: skip

    def stop(self) -> None:
        """End the loop; waits for a ship in flight, then puts the switch interval back."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._interval is not None:
            sys.setswitchinterval(self._interval)
            self._interval = None


def wait_for_round(seconds: float, shipper: ShipLoop | None) -> bool:
    """Wait ``seconds`` for the next round, waking early if the ship loop was fenced.

    :returns: whether a stop signal arrived.
    """
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if signal.sigtimedwait(STOP_SIGNALS, max(0.0, min(left, 0.5))) is not None:
            return True
        if left <= 0.5 or (shipper is not None and shipper.fenced is not None):
            return False


def ship_store(
    store: Path, args: argparse.Namespace, files: FileLayer, client: RemoteClient
) -> None:
    """Ship ``store`` to ``--remote`` (the library logs ``event=shipped``)."""
    ship(
        store, args.remote, retain=args.remote_retain, retain_for=args.remote_retain_for,
        client=client, files=files,
    )  # fmt: skip


def fenced_exit(store: Path, exc: FencedError) -> int:
    """Log and say that ``store`` was taken over; the daemon's exit status for it."""
    log.error(
        "%s",
        kv(event="fenced", store=store, generation=exc.ours, current=exc.current, hint=exc.hint),
    )
    print(
        f"statelog-compactor: {store} was taken over by another host (generation "
        f"{exc.current}, this store holds {exc.ours}); stop this daemon and the "
        "writer here (exiting, status 4)",
        file=sys.stderr,
    )
    return EXIT_FENCED
