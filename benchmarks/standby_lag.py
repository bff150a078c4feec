"""The standby-lag probe: a standby following a writer under sustained load; one JSON line.

    python -m benchmarks.standby_lag DIR --keys N --seconds S --poll-ms P

``DIR/primary`` is a loaded, compacted store (a template clone). A writer
subprocess (``writer`` mode of this module) opens it with ``durability="commit"``
and its in-process compactor, and commits checkpoints of 1% of the keys back to
back for ``S`` seconds, printing ``ack <epoch> <unix time>`` after each durable
commit. This process opens a standby of it at ``DIR/copy`` (``follow_poll`` of
``P`` ms) and, every 20 ms, samples: the lag in epochs (the writer's last
acknowledged epoch minus the standby's epoch) and in seconds (since the
acknowledgement of the oldest epoch the standby has not applied; 0 when it has
applied every acknowledged one), and its own RssAnon. After the writer ends, the
time until the standby reaches its last epoch.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import statelog

from .probe import _ENV, ROOT, _emit, percentile, rss
from .strategies import commit_checkpoint
from .workload import Workload

__all__ = ["main"]

_SAMPLE = 0.02


def writer(d: Path, keys: int, seconds: float) -> None:
    """Commit 1%-of-keys checkpoints back to back for ``seconds``; one ack line each."""
    workload = Workload(keys, max(1, keys // 100), seed=17)
    with statelog.open(d / "primary", durability="commit", compactor="thread") as s:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            commit_checkpoint(s, workload.checkpoint(i))
            sys.stdout.write(f"ack {s.epoch} {time.time():.6f}\n")
            sys.stdout.flush()
            i += 1


class _Acks:
    """The writer's acknowledgements, read from its stdout in a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.times: dict[int, float] = {}
        self.last = 0
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("ack "):
                _, epoch, at = line.split()
                self.times[int(epoch)] = float(at)
                self.last = int(epoch)

    def join(self) -> None:
        self._thread.join()


def lag(d: Path, keys: int, seconds: float, poll_ms: int) -> dict[str, Any]:
    """The probe (module docstring)."""
    standby = statelog.open(d / "copy", follow=d / "primary", follow_poll=timedelta(
        milliseconds=poll_ms))  # fmt: skip
    start_epoch = standby.epoch
    cmd = [sys.executable, "-m", "benchmarks.standby_lag", "writer", str(d), "--keys", str(keys)]
    cmd += ["--seconds", str(seconds)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_ENV, stdout=subprocess.PIPE, text=True)
    acks = _Acks(proc)
    epochs: list[float] = []
    secs: list[float] = []
    rss_max = 0
    while proc.poll() is None:
        time.sleep(_SAMPLE)
        last, have, now = acks.last, standby.epoch, time.time()
        if last <= start_epoch:
            continue  # the writer is still opening
        epochs.append(max(0, last - have))
        secs.append(now - acks.times[have + 1] if last > have and have + 1 in acks.times else 0.0)
        rss_max = max(rss_max, rss()["RssAnon"])
    acks.join()
    t0 = time.perf_counter()
    while standby.epoch < acks.last and time.perf_counter() - t0 < 120:
        time.sleep(_SAMPLE)
    drain = time.perf_counter() - t0
    caught = standby.epoch == acks.last
    standby.close()
    commits = acks.last - start_epoch
    return {
        "keys": keys, "poll_ms": poll_ms, "seconds": seconds, "commits": commits,
        "commits_per_second": commits / seconds, "updates_per_commit": max(1, keys // 100),
        "samples": len(epochs), "lag_epochs_p50": percentile(epochs, 50),
        "lag_epochs_p99": percentile(epochs, 99), "lag_epochs_max": max(epochs, default=0),
        "lag_seconds_p50": percentile(secs, 50), "lag_seconds_p99": percentile(secs, 99),
        "lag_seconds_max": max(secs, default=0.0), "standby_rss_anon_max": rss_max,
        "drain_seconds": drain, "caught_up": caught,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="The standby-lag probe.")
    ap.add_argument("mode", choices=("lag", "writer"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--keys", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--poll-ms", type=int, default=500)
    a = ap.parse_args(argv)
    if a.mode == "writer":
        writer(a.dir, a.keys, a.seconds)
    else:
        _emit(lag(a.dir, a.keys, a.seconds, a.poll_ms))


if __name__ == "__main__":
    main()
