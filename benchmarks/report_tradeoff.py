"""Issue 6's part of ``docs/benchmarks.md``: the trade-off table, targets, tables and plots."""

from __future__ import annotations

import math
from pathlib import Path

from .engines import ENGINES, GUARANTEES, INTERVAL
from .tradeoff import Cell, Tradeoff, names

__all__ = ["PLOTS", "TARGETS", "missed_throughput", "render_tradeoff", "write_plots"]

TARGET_KEYS = 1_000_000
TARGET_FRACTION = 0.01
TARGETS = (("rocksdb", 3.0), ("sqlite", 30.0), ("json", 300.0))
"""Engine and the factor statelog's updates/s must reach over it."""
RECOVERY_TARGET = 20.0
PLOTS = {
    "latency": "bench-commit-latency.png",
    "recovery": "bench-recovery.png",
    "bytes": "bench-bytes-written.png",
}

LABELS = {
    "json": "(1) JSON full snapshot every checkpoint, atomic rename",
    "zstd-interval": f"(2) zstd full snapshot every {INTERVAL} checkpoints + source replay",
    "statelog": '(3) statelog `durability="commit"` + compactor',
    "statelog-group": '(3) statelog `durability="group"` + compactor',
    "none": "(4) no checkpoint: replay the source from the start",
    "sqlite": "(5) SQLite WAL, `synchronous=FULL`",
    "lmdb": "(5) LMDB, synced commit per checkpoint",
    "rocksdb": "(5) RocksDB (rocksdict), synced WriteBatch",
}


def _ms(s: float) -> str:
    return "-" if math.isnan(s) else f"{s * 1e3:,.2f}" if s < 0.1 else f"{s * 1e3:,.0f}"


def _rate(r: float) -> str:
    if math.isnan(r):
        return "-"
    return f"{r / 1e6:.2f} M" if r >= 1e6 else f"{r / 1e3:,.1f} k" if r >= 1e3 else f"{r:.0f}"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"


def _keys(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n >= 1000 else str(n)


def _headline(t: Tradeoff) -> int:
    sizes = sorted({c.keys for c in t.cells})
    return TARGET_KEYS if TARGET_KEYS in sizes else sizes[-1]


def _recovery_cost(c: Cell) -> str:
    what = f"{c.recovery_seconds:.3f} s"
    return what + (f", {c.replayed:,} updates replayed" if c.replayed else ", nothing replayed")


def _tradeoff_table(t: Tradeoff, keys: int) -> list[str]:
    out = [
        "| strategy | recovery cost (after SIGKILL) | write overhead: checkpoint p50 / p99, "
        "updates/s | bytes written / checkpoint | consistency guarantee | peak RSS | disk |",
        "|---|---|---|---|---|---:|---:|",
    ]
    for name in names(t.cells):
        c = t.cell(name, keys)
        if c is None:
            continue
        p = c.phase(TARGET_FRACTION)
        over = "-" if p is None else f"{_ms(p.p50)} / {_ms(p.p99)} ms, {_rate(p.updates_per_s)}/s"
        written = "-" if p is None else _bytes(p.bytes_per_checkpoint)
        flag = "" if c.recovered_ok else " **MISMATCH**"
        out.append(
            f"| {LABELS[name]} | {_recovery_cost(c)}{flag} | {over} | {written} | "
            f"{GUARANTEES[name]} | {_bytes(c.peak_rss)} | {_bytes(c.disk_bytes)} |"
        )
    return out


def _judge(wall: float, cpu: float, goal: float, at_size: bool) -> str:
    ok_w, ok_c = wall >= goal, cpu >= goal
    status = "**inconclusive**"
    if ok_w == ok_c:
        status = "**met**" if ok_w else "**missed**"
    return status if at_size else f"{status.strip('*')} at this size; not measured at 1M"


def _targets(t: Tradeoff, keys: int) -> list[str]:
    out = [
        "| target | goal | measured | status |",
        "|---|---|---|---|",
    ]
    at_size = keys == TARGET_KEYS
    sl = t.cell("statelog", keys)
    slp = sl.phase(TARGET_FRACTION) if sl else None
    for other, goal in TARGETS:
        c = t.cell(other, keys)
        p = c.phase(TARGET_FRACTION) if c else None
        if slp is None or p is None:
            out.append(f"| statelog vs {other} | >= {goal:g}x updates/s | not measured | - |")
            continue
        wall = slp.updates_per_s / p.updates_per_s
        cpu = p.cpu_p50 / slp.cpu_p50 if slp.cpu_p50 > 0 else math.nan
        out.append(
            f"| statelog commit vs {other} | >= {goal:g}x the updates/s at {_keys(keys)} keys, "
            f"1% dirty | {wall:,.1f}x ({_rate(slp.updates_per_s)}/s vs {_rate(p.updates_per_s)}"
            f"/s); CPU p50 ratio {cpu:,.1f}x | {_judge(wall, cpu, goal, at_size)} |"
        )
    none = t.cell("none", keys)
    if sl is not None and none is not None:
        wall = none.recovery_seconds / sl.recovery_seconds
        cpu = none.recovery_cpu / sl.recovery_cpu if sl.recovery_cpu > 0 else math.nan
        out.append(
            f"| recovery vs no checkpoint | >= {RECOVERY_TARGET:g}x faster than replaying "
            f"everything at {_keys(keys)} keys | {wall:,.1f}x ({none.recovery_seconds:.3f} s vs "
            f"{sl.recovery_seconds:.3f} s; CPU {cpu:,.1f}x) | "
            f"{_judge(wall, cpu, RECOVERY_TARGET, at_size)} |"
        )
    return out


def missed_throughput(t: Tradeoff) -> list[tuple[str, int, float]]:
    """(engine, keys, p50) of statelog and each engine whose throughput target is missed."""
    if not t.cells:
        return []
    keys = _headline(t)
    sl = t.cell("statelog", keys)
    slp = sl.phase(TARGET_FRACTION) if sl else None
    if slp is None:
        return []
    out = []
    for other, goal in TARGETS:
        c = t.cell(other, keys)
        p = c.phase(TARGET_FRACTION) if c else None
        if p is not None and slp.updates_per_s < goal * p.updates_per_s:
            out.append((other, keys, p.p50))
    return [("statelog", keys, slp.p50), *out] if out else []


def _throughput_note(t: Tradeoff, keys: int) -> list[str]:
    """Why a throughput ratio falls short: wall vs CPU, and the compactor's share of the disk."""
    sl = t.cell("statelog", keys)
    p = sl.phase(TARGET_FRACTION) if sl else None
    if p is None or not any(name == "statelog" for name, _k, _p in missed_throughput(t)):
        return []
    wal = p.updates * 143  # log bytes per update (issue 3's memory section measures ~143 B)
    return [
        f"Throughput, where a ratio falls short: statelog's checkpoint here took "
        f"{_ms(p.p50)} ms wall but {_ms(p.cpu_p50)} ms of CPU at p50, and wrote "
        f"{_bytes(p.bytes_per_checkpoint)} per checkpoint where its log needs about "
        f"{_bytes(wal)}: the rest is the compactor process, which rewrites the whole base "
        "image on every pass and competes for the same 2 cores and disk while the "
        "checkpoints run back to back. The CPU ratios show the commit path alone; the "
        "profile below (a separate run, compactor mostly idle) shows where it goes: "
        "per-value encoding and validation (`table_delta`), the append with `fdatasync`, "
        "and the overlay's dict update.",
        "",
    ]


def _recovery_note(t: Tradeoff, keys: int) -> list[str]:
    """Why the recovery ratio is what it is: both sides' replay lengths, measured."""
    sl, none = t.cell("statelog", keys), t.cell("none", keys)
    if sl is None or none is None:
        return []
    history = none.replayed / keys
    return [
        f"Recovery, read with care: (4) replays everything the run produced: the load and "
        f"every checkpoint, {none.replayed:,} updates ({history:.1f} per key), because the "
        "benchmark's history is only its own few minutes. statelog's restart is bounded by the "
        "compaction trigger instead (here: 8 MiB segments, 8 MiB trigger, a pass every second; "
        f"this restart: {sl.recovery_detail or 'no detail'}, {sl.replayed:,} updates), plus "
        "what was committed while the compactor was still folding the back-to-back phases: "
        "each pass rewrites the whole image, so at 1M keys a pass takes seconds. The ratio "
        "grows with the history a real reconciler accumulates, which this run caps. The "
        "restart section of issue 3 below measures that case: a log many times longer than "
        "the state and a 100k-update tail after the newest snapshot.",
        "",
    ]


def _full_table(t: Tradeoff) -> list[str]:
    out = [
        "| keys | dirty | strategy | checkpoints | p50 ms | p99 ms | CPU p50 ms | updates/s "
        "| bytes / checkpoint | write amplification |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for keys in sorted({c.keys for c in t.cells}):
        for fraction in t.config.fractions:
            for name in names(t.cells):
                c = t.cell(name, keys)
                p = c.phase(fraction) if c else None
                if p is None:
                    continue
                logical = p.updates * 110  # msgpack bytes of one record (workload docstring)
                amp = p.bytes_per_checkpoint / logical
                out.append(
                    f"| {_keys(keys)} | {fraction:.1%} | {name} | {len(p.walls)} | "
                    f"{_ms(p.p50)} | {_ms(p.p99)} | {_ms(p.cpu_p50)} | {_rate(p.updates_per_s)} | "
                    f"{_bytes(p.bytes_per_checkpoint)} | {amp:,.1f}x |"
                )
    return out


def _recovery_table(t: Tradeoff) -> list[str]:
    out = [
        "| keys | strategy | recovery s | CPU s | updates replayed | peak RSS (recovery) "
        "| peak RSS (worker) | disk after the crash | load s | same state | recovered from |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for c in sorted(t.cells, key=lambda c: (c.keys, list(ENGINES).index(c.engine))):
        out.append(
            f"| {_keys(c.keys)} | {c.engine} | {c.recovery_seconds:.3f} | {c.recovery_cpu:.3f} | "
            f"{c.replayed:,} | {_bytes(c.recovery_rss)} | {_bytes(c.peak_rss)} | "
            f"{_bytes(c.disk_bytes)} | {c.load_seconds:.1f} | "
            + ("yes" if c.recovered_ok else "**NO**")
            + f" | {c.recovery_detail or '-'} |"
        )
    return out


def write_plots(t: Tradeoff, out_dir: Path) -> list[str]:
    """The three PNGs of the issue into ``out_dir``; returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({c.keys for c in t.cells})
    written = []

    def series(metric: str) -> dict[str, tuple[list[float], list[float]]]:
        data: dict[str, tuple[list[float], list[float]]] = {}
        for name in names(t.cells):
            xs: list[float] = []
            ys: list[float] = []
            for keys in sizes:
                c = t.cell(name, keys)
                p = c.phase(TARGET_FRACTION) if c else None
                if c is None or p is None:
                    continue
                if metric == "latency":
                    xs.append(keys)
                    ys.append(p.p50 * 1e3)
                elif metric == "bytes":
                    xs.append(keys)
                    ys.append(max(p.bytes_per_checkpoint, 1.0))
                elif c.replayed > 0:
                    xs.append(c.replayed)
                    ys.append(c.recovery_seconds)
            data[name] = (xs, ys)
        return data

    specs = {
        "latency": ("state size (keys)", "checkpoint p50 (ms)", "Checkpoint latency, 1% dirty"),
        "bytes": ("state size (keys)", "bytes written per checkpoint", "Bytes written, 1% dirty"),
        "recovery": (
            "updates replayed after the last snapshot (tail length)",
            "recovery after SIGKILL (s)",
            "Recovery time vs replayed tail",
        ),
    }
    for metric, (xl, yl, title) in specs.items():
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
        for name, (xs, ys) in series(metric).items():
            if xs:
                ax.plot(xs, ys, marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / PLOTS[metric])
        plt.close(fig)
        written.append(PLOTS[metric])
    return written


def render_tradeoff(t: Tradeoff, plots: list[str], profile: list[str]) -> list[str]:
    """The opening sections of the report (the plots are already written next to it)."""
    if not t.cells:
        return ["Issue 6's trade-off matrix failed: " + "; ".join(t.failures), ""]
    keys = _headline(t)
    cfg = t.config
    out = [
        f"## Durability strategy trade-off, measured ({_keys(keys)} keys, 1% dirty)",
        "",
        "The seed's table with every cell measured in this run: each strategy loaded the same "
        f"seeded state of {keys:,} reconciler records, took checkpoints that each rewrite "
        f"{TARGET_FRACTION:.0%} of the keys and advance 8 partition offsets and the "
        "watermark (as fast as it could, for the write-overhead columns), then"
        + (
            f" for {cfg.settle:g} s took one such checkpoint every {cfg.pace * 1e3:.0f} ms, "
            "a reconciler's steady cadence (without it the crash would land right after a "
            "burst no background compaction is sized for), then"
            if cfg.settle > 0
            else ""
        )
        + " was killed with SIGKILL (its whole process group), and was restarted in a "
        "fresh interpreter that had to find the offsets and watermark of the last acknowledged "
        "checkpoint and every key.",
        "",
        *_tradeoff_table(t, keys),
        "",
        "- *updates/s*: measured updates over the summed checkpoint time (plus the final "
        "flush for group commit): sustained, outliers included. For (2) and (4) a checkpoint "
        "is only the in-memory apply (and, every "
        f"{INTERVAL}th time for (2), the full snapshot): their cost moves to recovery.",
        "- *bytes written*: `write_bytes` of `/proc/<pid>/io` of the process and its children "
        "(statelog's compactor) over all checkpoints of the phase, warm-up included, divided "
        "by their number: page-granular, B-tree and LSM rewrites and compaction included.",
        "- *recovery*: (2) and (4) re-read a source log (length-prefixed msgpack records "
        "standing for the broker's topic) from the snapshot's position or from the start; "
        "the killed worker of (2) stopped in the middle of a snapshot interval.",
        "",
        "## Targets (issue 6)",
        "",
        *_targets(t, keys),
        "",
        "Throughput ratios use the sustained updates/s on wall time; the CPU p50 ratio "
        "(immune to waiting for a core) must agree, else the verdict is *inconclusive*.",
        "",
        *_throughput_note(t, keys),
        *_recovery_note(t, keys),
    ]
    if profile:
        out += profile
    out += [
        "## Plots",
        "",
        *[f"![{name}]({name})" for name in plots],
        "",
        "## Every size and dirty fraction",
        "",
        *_full_table(t),
        "",
        "*write amplification*: bytes written over the checkpoint's logical payload "
        "(updates x about 110 B of msgpack per record).",
        "",
        "### Recovery after SIGKILL, peak memory, disk",
        "",
        *_recovery_table(t),
        "",
        f"Checkpoints per phase: {cfg.warmup} warm-up, then up to {cfg.max_checkpoints} "
        f"measured, at least {cfg.min_checkpoints}, stopping after about {cfg.budget:g} s. "
        "Peak RSS is the worker's VmHWM (load included); disk is the allocated size of the "
        "strategy's files after the crash (the source log excluded).",
        "",
    ]
    if t.failures:
        out += ["Failed cells: " + "; ".join(t.failures), ""]
    return out
