"""Shipping lag: how much the remote does not have yet, and for how long.

Unshipped means sealed files not shipped yet and the acknowledged commits
of the active segment, which cannot be shipped until the writer seals it
(by size, or by age: ``max_ship_lag``). The active segment's commits are
read from the file (verified, a torn tail ignored), their age from each
record's commit time.

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

import msgspec
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from statelog.errors import StatelogError
from statelog.format.records import decode_record
from statelog.log.reader import peek_seal, scan_segment
from statelog.log.segments import list_segments
from statelog.remote.record import load_record
from statelog.storage.layout import SNAPSHOT_DIR, WAL_DIR
from statelog.storage.snapshots import list_snapshots

__all__ = ["Lag", "LagCollector", "lag"]


@dataclass(frozen=True)
class Lag:
    """``bytes``: sealed segments and snapshots not shipped, and the active segment's
    records the remote lacks; ``seconds``: age of the oldest of them (since it was sealed
    or written; for a commit of the active segment, since it was committed); ``epochs``:
    the newest epoch in the log minus the last epoch the remote reaches; ``files``: sealed
    files not shipped."""

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
    shipped = rec.last_epoch if rec else 0
    active = 0
    with contextlib.suppress(FileNotFoundError):
        for _seq, _lsn, path in list_segments(store / WAL_DIR):
            st = path.stat()
            seal = peek_seal(path, st.st_size)
            if seal is None:
                size, oldest_s, last = _active(path, shipped)
                newest = max(newest, last)
                if size:
                    active += 1
                    pending.append((size, oldest_s))
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
    return Lag(
        bytes=sum(s for s, _m in pending),
        seconds=max(0.0, now - oldest),
        epochs=max(0, newest - shipped),
        files=len(pending) - active,
    )


def _active(path: Path, shipped: int) -> tuple[int, float, int]:
    """An unsealed segment's records after epoch ``shipped``: (bytes, the oldest one's commit
    time in seconds, the newest LSN); (0, 0.0, 0) if it holds none or cannot be read."""
    try:
        data = path.read_bytes()
        scan = scan_segment(path, data, store_id=None, prev_crc=None, is_last=True)
    except (OSError, StatelogError):
        return 0, 0.0, 0
    if scan.header is None or not scan.records:
        return 0, 0.0, 0
    first = scan.header.first_lsn
    last = first + len(scan.records) - 1
    skip = max(0, shipped + 1 - first)
    if skip >= len(scan.records):
        return 0, 0.0, last
    oldest = scan.records[skip]
    try:
        committed = decode_record(oldest.payload).commit_ms / 1000
    except (StatelogError, msgspec.MsgspecError):
        committed = path.stat().st_mtime
    return scan.records[-1].end - oldest.offset, committed, last


class LagCollector(Collector):
    """Prometheus collector of :func:`lag` for each store, computed at scrape time."""

    def __init__(self, stores: Sequence[Path]) -> None:
        self.stores = [Path(s) for s in stores]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        b = GaugeMetricFamily(
            "statelog_remote_lag_bytes",
            "Bytes not yet shipped: sealed files, and the active segment's commits",
            labels=["store"],
        )
        s = GaugeMetricFamily(
            "statelog_remote_lag_seconds",
            "Age of the oldest unshipped file or acknowledged commit",
            labels=["store"],
        )
        e = GaugeMetricFamily(
            "statelog_remote_lag_epochs",
            "Newest epoch in the log minus the last epoch the remote reaches",
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
