"""Prometheus metrics of statelog stores, kept in a library registry the host exposes.

Everything lives in :data:`REGISTRY`, a ``CollectorRegistry`` of its own
rather than ``prometheus_client``'s global one, so importing statelog never
adds series to a host's default endpoint uninvited. A host exposes it with
``prometheus_client.start_http_server(port, registry=statelog.ops.metrics.REGISTRY)``
or mounts ``prometheus_client.make_wsgi_app(statelog.ops.metrics.REGISTRY)``;
``statelog-compactor --metrics-port`` serves it too. ``docs/metrics.md``
lists every series and example alert rules.

Three sources feed it, each at the cost its place can afford:

* the commit path (:func:`bind`): bound once per open, so a commit does no
  label lookup; plain accumulators (half the cost of prometheus_client
  children) rendered at scrape time;
* store events (:func:`install`): recoveries, walk-backs, integrity
  mismatches, truncations, compactions and retention deletions arrive
  through :mod:`statelog.events` and become counters;
* scrape time (:func:`watch`, :mod:`statelog.ops.metrics_gauges`): the
  tail size, the newest snapshot's age and chain length, and the snapshot
  count are read from the store directory only when Prometheus scrapes,
  so they cost the commit path nothing.

Every per-store series carries a ``store`` label: the store's resolved path.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from statelog import events
from statelog.ops.metrics_gauges import LagGauges, LagSource, StoreGauges

__all__ = [
    "REGISTRY",
    "StoreMetrics",
    "bind",
    "install",
    "store_label",
    "unwatch",
    "unwatch_lag",
    "watch",
    "watch_lag",
    "watched",
]

log = logging.getLogger("statelog.ops.metrics")

REGISTRY: Final = CollectorRegistry(auto_describe=True)
"""The registry every statelog metric is registered in; expose it from the host."""

# A durable commit is an fdatasync (~0.1-1 ms) plus encoding; large
# checkpoints and stalled disks reach seconds, so the buckets span both.
_LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
_LE = (*(repr(b) for b in _LATENCY_BUCKETS), "+Inf")
_COMPACTION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_STORE = ("store",)


def _counter(name: str, doc: str, *labels: str) -> Counter:
    return Counter(name, doc, ("store", *labels), registry=REGISTRY)


RECOVERIES: Final = _counter(
    "statelog_recoveries", "Recoveries run by opens (clean, torn-tail, corruption).", "outcome"
)
REPLAYED: Final = _counter("statelog_replayed_commits", "Commits replayed by recoveries.")
LOST_EPOCHS: Final = _counter(
    "statelog_lost_epochs", "Epochs recoveries found lost to damage (writer opens only)."
)
AUDIT_FAILURES: Final = _counter(
    "statelog_audit_failures", "Events the audit trail failed to record, by kind.", "kind"
)
WALKBACKS: Final = _counter("statelog_walkbacks", "Snapshots refused and walked past.", "source")
MISMATCHES: Final = _counter(
    "statelog_integrity_mismatches", "Stored bytes that failed verification.", "source"
)
TRUNCATIONS: Final = _counter("statelog_truncations", "Log cuts by recovery.", "reason")
COMPACTIONS: Final = _counter("statelog_compactions", "Snapshots written by compaction passes.")
COMPACTION_PASSES: Final = _counter(
    "statelog_compaction_passes",
    "Compaction passes that wrote a snapshot, by the kind written (full, delta).",
    "kind",
)
COMPACTION_WRITTEN: Final = _counter(
    "statelog_compaction_written_bytes",
    "Bytes of snapshot files written by compaction passes, by kind (full, delta).",
    "kind",
)
COMPACTION_SECONDS: Final = Histogram(
    "statelog_compaction_seconds", "Seconds per compaction pass that wrote a snapshot.",
    _STORE, buckets=_COMPACTION_BUCKETS, registry=REGISTRY,
)  # fmt: skip
RETENTION_DELETIONS: Final = _counter("statelog_retention_deletions", "Files retention deleted.")
BASE_SWAPS: Final = _counter("statelog_base_swaps", "Snapshots a writer swapped in as its base.")


def store_label(root: Path | str) -> str:
    """The ``store`` label of the store at ``root``: its resolved path, as text."""
    return str(Path(root).resolve())


# -- the commit path --------------------------------------------------------------
# prometheus_client's children take a lock per bucket and per sum: four of
# them cost ~3 us per commit. These accumulators cost under half of that
# (docs/metrics.md, "Cost on the commit path") and render at scrape time.


class _Tally:
    """A monotonic count, exact under concurrent increments."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount


class _Latency:
    """Histogram counts over :data:`_LATENCY_BUCKETS` (``le`` inclusive) and their sum."""

    __slots__ = ("_lock", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(_LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect_left(_LATENCY_BUCKETS, seconds)
        with self._lock:
            self.counts[i] += 1
            self.sum += seconds

    def read(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative ``(le, count)`` buckets and the sum, taken together."""
        with self._lock:
            counts, total = list(self.counts), self.sum
        return list(zip(_LE, accumulate(counts), strict=True)), total


@dataclass(frozen=True, slots=True)
class StoreMetrics:
    """The commit-path series of one store, bound once per open (see :func:`bind`)."""

    commit_seconds: _Latency
    commits: _Tally
    appended_bytes: _Tally
    fsync_seconds: _Latency
    stalls: _Tally
    stall_seconds: _Tally


_bound: dict[str, StoreMetrics] = {}
_bound_guard = threading.Lock()


def bind(root: Path) -> StoreMetrics:
    """The commit-path series of the store at ``root`` (resolved), for a writer to keep.

    Call once per open, so each commit does no lookup. A store reopened in
    the same process gets the same series back: counters stay monotonic.
    """
    label = store_label(root)
    with _bound_guard:
        found = _bound.get(label)
        if found is None:
            found = _bound[label] = StoreMetrics(
                _Latency(), _Tally(), _Tally(), _Latency(), _Tally(), _Tally()
            )
        return found


class _CommitPath(Collector):
    """Renders the accumulators of every bound store at scrape time."""

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        seconds, commits, appended, fsyncs, stalls, stalled = self._families()
        with _bound_guard:
            bound = sorted(_bound.items())
        for label, m in bound:
            commits.add_metric([label], m.commits.value)
            appended.add_metric([label], m.appended_bytes.value)
            stalls.add_metric([label], m.stalls.value)
            stalled.add_metric([label], m.stall_seconds.value)
            for family, latency in ((seconds, m.commit_seconds), (fsyncs, m.fsync_seconds)):
                buckets, total = latency.read()
                family.add_metric([label], buckets, total)
        yield from (seconds, commits, appended, fsyncs, stalls, stalled)

    @staticmethod
    def _families() -> tuple[
        HistogramMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
        HistogramMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
    ]:
        H, C = HistogramMetricFamily, CounterMetricFamily
        return (
            H(
                "statelog_commit_seconds",
                "Seconds from a commit call to its return.",
                labels=_STORE,
            ),
            C("statelog_commits", "Commits appended to the log.", labels=_STORE),
            C("statelog_appended_bytes", "Bytes appended to log segments.", labels=_STORE),
            H("statelog_fsync_seconds", "Seconds per fdatasync of the log.", labels=_STORE),
            C(
                "statelog_write_stalls",
                "Commits that waited for a snapshot because the overlay was full.",
                labels=_STORE,
            ),
            C(
                "statelog_write_stall_seconds",
                "Seconds commits waited for a snapshot to fold the full overlay.",
                labels=_STORE,
            ),
        )


REGISTRY.register(_CommitPath())


# -- events -------------------------------------------------------------------


def _text(fields: Any, key: str) -> str:
    value = fields.get(key)
    return "unknown" if value is None else str(value)


def _count(fields: Any, key: str) -> float | None:
    """A non-negative number from the event, or None (a malformed field is skipped, not fatal)."""
    value = fields.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _on_event(event: events.Event) -> None:
    """Turn one store event into counter increments (fields: see :mod:`statelog.events`)."""
    label = store_label(event.store)
    f = event.fields
    kind = event.kind
    if kind == "recovery":
        RECOVERIES.labels(label, _text(f, "outcome")).inc()
        replayed = _count(f, "records_replayed")
        if replayed:
            REPLAYED.labels(label).inc(replayed)
        lost = f.get("lost_epochs")
        if event.writable and isinstance(lost, list) and len(lost) == 2:
            LOST_EPOCHS.labels(label).inc(lost[1] - lost[0] + 1)
    elif kind == "walk_back":
        WALKBACKS.labels(label, _text(f, "source")).inc()
    elif kind == "integrity_mismatch":
        MISMATCHES.labels(label, _text(f, "source")).inc()
    elif kind == "truncation":
        TRUNCATIONS.labels(label, _text(f, "reason")).inc()
    elif kind == "compaction":
        _on_compaction(label, f)
    elif kind == "retention_delete":
        listed = f.get("files")
        RETENTION_DELETIONS.labels(label).inc(len(listed) if isinstance(listed, list) else 1)
    elif kind == "base_swap":
        BASE_SWAPS.labels(label).inc()


_SNAPSHOT_KINDS = frozenset({"full", "delta"})


def _on_compaction(label: str, f: Any) -> None:
    """A pass that wrote a snapshot: counted, timed, and its bytes counted by kind.

    An event without a known ``snapshot_kind`` (from an older emitter) is
    counted under ``kind="unknown"``, so the totals by kind still add up.
    """
    COMPACTIONS.labels(label).inc()
    seconds = _count(f, "seconds")
    if seconds is not None:
        COMPACTION_SECONDS.labels(label).observe(seconds)
    written_kind = f.get("snapshot_kind")
    written_kind = written_kind if written_kind in _SNAPSHOT_KINDS else "unknown"
    COMPACTION_PASSES.labels(label, written_kind).inc()
    written = _count(f, "written_bytes")
    if written:
        COMPACTION_WRITTEN.labels(label, written_kind).inc(written)


_installed = False
_install_guard = threading.Lock()


def install() -> None:
    """Count store events of this process in :data:`REGISTRY`. Idempotent.

    Writers call it when they open and the daemon when it starts, so a host
    only needs it to count events of code that runs before any open.
    """
    global _installed
    with _install_guard:
        if not _installed:
            events.subscribe(_on_event)
            _installed = True


# -- scrape-time gauges: statelog.ops.metrics_gauges ----------------------------

_GAUGES: Final = StoreGauges()
REGISTRY.register(_GAUGES)


def watch(root: Path) -> None:
    """Report the tail, the newest snapshot's age and chain length, and the snapshot count.

    Watches are counted: a store watched twice (a writer and an in-process
    daemon) stays watched until unwatched twice. Reads nothing now.
    """
    _GAUGES.watch(Path(root).resolve())


def unwatch(root: Path) -> None:
    """Undo one :func:`watch` of ``root``; a store not watched is left alone."""
    _GAUGES.unwatch(Path(root).resolve())


def watched() -> list[Path]:
    """The stores the scrape-time gauges report, resolved, in path order."""
    return _GAUGES.roots()


_LAG: Final = LagGauges()
REGISTRY.register(_LAG)


def watch_lag(root: Path, source: LagSource) -> None:
    """Report the standby at ``root``: ``source()`` gives its epochs, bytes and seconds behind."""
    _LAG.watch(Path(root).resolve(), source)


def unwatch_lag(root: Path) -> None:
    """Stop reporting the standby at ``root``."""
    _LAG.unwatch(Path(root).resolve())
