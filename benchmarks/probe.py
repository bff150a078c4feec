"""Measurements that need a fresh interpreter, and the helpers the suites use to run them.

``python -m benchmarks.probe COMMAND ...`` runs one probe and prints one JSON
line on stdout:

* ``worker``: load a strategy, measure checkpoints at each dirty fraction,
  settle at a steady cadence, print, then wait to be SIGKILLed;
* ``recover``: time :meth:`~benchmarks.strategies.Strategy.recover` after that kill;
* ``template``: build a store of ``--keys`` keys, with ``--history`` updates
  after the load, closed and compacted into one snapshot, its whole log
  hard-linked into ``log/`` first (the full-replay comparison replays it);
* ``tail``: commit durable checkpoints into a store, print, wait to be killed;
* ``open``: time ``statelog.open`` (``--json``: a JSON snapshot's restore);
* ``memory``: RssAnon before and after opening a store, and after updates;
* ``commits``: time durable commits, with or without ``python -m compactor``
  running on the same store.

Probes leave with ``os._exit``: every repeat finds a store as the killed writer left it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import statelog
from statelog.compaction.fold import compact
from statelog.log.segments import list_segments
from statelog.storage.snapshots import list_snapshots

from .strategies import (
    INTERVAL,
    STRATEGIES,
    JsonSnapshot,
    SourceLog,
    Strategy,
    ZstdInterval,
    commit_checkpoint,
)
from .workload import DEFAULT_SEED, Checkpoint, Workload

__all__ = ["ROOT", "clone_store", "dir_footprint", "io_write_bytes", "percentile", "rss"]
__all__ += ["run_probe", "start_probe", "stop_group", "timed"]

ROOT = Path(__file__).resolve().parent.parent
WARMUP, MIN_CHECKPOINTS, PACE = 2, 3, 0.25  # untimed checkpoints; per phase; settle cadence
_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def rss() -> dict[str, int]:
    """``RssAnon``, ``RssFile`` and ``VmHWM`` of this process in bytes (0 without /proc)."""
    out = {"RssAnon": 0, "RssFile": 0, "VmHWM": 0}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in out:
                out[name] = int(rest.split()[0]) * 1024
    return out


def io_write_bytes(pids: Iterable[int]) -> int:
    """Sum of ``write_bytes`` of ``pids``: page-granular, B-tree and LSM rewrites included."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/io").read_text().splitlines():
                if line.startswith("write_bytes:"):
                    total += int(line.split()[1])
    return total


def dir_footprint(path: Path) -> int:
    """Allocated bytes (st_blocks) of every file under ``path``, the source log excluded."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            if f != "source.log":
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(os.path.join(root, f)).st_blocks * 512
    return total


def clone_store(template: Path, dest: Path) -> None:
    """Hard-link a compacted store's immutable files (identity, snapshots, sealed segments,
    and the stamped base images the template's compactor published or its writer built,
    which a writer open of the clone maps instead of extracting its snapshot again)."""
    for sub, listing in (("snapshots", list_snapshots), ("wal", list_segments)):
        (dest / sub).mkdir(parents=True)
        for *_key, path in listing(template / sub):
            os.link(path, dest / sub / path.name)
    if (template / "base").is_dir():
        (dest / "base").mkdir()
        for image in (template / "base").iterdir():
            os.link(image, dest / "base" / image.name)
    os.link(template / "IDENTITY", dest / "IDENTITY")


def run_probe(args: Sequence[str], *, timeout: float = 3600.0) -> dict[str, Any]:
    """Run one probe to its end; its JSON line.

    :raises RuntimeError: the probe failed; its stderr is quoted.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.probe", *args],
        cwd=ROOT,
        env=_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"probe {' '.join(args)} exited {proc.returncode}: {proc.stderr[-3000:]}"
        )
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc


def start_probe(args: Sequence[str]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start a probe that waits to be killed, in its own session; it and its JSON line.

    :raises RuntimeError: the probe ended before printing (its stderr is quoted).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.probe", *args],
        cwd=ROOT,
        env=_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        stop_group(proc)
        raise RuntimeError(f"probe {' '.join(args)} died: {proc.communicate()[1][-3000:]}")
    doc: dict[str, Any] = json.loads(line)
    return proc, doc


def stop_group(proc: subprocess.Popen[str]) -> int:
    """SIGKILL the probe's whole process group (a compactor child included); its status."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=120)
    return proc.returncode


def _emit(doc: dict[str, Any], *, wait_for_kill: bool = False) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    while wait_for_kill:  # everything reported is durable: the SIGKILL may come at any moment
        time.sleep(3600)
    os._exit(0)


def _family() -> list[int]:
    """This process and its children (statelog's compactor): whose writes a phase counts."""
    me = os.getpid()
    with contextlib.suppress(OSError):
        return [me, *map(int, Path(f"/proc/{me}/task/{me}/children").read_text().split())]
    return [me]


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``, its wall seconds and the CPU seconds of this process meanwhile."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    gc.collect()  # a probe times one operation: no earlier garbage collected during it
    return timed(fn)


def _checkpoints(workload: Workload, events: list[int]) -> Iterator[Checkpoint]:
    """The run's next checkpoints; ``events``: [events, checkpoints] so far, across phases."""
    while True:
        cp = workload.checkpoint(events[1])
        events[0] += cp.updates
        events[1] += 1
        offsets = {p: events[0] + n for n, p in enumerate(cp.offsets)}
        yield Checkpoint(cp.index, offsets, cp.low_watermark_ms, cp.put, cp.delete)


def _phase(
    strategy: Strategy, cps: Iterator[Checkpoint], source: SourceLog | None, a: argparse.Namespace
) -> tuple[dict[str, Any], Checkpoint]:
    """Checkpoints back to back until the budget is spent; their times and bytes written."""
    walls: list[float] = []
    cpus: list[float] = []
    io0, disk0 = io_write_bytes(_family()), dir_footprint(a.dir)
    src0 = source.pos if source is not None else 0
    t_start = time.perf_counter()
    for i, cp in enumerate(cps):
        pos = source.append(cp.offsets, cp.low_watermark_ms, cp.put) if source else 0
        c0, w0 = time.process_time(), time.perf_counter()
        strategy.checkpoint(cp, pos)
        w1, c1 = time.perf_counter(), time.process_time()
        if i >= WARMUP:
            walls.append(w1 - w0)
            cpus.append(c1 - c0)
        # zstd-interval: whole intervals, so its mean includes its share of a snapshot.
        whole = not isinstance(strategy, ZstdInterval) or strategy.epoch % INTERVAL == 0
        if len(walls) >= a.max_checkpoints or (
            len(walls) >= MIN_CHECKPOINTS and w1 - t_start > a.budget and whole
        ):
            break
    f0 = time.perf_counter()
    strategy.finish()
    finish = time.perf_counter() - f0
    source_bytes = source.pos - src0 if source is not None else 0
    written = io_write_bytes(_family()) - io0 - source_bytes
    doc = {"walls": walls, "cpus": cpus, "finish": finish, "checkpoints_total": i + 1}
    return {**doc, "bytes_written": max(0, written), "disk": dir_footprint(a.dir) - disk0}, cp


def probe_worker(a: argparse.Namespace) -> None:
    """Load, measure every fraction, settle at a steady cadence; acknowledge, await the kill."""
    a.dir.mkdir(parents=True, exist_ok=True)
    strategy = STRATEGIES[a.strategy](a.dir, compactor=True)
    source = SourceLog(a.dir / "source.log") if strategy.uses_source else None
    t0 = time.perf_counter()
    for chunk in Workload(a.keys, 1, seed=a.seed).initial_chunks():
        if source is not None:
            source.append({}, 0, chunk)
        strategy.load([chunk])
    strategy.loaded(source.pos if source is not None else 0)
    strategy.finish()
    load_seconds = time.perf_counter() - t0
    gc.collect()
    phases, events = [], [0, 0]
    for fraction in a.fractions:
        workload = Workload(a.keys, max(1, round(a.keys * fraction)), seed=a.seed)
        doc, last = _phase(strategy, _checkpoints(workload, events), source, a)
        phases.append({"fraction": fraction, "updates": workload.updates, **doc})
    # Back-to-back phases outrun any background compaction; a reconciler's steady cadence
    # (one 1%-dirty checkpoint every `pace` seconds) is where the crash should land.
    workload = Workload(a.keys, max(1, a.keys // 100), seed=a.seed)
    end, settled = time.perf_counter() + a.settle, 0
    for cp in _checkpoints(workload, events):
        # zstd-interval stops half-way through a snapshot interval: a typical moment.
        whole = not isinstance(strategy, ZstdInterval) or strategy.epoch % INTERVAL == INTERVAL // 2
        if time.perf_counter() >= end and whole:
            break
        started = time.perf_counter()
        pos = source.append(cp.offsets, cp.low_watermark_ms, cp.put) if source else 0
        strategy.checkpoint(cp, pos)
        last, settled = cp, settled + 1
        time.sleep(max(0.0, min(PACE - (time.perf_counter() - started), end - started)))
    strategy.finish()
    doc = {"load_seconds": load_seconds, "phases": phases, "peak_rss": rss()["VmHWM"]}
    doc |= {"offsets": last.offsets, "low_watermark_ms": last.low_watermark_ms}
    _emit({**doc, "settled": settled}, wait_for_kill=True)


def probe_recover(a: argparse.Namespace) -> None:
    rec, seconds, cpu = _timed(lambda: STRATEGIES[a.strategy].recover(a.dir))
    doc = {"seconds": seconds, "cpu_seconds": cpu, "replayed": rec.replayed}
    doc |= {"offsets": rec.offsets, "low_watermark_ms": rec.low_watermark_ms}
    _emit({**doc, "count": rec.count(), "peak_rss": rss()["VmHWM"], "detail": rec.detail})


def probe_template(a: argparse.Namespace) -> None:
    store, log = a.dir / "store", a.dir / "log"
    t0 = time.perf_counter()
    with statelog.open(store, durability="none") as s:  # set-up: the close syncs it
        for chunk in Workload(a.keys, 1, seed=a.seed).initial_chunks():
            s.commit(offsets={}, low_watermark_ms=0, put=chunk)
        steps = Workload(a.keys, min(a.updates, a.keys), seed=a.seed)
        for i in range(a.history // steps.updates):
            commit_checkpoint(s, steps.checkpoint(i))
        epoch = s.epoch
    load_seconds = time.perf_counter() - t0
    log.mkdir(parents=True)
    for *_key, seg in list_segments(store / "wal"):
        os.link(seg, log / seg.name)
    result, compact_seconds, _ = _timed(lambda: compact(store, retain=3))
    if result.snapshot is None:
        raise RuntimeError(f"compacting {store} wrote no snapshot: {result}")
    doc = {"epoch": epoch, "history_commits": a.history // steps.updates}
    doc |= {"snapshot_bytes": result.snapshot.stat().st_size, "load_seconds": load_seconds}
    _emit({**doc, "compact_seconds": compact_seconds})


def probe_tail(a: argparse.Namespace) -> None:
    workload = Workload(a.keys, min(a.updates, a.keys), seed=a.seed)
    s = statelog.open(a.dir, durability="commit")
    for i in range(a.start, a.start + a.commits):
        commit_checkpoint(s, workload.checkpoint(i))
    _emit({"epoch": s.epoch}, wait_for_kill=True)


def probe_open(a: argparse.Namespace) -> None:
    """Time a restart; RssAnon is read while the restored state is still alive."""
    if a.json:
        restored, seconds, cpu = _timed(lambda: JsonSnapshot.restore(a.dir))
        epoch, count, replayed = restored["epoch"], len(restored["state"]), 0
    else:
        restored, seconds, cpu = _timed(lambda: statelog.open(a.dir))
        epoch, count, replayed = restored.epoch, restored.count(), restored.recovery.replayed
    out = {"seconds": seconds, "cpu_seconds": cpu, "epoch": epoch, "count": count}
    _emit({**out, "replayed_commits": replayed, "rss_anon": rss()["RssAnon"]})


def probe_memory(a: argparse.Namespace) -> None:
    before = rss()["RssAnon"]
    s, seconds, _ = _timed(lambda: statelog.open(a.dir, durability="commit"))
    gc.collect()
    opened = rss()
    w = Workload(a.keys, min(10_000, a.keys, a.updates), seed=a.seed)
    n = max(1, a.updates // w.updates)
    for i in range(n):
        commit_checkpoint(s, w.checkpoint(i))
    gc.collect()
    doc = {"rss_anon_before": before, "rss_anon_open": opened["RssAnon"], "count": s.count()}
    doc |= {"rss_file_open": opened["RssFile"], "open_seconds": seconds, "updates": n * w.updates}
    _emit({**doc, "rss_anon_updated": rss()["RssAnon"]})


def probe_commits(a: argparse.Namespace) -> None:
    s = statelog.open(a.dir, durability="commit", segment_bytes=8 << 20)
    log = a.dir.parent / f"{a.dir.name}.compactor.log"
    daemon: subprocess.Popen[bytes] | None = None
    if a.daemon:
        cmd = [sys.executable, "-m", "compactor", "--interval", "1"]
        cmd += ["--min-tail-bytes", str(8 << 20), "--retain", "2", str(a.dir)]
        with open(log, "wb") as err:
            daemon = subprocess.Popen(
                cmd, cwd=ROOT, env=_ENV, stdout=subprocess.DEVNULL, stderr=err
            )
        deadline = time.monotonic() + 60
        while "event=locked_store" not in log.read_text():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the compactor did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
    workload = Workload(a.keys, min(a.updates, a.keys), seed=a.seed)
    walls: list[float] = []
    cpus: list[float] = []
    for i in range(WARMUP + a.checkpoints):
        cp = workload.checkpoint(i)
        c0, t0 = time.thread_time(), time.perf_counter()
        commit_checkpoint(s, cp)
        t1, c1 = time.perf_counter(), time.thread_time()
        if i >= WARMUP:
            walls.append(t1 - t0)
            cpus.append(c1 - c0)
    status = None
    if daemon is not None:
        daemon.send_signal(signal.SIGTERM)
        status = daemon.wait(timeout=300)
    s.close()
    lines = log.read_text().splitlines() if daemon is not None else []
    passes = sum("event=pass_done" in ln and "snapshot=-" not in ln for ln in lines)
    doc = {"walls": walls, "cpus": cpus, "daemon_status": status, "snapshots": passes}
    _emit({**doc, "errors": sum("level=ERROR" in ln for ln in lines)})


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="One benchmark probe; prints one JSON line.")
    sub = ap.add_subparsers(dest="probe", required=True)
    probes = {n[6:]: f for n, f in globals().items() if n.startswith("probe_")}
    for name in probes:
        p = sub.add_parser(name)
        if name in ("worker", "recover"):
            p.add_argument("strategy", choices=list(STRATEGIES))
        p.add_argument("dir", type=Path)
        p.add_argument("--keys", type=int, default=0)
        p.add_argument("--seed", type=int, default=DEFAULT_SEED)
        p.add_argument("--updates", type=int, default=10_000, help="updates per checkpoint")
        p.add_argument("--history", type=int, default=0, help="updates after the load")
        p.add_argument("--commits", type=int, default=1)
        p.add_argument("--start", type=int, default=0, help="index of the first checkpoint")
        p.add_argument("--json", action="store_true", help="open: a JSON snapshot file")
        p.add_argument("--daemon", action="store_true", help="commits: run the compactor")
        p.add_argument("--checkpoints", type=int, default=20)
        p.add_argument("--fractions", type=lambda s: [float(f) for f in s.split(",")])
        p.add_argument("--max-checkpoints", type=int, default=50)
        p.add_argument("--budget", type=float, default=10.0, help="seconds per fraction")
        p.add_argument("--settle", type=float, default=0.0, help="seconds at a steady cadence")
    args = ap.parse_args(argv)
    probes[args.probe](args)


if __name__ == "__main__":
    main()
