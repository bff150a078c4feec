"""The scrape-time gauges of :mod:`statelog.ops.metrics`: read from a store's directory.

Nothing here runs on the commit path or in a pass: each scrape lists a
watched store's ``snapshots/`` and ``wal/`` and reads the newest snapshot's
header and meta, unverified (damage is verification's to report, and
``statelog_integrity_mismatches_total`` counts what recovery and the
compactor meet). A store that is missing or unreadable gives no samples
rather than a failed scrape.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Refcounts
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from statelog.format.snapshot import (
    FLAG_DELTA,
    HEADER_SIZE,
    MAGIC,
    SnapshotHeader,
    peek_created_ms,
    peek_delta,
)
from statelog.log.segments import list_segments
from statelog.storage.snapshots import list_snapshots

__all__ = ["LagGauges", "LagSource", "StoreGauges"]

log = logging.getLogger("statelog.ops.metrics")

# A scrape reads at most this much meta: a damaged length field costs no more.
_META_MAX = 1 << 20
_STORE = ("store",)


class StoreGauges(Collector):
    """Reads each watched store's directory when scraped; the writer never pays for it.

    Watches are counted per resolved root (see ``statelog.ops.metrics.watch``).
    """

    def __init__(self) -> None:
        self._roots: Refcounts[Path] = Refcounts()
        self._guard = threading.Lock()

    def watch(self, root: Path) -> None:
        with self._guard:
            self._roots[root] += 1

    def unwatch(self, root: Path) -> None:
        with self._guard:
            if self._roots.get(root, 0) > 1:
                self._roots[root] -= 1
            else:
                self._roots.pop(root, None)

    def roots(self) -> list[Path]:
        with self._guard:
            return sorted(self._roots)

    def describe(self) -> list[Metric]:
        # Registration asks for names only: never read a store to answer it.
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        tail, age, count, chain = self._families()
        now = time.time()
        for root in self.roots():
            label = str(root)
            try:
                snaps = list_snapshots(root / "snapshots")
                segments = list_segments(root / "wal")
            except OSError as exc:  # a missing or unreadable store: no samples, no failed scrape
                log.debug("store=%s event=metrics_store_unreadable error=%r", root, str(exc))
                continue
            newest_lsn = snaps[0][1] if snaps else 0
            tail.add_metric([label], _tail_bytes(segments, newest_lsn))
            count.add_metric([label], len(snaps))
            if snaps:
                newest = _peek(snaps[0][2])
                if newest.created is not None:
                    age.add_metric([label], max(0.0, now - newest.created))
                if newest.depth is not None:
                    chain.add_metric([label], newest.depth)
        yield from (tail, age, count, chain)

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily
    ]:
        G = GaugeMetricFamily
        return (
            G("statelog_tail_bytes", "Log bytes after the newest snapshot.", labels=_STORE),
            G("statelog_snapshot_age_seconds", "Age of the newest snapshot.", labels=_STORE),
            G("statelog_snapshots", "Snapshot files in the store.", labels=_STORE),
            G(
                "statelog_snapshot_chain_length",
                "Delta snapshots between the newest snapshot and its chain's full snapshot "
                "(0: the newest is full).",
                labels=_STORE,
            ),
        )


def _tail_bytes(segments: list[tuple[int, int, Path]], lsn: int) -> int:
    """Bytes of the segments that start after ``lsn``, the active one included.

    Snapshots end on segment boundaries (the compactor folds whole
    segments), so a segment holds records after ``lsn`` exactly when it
    starts after it.
    """
    total = 0
    for _, first_lsn, path in segments:
        if first_lsn > lsn:
            try:
                total += path.stat().st_size
            except FileNotFoundError:  # deleted by retention since the listing
                continue
    return total


@dataclass(frozen=True, slots=True)
class _Newest:
    created: float | None  # seconds since the epoch; None: the file is gone or unreadable
    depth: int | None  # deltas down to the full snapshot; None: the meta does not say


def _peek(path: Path) -> _Newest:
    """When the snapshot at ``path`` was written (its ``created_ms``, else its mtime),
    and its depth (0 for a full snapshot), read from its header and meta unverified."""
    try:
        mtime = path.stat().st_mtime
        with path.open("rb") as fh:
            head = fh.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE or head[:8] != MAGIC:
                return _Newest(mtime, None)
            h = SnapshotHeader.unpack(head)
            raw = fh.read(min(h.meta_len, _META_MAX))
    except OSError:
        return _Newest(None, None)
    created = peek_created_ms(raw)
    depth = _depth(raw) if h.flags & FLAG_DELTA else 0
    return _Newest(mtime if created is None else created / 1000.0, depth)


def _depth(raw_meta: bytes) -> int | None:
    """A delta's ``delta.depth`` from meta bytes read unverified, or None if they do not say."""
    try:
        link = peek_delta(raw_meta)
    except msgspec.DecodeError:  # damaged, or cut at _META_MAX
        return None
    return None if link is None else link.depth


LagSource = Callable[[], tuple[int, int, float]]
"""What a standby reports when scraped: epochs, bytes and seconds behind its source."""


class LagGauges(Collector):
    """Each live standby's lag, asked of the standby when scraped (its last look's)."""

    def __init__(self) -> None:
        self._sources: dict[Path, LagSource] = {}
        self._guard = threading.Lock()

    def watch(self, root: Path, source: LagSource) -> None:
        with self._guard:
            self._sources[root] = source

    def unwatch(self, root: Path) -> None:
        with self._guard:
            self._sources.pop(root, None)

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        with self._guard:
            sources = sorted(self._sources.items())
        for root, source in sources:
            for family, value in zip(families, source(), strict=True):
                family.add_metric([str(root)], value)
        yield from families

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        G = GaugeMetricFamily
        return (
            G(
                "statelog_standby_lag_epochs",
                "Epochs the source held at the standby's last look that it had not applied.",
                labels=_STORE,
            ),
            G(
                "statelog_standby_lag_bytes",
                "Log bytes the standby's last look copied but had not applied.",
                labels=_STORE,
            ),
            G(
                "statelog_standby_lag_seconds",
                "Seconds since the standby was last caught up with its source (0: it is).",
                labels=_STORE,
            ),
        )
