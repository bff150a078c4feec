"""The writer's anonymous memory over a memory-mapped base (issue 3, "Memory").

In a freshly spawned interpreter: read ``RssAnon`` after the imports; open
a clone of a template (its whole state in one snapshot, so the overlay is
empty) and read ``RssAnon`` again: the base is a file-backed map, so this
must not grow with the state. Then rewrite ``updates`` distinct existing
keys in durable commits of 10k and read it a third time: the growth over
the number of overlay entries is the overlay's memory per buffered update.
``gc.collect()`` runs before each reading.
"""

from __future__ import annotations

import gc
import random
import time
from dataclasses import dataclass
from pathlib import Path

from .procstat import rss
from .stores import dir_bytes
from .workload import DEFAULT_SEED, EPOCH_MS, Workload, make_value

__all__ = ["MemoryResult", "measure_memory"]

_CHUNK = 10_000


@dataclass(frozen=True)
class MemoryResult:
    keys: int
    image_bytes: int
    rss_anon_idle: int
    """After the imports, before the open (bytes)."""
    rss_anon_open: int
    """After the open: base mapped, overlay empty."""
    rss_file_open: int
    open_seconds: float
    overlay_entries_open: int
    count: int
    base: str | None
    """The snapshot the open used."""
    updates: int
    """Distinct existing keys rewritten after the open."""
    rss_anon_updated: int
    overlay_entries_updated: int
    wal_bytes_updated: int
    """Bytes those commits added to the log (frames and padding included)."""

    @property
    def per_update(self) -> float:
        """Overlay bytes per buffered update: RssAnon growth over the overlay's entries."""
        n = self.overlay_entries_updated - self.overlay_entries_open
        return (self.rss_anon_updated - self.rss_anon_open) / n if n else float("nan")

    @property
    def wal_per_update(self) -> float:
        return self.wal_bytes_updated / self.updates if self.updates else float("nan")


def _overlay_entries(store: object) -> int:
    state = store._state  # type: ignore[attr-defined]
    return sum(len(t) for g in state.generations for t in g.tables.values())


def measure_memory(
    store_path: Path, keys: int, image_bytes: int, updates: int, *, seed: int = DEFAULT_SEED
) -> MemoryResult:
    """Open the store at ``store_path`` (a template clone) and read RssAnon (module docstring)."""
    import statelog

    gc.collect()
    idle = rss()["RssAnon"]
    t0 = time.perf_counter()
    store = statelog.open(store_path, durability="commit")
    open_seconds = time.perf_counter() - t0
    try:
        gc.collect()
        opened = rss()
        entries_open = _overlay_entries(store)
        count = store.count()
        base = store.recovery.snapshot.name if store.recovery.snapshot else None
        wal_before = dir_bytes(store_path / "wal", ".wal")
        rng = random.Random(seed ^ 0x5EED)
        n = min(updates, keys)
        for start in range(0, n, _CHUNK):
            put = {
                Workload.key(i): make_value(rng, i, EPOCH_MS + keys + 10**9)
                for i in range(start, min(start + _CHUNK, n))
            }
            store.commit(offsets={}, low_watermark_ms=0, put=put)
            del put
        gc.collect()
        updated = rss()["RssAnon"]
        entries_updated = _overlay_entries(store)
        wal_after = dir_bytes(store_path / "wal", ".wal")
    finally:
        store.close()
    return MemoryResult(
        keys=keys,
        image_bytes=image_bytes,
        rss_anon_idle=idle,
        rss_anon_open=opened["RssAnon"],
        rss_file_open=opened["RssFile"],
        open_seconds=open_seconds,
        overlay_entries_open=entries_open,
        count=count,
        base=base,
        updates=n,
        rss_anon_updated=updated,
        overlay_entries_updated=entries_updated,
        wal_bytes_updated=wal_after - wal_before,
    )
