"""What the log writer counts, as protocols: the store binds its metrics to them.

The log sits below :mod:`statelog.ops`, so the writer cannot name the
metrics it feeds; it names only the two operations it performs. Any object
with those attributes fits, :class:`statelog.ops.metrics.StoreMetrics`
among them.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Count", "Seconds", "WalMetrics"]


class Seconds(Protocol):
    """A distribution of durations."""

    def observe(self, seconds: float) -> None:
        """Record one duration of ``seconds``; must be safe to call from any thread."""


class Count(Protocol):
    """A monotonic total."""

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount`` (non-negative); must be exact under concurrent calls."""


class WalMetrics(Protocol):
    """The series a :class:`~statelog.log.writer.WalWriter` feeds on every append."""

    @property
    def fsync_seconds(self) -> Seconds:
        """Seconds per fdatasync of the active segment."""

    @property
    def appended_bytes(self) -> Count:
        """Bytes appended to segments (frames and seals; headers are not appends)."""
