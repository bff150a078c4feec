"""The two processes of one trade-off cell: the checkpointing worker and the recovery.

``python -m benchmarks.tradeoff_probe worker ENGINE DIR ...`` loads ``--keys``
keys, then, for each dirty fraction, takes warm-up and measured checkpoints
(bounded by ``--max-checkpoints`` and a time budget), prints one JSON line
and sleeps until the runner SIGKILLs it. Every checkpoint it reports was
durable (or flushed, for group commit) before the line was printed.

``python -m benchmarks.tradeoff_probe recover ENGINE DIR`` is the restart:
a fresh interpreter times :func:`recover` and prints one JSON line.

Bytes written come from ``/proc/<pid>/io`` ``write_bytes`` of the worker and
of its child processes (statelog's compactor), counted when pages are
dirtied, so rewrites inside a B-tree or an LSM compaction count, and
file-system metadata does too. The source log's own bytes are subtracted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import zstandard

import statelog

from .engines import (
    ENGINES,
    INTERVAL,
    META,
    Recovered,
    RocksEngine,
    SourceLog,
    SqliteEngine,
    ZstdIntervalEngine,
)
from .procstat import rss
from .strategies import JsonSnapshotStrategy
from .workload import DEFAULT_SEED, EPOCH_MS, Checkpoint, Workload

__all__ = ["io_write_bytes", "recover", "run_worker"]

PARTITIONS = 8
_dec = msgspec.msgpack.Decoder()


def io_write_bytes(pids: Iterable[int]) -> int:
    """Sum of ``write_bytes`` of ``pids`` (a process that is gone or unreadable counts 0)."""
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
            if f == "source.log":
                continue
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, f)).st_blocks * 512
    return total


def _checkpoint(workload: Workload, g: int, events: int, keys: int) -> Checkpoint:
    """Checkpoint ``g`` of the run: offsets and watermark advance across the fractions."""
    cp = workload.checkpoint(g)
    return dataclasses.replace(
        cp,
        offsets={f"orders-{p}": events + p for p in range(PARTITIONS)},
        low_watermark_ms=EPOCH_MS + keys + g * 1000,
    )


def run_worker(
    name: str,
    directory: Path,
    keys: int,
    fractions: Sequence[float],
    *,
    max_checkpoints: int,
    min_checkpoints: int,
    budget: float,
    warmup: int,
    seed: int = DEFAULT_SEED,
    settle: float = 0.0,
    pace: float = 0.25,
    settle_fraction: float = 0.01,
) -> dict[str, Any]:
    """Load, measure every fraction, then settle; returns the acknowledgement document.

    The measured phases run checkpoints back to back, a write rate far above a
    reconciler's cadence, which no background compaction is sized for. So
    before the crash the worker *settles*: for ``settle`` seconds it takes one
    checkpoint of ``settle_fraction`` every ``pace`` seconds, as a reconciler
    checkpointing four times a second would; the SIGKILL then lands in that
    steady state.
    """
    directory.mkdir(parents=True, exist_ok=True)
    engine = ENGINES[name](directory)
    source = SourceLog(directory / "source.log") if engine.uses_source else None
    pos = 0
    t0 = time.perf_counter()
    for chunk in Workload(keys, 1, seed=seed).initial_chunks():
        if source is not None:
            pos = source.append({}, 0, chunk)
        engine.load([chunk])
    if isinstance(engine, ZstdIntervalEngine):
        engine.loaded(pos)
    engine.finish()
    load_seconds = time.perf_counter() - t0
    gc.collect()
    me = os.getpid()
    phases: list[dict[str, Any]] = []
    g = 0
    events = 0
    last_offsets: dict[str, int] = {}
    last_wm = 0
    for fraction in fractions:
        updates = max(1, round(keys * fraction))
        workload = Workload(keys, updates, seed=seed)
        walls: list[float] = []
        cpus: list[float] = []
        io0 = io_write_bytes([me, *engine.children()])
        src0 = pos
        disk0 = dir_footprint(directory)
        phase_t0 = time.perf_counter()
        # zstd-interval: whole intervals, so its amortised cost includes one snapshot each.
        floor = INTERVAL if isinstance(engine, ZstdIntervalEngine) else min_checkpoints
        i = 0
        while True:
            measured = i - warmup
            if measured >= max_checkpoints:
                break
            over = measured >= floor and time.perf_counter() - phase_t0 > budget
            whole = not isinstance(engine, ZstdIntervalEngine) or engine.epoch % INTERVAL == 0
            if over and whole:
                break
            events += updates
            cp = _checkpoint(workload, g, events, keys)
            g += 1
            if source is not None:
                pos = source.append(cp.offsets, cp.low_watermark_ms, cp.put)
            c0 = time.process_time()
            w0 = time.perf_counter()
            engine.checkpoint(cp, pos)
            w1 = time.perf_counter()
            c1 = time.process_time()
            if measured >= 0:
                walls.append(w1 - w0)
                cpus.append(c1 - c0)
            last_offsets, last_wm = cp.offsets, cp.low_watermark_ms
            i += 1
        f0 = time.perf_counter()
        engine.finish()
        finish = time.perf_counter() - f0
        written = io_write_bytes([me, *engine.children()]) - io0 - (pos - src0)
        phases.append(
            {
                "fraction": fraction,
                "updates": updates,
                "walls": walls,
                "cpus": cpus,
                "finish": finish,
                "checkpoints_total": i,
                "bytes_written": max(0, written),
                "disk_growth": dir_footprint(directory) - disk0,
            }
        )
    settled = 0
    if settle > 0:
        workload = Workload(keys, max(1, round(keys * settle_fraction)), seed=seed)
        end = time.perf_counter() + settle
        while time.perf_counter() < end:
            started = time.perf_counter()
            events += workload.updates
            cp = _checkpoint(workload, g, events, keys)
            g += 1
            if source is not None:
                pos = source.append(cp.offsets, cp.low_watermark_ms, cp.put)
            engine.checkpoint(cp, pos)
            last_offsets, last_wm = cp.offsets, cp.low_watermark_ms
            settled += 1
            time.sleep(max(0.0, pace - (time.perf_counter() - started)))
        engine.finish()
    if isinstance(engine, ZstdIntervalEngine) and source is not None:
        # Stop half-way through a snapshot interval: the crash lands at a typical moment.
        if not settled:
            workload = Workload(keys, phases[-1]["updates"], seed=seed)
        while engine.epoch % INTERVAL != INTERVAL // 2:
            events += workload.updates
            cp = _checkpoint(workload, g, events, keys)
            g += 1
            pos = source.append(cp.offsets, cp.low_watermark_ms, cp.put)
            engine.checkpoint(cp, pos)
            last_offsets, last_wm = cp.offsets, cp.low_watermark_ms
    mem = rss()
    return {
        "engine": name,
        "keys": keys,
        "load_seconds": load_seconds,
        "phases": phases,
        "peak_rss": mem["VmHWM"],
        "rss_anon": mem["RssAnon"],
        "offsets": last_offsets,
        "low_watermark_ms": last_wm,
        "children": engine.children(),
        "source_bytes": pos,
        "settled": settled,
    }


# -- recovery -------------------------------------------------------------


def _replay(
    state: dict[str, Any], records: Iterable[tuple[dict[str, int], int, dict[str, Any]]]
) -> tuple[tuple[dict[str, int], int], int]:
    """Apply source records to ``state``; the last offsets and watermark seen, and the updates."""
    last: tuple[dict[str, int], int] = ({}, 0)
    n = 0
    for offsets, wm, put in records:
        state.update(put)
        n += len(put)
        if offsets:
            last = (offsets, wm)
    return last, n
def recover(name: str, directory: Path) -> Recovered:
    """Recover engine ``name``'s state from ``directory`` as a fresh process would."""
    source = directory / "source.log"
    if name == "json":
        for snap in sorted((directory / "snapshots").glob("snapshot-*.json"), reverse=True):
            with contextlib.suppress(ValueError):
                doc, _ = JsonSnapshotStrategy.restore(snap)
                n_keys: int = len(doc["state"])
                return Recovered(doc["offsets"], doc["low_watermark_ms"], n_keys.__int__, 0)
        raise RuntimeError("no JSON snapshot verifies")
    if name == "none":
        state: dict[str, Any] = {}
        (offsets, wm), n = _replay(state, SourceLog.read(source))
        return Recovered(offsets, wm, lambda: len(state), n)
    if name == "zstd-interval":
        newest = sorted((directory / "snapshots").glob("snap-*.zst"))[-1]
        doc = _dec.decode(zstandard.ZstdDecompressor().decompress(newest.read_bytes()))
        meta = _dec.decode(doc["meta"])
        snap_state: dict[str, Any] = doc["state"]
        (offsets, wm), n = _replay(snap_state, SourceLog.read(source, doc["pos"]))
        if not offsets:
            offsets, wm = meta["offsets"], meta["wm"]
        return Recovered(offsets, wm, lambda: len(snap_state), n)
    if name in ("statelog", "statelog-group"):
        store = statelog.open(directory / "store")
        rec = store.recovery
        schedule = json.loads((directory / "schedule.json").read_text())
        epoch = store.epoch
        replayed = sum(schedule[epoch - rec.replayed : epoch])
        return Recovered(
            dict(store.offsets),
            store.low_watermark_ms,
            store.count,
            replayed,
            f"snapshot {rec.snapshot.name if rec.snapshot else '-'}, {rec.replayed} commits",
        )
    meta_doc: bytes
    count: Callable[[], int]
    if name == "sqlite":
        db = SqliteEngine.connect(directory)
        meta_doc = db.execute("SELECT doc FROM meta WHERE id = 0").fetchone()[0]
        count = lambda: int(db.execute("SELECT count(*) FROM kv").fetchone()[0])  # noqa: E731
    elif name == "lmdb":
        env = lmdb.open(str(directory / "lmdb"), map_size=64 << 30)
        with env.begin() as txn:
            got = txn.get(META)
        assert got is not None, "LMDB holds no checkpoint"
        meta_doc = got
        count = lambda: int(env.stat()["entries"]) - 1  # noqa: E731
    elif name == "rocksdb":
        rdb = RocksEngine.open(directory)
        meta_doc = rdb[META]
        count = lambda: sum(1 for _ in rdb.keys()) - 1  # noqa: E731, SIM118
    else:
        raise ValueError(f"unknown engine {name!r}")
    m = _dec.decode(meta_doc)
    return Recovered(m["offsets"], m["wm"], count, 0)


def probe_recover(name: str, directory: Path) -> dict[str, Any]:
    """Time :func:`recover` in this (fresh) process; the keys are counted after the timing."""
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    rec: Recovered = recover(name, directory)
    t1 = time.perf_counter()
    c1 = time.process_time()
    mem = rss()
    return {
        "seconds": t1 - t0,
        "cpu_seconds": c1 - c0,
        "replayed": rec.replayed,
        "offsets": rec.offsets,
        "low_watermark_ms": rec.low_watermark_ms,
        "count": rec.count(),
        "peak_rss": mem["VmHWM"],
        "detail": rec.detail,
    }


def _emit(doc: dict[str, Any], then: Callable[[], None]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    then()


def _wait_for_kill() -> None:
    while True:  # everything reported is durable: the SIGKILL may come at any moment
        time.sleep(3600)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One trade-off worker or recovery; one JSON line.")
    sub = ap.add_subparsers(dest="probe", required=True)
    w = sub.add_parser("worker")
    w.add_argument("engine", choices=list(ENGINES))
    w.add_argument("dir", type=Path)
    w.add_argument("--keys", type=int, required=True)
    w.add_argument("--fractions", required=True, help="comma-separated, e.g. 0.001,0.01,0.1")
    w.add_argument("--max-checkpoints", type=int, default=50)
    w.add_argument("--min-checkpoints", type=int, default=3)
    w.add_argument("--budget", type=float, default=10.0, help="seconds per fraction, roughly")
    w.add_argument("--warmup", type=int, default=2)
    w.add_argument("--seed", type=int, default=DEFAULT_SEED)
    w.add_argument("--settle", type=float, default=0.0, help="seconds of paced checkpoints")
    w.add_argument("--pace", type=float, default=0.25, help="seconds between them")
    r = sub.add_parser("recover")
    r.add_argument("engine", choices=list(ENGINES))
    r.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    if args.probe == "worker":
        doc = run_worker(
            args.engine,
            args.dir,
            args.keys,
            [float(f) for f in args.fractions.split(",")],
            max_checkpoints=args.max_checkpoints,
            min_checkpoints=args.min_checkpoints,
            budget=args.budget,
            warmup=args.warmup,
            seed=args.seed,
            settle=args.settle,
            pace=args.pace,
        )
        _emit(doc, _wait_for_kill)
    else:
        _emit(probe_recover(args.engine, args.dir), lambda: os._exit(0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
