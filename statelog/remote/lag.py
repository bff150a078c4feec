"""Shipping lag: how much sealed data the remote does not have yet, and for how long.

Computed from local files and ``remote.json`` only (no request), so it is
cheap enough for every scrape. :class:`LagCollector` exports it as the
Prometheus gauges ``statelog_remote_lag_bytes``, ``statelog_remote_lag_seconds``
and ``statelog_remote_lag_epochs`` with a ``store`` label.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from statelog.log.reader import peek_seal
from statelog.log.segments import list_segments
from statelog.remote.record import load_record
from statelog.storage.layout import SNAPSHOT_DIR, WAL_DIR
from statelog.storage.snapshots import list_snapshots

__all__ = ["Lag", "LagCollector", "lag"]


@dataclass(frozen=True)
class Lag:
    """``bytes``: sealed segments and snapshots not shipped; ``seconds``: age of the oldest
    of them (since it was sealed or written); ``epochs``: newest sealed LSN minus the last
    epoch the remote reaches. The active segment is not counted: it cannot be shipped."""

    bytes: int
    seconds: float
    epochs: int
    files: int


def lag(store: Path, *, now: float | None = None) -> Lag:
    """The shipping lag of ``store`` (module docstring). A store never shipped lags by all.

    :raises OSError: listing the store failed.
    """
    now = time.time() if now is None else now
    rec = load_record(store)
    done = set(rec.files) if rec else set()
    pending: list[tuple[int, float]] = []
    newest = 0
    with contextlib.suppress(FileNotFoundError):
        for _seq, _lsn, path in list_segments(store / WAL_DIR):
            st = path.stat()
            seal = peek_seal(path, st.st_size)
            if seal is None:
                continue
            newest = max(newest, seal[0])
            if f"{WAL_DIR}/{path.name}" not in done:
                pending.append((st.st_size, st.st_mtime))
    for _e, _l, path in list_snapshots(store / SNAPSHOT_DIR):
        if f"{SNAPSHOT_DIR}/{path.name}" not in done:
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                pending.append((st.st_size, st.st_mtime))
    oldest = min((m for _s, m in pending), default=now)
    shipped = rec.last_epoch if rec else 0
    return Lag(
        bytes=sum(s for s, _m in pending),
        seconds=max(0.0, now - oldest),
        epochs=max(0, newest - shipped),
        files=len(pending),
    )


class LagCollector(Collector):
    """Prometheus collector of :func:`lag` for each store, computed at scrape time."""

    def __init__(self, stores: Sequence[Path]) -> None:
        self.stores = [Path(s) for s in stores]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        b = GaugeMetricFamily(
            "statelog_remote_lag_bytes", "Sealed bytes not yet shipped", labels=["store"]
        )
        s = GaugeMetricFamily(
            "statelog_remote_lag_seconds",
            "Age of the oldest sealed file not yet shipped",
            labels=["store"],
        )
        e = GaugeMetricFamily(
            "statelog_remote_lag_epochs",
            "Newest sealed epoch minus the last epoch the remote reaches",
            labels=["store"],
        )
        for store in self.stores:
            try:
                got = lag(store)
            except OSError:
                continue  # a store that cannot be listed exports nothing, not a wrong zero
            b.add_metric([str(store)], got.bytes)
            s.add_metric([str(store)], got.seconds)
            e.add_metric([str(store)], got.epochs)
        yield from (b, s, e)
