"""The daemon's shipping: one store to ``--remote``, and shipping between passes.

Shipping between passes takes what the writers sealed by age, so a commit
reaches the bucket within about ``--max-ship-lag`` while the passes stay
``--interval`` apart.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from pathlib import Path

from statelog.compaction.lock import CompactorLock
from statelog.compaction.logfmt import LOGGER, kv
from statelog.errors import FencedError, StatelogError
from statelog.remote import RemoteClient, ship
from statelog.storage.fileio import FileLayer

__all__ = ["STOP_SIGNALS", "ship_store", "wait_shipping"]

log = logging.getLogger(LOGGER)

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""The signals that stop the daemon (blocked, and waited for with ``sigtimedwait``)."""


def wait_shipping(
    args: argparse.Namespace,
    files: FileLayer,
    locks: dict[Path, CompactorLock],
    client: RemoteClient | None,
    seconds: float,
) -> bool:
    """Wait ``seconds`` for the next round; with ``--remote``, ship every half ``--max-ship-lag``.

    Shipping between passes takes what the writers sealed by age, so a
    commit reaches the bucket within about ``--max-ship-lag`` while passes
    stay ``--interval`` apart. A failed ship is logged and tried again.

    :returns: whether a stop signal arrived.
    :raises FencedError: a store was taken over by another host.
    """
    deadline = time.monotonic() + seconds
    period = args.max_ship_lag.total_seconds() / 2
    while True:
        left = deadline - time.monotonic()
        wait = max(0.0, left if client is None else min(left, period))
        if signal.sigtimedwait(STOP_SIGNALS, wait) is not None:
            return True
        if left <= period or client is None:
            return False
        for store in list(locks):
            try:
                ship_store(store, args, files, client)
            except FencedError:
                raise
            except (StatelogError, OSError) as exc:
                log.error("%s", kv(event="ship_failed", store=store, error=str(exc)))


def ship_store(
    store: Path, args: argparse.Namespace, files: FileLayer, client: RemoteClient
) -> None:
    """Ship ``store`` to ``--remote`` (the library logs ``event=shipped``)."""
    ship(
        store, args.remote, retain=args.remote_retain, retain_for=args.remote_retain_for,
        client=client, files=files,
    )  # fmt: skip
