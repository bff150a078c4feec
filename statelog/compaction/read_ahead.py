"""Reading ahead, on another core, the full snapshots retention will read again.

Before a pass deletes an older full snapshot, or a segment from before the
oldest full snapshot it keeps, retention hashes the full snapshots every
kept restore point rests on (:mod:`statelog.compaction.retention`): a read
of the state's size. Done after the fold, it is a wait the pass adds to
every first pass after a full snapshot. Started when the fold starts, in a
thread (file reads and SHA-256 release the GIL), it runs beside the fold
and retention finds it done (``hashed_since``: a hash this process made
during the pass counts as read again).

Which snapshots: a guess from names and unverified metas
(:func:`likely_rereads`), the retention plan as it will stand once the
pass adds its restore point. A wrong guess costs a read, never safety:
only a hash that matched is noted, and retention reads again whatever it
needs that was not noted during the pass.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

from statelog.compaction.tail import list_segment_infos
from statelog.compaction.verdicts import read_back
from statelog.compaction.window import cutoff_ms, window_count
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import SNAPSHOT_DIR, WAL_DIR
from statelog.storage.snapshot_read import peek_meta
from statelog.storage.snapshots import list_snapshots

__all__ = ["HashAhead", "likely_rereads"]


def likely_rereads(
    store: Path, retain: int, retain_for: timedelta | None, *, full: bool
) -> list[Path]:
    """The full snapshots retention will likely hash again after the pass about to
    write one more restore point (a full snapshot if ``full``, else a delta): the full
    snapshot under the oldest restore point it will keep, and every newer full one,
    when something older than that full snapshot is left to delete (an older
    snapshot, or a segment that starts at or before it). None when the pass's own
    full snapshot is the only one kept: it is not there to read yet.

    Reads names and metas only, unverified: a plan, never a verdict.

    :raises OSError: listing ``snapshots/`` or ``wal/`` failed.
    """
    snaps = list_snapshots(store / SNAPSHOT_DIR)  # newest first
    if not snaps:
        return []
    keep = max(retain, window_count(snaps, cutoff_ms(retain_for)))
    if full and keep <= 1:
        return []
    # The pass's own snapshot takes the newest place: keep - 1 of these stay.
    oldest = min(max(keep - 2, 0), len(snaps) - 1)
    fulls = [i for i in range(oldest, len(snaps)) if _is_full(snaps[i][2])]
    if not fulls:
        return []
    base = fulls[0]
    base_lsn = snaps[base][1]
    segs = list_segment_infos(store / WAL_DIR)[:-1]  # the last segment is never deleted
    if base + 1 == len(snaps) and not any(s.first_lsn <= base_lsn for s in segs):
        return []
    return [p for i, (_e, _l, p) in enumerate(snaps[: base + 1]) if i == base or _is_full(p)]


def _is_full(path: Path) -> bool:
    doc = peek_meta(path)
    return doc is not None and doc.delta is None


class HashAhead:
    """One thread hashing snapshots (:meth:`start`) while its caller does other work;
    :meth:`wait` before using what it noted, or :meth:`abandon` it (it then stops
    before its next file; it only reads, so it may finish the one it is on alone).
    ``stop`` (the pass's) is also polled between files.

    Each snapshot that verifies is noted as read back
    (:func:`~statelog.compaction.verdicts.read_back`); one that does not, or
    cannot be read, is left unnoted and unreported: the caller's own check reads
    it again and reports it.
    """

    def __init__(
        self, files: FileLayer, store_id: uuid.UUID, stop: Callable[[], bool] = lambda: False
    ) -> None:
        self._files = files
        self._store_id = store_id
        self._stop = stop
        self._abandoned = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, paths: Sequence[Path]) -> None:
        """Start hashing ``paths`` in order (nothing if empty; once per instance; nothing
        either if no thread can be started: the caller's own check reads them)."""
        if self._thread is not None or not paths:
            return
        thread = threading.Thread(
            target=self._run, args=(list(paths),), name="statelog-hash-ahead", daemon=True
        )
        with contextlib.suppress(RuntimeError):
            thread.start()
            self._thread = thread

    def wait(self) -> None:
        """Return once every hash started is done."""
        if self._thread is not None:
            self._thread.join()

    def abandon(self) -> None:
        """Let the thread stop before its next file, without waiting for it."""
        self._abandoned.set()

    def _run(self, paths: list[Path]) -> None:
        for path in paths:
            if self._abandoned.is_set() or self._stop():
                return
            # Whatever fails here is the caller's own check to find and report.
            with contextlib.suppress(Exception):
                read_back(self._files, path, self._store_id)
