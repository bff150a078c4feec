"""Issue 6: every durability strategy on the same seeded workload, SIGKILL, recovery.

For each state size and each engine (:mod:`benchmarks.engines`) the runner
starts a worker process (:mod:`benchmarks.tradeoff_probe`) in its own
session, which loads the state and measures checkpoints at each dirty
fraction; it then SIGKILLs the worker's whole process group (statelog's
compactor child included), measures the disk footprint the crash left, and
times the recovery in a fresh interpreter. Recovery must find exactly the
offsets and watermark of the last acknowledged checkpoint and all ``S`` keys.

Engines run one after the other, so none pays for another's heap or disk
traffic, but all share the machine's noise within minutes of each other.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engines import ENGINES
from .measure import percentile
from .stores import ROOT
from .tradeoff_probe import dir_footprint
from .workload import DEFAULT_SEED

__all__ = ["Cell", "Phase", "Tradeoff", "TradeoffConfig", "run_tradeoff"]

FRACTIONS = (0.001, 0.01, 0.1)


@dataclass(frozen=True)
class TradeoffConfig:
    sizes: tuple[int, ...]
    fractions: tuple[float, ...] = FRACTIONS
    engines: tuple[str, ...] = tuple(ENGINES)
    budget: float = 10.0
    """Seconds of checkpoints per (engine, size, fraction), roughly."""
    max_checkpoints: int = 100
    min_checkpoints: int = 3
    warmup: int = 2
    seed: int = DEFAULT_SEED
    settle: float = 0.0
    """Seconds of paced 1%-dirty checkpoints (four a second) before the SIGKILL."""
    pace: float = 0.25


@dataclass(frozen=True)
class Phase:
    """Checkpoints at one dirty fraction."""

    fraction: float
    updates: int
    walls: list[float]
    cpus: list[float]
    finish: float
    """Seconds to make the acknowledged checkpoints durable at the end (group commit)."""
    bytes_written: int
    """write_bytes of the worker and its children over the phase (all its checkpoints)."""
    checkpoints_total: int
    """Warm-up included: what ``bytes_written`` is divided by."""

    @property
    def p50(self) -> float:
        return percentile(self.walls, 50)

    @property
    def p99(self) -> float:
        return percentile(self.walls, 99)

    @property
    def cpu_p50(self) -> float:
        return percentile(self.cpus, 50)

    @property
    def updates_per_s(self) -> float:
        """Sustained: every measured update over the summed checkpoint time plus the flush."""
        total = sum(self.walls) + self.finish
        return self.updates * len(self.walls) / total if total > 0 else math.nan

    @property
    def bytes_per_checkpoint(self) -> float:
        return self.bytes_written / max(1, self.checkpoints_total)


@dataclass(frozen=True)
class Cell:
    """One engine at one state size: its phases, the crash, and the recovery."""

    engine: str
    keys: int
    load_seconds: float
    phases: list[Phase]
    peak_rss: int
    """VmHWM of the worker (load included)."""
    disk_bytes: int
    """Allocated bytes of the engine's files after the SIGKILL (the source log excluded)."""
    source_bytes: int
    recovery_seconds: float
    recovery_cpu: float
    replayed: int
    recovery_rss: int
    recovered_ok: bool
    recovery_detail: str = ""
    settled: int = 0
    """Paced checkpoints taken after the measured phases, before the SIGKILL."""

    def phase(self, fraction: float) -> Phase | None:
        for p in self.phases:
            if math.isclose(p.fraction, fraction):
                return p
        return None


@dataclass(frozen=True)
class Tradeoff:
    config: TradeoffConfig
    cells: list[Cell] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def cell(self, engine: str, keys: int) -> Cell | None:
        for c in self.cells:
            if c.engine == engine and c.keys == keys:
                return c
        return None


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _probe(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "benchmarks.tradeoff_probe", *args]


def run_cell(cfg: TradeoffConfig, engine: str, keys: int, work: Path) -> Cell:
    """Worker, SIGKILL of its process group, footprint, recovery (module docstring)."""
    d = work / f"{engine}-{keys}"
    args = [
        "worker", engine, str(d), "--keys", str(keys),
        "--fractions", ",".join(str(f) for f in cfg.fractions),
        "--max-checkpoints", str(cfg.max_checkpoints),
        "--min-checkpoints", str(cfg.min_checkpoints),
        "--budget", str(cfg.budget), "--seed", str(cfg.seed),
        "--settle", str(cfg.settle), "--pace", str(cfg.pace),
        # One warm-up for the JSON snapshot: at 1M keys each one takes seconds.
        "--warmup", str(min(cfg.warmup, 1) if engine == "json" else cfg.warmup),
    ]  # fmt: skip
    timeout = 300 + keys / 500
    proc = subprocess.Popen(
        _probe(args),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    if not line:
        raise RuntimeError(f"{engine} worker at {keys:,} keys died (exit {proc.returncode})")
    ack: dict[str, Any] = json.loads(line)
    time.sleep(0.2)  # the killed compactor's files are closed by the kernel
    disk = dir_footprint(d)
    out = subprocess.run(
        _probe(["recover", engine, str(d)]),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{engine} recovery at {keys:,} keys failed: {out.stderr[-1500:]}")
    rec: dict[str, Any] = json.loads(lines[-1])
    ok = (
        rec["offsets"] == ack["offsets"]
        and rec["low_watermark_ms"] == ack["low_watermark_ms"]
        and rec["count"] == keys
    )
    shutil.rmtree(d, ignore_errors=True)
    return Cell(
        engine=engine,
        keys=keys,
        load_seconds=float(ack["load_seconds"]),
        phases=[
            Phase(
                fraction=float(p["fraction"]),
                updates=int(p["updates"]),
                walls=[float(x) for x in p["walls"]],
                cpus=[float(x) for x in p["cpus"]],
                finish=float(p["finish"]),
                bytes_written=int(p["bytes_written"]),
                checkpoints_total=int(p["checkpoints_total"]),
            )
            for p in ack["phases"]
        ],
        peak_rss=int(ack["peak_rss"]),
        disk_bytes=disk,
        source_bytes=int(ack["source_bytes"]),
        recovery_seconds=float(rec["seconds"]),
        recovery_cpu=float(rec["cpu_seconds"]),
        replayed=int(rec["replayed"]),
        recovery_rss=int(rec["peak_rss"]),
        recovered_ok=ok,
        recovery_detail=str(rec.get("detail", "")),
        settled=int(ack.get("settled", 0)),
    )


def run_tradeoff(
    cfg: TradeoffConfig, base_dir: str | None, log: Callable[[str], None]
) -> Tradeoff:
    """Every (size, engine) cell, smallest size first; a failed cell is reported, not fatal."""
    result = Tradeoff(cfg)
    with tempfile.TemporaryDirectory(prefix="bench-tradeoff-", dir=base_dir) as tmp:
        work = Path(tmp)
        for keys in cfg.sizes:
            for engine in cfg.engines:
                log(f"[tradeoff] {engine} at {keys:,} keys ...")
                try:
                    cell = run_cell(cfg, engine, keys, work)
                except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                    result.failures.append(f"{engine} at {keys:,} keys: {exc}")
                    log(f"[tradeoff]   FAILED: {exc}")
                    continue
                mid = cell.phase(0.01) or cell.phases[len(cell.phases) // 2]
                log(
                    f"[tradeoff]   {mid.fraction:.1%} dirty: p50 {mid.p50 * 1e3:.2f} ms, "
                    f"{mid.updates_per_s:,.0f} updates/s, "
                    f"{mid.bytes_per_checkpoint / 1024:,.0f} KiB/checkpoint; recovery "
                    f"{cell.recovery_seconds:.3f} s, {cell.replayed:,} replayed"
                    + ("" if cell.recovered_ok else " MISMATCH")
                )
                result.cells.append(cell)
    return result


def names(cells: Sequence[Cell]) -> list[str]:
    """Engines present, in the report's order."""
    present = {c.engine for c in cells}
    return [e for e in ENGINES if e in present]
