"""The point-in-time probes; each prints one JSON line.

    python -m benchmarks.point_in_time views DIR --keys N --checkpoints C --samples S
    python -m benchmarks.point_in_time window DIR --keys N --seconds T --window W
        --interval I [--remote URL]

``DIR/store`` is a loaded, compacted store (a template clone). Both write the
workload's checkpoints of 1% of the keys (``durability="commit"``) into
segments of 8 bytes per key, at most 8 MiB (8 MiB at 1M keys, as the
sustained-load suite).

``views``: ``C`` checkpoints, a compaction pass after every tenth (the
compactor's default chain policy: full and delta snapshots; every snapshot
kept), then the writer closes. Then ``S`` rounds, each of a read-only open of
the newest state and a read-only view at a random epoch of the retained
range (``at=``), in alternating order: each open timed until it returns, its
epoch checked, and how it recovered recorded (the snapshot, how many images
of its chain it copied from ``STORE/base`` and how many it extracted from
their snapshots, the log records it replayed).

``window``: the compaction daemon (``python -m compactor``, a pass every
``I`` seconds once an 8 MiB tail is sealed, back to back while passes write
snapshots) keeps ``--retain 1 --retain-for W`` (with ``--remote URL``, it
ships every pass and keeps the same window there) while the writer commits
back to back for ``T`` seconds. A thread samples every half second the bytes
of ``snapshots/``, ``wal/`` and ``base/`` (and of the bucket). Reported: the
log bytes written per second ``R``, the snapshots written (count, mean size
``S``, the mean time ``P`` between them, from the daemon's log), the bytes
kept once the run is past 1.5 W, and the documented formula
``R * (W + P) + S * (W / P + 1)`` for W and for one hour.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import statelog
from statelog.compaction.fold import compact
from statelog.recovery.timeline import oldest_restorable

from .probe import _ENV, ROOT, _emit, percentile
from .strategies import commit_checkpoint
from .workload import Workload

__all__ = ["main", "segment_bytes"]

_EVERY = 10  # checkpoints between the views probe's compaction passes
_SAMPLE = 0.5  # seconds between the window probe's samples
_STEADY = 1.5  # the window probe's steady state: from this many windows into the run


def segment_bytes(keys: int) -> int:
    """8 bytes per key, 4 KiB to 8 MiB: a few checkpoints per segment at every size."""
    return max(4096, min(8 << 20, keys * 8))


def _history(root: Path, keys: int, checkpoints: int) -> list[dict[str, Any]]:
    """The views probe's writes (module docstring); each snapshot written."""
    workload = Workload(keys, max(1, keys // 100), seed=29)
    written = []
    with statelog.open(root, durability="commit", segment_bytes=segment_bytes(keys)) as w:
        for i in range(checkpoints):
            commit_checkpoint(w, workload.checkpoint(i))
            if (i + 1) % _EVERY == 0:
                done = compact(root, min_tail_bytes=0, retain=checkpoints)
                if done.snapshot is not None:
                    written.append({"full": done.full, "depth": done.depth,
                                    "bytes": done.written_bytes})  # fmt: skip
    return written


def _open(root: Path, tmp: Path, at: int | None) -> dict[str, Any]:
    """One timed read-only open (``at``: a view of that epoch), and how it recovered."""
    kw: dict[str, Any] = {} if at is None else {"at": at}
    started = time.perf_counter()
    with statelog.open(root, readonly=True, **kw) as s:
        seconds = time.perf_counter() - started
        (image_dir,) = tmp.glob("statelog-ro-*")  # tempfile.tempdir is ``tmp``
        images = list(image_dir.glob("*.mdb"))
        # An extraction stamps the image it wrote; a copy from STORE/base is not stamped.
        extracted = len(list(image_dir.glob("*.mdb.ok")))
        report = s.recovery
        snap = report.snapshot.name if report.snapshot is not None else None
        doc = {"seconds": seconds, "epoch": s.epoch, "snapshot": snap, "images": len(images)}
    return {**doc, "extracted": extracted, "replayed": report.replayed}


def views(d: Path, keys: int, checkpoints: int, samples: int) -> dict[str, Any]:
    """The ``views`` probe (module docstring)."""
    root, tmp = d / "store", d / "tmp"
    tmp.mkdir(exist_ok=True)
    tempfile.tempdir = str(tmp)
    written = _history(root, keys, checkpoints)
    oldest = oldest_restorable(root) or 1
    with statelog.open(root, readonly=True) as s:
        newest_epoch = s.epoch
    rng = random.Random(5)
    newest: list[dict[str, Any]] = []
    past: list[dict[str, Any]] = []
    for i in range(samples):
        want = rng.randint(oldest, newest_epoch)
        for at in (None, want) if i % 2 == 0 else (want, None):
            got = _open(root, tmp, at)
            assert got["epoch"] == (newest_epoch if at is None else at), (got, at)
            (newest if at is None else past).append(got)
    snaps = sorted(p.name for p in (root / "snapshots").glob("*.snap"))
    doc: dict[str, Any] = {"keys": keys, "checkpoints": checkpoints, "samples": samples}
    doc["every"] = _EVERY
    doc |= {"oldest_epoch": oldest, "newest_epoch": newest_epoch, "snapshots": len(snaps)}
    doc |= {"full_snapshots": 1 + sum(w["full"] for w in written), "written": written}
    doc["base_images"] = len(list((root / "base").glob("*.mdb")))
    return {**doc, **_view_stats(newest, past), "views": past}


def _view_stats(newest: list[dict[str, Any]], past: list[dict[str, Any]]) -> dict[str, Any]:
    def p50(rows: list[dict[str, Any]]) -> float:
        return statistics.median(r["seconds"] for r in rows) if rows else float("nan")

    def p90(rows: list[dict[str, Any]]) -> float:
        return percentile([r["seconds"] for r in rows], 90)

    copied = [r for r in past if r["extracted"] == 0]
    extracting = [r for r in past if r["extracted"] > 0]
    return {
        "newest_p50": p50(newest), "newest_p90": p90(newest),
        "newest_images": newest[0]["images"], "newest_replayed": newest[0]["replayed"],
        "newest_extracted": max(r["extracted"] for r in newest),
        "view_p50": p50(past), "view_p90": p90(past),
        "ratio_p50": p50(past) / p50(newest), "ratio_p90": p90(past) / p90(newest),
        "replayed_mean": statistics.mean(r["replayed"] for r in past),
        "replayed_max": max(r["replayed"] for r in past),
        "images_mean": statistics.mean(r["images"] for r in past),
        "copied_views": len(copied), "copied_p50": p50(copied),
        "extracting_views": len(extracting), "extracting_p50": p50(extracting),
        "extracted_mean": statistics.mean([r["extracted"] for r in extracting] or [0]),
    }  # fmt: skip


def _sizes(d: Path) -> dict[str, int]:
    """``name: bytes`` of the files in ``d`` (files removed meanwhile are left out)."""
    out = {}
    for p in d.iterdir() if d.is_dir() else ():
        with contextlib.suppress(FileNotFoundError):
            out[p.name] = p.stat().st_size
    return out


class _Sampler:
    """Every half second: the bytes of ``snapshots/``, ``wal/``, ``base/`` and the bucket."""

    def __init__(self, root: Path, remote: str | None) -> None:
        self.root, self.remote = root, remote
        self.rows: list[dict[str, Any]] = []
        self.segments: dict[str, int] = {}  # every segment seen: its largest size
        self.start: dict[str, int] = _sizes(root / "wal")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.begin = 0.0

    def _bucket(self) -> tuple[int, int]:
        from statelog.remote import RemoteClient

        if self.remote is None:
            return 0, 0
        objects = list(RemoteClient.from_url(self.remote).list_objects(""))
        snaps = sum(n for key, n in objects if "/snapshots/" in key)
        return snaps, sum(n for key, n in objects if "/wal/" in key)

    def sample(self) -> None:
        t = time.monotonic() - self.begin
        wal = _sizes(self.root / "wal")
        for name, n in wal.items():
            self.segments[name] = max(n, self.segments.get(name, 0))
        snaps, log = sum(_sizes(self.root / "snapshots").values()), sum(wal.values())
        bucket_snaps, bucket_log = self._bucket()
        images = sum(_sizes(self.root / "base").values())
        self.rows.append({"t": round(t, 2), "snapshots": snaps, "log": log, "images": images,
                          "bucket_snapshots": bucket_snaps, "bucket_log": bucket_log})  # fmt: skip

    def _run(self) -> None:
        while not self.stop.wait(_SAMPLE):
            self.sample()

    def log_written(self) -> int:
        return sum(self.segments.values()) - sum(self.start.values())


def _daemon(root: Path, a: argparse.Namespace, seg: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "compactor", "--interval", f"{a.interval:g}"]
    cmd += ["--min-tail-bytes", str(seg), "--retain", "1", "--retain-for", f"{a.window:g}"]
    if a.remote is not None:
        cmd += ["--remote", a.remote, "--remote-retain", "1"]
        cmd += ["--remote-retain-for", f"{a.window:g}"]
    with open(log, "wb") as err:
        daemon = subprocess.Popen(
            [*cmd, str(root)], cwd=ROOT, env=_ENV, stdout=subprocess.DEVNULL, stderr=err
        )
    deadline = time.monotonic() + 120
    while "event=locked_store" not in log.read_text():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the compactor did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return daemon


def _events(log: Path, event: str) -> list[dict[str, str]]:
    """The ``key=value`` fields of the daemon's log lines of ``event``."""
    out = []
    for line in log.read_text().splitlines():
        if f" event={event} " in f"{line} ":
            out.append(dict(f.split("=", 1) for f in line.split() if "=" in f))
    return out


def _ts(fields: dict[str, str]) -> float:
    return datetime.fromisoformat(fields["ts"].replace("Z", "+00:00")).timestamp()


def window(d: Path, a: argparse.Namespace) -> dict[str, Any]:
    """The ``window`` probe (module docstring)."""
    root, log, seg = d / "store", d / "compactor.log", segment_bytes(a.keys)
    workload = Workload(a.keys, max(1, a.keys // 100), seed=31)
    sampler = _Sampler(root, a.remote)
    daemon = _daemon(root, a, seg, log)
    try:
        with statelog.open(root, durability="commit", segment_bytes=seg) as w:
            epoch0, commits, began_unix = w.epoch, 0, time.time()
            sampler.begin = began = time.monotonic()
            sampler.sample()
            sampler.thread.start()
            while time.monotonic() - began < a.seconds:
                commit_checkpoint(w, workload.checkpoint(commits))
                commits += 1
            elapsed, epochs = time.monotonic() - began, w.epoch - epoch0
        sampler.stop.set()
        sampler.thread.join()
        sampler.sample()
    finally:
        daemon.send_signal(signal.SIGTERM)
        status = daemon.wait(timeout=600)
    doc = {"keys": a.keys, "seconds": elapsed, "commits": commits, "epochs": epochs}
    doc |= {"updates_per_commit": workload.updates, "window": a.window, "interval": a.interval}
    doc |= {"remote": a.remote is not None, "segment_bytes": seg, "daemon_status": status}
    doc["errors"] = [ln[:300] for ln in log.read_text().splitlines() if "level=ERROR" in ln][:3]
    return {**doc, **_window_stats(sampler, log, began_unix, elapsed, a.window)}


def _window_stats(
    sampler: _Sampler, log: Path, began: float, elapsed: float, w: float
) -> dict[str, Any]:
    """What the window kept in its steady state, and the formula for it."""
    written = [e for e in _events(log, "snapshot_written") if _ts(e) >= began]
    times = [_ts(e) for e in written]
    period = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")
    sizes = [int(e["snapshot_bytes"]) for e in written]
    s = statistics.mean(sizes) if sizes else 0.0
    r = sampler.log_written() / elapsed
    steady = [row for row in sampler.rows if row["t"] >= _STEADY * w] or sampler.rows[-1:]

    def mean(key: str) -> float:
        return float(statistics.mean(row[key] for row in steady))

    def most(*keys: str) -> int:
        return int(max(sum(row[k] for k in keys) for row in steady))

    kept = mean("snapshots") + mean("log")
    return {
        "log_bytes_per_s": r, "snapshots_written": len(sizes),
        "full_written": sum(e.get("kind") == "full" for e in written),
        "snapshot_bytes_mean": s, "period": period,
        "passes": sum(_ts(e) >= began for e in _events(log, "pass_done")),
        "steady_from": _STEADY * w, "steady_samples": len(steady),
        "kept_snapshots_mean": mean("snapshots"), "kept_log_mean": mean("log"),
        "kept_mean": kept, "kept_max": most("snapshots", "log"),
        "kept_per_window_s": kept / w, "images_mean": mean("images"),
        "bucket_mean": mean("bucket_snapshots") + mean("bucket_log"),
        "bucket_max": most("bucket_snapshots", "bucket_log"),
        "formula_log": r * (w + period), "formula_snapshots": s * (w / period + 1),
        "formula": r * (w + period) + s * (w / period + 1),
        "hour_log": r * (3600 + period), "hour_snapshots": s * (3600 / period + 1),
        "hour": r * (3600 + period) + s * (3600 / period + 1),
        "series": sampler.rows,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.point_in_time")
    p.add_argument("mode", choices=["views", "window"])
    p.add_argument("dir", type=Path)
    p.add_argument("--keys", type=int, required=True)
    p.add_argument("--checkpoints", type=int, default=60)
    p.add_argument("--samples", type=int, default=25)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--remote", default=None)
    a = p.parse_args(argv)
    if a.mode == "views":
        _emit(views(a.dir, a.keys, a.checkpoints, a.samples))
    else:
        _emit(window(a.dir, a))


if __name__ == "__main__":
    main()
