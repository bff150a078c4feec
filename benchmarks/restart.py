"""Restart after SIGKILL (issue 3): snapshot + tail vs full replay vs JSON restore vs the floor.

Set-up, from a template (:mod:`benchmarks.stores`: ``keys`` keys loaded,
sealed, compacted into one snapshot, the whole log kept aside):

1. ``restart/store``: a clone of the template. A writer subprocess opens it
   (``durability="commit"``), commits ``tail`` updates in checkpoints of
   ``updates`` keys, says so, and is killed with SIGKILL.
2. ``restart/replay``: the same store without ``snapshots/``: its
   ``IDENTITY`` and every segment from epoch 1 (the template's kept log,
   then copies of the segments the killed writer wrote), so the ladder
   has to replay the whole log.
3. ``restart/json``: the seed-style full JSON snapshot of the same state
   (:class:`~benchmarks.strategies.JsonSnapshotStrategy`).

Then, ``repeats`` times and each time in a fresh interpreter (the order
rotates between repeats), after the imports and outside the timed span
otherwise:

* (a) ``snapshot``: ``statelog.open(restart/store)``: the newest snapshot is
  verified, extracted to ``base/`` and mapped, the tail replayed;
* (b) ``replay``: ``statelog.open(restart/replay)``: the whole log replayed;
* (c) ``json``: read the JSON file, verify its sha256, ``json.loads`` it;
* (d) ``floor``: read the snapshot file, decompress its body (discarding
  the output) and read the tail segments' bytes: what any restart from
  this snapshot has to do at the least.

The statelog probes end with ``os._exit`` (no ``close``): each restart finds
the store exactly as the killed writer left it. The files are in the page
cache for every probe (they were just written); no probe drops caches.

``python -m benchmarks.restart PROBE ...`` runs one probe and prints JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procstat import rss
from .stores import (
    ROOT,
    Template,
    copy_files,
    dir_bytes,
    run_json_probe,
    segments_after,
    spawn_call,
)
from .workload import DEFAULT_SEED, Workload

__all__ = [
    "KINDS",
    "LABELS",
    "OPEN_STEPS",
    "Probe",
    "ProfileTree",
    "RestartResult",
    "RestartSpec",
    "run_restart",
]

KINDS = ("snapshot", "replay", "json", "floor")
LABELS = {
    "snapshot": "(a) statelog: newest snapshot + log tail",
    "replay": "(b) statelog: the whole log replayed, no snapshot",
    "json": "(c) seed-style JSON restore: read, sha256, json.loads",
    "floor": "(d) floor: read + decompress the snapshot, read the tail",
}
_SAMPLES = 1000
"""Keys compared between restores (evenly spaced), to check they agree."""
_CHUNK = 1 << 20


@dataclass(frozen=True)
class RestartSpec:
    keys: int
    tail: int
    """Updates committed after the snapshot, before the SIGKILL."""
    updates: int = 10_000
    """Updates per tail commit."""
    repeats: int = 3
    seed: int = DEFAULT_SEED
    profile: bool = True
    """Run pyinstrument on (a) and (b) when a restart target is missed."""

    @property
    def commits(self) -> int:
        return max(1, self.tail // self.updates)


@dataclass(frozen=True)
class Probe:
    """One timed restore in a fresh interpreter."""

    kind: str
    seconds: float
    cpu_seconds: float
    """CPU time of the process (every thread) over the timed span."""
    rss_anon: int
    """RssAnon after the restore (bytes), the restored state still alive."""
    rss_file: int
    parts: dict[str, float] = field(default_factory=dict)
    epoch: int = 0
    count: int = 0
    digest: str = ""
    """sha256 over the values of evenly spaced keys: equal digests, equal states."""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileTree:
    """A pyinstrument profile, as (depth, seconds, frame) lines of its call tree."""

    kind: str
    duration: float
    cpu_time: float
    lines: list[tuple[int, float, str]]


@dataclass(frozen=True)
class RestartResult:
    spec: RestartSpec
    template: Template
    acked_epoch: int
    """The epoch the killed writer had acknowledged (durably) before SIGKILL."""
    tail_bytes: int
    """Bytes of the segments after the snapshot (what (a) replays)."""
    replay_bytes: int
    """Bytes of the whole log (what (b) replays)."""
    json_bytes: int
    json_seconds: float
    """Building and writing the JSON snapshot (set-up, not a restore)."""
    probes: dict[str, list[Probe]]
    breakdown: dict[str, float]
    """Instrumented (a), separate run: step -> seconds (nested steps overlap)."""
    breakdown_total: float
    profiles: list[ProfileTree] = field(default_factory=list)

    def median(self, kind: str, attr: str = "seconds") -> float:
        values = sorted(float(getattr(p, attr)) for p in self.probes.get(kind, []))
        if not values:
            return float("nan")
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    def consistent(self) -> tuple[bool, str]:
        """Whether (a), (b) and (c) restored the same state, and a sentence saying so."""
        firsts = {k: ps[0] for k, ps in self.probes.items() if ps and k != "floor"}
        digests = {p.digest for p in firsts.values()}
        counts = {p.count for p in firsts.values()}
        epochs = {firsts[k].epoch for k in ("snapshot", "replay") if k in firsts}
        ok = len(digests) == 1 and counts == {self.spec.keys} and epochs == {self.acked_epoch}
        what = (
            f"(a), (b) and (c) restored {', '.join(f'{p.count:,}' for p in firsts.values())} "
            f"keys; (a) and (b) epochs {sorted(epochs)} (acknowledged before the kill: "
            f"{self.acked_epoch}); sampled-value digests "
            + ("all equal" if len(digests) == 1 else f"DIFFER: {sorted(digests)}")
        )
        return ok, what


# -- set-up ---------------------------------------------------------------


def _writer_cmd(store: Path, spec: RestartSpec, start: int) -> list[str]:
    return [
        sys.executable, "-m", "benchmarks.restart", "writer", str(store),
        "--keys", str(spec.keys), "--updates", str(spec.updates),
        "--commits", str(spec.commits), "--seed", str(spec.seed), "--start", str(start),
    ]  # fmt: skip


def _commit_tail_and_kill(store: Path, spec: RestartSpec, start: int, timeout: float) -> int:
    """Start the tail writer, wait for its acknowledgement, SIGKILL it; the epoch acked."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        _writer_cmd(store, spec, start),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tail writer died: {proc.communicate(timeout=timeout)[1][-2000:]}")
        epoch = int(json.loads(line)["epoch"])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=timeout)
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"tail writer ended with {proc.returncode}, not by SIGKILL")
    return epoch


def _build_json(out_dir: Path, spec: RestartSpec, epoch: int, start: int = 0) -> tuple[Path, float]:
    """The JSON snapshot of the state the killed writer acknowledged; path and seconds."""
    from .strategies import JsonSnapshotStrategy

    t0 = time.perf_counter()
    workload = Workload(spec.keys, min(spec.updates, spec.keys), seed=spec.seed)
    js = JsonSnapshotStrategy(out_dir)
    js.load(workload.initial_chunks())
    for i in range(start + spec.commits):  # the history, then the tail
        js.apply(workload.checkpoint(i))
    js.epoch = epoch
    js.snapshot()
    path = js.newest()
    assert path is not None
    return path, time.perf_counter() - t0


def run_restart(
    spec: RestartSpec,
    template: Template,
    work: Path,
    *,
    log: Callable[[str], None] | None = None,
) -> RestartResult:
    """Set up (module docstring) under ``work`` from ``template``, then time every probe."""
    from .stores import clone_store

    say = log or (lambda msg: None)
    timeout = 600.0 + spec.keys / 1000
    store, replay = work / "store", work / "replay"
    clone_store(template.path, store)
    say(f"[restart] tail writer: {spec.commits} commits of {spec.updates:,} updates, then SIGKILL")
    start = template.history_commits
    acked = _commit_tail_and_kill(store, spec, start, timeout)
    # The replay copy: the whole log from epoch 1, then what the killed writer added.
    replay.mkdir()
    os.link(store / "IDENTITY", replay / "IDENTITY")
    (replay / "snapshots").mkdir()
    kept = {p.name for p in template.log.iterdir()}
    (replay / "wal").mkdir()
    for seg in sorted(template.log.iterdir()):
        os.link(seg, replay / "wal" / seg.name)
    copy_files(
        [p for p in sorted((store / "wal").glob("*.wal")) if p.name not in kept], replay / "wal"
    )
    say("[restart] JSON snapshot of the same state ...")
    json_path, json_seconds = spawn_call(_build_json, work / "json", spec, acked, start)
    args = {
        "snapshot": ["open", str(store)],
        "replay": ["open", str(replay)],
        "json": ["json", str(json_path)],
        "floor": ["floor", str(store)],
    }
    probes: dict[str, list[Probe]] = {k: [] for k in KINDS}
    for r in range(spec.repeats):
        order = KINDS[r % len(KINDS) :] + KINDS[: r % len(KINDS)]
        for kind in order:
            doc = run_json_probe("benchmarks.restart", args[kind], timeout=timeout)
            probes[kind].append(_probe_from(kind, doc))
        say(
            f"[restart] repeat {r + 1}/{spec.repeats}: "
            + ", ".join(f"{k} {probes[k][-1].seconds:.3f} s" for k in KINDS)
        )
    inst = run_json_probe(
        "benchmarks.restart", ["open", str(store), "--instrument"], timeout=timeout
    )
    snap_lsn = template.epoch
    result = RestartResult(
        spec=spec,
        template=template,
        acked_epoch=acked,
        tail_bytes=sum(p.stat().st_size for p in segments_after(store / "wal", snap_lsn)),
        replay_bytes=dir_bytes(replay / "wal", ".wal"),
        json_bytes=json_path.stat().st_size,
        json_seconds=json_seconds,
        probes=probes,
        breakdown=dict(inst["parts"]),
        breakdown_total=float(inst["seconds"]),
    )
    if spec.profile and _missed(result):
        trees = []
        for kind in ("snapshot", "replay"):
            say(f"[restart] a target is missed: pyinstrument on {kind} ...")
            doc = run_json_probe(
                "benchmarks.restart", [*args[kind], "--pyinstrument"], timeout=timeout
            )
            prof = doc["detail"]["profile"]
            trees.append(
                ProfileTree(
                    kind,
                    float(prof["duration"]),
                    float(prof["cpu_time"]),
                    [(int(d), float(s), str(f)) for d, s, f in prof["lines"]],
                )
            )
        result = dataclasses.replace(result, profiles=trees)
    return result


def _missed(r: RestartResult) -> bool:
    a, b, d = r.median("snapshot"), r.median("replay"), r.median("floor")
    return not (b / a >= 20 and a / d <= 2)


def _probe_from(kind: str, doc: dict[str, Any]) -> Probe:
    return Probe(
        kind=kind,
        seconds=float(doc["seconds"]),
        cpu_seconds=float(doc["cpu_seconds"]),
        rss_anon=int(doc["rss_anon"]),
        rss_file=int(doc["rss_file"]),
        parts={k: float(v) for k, v in doc.get("parts", {}).items()},
        epoch=int(doc.get("epoch", 0)),
        count=int(doc.get("count", 0)),
        digest=str(doc.get("digest", "")),
        detail=dict(doc.get("detail", {})),
    )


# -- probes (each in its own interpreter) ---------------------------------


def _digest(count: int, get: Any) -> str:
    """sha256 over the values of ``_SAMPLES`` evenly spaced keys, as canonical JSON."""
    h = hashlib.sha256()
    step = max(1, count // _SAMPLES)
    for i in range(0, count, step):
        h.update(json.dumps(get(Workload.key(i)), sort_keys=True).encode())
    return h.hexdigest()


def _emit(doc: dict[str, Any]) -> None:
    """Print the result and leave at once, as a killed process would: no clean-up."""
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    os._exit(0)


OPEN_STEPS: tuple[tuple[str, str, str], ...] = (
    ("statelog.recovery.image_cache", "_hashes_to_footer", "verify: read + sha256 of the file"),
    ("statelog.recovery.image_cache", "_crc", "reuse: read + CRC-32C of the old image"),
    ("statelog.recovery.ladder", "check_link", "check that the snapshot links to the log"),
    ("statelog.recovery.image_cache", "extract_snapshot", "extract: sha256 + zstd + write"),
    ("statelog.storage.snapshots._Sink", "write", "  of which: write the image (page cache)"),
    ("statelog.storage.fileio.FileLayer", "rename", "  of which: rename over the previous image"),
    ("statelog.recovery.ladder", "BaseLevel", "map the image (LMDB open)"),
    ("statelog.recovery.ladder", "recover_log", "replay the log tail"),
    ("statelog.recovery.ladder", "_remove_stale_images", "remove stale images"),
    ("statelog.storage.layout.StoreLayout", "remove_temp_files", "remove temp files"),
)
"""Steps of a writer open, timed by the instrumented probe: (owner, attribute, label)."""


def _owner(dotted: str) -> Any:
    import importlib

    module, _, cls = dotted.rpartition(".")
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        return getattr(importlib.import_module(module), cls)


def _pyinstrument_tree(session: Any, floor: float = 0.03) -> dict[str, Any]:
    """The call tree of a pyinstrument session: frames holding >= ``floor`` of the time."""
    root = session.root_frame()
    total = root.time if root is not None else 0.0
    lines: list[tuple[int, float, str]] = []

    def label(frame: Any) -> str:
        where = (
            f"{frame.file_path_short}:{frame.line_no}" if frame.line_no else frame.file_path_short
        )
        return f"{frame.function} ({where})"

    def walk(frame: Any, seconds: float, depth: int) -> None:
        if seconds < floor * total or depth > 14:
            return
        lines.append((depth, seconds, label(frame)))
        # Leaves with the same label (pyinstrument's "[self]" of several lines) are merged.
        merged: dict[str, tuple[Any, float]] = {}
        for child in frame.children:
            key = label(child) if not child.children else f"{id(child)}"
            first, t = merged.get(key, (child, 0.0))
            merged[key] = (first, t + child.time)
        for child, t in sorted(merged.values(), key=lambda ct: -ct[1]):
            walk(child, t, depth + 1)

    if root is not None:
        walk(root, root.time, 0)
    return {"duration": session.duration, "cpu_time": session.cpu_time, "lines": lines}


def probe_open(path: Path, *, instrument: bool, pyinstrument: bool) -> None:
    """(a) or (b): ``statelog.open`` on a store left by a killed writer."""
    import statelog

    from .profile_commit import instrument as timers

    probes = []
    if instrument:  # a step statelog no longer has is left out (reported as missing)
        for owner_name, attr, label in OPEN_STEPS:
            with contextlib.suppress(ImportError, AttributeError):
                owner = _owner(owner_name)
                if attr in vars(owner):
                    probes.append((owner, attr, label))
    profiler: Any = None
    if pyinstrument:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.001)
    gc.collect()
    with timers(probes) as totals:
        if profiler is not None:
            profiler.start()
        c0 = time.process_time()
        t0 = time.perf_counter()
        store = statelog.open(path)
        t1 = time.perf_counter()
        c1 = time.process_time()
    detail: dict[str, Any] = {}
    if profiler is not None:
        detail["profile"] = _pyinstrument_tree(profiler.stop())
    mem = rss()
    rec = store.recovery
    detail.update(
        snapshot=rec.snapshot.name if rec.snapshot else None,
        replayed=rec.replayed,
        recovery_seconds=rec.seconds,
        outcome=str(rec.outcome),
        generations=len(store._state.generations),
        overlay_entries=sum(len(t) for g in store._state.generations for t in g.tables.values()),
    )
    count = store.count()
    _emit(
        {
            "seconds": t1 - t0,
            "cpu_seconds": c1 - c0,
            "rss_anon": mem["RssAnon"],
            "rss_file": mem["RssFile"],
            "parts": totals,
            "epoch": store.epoch,
            "count": count,
            "digest": _digest(count, store.get),
            "detail": detail,
        }
    )


def probe_json(path: Path) -> None:
    """(c): the seed-style restore of a JSON snapshot."""
    from .strategies import JsonSnapshotStrategy

    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    doc, parts = JsonSnapshotStrategy.restore(path)
    t1 = time.perf_counter()
    c1 = time.process_time()
    mem = rss()
    state = doc["state"]
    _emit(
        {
            "seconds": t1 - t0,
            "cpu_seconds": c1 - c0,
            "rss_anon": mem["RssAnon"],
            "rss_file": mem["RssFile"],
            "parts": parts,
            "epoch": doc["epoch"],
            "count": len(state),
            "digest": _digest(len(state), state.get),
        }
    )


def probe_floor(store: Path) -> None:
    """(d): read the newest snapshot, decompress its body, read the tail segments' bytes."""
    import zstandard

    from statelog.format.snapshot import HEADER_SIZE, SnapshotHeader
    from statelog.storage.snapshots import list_snapshots

    _epoch, lsn, snap = list_snapshots(store / "snapshots")[0]
    tail = segments_after(store / "wal", lsn)
    dctx = zstandard.ZstdDecompressor()
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    with open(snap, "rb") as fh:
        data = fh.read()
    t1 = time.perf_counter()
    header = SnapshotHeader.unpack(data)
    start = HEADER_SIZE + header.meta_len
    reader = dctx.stream_reader(memoryview(data)[start : start + header.body_len])
    image = 0
    while chunk := reader.read(_CHUNK):
        image += len(chunk)
    t2 = time.perf_counter()
    tail_bytes = 0
    for seg in tail:
        with open(seg, "rb") as fh:
            tail_bytes += len(fh.read())
    t3 = time.perf_counter()
    c1 = time.process_time()
    mem = rss()
    _emit(
        {
            "seconds": t3 - t0,
            "cpu_seconds": c1 - c0,
            "rss_anon": mem["RssAnon"],
            "rss_file": mem["RssFile"],
            "parts": {
                "read snapshot": t1 - t0,
                "decompress": t2 - t1,
                "read tail": t3 - t2,
            },
            "detail": {
                "snapshot_bytes": len(data),
                "image_bytes": image,
                "tail_bytes": tail_bytes,
                "tail_segments": len(tail),
            },
        }
    )


def probe_writer(
    store: Path, keys: int, updates: int, commits: int, seed: int, start: int = 0
) -> None:
    """The tail writer: commit, acknowledge on stdout, then wait to be killed."""
    import statelog

    from .strategies import commit_checkpoint

    workload = Workload(keys, min(updates, keys), seed=seed)
    s = statelog.open(store, durability="commit")
    for i in range(start, start + commits):  # after the template's history
        commit_checkpoint(s, workload.checkpoint(i))
    sys.stdout.write(json.dumps({"epoch": s.epoch, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    while True:  # durable already: the SIGKILL may come at any moment
        time.sleep(3600)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One restart probe; prints one JSON line.")
    sub = ap.add_subparsers(dest="probe", required=True)
    p_open = sub.add_parser("open", help="(a)/(b): statelog.open of a store")
    p_open.add_argument("store", type=Path)
    p_open.add_argument("--instrument", action="store_true", help="time the steps of the open")
    p_open.add_argument("--pyinstrument", action="store_true", help="profile with pyinstrument")
    p_json = sub.add_parser("json", help="(c): restore a JSON snapshot")
    p_json.add_argument("file", type=Path)
    p_floor = sub.add_parser("floor", help="(d): read + decompress the snapshot, read the tail")
    p_floor.add_argument("store", type=Path)
    p_writer = sub.add_parser("writer", help="commit a tail, print the epoch, wait for SIGKILL")
    p_writer.add_argument("store", type=Path)
    p_writer.add_argument("--keys", type=int, required=True)
    p_writer.add_argument("--updates", type=int, required=True)
    p_writer.add_argument("--commits", type=int, required=True)
    p_writer.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p_writer.add_argument("--start", type=int, default=0, help="first checkpoint index")
    args = ap.parse_args(argv)
    if args.probe == "open":
        probe_open(args.store, instrument=args.instrument, pyinstrument=args.pyinstrument)
    elif args.probe == "json":
        probe_json(args.file)
    elif args.probe == "floor":
        probe_floor(args.store)
    else:
        probe_writer(args.store, args.keys, args.updates, args.commits, args.seed, args.start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
