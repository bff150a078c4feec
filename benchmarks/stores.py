"""Stores for issue 3's benchmarks: loaded, sealed and compacted once, then cloned.

A *template* is a store holding ``keys`` keys of the benchmark workload,
loaded in 50k-key commits, closed (which seals its last segment) and
compacted once with :func:`statelog.compaction.fold.compact`, so its whole state is in
one snapshot and its overlay is empty when opened. Before the compaction
every segment is hard-linked into ``log/``, so the complete log from epoch 1
survives the compactor's retention: that is what the full-replay
comparison replays.

Every file of a template is immutable once the template is built (sealed
segments, snapshots, ``IDENTITY``), so a clone is a directory of hard links:
instant, and free of disk space. A writer opened on a clone starts a new
segment (the last one is sealed) and never writes into a linked file;
retention and the compactor only create and unlink files.

Each template is built in a freshly spawned interpreter: loading a million
keys leaves a large heap behind, and no measurement may run in that process.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import statelog
from statelog.compaction.fold import compact
from statelog.log.segments import list_segments
from statelog.storage.fileio import FileLayer
from statelog.storage.snapshots import list_snapshots, verify_snapshot

from .workload import DEFAULT_SEED, Workload

__all__ = [
    "ROOT",
    "Template",
    "build_template",
    "build_template_isolated",
    "clone_store",
    "copy_files",
    "dir_bytes",
    "run_json_probe",
    "segments_after",
    "spawn_call",
]

ROOT = Path(__file__).resolve().parent.parent
LOAD_CHUNK = 50_000


@dataclass(frozen=True)
class Template:
    """A loaded, sealed and compacted store (module docstring)."""

    keys: int
    path: Path
    """The store: one snapshot holding every key, and the last sealed segment."""
    log: Path
    """Hard links of every segment written before the compaction: the log from epoch 1."""
    epoch: int
    snapshot: Path
    snapshot_bytes: int
    image_bytes: int
    log_bytes: int
    load_seconds: float
    compact_seconds: float
    history_commits: int = 0
    """Checkpoints committed after the load, before the compaction (``workload.checkpoint(i)``
    for i below this), so the log is much longer than the state."""
    history_updates: int = 0


def dir_bytes(path: Path, suffix: str = "") -> int:
    """Total size of the files directly in ``path`` whose names end with ``suffix``."""
    try:
        with os.scandir(path) as it:
            return sum(e.stat().st_size for e in it if e.is_file() and e.name.endswith(suffix))
    except FileNotFoundError:
        return 0


def build_template(
    root: Path, keys: int, *, seed: int = DEFAULT_SEED, history: int = 0, updates: int = 10_000
) -> Template:
    """Load ``keys`` keys into ``root/store``, close, link the log into ``root/log``, compact.

    With ``history``, about that many updates follow the load, as checkpoints of
    ``updates`` keys each (the benchmark workload's ``checkpoint(0..)``): a
    reconciler's log after months of running holds many writes per key.
    The load uses ``durability="none"`` (it is set-up, not measured); the
    close seals and syncs the last segment, and the compactor syncs the snapshot.
    """
    from .strategies import commit_checkpoint

    store, log = root / "store", root / "log"
    workload = Workload(keys, 1, seed=seed)
    updates = min(updates, keys)
    history_commits = history // updates
    t0 = time.perf_counter()
    s = statelog.open(store, durability="none")
    try:
        for chunk in workload.initial_chunks(chunk=LOAD_CHUNK):
            s.commit(offsets={}, low_watermark_ms=0, put=chunk)
        steps = Workload(keys, updates, seed=seed)
        for i in range(history_commits):
            commit_checkpoint(s, steps.checkpoint(i))
        epoch = s.epoch
    finally:
        s.close()
    del s
    gc.collect()
    load_seconds = time.perf_counter() - t0
    log.mkdir(parents=True)
    for _seq, _lsn, seg in list_segments(store / "wal"):
        os.link(seg, log / seg.name)
    t0 = time.perf_counter()
    result = compact(store, retain=3)
    compact_seconds = time.perf_counter() - t0
    if result.snapshot is None:
        raise RuntimeError(f"compacting the template at {store} wrote no snapshot: {result}")
    meta = verify_snapshot(FileLayer(), result.snapshot, store_id=None)
    return Template(
        keys=keys,
        path=store,
        log=log,
        epoch=epoch,
        snapshot=result.snapshot,
        snapshot_bytes=result.snapshot.stat().st_size,
        image_bytes=meta.image_bytes,
        log_bytes=dir_bytes(log, ".wal"),
        load_seconds=load_seconds,
        compact_seconds=compact_seconds,
        history_commits=history_commits,
        history_updates=history_commits * updates,
    )


def spawn_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a freshly spawned interpreter; returns its result."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def build_template_isolated(
    root: Path, keys: int, *, seed: int = DEFAULT_SEED, history: int = 0, updates: int = 10_000
) -> Template:
    """:func:`build_template` in a freshly spawned interpreter."""
    result: Template = spawn_call(
        build_template, root, keys, seed=seed, history=history, updates=updates
    )
    return result


def _link_all(files: Iterable[Path], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        os.link(f, dest / f.name)


def clone_store(template: Path, dest: Path) -> None:
    """Hard-link the immutable files of the store ``template`` into a new store ``dest``.

    ``IDENTITY``, every snapshot and every segment; the segments must all be
    sealed (a template's are). ``base/`` is a cache the writer rebuilds.
    """
    dest.mkdir(parents=True)
    os.link(template / "IDENTITY", dest / "IDENTITY")
    _link_all((p for _e, _l, p in list_snapshots(template / "snapshots")), dest / "snapshots")
    _link_all((p for _s, _l, p in list_segments(template / "wal")), dest / "wal")


def segments_after(wal_dir: Path, lsn: int) -> list[Path]:
    """Segments of ``wal_dir`` whose first LSN is past ``lsn``: the log tail after a snapshot."""
    return [p for _s, first, p in list_segments(wal_dir) if first > lsn]


def copy_files(files: Iterable[Path], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, dest / f.name)


def run_json_probe(module: str, args: list[str], *, timeout: float) -> dict[str, Any]:
    """Run ``python -m module args`` from the repository root; return its last stdout line as JSON.

    Used for measurements that must start in a fresh interpreter and end
    without any clean-up of the store (the probe exits with ``os._exit``,
    as a killed process would).

    :raises RuntimeError: the probe failed; its stderr is quoted.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"probe {module} {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}"
        )
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc
