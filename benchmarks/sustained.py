"""The sustained-load probe: a writer committing back to back for minutes, its compactor running.

    python -m benchmarks.sustained STORE --keys N --seconds S [--updates U] [--max-overlay-mib M]
                                   [--interval I]

Opens ``STORE`` (a template: a loaded, compacted store) with
``durability="commit"`` and the compactor as a child process (8 MiB segments,
an 8 MiB tail trigger, a pass every ``--interval`` seconds, 1 by default, or
as soon as a segment is sealed), then commits checkpoints of
``--updates`` random updates of the reconciler workload back to back for
``--seconds``, the writer's ``max_overlay_bytes`` set to ``M`` MiB if given.
Every ``--sample`` seconds it records the writer's RssAnon, the epoch, and
the bytes written (``/proc/<pid>/io`` ``write_bytes``) by the writer
(the log) and by its compactor child (snapshots, images, scratch). The time
spent making each checkpoint's data is measured apart (``generate_seconds``,
``generate_cpu_seconds``), so the store's rate can leave it out as the
trade-off benchmark does. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import statelog
from statelog.ops import metrics
from statelog.storage.fileio import FileLayer
from statelog.storage.snapshots import list_snapshots, verify_snapshot

from .probe import _emit, _family, io_write_bytes, rss
from .strategies import commit_checkpoint
from .workload import DEFAULT_SEED, Workload

__all__ = ["main", "sustain"]


def _sample(t0: float, s: statelog.StateStore, writer0: int, family0: int) -> dict[str, Any]:
    me = os.getpid()
    writer = io_write_bytes([me]) - writer0
    return {
        "t": round(time.perf_counter() - t0, 3),
        "rss_anon": rss()["RssAnon"],
        "epoch": s.epoch,
        "writer_bytes": writer,
        "compactor_bytes": io_write_bytes(_family()) - family0 - writer,
    }


def _stalled(store: Path) -> float:
    """Seconds this process's commits to ``store`` waited for the compactor (its metrics)."""
    return float(metrics.REGISTRY.get_sample_value(
        "statelog_write_stall_seconds_total", {"store": metrics.store_label(store)}
    ) or 0.0)  # fmt: skip


def sustain(
    store: Path,
    keys: int,
    seconds: float,
    updates: int,
    sample: float,
    overlay: int | None,
    interval: float = 1.0,
) -> dict[str, Any]:
    """Run the load (module docstring); what it measured."""
    s = statelog.open(
        store, durability="commit", compactor="process", segment_bytes=8 << 20,
        min_tail_bytes=8 << 20, compactor_interval=timedelta(seconds=interval),
        max_overlay_bytes=overlay, overlay_wait=timedelta(minutes=10),
    )  # fmt: skip
    gc.collect()
    workload = Workload(keys, updates, seed=DEFAULT_SEED + 1)
    me = os.getpid()
    writer0, family0 = io_write_bytes([me]), io_write_bytes(_family())
    epoch0, cpu0 = s.epoch, time.process_time()
    t0 = time.perf_counter()
    samples = [_sample(t0, s, writer0, family0)]
    n, next_sample = 0, t0 + sample
    gen_wall = gen_cpu = 0.0  # making the workload is the benchmark's cost, not the store's
    while (now := time.perf_counter()) - t0 < seconds:
        g0, gc0 = time.perf_counter(), time.thread_time()
        cp = workload.checkpoint(n)
        gen_wall += time.perf_counter() - g0
        gen_cpu += time.thread_time() - gc0
        commit_checkpoint(s, cp)
        n += 1
        if now >= next_sample:
            samples.append(_sample(t0, s, writer0, family0))
            next_sample += sample
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    samples.append(_sample(t0, s, writer0, family0))
    s.close()
    snaps = list_snapshots(store / "snapshots")
    newest = verify_snapshot(FileLayer(), snaps[0][2], store_id=None, parse=False)
    last = samples[-1]
    return {
        "keys": keys, "seconds": wall, "writer_cpu_seconds": cpu, "checkpoints": n,
        "generate_seconds": gen_wall, "generate_cpu_seconds": gen_cpu,
        "updates": n * workload.updates, "epochs": last["epoch"] - epoch0,
        "writer_bytes": last["writer_bytes"], "compactor_bytes": last["compactor_bytes"],
        "samples": samples, "snapshots": len(snaps), "newest_depth": newest.depth,
        "max_overlay_bytes": overlay, "stall_seconds": _stalled(store),
        "compactor_interval": interval,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Sustained load with the compactor running.")
    ap.add_argument("store", type=Path)
    ap.add_argument("--keys", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--updates", type=int, default=10_000, help="updates per checkpoint")
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    ap.add_argument(
        "--max-overlay-mib", type=int, default=None, help="the writer's max_overlay_bytes, in MiB"
    )
    ap.add_argument("--interval", type=float, default=1.0, help="the compactor's, in seconds")
    a = ap.parse_args(argv)
    overlay = None if a.max_overlay_mib is None else a.max_overlay_mib << 20
    updates = min(a.updates, a.keys)
    _emit(sustain(a.store, a.keys, a.seconds, updates, a.sample, overlay, a.interval))


if __name__ == "__main__":
    main()
