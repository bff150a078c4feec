"""Run every strategy side by side and rewrite docs/benchmarks.md.

    python benchmarks/run.py --quick            # issue 2 at 10k/100k keys, issue 3 small
    python benchmarks/run.py --full             # issue 2 at 10k/100k/1M, issue 3 at 1M/10M
    python benchmarks/run.py --full --out docs/benchmarks.md

Issue 2: each (strategy, state size) is measured in its own spawned
interpreter, one after the other, then an instrumented pass profiles
statelog's commit path at the smallest and largest size. Issue 3
(:mod:`benchmarks.issue3`): restart after SIGKILL, commit latency with the
compaction daemon and without, and memory. The other options exist for
experiments and for the smoke test (tiny sizes); the report records the
exact command line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(ROOT))

from benchmarks.issue3 import PARTS, Issue3, Issue3Config, run_issue3  # noqa: E402
from benchmarks.measure import RunResult, RunSpec, measure_isolated  # noqa: E402
from benchmarks.profile_commit import Breakdown, profile_isolated  # noqa: E402
from benchmarks.report import Report, machine_info, python_command, render  # noqa: E402
from benchmarks.strategies import JsonSnapshotStrategy, StatelogStrategy  # noqa: E402
from benchmarks.tradeoff import Tradeoff, TradeoffConfig, run_tradeoff  # noqa: E402
from benchmarks.workload import DEFAULT_SEED  # noqa: E402

__all__ = ["FULL", "QUICK", "Plan", "main", "run"]


@dataclass(frozen=True)
class Plan:
    """Sizes and repetitions of one benchmark run."""

    mode: str
    sizes: tuple[int, ...]
    updates: int = 10_000
    statelog_checkpoints: int = 40
    json_checkpoints: int | None = None
    """None: by size (a full snapshot of 1M keys takes seconds)."""
    warmup: int = 3
    profile_commits: int = 20
    seed: int = DEFAULT_SEED
    parts: tuple[str, ...] = ("tradeoff", "commit", *PARTS, "remote")
    """``tradeoff`` (issue 6), ``commit`` (issue 2), issue 3's ``restart``, ``daemon``,
    ``memory``."""
    tradeoff_sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    tradeoff_budget: float = 8.0
    tradeoff_checkpoints: int = 100
    tradeoff_settle: float = 15.0
    restart_history: int = 5_000_000
    """Issue 3: updates committed before the snapshot (history much longer than the state)."""
    restart_keys: int = 1_000_000
    restart_tail: int = 100_000
    restart_repeats: int = 3
    daemon_keys: int = 1_000_000
    daemon_checkpoints: int = 300
    daemon_pairs: int = 2
    memory_keys: tuple[int, ...] = (1_000_000, 10_000_000)
    memory_updates: int = 200_000

    def issue3(self) -> Issue3Config | None:
        """Issue 3's part of the plan, or None if none of its parts is selected."""
        parts = tuple(p for p in self.parts if p in PARTS)
        if not parts:
            return None
        return Issue3Config(
            restart_keys=self.restart_keys,
            restart_tail=self.restart_tail,
            restart_repeats=self.restart_repeats,
            restart_history=self.restart_history,
            daemon_keys=self.daemon_keys,
            daemon_checkpoints=self.daemon_checkpoints,
            daemon_pairs=self.daemon_pairs,
            memory_keys=self.memory_keys,
            memory_updates=self.memory_updates,
            updates=self.updates,
            parts=parts,
            seed=self.seed,
        )

    def json_count(self, keys: int) -> int:
        if self.json_checkpoints is not None:
            return self.json_checkpoints
        if self.mode == "quick":
            return 10
        return 50 if keys <= 10_000 else 30 if keys <= 100_000 else 15

    def specs(self, base_dir: str | None) -> list[RunSpec]:
        out = []
        for keys in self.sizes:
            for name, count in (
                (JsonSnapshotStrategy.name, self.json_count(keys)),
                (StatelogStrategy.name, self.statelog_checkpoints),
            ):
                warmup = min(self.warmup, 2) if name == JsonSnapshotStrategy.name else self.warmup
                out.append(RunSpec(name, keys, self.updates, count, warmup, self.seed, base_dir))
        return out


QUICK = Plan(
    "quick",
    (10_000, 100_000),
    statelog_checkpoints=20,
    json_checkpoints=5,
    profile_commits=10,
    restart_keys=100_000,
    restart_tail=10_000,
    restart_history=500_000,
    daemon_keys=100_000,
    daemon_checkpoints=60,
    daemon_pairs=1,
    memory_keys=(100_000,),
    tradeoff_sizes=(10_000, 100_000),
    tradeoff_budget=0.6,
    tradeoff_checkpoints=20,
    tradeoff_settle=1.0,
)
FULL = Plan(
    "full",
    (10_000, 100_000, 1_000_000),
    statelog_checkpoints=300,
    profile_commits=50,
    restart_repeats=5,
    daemon_checkpoints=500,
)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(plan: Plan, base_dir: str | None) -> tuple[list[RunResult], list[Breakdown]]:
    """Measure every spec of ``plan`` in a fresh process each, then profile statelog's commit.

    The profile runs at the smallest and the largest size, so the report can
    show which steps grow with the state.
    """
    results: list[RunResult] = []
    for spec in plan.specs(base_dir):
        _log(
            f"[bench] {spec.strategy} at {spec.state_keys:,} keys: "
            f"{spec.checkpoints} checkpoints of {spec.updates:,} updates ..."
        )
        try:
            result = measure_isolated(spec)
        except Exception as exc:  # one failed run must not lose the others' numbers
            _log(f"[bench]   FAILED: {exc!r}")
            continue
        s = result.summary()
        _log(
            f"[bench]   p50 {s.p50 * 1e3:.2f} ms, p99 {s.p99 * 1e3:.2f} ms, "
            f"{s.updates_per_s:,.0f} updates/s, {s.bytes_per_checkpoint:,.0f} B/checkpoint "
            f"(load {result.load_seconds:.1f} s)"
        )
        results.append(result)
    breakdowns: list[Breakdown] = []
    if plan.profile_commits > 0:
        for keys in sorted({min(plan.sizes), max(plan.sizes)}):
            _log(f"[bench] profiling {plan.profile_commits} statelog commits at {keys:,} keys ...")
            try:
                breakdowns.append(
                    profile_isolated(
                        keys, plan.updates, plan.profile_commits, seed=plan.seed, base_dir=base_dir
                    )
                )
            except Exception as exc:  # the profile is optional; the runs above stand
                _log(f"[bench]   profile FAILED: {exc!r}")
    return results, breakdowns


def _profile_misses(tradeoff: Tradeoff, plan: Plan) -> list[str]:
    """pyinstrument of statelog and of each engine it missed a throughput target against."""
    from benchmarks.report_tradeoff import TARGET_FRACTION, missed_throughput
    from benchmarks.tradeoff_profile import profile_isolated, render_profile

    docs = []
    for engine, keys, p50 in missed_throughput(tradeoff):
        n = max(3, min(plan.profile_commits, int(2.0 / max(p50, 1e-3))))
        _log(f"[tradeoff] target missed: pyinstrument on {n} {engine} checkpoints at {keys:,} keys")
        docs.append(profile_isolated(engine, keys, TARGET_FRACTION, n, plan.seed))
    return render_profile(docs) if docs else []


def _loadavg(avg: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in avg)


def _head() -> str:
    """The repository's HEAD commit, short ("" outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip()


def _code_changed(a: str, b: str) -> bool:
    """Whether statelog/ or compactor/ differ between commits ``a`` and ``b`` (True if unsure)."""
    if not a or not b:
        return True
    try:
        proc = subprocess.run(
            ["git", "diff", "--quiet", a, b, "--", "statelog", "compactor"],
            cwd=ROOT,
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return True
    return proc.returncode != 0


def _cpu_pressure() -> str:
    """``some avg60`` and ``avg300`` of /proc/pressure/cpu, e.g. "76% / 78%" ("" if absent)."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return ""
    fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
    try:
        return f"{float(fields['avg60']):.0f}% / {float(fields['avg300']):.0f}%"
    except (KeyError, ValueError):
        return ""


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s.replace("_", "")) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ints: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("sizes must be positive")
    return sizes


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="Durable checkpoints: statelog vs the seed-style full JSON snapshot.",
    )
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_true", help="10k and 100k keys, few repetitions")
    mode.add_argument("--full", action="store_true", help="10k, 100k and 1M keys")
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "benchmarks.md",
        help="report to write (default: docs/benchmarks.md)",
    )
    ap.add_argument("--dir", default=None, help="where stores are created (default: temp dir)")
    ap.add_argument("--sizes", type=_sizes, help="override the state sizes, e.g. 10000,100000")
    ap.add_argument("--updates", type=int, help="updates per checkpoint (default 10000)")
    ap.add_argument("--checkpoints", type=int, help="measured statelog checkpoints per size")
    ap.add_argument("--json-checkpoints", type=int, help="measured JSON checkpoints per size")
    ap.add_argument("--warmup", type=int, help="unmeasured checkpoints first")
    ap.add_argument("--profile-commits", type=int, help="instrumented commits (0: no profile)")
    ap.add_argument("--seed", type=int, help=f"workload seed (default {DEFAULT_SEED})")
    ap.add_argument(
        "--parts",
        type=_parts,
        help=f"comma-separated subset of {','.join(ALL_PARTS)} (default: all)",
    )
    ap.add_argument("--tradeoff-sizes", type=_sizes, help="issue 6: state sizes")
    ap.add_argument("--tradeoff-budget", type=float, help="issue 6: seconds per phase")
    ap.add_argument("--tradeoff-checkpoints", type=int, help="issue 6: max checkpoints per phase")
    ap.add_argument("--tradeoff-settle", type=float, help="issue 6: paced seconds before kill")
    ap.add_argument("--restart-history", type=int, help="issue 3: updates before the snapshot")
    ap.add_argument("--restart-keys", type=int, help="issue 3: state size of the restart")
    ap.add_argument("--restart-tail", type=int, help="issue 3: updates after the snapshot")
    ap.add_argument("--restart-repeats", type=int, help="issue 3: fresh-process restores each")
    ap.add_argument("--daemon-keys", type=int, help="issue 3: state size of the daemon runs")
    ap.add_argument("--daemon-checkpoints", type=int, help="issue 3: measured commits per run")
    ap.add_argument("--daemon-pairs", type=int, help="issue 3: runs per condition")
    ap.add_argument(
        "--memory-keys", type=_sizes, help="issue 3: base sizes for RssAnon, e.g. 1000000"
    )
    ap.add_argument("--memory-updates", type=int, help="issue 3: updates buffered in the overlay")
    ap.add_argument("--remote-keys", type=int, help="issue 7: keys of the store restored")
    ap.add_argument("--remote-seconds", type=float, help="issue 7: seconds of shipping under load")
    return ap


ALL_PARTS = ("tradeoff", "commit", *PARTS, "remote")


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in parts if p not in ALL_PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"parts are {', '.join(ALL_PARTS)}; got {text!r}")
    return parts


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(args_list)
    plan = QUICK if args.quick else FULL
    overrides = {
        "sizes": args.sizes,
        "updates": args.updates,
        "statelog_checkpoints": args.checkpoints,
        "json_checkpoints": args.json_checkpoints,
        "warmup": args.warmup,
        "profile_commits": args.profile_commits,
        "seed": args.seed,
        "parts": args.parts,
        "tradeoff_sizes": args.tradeoff_sizes,
        "tradeoff_budget": args.tradeoff_budget,
        "tradeoff_checkpoints": args.tradeoff_checkpoints,
        "tradeoff_settle": args.tradeoff_settle,
        "restart_history": args.restart_history,
        "restart_keys": args.restart_keys,
        "restart_tail": args.restart_tail,
        "restart_repeats": args.restart_repeats,
        "daemon_keys": args.daemon_keys,
        "daemon_checkpoints": args.daemon_checkpoints,
        "daemon_pairs": args.daemon_pairs,
        "memory_keys": args.memory_keys,
        "memory_updates": args.memory_updates,
    }
    plan = replace(plan, **{k: v for k, v in overrides.items() if v is not None})
    if "commit" in plan.parts and plan.updates > min(plan.sizes):
        _parser().error(f"--updates {plan.updates} is larger than the smallest state size")

    started = dt.datetime.now(dt.UTC)
    head_before = _head()
    load_before, psi_before = os.getloadavg(), _cpu_pressure()
    t0 = time.perf_counter()
    tradeoff: Tradeoff | None = None
    if "tradeoff" in plan.parts:
        tradeoff = run_tradeoff(
            TradeoffConfig(
                sizes=plan.tradeoff_sizes,
                budget=plan.tradeoff_budget,
                max_checkpoints=plan.tradeoff_checkpoints,
                seed=plan.seed,
                settle=plan.tradeoff_settle,
            ),
            args.dir,
            _log,
        )
    tradeoff_profile = _profile_misses(tradeoff, plan) if tradeoff is not None else []
    results, breakdowns = run(plan, args.dir) if "commit" in plan.parts else ([], [])
    issue3: Issue3 | None = None
    cfg = plan.issue3()
    if cfg is not None:
        issue3 = run_issue3(cfg, args.dir, _log)
    machine = machine_info(Path(args.dir or tempfile.gettempdir()))
    head_after = _head()
    if head_before != head_after:
        changed = _code_changed(head_before, head_after)
        machine["source"] += (
            f" (HEAD moved from {head_before or '?'} to {head_after or '?'} during the run; "
            + (
                "statelog/ or compactor/ changed: earlier parts ran the older code)"
                if changed
                else "statelog/ and compactor/ are the same in both)"
            )
        )
    load_after, psi_after = os.getloadavg(), _cpu_pressure()
    machine["load average (1, 5, 15 min)"] = (
        f"{_loadavg(load_before)} at the start, {_loadavg(load_after)} at the end"
    )
    if psi_before or psi_after:
        machine["CPU pressure (/proc/pressure/cpu, some avg60/avg300)"] = (
            f"{psi_before or '-'} at the start, {psi_after or '-'} at the end: the share of "
            "time some runnable task waited for a core"
        )
    report = Report(
        command=python_command(["benchmarks/run.py", *args_list]),
        mode=plan.mode,
        results=results,
        breakdowns=breakdowns,
        machine=machine,
        started=started,
        seconds=time.perf_counter() - t0,
        issue3=issue3,
        tradeoff=tradeoff,
        tradeoff_profile=tradeoff_profile,
    )
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    if tradeoff is not None and tradeoff.cells:
        from benchmarks.report_tradeoff import write_plots

        report = replace(report, plots=write_plots(tradeoff, out.parent))
    previous = out.read_text() if out.exists() else ""
    out.write_text(render(report))
    _remote_section(plan, out, previous, args.remote_keys, args.remote_seconds)
    _log(f"[bench] wrote {out} in {report.seconds:.0f} s")
    return 0


def _remote_section(
    plan: Plan, out: Path, previous: str, keys: int | None, seconds: float | None
) -> None:
    """Issue 7's table: measured now (part ``remote``), or carried over from the old report."""
    from benchmarks.remote import END, START

    if "remote" in plan.parts:
        quick = plan.mode == "quick"
        keys = keys or (100_000 if quick else 1_000_000)
        seconds = seconds or (5.0 if quick else 10.0)
        cmd = [sys.executable, "benchmarks/remote.py", "--keys", str(keys)]
        cmd += ["--seconds", f"{seconds:g}"]
        _log(f"[bench] remote tier: {' '.join(cmd[1:])}")
        done = subprocess.run([*cmd, "--report", str(out)], cwd=ROOT, check=False)
        if done.returncode == 0:
            return
        _log(f"[bench] remote tier failed with status {done.returncode}; old table kept")
    if START in previous and END in previous:
        kept = START + previous.split(START, 1)[1].split(END, 1)[0] + END
        out.write_text(out.read_text().rstrip("\n") + "\n\n" + kept + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
