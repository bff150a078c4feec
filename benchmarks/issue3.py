"""Issue 3's measurements, run by ``benchmarks/run.py`` after issue 2's.

* restart after SIGKILL (:mod:`benchmarks.restart`);
* commit latency with the compaction daemon and without (:mod:`benchmarks.daemon_latency`);
* the writer's RssAnon over a memory-mapped base, and the overlay's memory
  per buffered update (:mod:`benchmarks.memory`).

Templates (:mod:`benchmarks.stores`) are built once per state size (the restart's
with its own long history) and
shared by the measurements that use that size; each is removed as soon as no
later measurement needs it, and everything lives in one temporary directory.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .daemon_latency import DaemonSpec, LatencyRun, run_latency
from .memory import MemoryResult, measure_memory
from .restart import RestartResult, RestartSpec, run_restart
from .stores import Template, build_template_isolated, clone_store, spawn_call
from .workload import DEFAULT_SEED

__all__ = ["PARTS", "Issue3", "Issue3Config", "disk_needed", "run_issue3"]

PARTS = ("restart", "daemon", "memory")

_DISK_PER_KEY = 900
"""Peak disk bytes per key of a template and its clone: log ~140, the compactor's
scratch images ~2 x 165, snapshot ~30, the extracted base ~165, with margin."""


@dataclass(frozen=True)
class Issue3Config:
    restart_keys: int
    restart_tail: int
    restart_repeats: int
    daemon_keys: int
    daemon_checkpoints: int
    daemon_pairs: int
    memory_keys: tuple[int, ...]
    memory_updates: int
    updates: int = 10_000
    parts: tuple[str, ...] = PARTS
    seed: int = DEFAULT_SEED
    daemon_segment_bytes: int = 8 << 20
    daemon_min_tail_bytes: int = 8 << 20
    restart_history: int = 0
    """Updates committed before the snapshot of the restart's store (0: load only)."""
    daemon_nice: int | None = 19
    """Also run the daemon under ``nice -n`` this (None: skip that condition)."""


@dataclass(frozen=True)
class Issue3:
    config: Issue3Config
    restart: RestartResult | None = None
    daemon: DaemonSpec | None = None
    daemon_runs: list[LatencyRun] = field(default_factory=list)
    memory: list[MemoryResult] = field(default_factory=list)
    templates: list[Template] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Measurements not taken, each with the reason."""


def disk_needed(keys: int) -> int:
    return keys * _DISK_PER_KEY


def run_issue3(cfg: Issue3Config, base_dir: str | None, log: Callable[[str], None]) -> Issue3:
    """Run each part of ``cfg.parts``: restart, the daemon runs, then memory (smallest first)."""
    restart: RestartResult | None = None
    daemon_spec: DaemonSpec | None = None
    runs: list[LatencyRun] = []
    memory: list[MemoryResult] = []
    skipped: list[str] = []
    built: dict[tuple[int, int], Template] = {}
    uses: list[int] = []
    if "restart" in cfg.parts:
        uses.append(cfg.restart_keys)
    if "daemon" in cfg.parts:
        uses.append(cfg.daemon_keys)
    mem_keys = sorted(cfg.memory_keys) if "memory" in cfg.parts else []
    uses += mem_keys

    with tempfile.TemporaryDirectory(prefix="bench-issue3-", dir=base_dir) as d:
        work = Path(d)

        def template(keys: int, history: int = 0) -> Template:
            # The restart's store has a long history; the others start from a plain load.
            if (keys, history) not in built:
                log(f"[issue3] template: {keys:,} keys (+{history:,} updates) loaded, compacted")
                t = build_template_isolated(
                    work / f"template-{keys}-{history}",
                    keys,
                    seed=cfg.seed,
                    history=history,
                    updates=min(cfg.updates, cfg.restart_tail, keys),
                )
                log(
                    f"[issue3]   load {t.load_seconds:.1f} s, compact {t.compact_seconds:.1f} s, "
                    f"snapshot {t.snapshot_bytes / 2**20:.1f} MiB, "
                    f"image {t.image_bytes / 2**20:.1f} MiB"
                )
                built[keys, history] = t
            return built[keys, history]

        def done_with(keys: int, history: int = 0) -> None:
            uses.remove(keys)
            if (keys not in uses or history) and (keys, history) in built:
                shutil.rmtree(work / f"template-{keys}-{history}", ignore_errors=True)

        if "restart" in cfg.parts:
            spec = RestartSpec(
                cfg.restart_keys,
                cfg.restart_tail,
                updates=min(cfg.updates, cfg.restart_tail, cfg.restart_keys),
                repeats=cfg.restart_repeats,
                seed=cfg.seed,
            )
            log(f"[issue3] restart after SIGKILL: {spec.keys:,} keys, {spec.tail:,}-update tail")
            t = template(spec.keys, cfg.restart_history)
            try:
                restart = run_restart(spec, t, work / "restart", log=log)
            except Exception as exc:  # one failed part must not lose the others' numbers
                skipped.append(f"restart at {spec.keys:,} keys failed: {exc!r}"[:500])
                log(f"[issue3]   FAILED: {exc!r}")
            shutil.rmtree(work / "restart", ignore_errors=True)
            done_with(spec.keys, cfg.restart_history)

        if "daemon" in cfg.parts:
            daemon_spec = DaemonSpec(
                cfg.daemon_keys,
                updates=min(cfg.updates, cfg.daemon_keys),
                checkpoints=cfg.daemon_checkpoints,
                pairs=cfg.daemon_pairs,
                segment_bytes=cfg.daemon_segment_bytes,
                min_tail_bytes=cfg.daemon_min_tail_bytes,
                seed=cfg.seed,
            )
            t = template(daemon_spec.keys)
            conditions: list[tuple[bool, int | None]] = [(False, None), (True, None)]
            if cfg.daemon_nice is not None:
                conditions.append((True, cfg.daemon_nice))
            for i in range(len(conditions) * daemon_spec.pairs):
                with_daemon, nice = conditions[i % len(conditions)]
                run_dir = work / "latency"
                run_dir.mkdir()
                try:
                    run: LatencyRun = spawn_call(
                        run_latency, daemon_spec, t.path, run_dir, with_daemon, i, nice
                    )
                except Exception as exc:  # one failed part must not lose the others' numbers
                    skipped.append(f"daemon latency run {i + 1} failed: {exc!r}"[:500])
                    log(f"[issue3]   FAILED: {exc!r}")
                    shutil.rmtree(run_dir, ignore_errors=True)
                    continue
                shutil.rmtree(run_dir, ignore_errors=True)
                log(
                    f"[issue3] commit latency, {run.condition}: {daemon_spec.checkpoints} "
                    f"checkpoints at {daemon_spec.keys:,} keys: p50 {run.p(50) * 1e3:.1f} ms, "
                    f"p99 {run.p(99) * 1e3:.1f} ms, {len(run.in_window())} snapshots, "
                    f"{len(run.swaps)} swaps"
                )
                runs.append(run)
            done_with(daemon_spec.keys)

        for keys in mem_keys:
            free = shutil.disk_usage(work).free
            if (keys, 0) not in built and free < 2 * disk_needed(keys):
                skipped.append(
                    f"memory at {keys:,} keys: needs about {disk_needed(keys) / 2**30:.1f} GiB "
                    f"of disk, {free / 2**30:.1f} GiB free"
                )
                done_with(keys)
                continue
            t = template(keys)
            clone = work / f"memory-{keys}"
            clone_store(t.path, clone)
            log(
                f"[issue3] memory: open {keys:,} keys in a base, "
                f"then {cfg.memory_updates:,} updates"
            )
            try:
                m: MemoryResult = spawn_call(
                    measure_memory, clone, keys, t.image_bytes, cfg.memory_updates, seed=cfg.seed
                )
            except Exception as exc:  # one failed part must not lose the others' numbers
                skipped.append(f"memory at {keys:,} keys failed: {exc!r}"[:500])
                log(f"[issue3]   FAILED: {exc!r}")
                shutil.rmtree(clone, ignore_errors=True)
                done_with(keys)
                continue
            shutil.rmtree(clone, ignore_errors=True)
            log(
                f"[issue3]   RssAnon {m.rss_anon_open / 2**20:.1f} MiB with an empty overlay, "
                f"{m.per_update:.0f} B per buffered update"
            )
            memory.append(m)
            done_with(keys)

    return Issue3(
        config=cfg,
        restart=restart,
        daemon=daemon_spec,
        daemon_runs=runs,
        memory=memory,
        templates=sorted(built.values(), key=lambda t: (t.keys, t.history_updates)),
        skipped=skipped,
    )
