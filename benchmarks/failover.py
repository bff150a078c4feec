"""The failover and changes-feed probes: each prints one JSON line.

    python -m benchmarks.failover promote DIR --keys N [--commits C] [--remote URL]
    python -m benchmarks.failover changes DIR --keys N [--commits C]

``promote``: ``DIR/primary`` is a loaded, compacted store (a template clone).
A standby of it is opened at ``DIR/copy`` (its first sync timed); a writer
subprocess (``probe tail``) commits ``C`` checkpoints of 10,000 updates to the
primary and is SIGKILLed once it has acknowledged them. Timed from the kill:
``standby.promote()`` and the promoted writer's first durable commit. Then,
side by side, the cold path a standby saves: the primary's files copied into
an empty directory (``DIR/cold``) and opened by a writer, then its first
durable commit. With ``--remote URL`` (connection in the ``AWS_*`` environment), also
(c): the primary shipped there (untimed), then ``statelog restore`` into an empty
directory, its open and its first durable commit, timed. RssAnon of this process is
read after the standby's first sync.

``changes``: a store of ``C`` checkpoints of ``--updates`` updates over ``N``
keys, read back whole through ``store.changes()``: epochs and updates per second.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import statelog
from statelog.remote import restore, ship

from .probe import _emit, rss, start_probe
from .strategies import commit_checkpoint
from .workload import Workload

__all__ = ["main"]


def promote(d: Path, keys: int, commits: int, url: str | None) -> dict[str, Any]:
    """The ``promote`` probe (module docstring)."""
    primary, copy, cold = d / "primary", d / "copy", d / "cold"
    t0 = time.perf_counter()
    standby = statelog.open(copy, follow=primary, follow_poll=timedelta(milliseconds=100))
    first_sync = time.perf_counter() - t0
    rss_anon = rss()["RssAnon"]
    args = ["tail", str(primary), "--keys", str(keys), "--commits", str(commits), "--start", "0"]
    writer, acked = start_probe(args)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    killed = time.perf_counter()
    promoted = standby.promote()
    promoted_at = time.perf_counter()
    workload = Workload(keys, min(10_000, keys), seed=99)
    commit_checkpoint(standby, workload.checkpoint(commits))
    first_commit = time.perf_counter()
    standby.close()
    t0 = time.perf_counter()
    # PROMOTED: the promotion above claimed the primary; its files are still the cold start.
    skip = shutil.ignore_patterns("LOCK", "pins", "base", "PROMOTED")
    shutil.copytree(primary, cold, ignore=skip)
    copied = time.perf_counter()
    with statelog.open(cold) as s:
        opened = time.perf_counter()
        commit_checkpoint(s, workload.checkpoint(commits))
        cold_commit = time.perf_counter()
        cold_epoch = s.epoch - 1
    remote = _restore(d, url, workload, commits) if url is not None else {}
    return {
        **remote,
        "keys": keys,
        "tail_commits": commits,
        "tail_updates": commits * min(10_000, keys),
        "acked_epoch": acked["epoch"],
        "promoted_epoch": promoted.epoch,
        "cold_epoch": cold_epoch,
        "first_sync_seconds": first_sync,
        "standby_rss_anon": rss_anon,
        "promote_seconds": promoted_at - killed,
        "promote_to_commit_seconds": first_commit - killed,
        "cold_copy_seconds": copied - t0,
        "cold_open_seconds": opened - copied,
        "cold_to_commit_seconds": cold_commit - t0,
    }


def _restore(d: Path, url: str, workload: Workload, commits: int) -> dict[str, Any]:
    """(c): the primary shipped (untimed: what its host's daemon had shipped, its sealed
    segments and snapshots), then timed: ``statelog restore`` into an empty directory,
    the writer's open and its first durable commit."""
    shipped = ship(d / "primary", url)
    t0 = time.perf_counter()
    res = restore(url, d / "restored")
    restored = time.perf_counter()
    with statelog.open(d / "restored") as s:
        opened = time.perf_counter()
        commit_checkpoint(s, workload.checkpoint(commits))
        done = time.perf_counter()
    return {
        "restore_shipped_bytes": shipped.bytes_uploaded,
        "restore_downloaded_bytes": res.bytes_downloaded,
        "restored_epoch": res.epoch,
        "restore_seconds": restored - t0,
        "restore_open_seconds": opened - restored,
        "restore_to_commit_seconds": done - t0,
    }


def changes(d: Path, keys: int, updates: int, commits: int) -> dict[str, Any]:
    """The ``changes`` probe (module docstring)."""
    workload = Workload(keys, min(updates, keys), seed=5)
    with statelog.open(d / "store", durability="none", segment_bytes=8 << 20) as s:
        for i in range(commits):
            commit_checkpoint(s, workload.checkpoint(i))
    with statelog.open(d / "store", readonly=True) as ro:
        t0, cpu0 = time.perf_counter(), time.process_time()
        epochs = n = 0
        for change in ro.changes():
            epochs += 1
            n += change.updates
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"keys": keys, "epochs": epochs, "updates": n, "seconds": wall, "cpu_seconds": cpu}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Failover and changes-feed probes.")
    ap.add_argument("probe", choices=("promote", "changes"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--keys", type=int, required=True)
    ap.add_argument("--commits", type=int, default=10)
    ap.add_argument("--updates", type=int, default=10_000)
    ap.add_argument("--remote", default=None, help="promote: also restore from this URL")
    a = ap.parse_args(argv)
    if a.probe == "promote":
        _emit(promote(a.dir, a.keys, a.commits, a.remote))
    else:
        _emit(changes(a.dir, a.keys, a.updates, a.commits))


if __name__ == "__main__":
    main()
