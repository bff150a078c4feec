"""The writer's watch for new snapshots: swap in a newer base level, drop what it folded.

The compactor (its own process) publishes snapshots into ``STORE/snapshots``.
A thread of the writing process polls that directory. A snapshot newer than
the base in use is installed only when it links to *this* writer's log: its
``(lsn, chain)`` must equal the end of a sealed segment the writer replayed
or wrote. It, and for a delta every link of its chain, is verified while
extracted to ``STORE/base/`` (or its published image checked against its
stamp), mapped read-only, and swapped in under the store's view lock, so a
reader sees either the old base with every generation or the new base with
the generations it did not fold: one consistent state either way. All the
reading, hashing and decompressing happens off the commit path.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from statelog.errors import CorruptionError, FormatVersionError, StorageError
from statelog.events import emit
from statelog.state.live import Generation, LiveState
from statelog.storage.fileio import FileLayer
from statelog.storage.image_cache import published
from statelog.storage.image_stamp import stamp_of
from statelog.storage.levels import ImageSources, open_chain
from statelog.storage.snapshots import list_snapshots

__all__ = ["PUBLISH_GRACE", "BaseWatcher"]

log = logging.getLogger("statelog.store.store")

PUBLISH_GRACE = 3.0
"""Seconds a snapshot without a published image waits, from when this watcher first
saw it, before the writer builds the image itself."""


class BaseWatcher:
    """Polls for snapshots and swaps them in. One per writing store."""

    def __init__(
        self,
        *,
        files: FileLayer,
        snapshots: Path,
        image_dir: Path,
        store_id: uuid.UUID,
        state: LiveState,
        view: threading.Lock,
        boundaries: dict[int, int],
        interval: float,
        on_swap: Callable[[Path, int], None] | None = None,
    ) -> None:
        self._files = files
        self._snapshots = snapshots
        self._image_dir = image_dir
        self._store_id = store_id
        self._state = state
        self._view = view
        self._boundaries = boundaries
        self._interval = interval
        self._on_swap = on_swap
        self._refused: set[Path] = set()
        self._first_seen: dict[Path, float] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="statelog-base-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.check()
            except Exception:  # a bad snapshot must never take the writer down
                log.exception("event=base_watch_failed")

    def check(self) -> Path | None:
        """Install the newest usable snapshot newer than the current base; returns it, or None."""
        state = self._state
        for epoch, lsn, path in list_snapshots(self._snapshots):
            if lsn <= state.base_epoch:
                return None
            if path in self._refused or lsn > state.epoch:
                continue
            chain = self._boundaries.get(lsn)
            if chain is None:
                continue  # not the end of a segment this writer knows: not ours to judge
            if self._publishing(path):
                return None
            try:
                self._files.makedirs(self._image_dir)
                sources = ImageSources(self._image_dir, (self._image_dir,))
                found, base = open_chain(self._files, path, self._store_id, sources)
                if found.meta.chain != chain:
                    base.close()
                    why = f"chain {found.meta.chain:#010x} != log {chain:#010x}"
                    raise CorruptionError(path, 0, why)
            except (CorruptionError, FormatVersionError) as exc:
                self._refused.add(path)  # damage does not heal: never try this file again
                log.error(
                    "snapshot=%s event=snapshot_refused epoch=%d reason=%r", path.name, epoch, exc
                )
                reason = getattr(exc, "reason", None) or str(exc)
                emit(
                    self._snapshots.parent,
                    "integrity_mismatch",
                    file=path.name,
                    offset=getattr(exc, "offset", None),
                    reason=reason,
                    source="swap",
                )
                continue
            except (StorageError, OSError) as exc:
                # Transient, or retention removed it meanwhile: look again next round.
                log.warning(
                    "snapshot=%s event=snapshot_unreadable epoch=%d error=%r", path.name, epoch, exc
                )
                continue
            dropped: list[Generation] = []
            with self._view:
                old = state.swap_base(base, lsn, dropped)
            dropped.clear()  # the folded entries are freed here, commits no longer waiting
            old.close()
            for image in set(getattr(old, "paths", ())) - set(base.paths):
                for p in (image, stamp_of(image)):
                    with contextlib.suppress(FileNotFoundError):  # a compactor's, removed by it
                        self._files.remove(p)
            for k in [k for k in self._boundaries if k < lsn]:
                del self._boundaries[k]
            log.info(
                "snapshot=%s event=base_swapped epoch=%d generations=%d",
                path.name,
                lsn,
                len(state.generations),
            )
            emit(self._snapshots.parent, "base_swap", snapshot=path.name, epoch=lsn)
            if self._on_swap is not None:
                self._on_swap(path, lsn)
            return path
        return None

    def _publishing(self, snapshot: Path) -> bool:
        """Whether ``snapshot``'s compactor may still be publishing its image: it renames
        the snapshot into place, then its image, and building the image here instead
        would write the whole state a second time, in the writer's process.

        The grace runs from this watcher's first sight of the snapshot, not from its
        mtime: a large snapshot's mtime is its last write, before its fsync.
        """
        if published(self._image_dir, snapshot):
            return False
        now = time.monotonic()
        first = self._first_seen.setdefault(snapshot, now)
        for old in [p for p in self._first_seen if p.name < snapshot.name]:
            del self._first_seen[old]  # older snapshots are never installed any more
        return now - first < PUBLISH_GRACE

    def poke(self) -> None:
        """Look for a snapshot now rather than at the next interval (a stalled commit waits)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()
