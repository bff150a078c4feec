"""Retention by time: which snapshots keep every epoch of a window restorable.

``--retain-for DURATION`` (``compact(retain_for=)``) keeps, besides the
newest ``retain`` restore points, every restore point back to the newest
one whose state is at or before the window's start (now minus the
duration): that one and the log after it rebuild every epoch committed
within the window, and its chain and the log from it are kept with it as
for any restore point.

A snapshot's time is the commit time its meta names (``commit_ms``, the
time of its epoch's commit) or, for a snapshot written before commit times
were recorded, the time the compactor wrote it (``created_ms``), which is
never earlier than its epoch's commit: a snapshot is taken to be at or
before the window's start only when it certainly is, so the window never
keeps less than it promises.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

from statelog.errors import InvalidOptionError
from statelog.storage.snapshot_read import peek_meta
from statelog.storage.snapshots import SnapshotMeta

__all__ = ["check_window", "cutoff_ms", "meta_time", "peek_time", "window_count"]


def check_window(retain_for: object) -> None:
    """:raises InvalidOptionError: ``retain_for`` is neither None nor a positive timedelta."""
    if retain_for is not None and (
        not isinstance(retain_for, timedelta) or retain_for <= timedelta(0)
    ):
        raise InvalidOptionError(
            f"retain_for={retain_for!r}",
            hint="a positive timedelta, e.g. timedelta(hours=1); None keeps by count only",
        )


def cutoff_ms(retain_for: timedelta | None, now_ms: int | None = None) -> int | None:
    """The window's start in Unix ms (None: no window)."""
    if retain_for is None:
        return None
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return now - int(retain_for.total_seconds() * 1000)


def meta_time(meta: SnapshotMeta) -> int:
    """A verified snapshot's time (module docstring)."""
    return meta.commit_ms or meta.created_ms


def peek_time(path: Path) -> int | None:
    """A snapshot's time read from its meta, unverified (None: unreadable): the cheap
    plan's only."""
    doc = peek_meta(path)
    return None if doc is None else doc.commit_ms or doc.created_ms


def window_count(snaps: list[tuple[int, int, Path]], cutoff: int | None) -> int:
    """How many of ``snaps`` (newest first) the window needs, judged by their metas:
    up to and with the first at or before ``cutoff`` (all of them: none is)."""
    if cutoff is None:
        return 0
    for i, (_e, _l, path) in enumerate(snaps):
        t = peek_time(path)
        if t is not None and t <= cutoff:
            return i + 1
    return len(snaps)
