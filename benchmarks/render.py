"""Turn the ``--benchmark-json`` file of the suites into ``docs/benchmarks.md`` and its plots.

    python -m benchmarks.render RESULTS.json [--out docs/benchmarks.md]

Every number and judgement comes from that file: the machine as the run measured it, the
suites' ``extra_info``, the targets judged *met*, *missed* or *inconclusive* (wall and CPU
ratios disagree). An existing report's ``previous-full`` section is carried over unless
this run was a full-size one.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from statistics import median

from .conftest import LARGE, size_id
from .plots import anchors_plot, plots
from .probe import percentile
from .render_anchors import anchors_section
from .render_build import build_section
from .render_engines import engines_section
from .render_pass import overlay_section, pass_section, sustained_section
from .render_pit import pit_section
from .render_standby import standby_section
from .render_text import Doc, ms, rate, ratio, size, table
from .render_text import suite as _suite
from .strategies import DESCRIPTIONS

__all__ = ["KEEP_END", "KEEP_START", "main", "phase_stats", "render"]

KEEP_START, KEEP_END = "<!-- previous-full:start -->", "<!-- previous-full:end -->"
TARGETS = (("rocksdb", 3.0), ("sqlite", 30.0), ("json", 300.0))
"""statelog commit must reach this multiple of the other's updates/s (1M keys, 1% dirty)."""
RECOVERY_GOAL = 20.0
RESTART_SCALE = 2.0
"""A restart at the largest size must take less than this multiple of the 1M-key one."""
TARGET_KEYS = 1_000_000
RESTORES = {"snapshot": "(a) statelog: newest snapshot + log tail"}
RESTORES["replay"] = "(b) statelog: the whole log replayed, no snapshot"
RESTORES["json"] = "(c) JSON snapshot: read, sha256, json.loads"


def verdict(wall: float, cpu: float, goal: float) -> str:
    """*met* when the wall and CPU ratios both reach ``goal``, *missed* when neither does."""
    ok = [r >= goal for r in (wall, cpu)]
    return "**met**" if all(ok) else "**missed**" if not any(ok) else "**inconclusive**"


def phase_stats(phase: Doc) -> Doc:
    """p50, p99, CPU p50, sustained updates/s (final flush included), bytes per checkpoint."""
    walls, cpus = phase["walls"], phase["cpus"]
    spent = sum(walls) + phase["finish"]
    return {
        "p50": percentile(walls, 50),
        "p99": percentile(walls, 99),
        "cpu_p50": percentile(cpus, 50),
        "rate": phase["updates"] * len(walls) / spent if spent > 0 else float("nan"),
        "bytes": phase["bytes_written"] / max(1, phase["checkpoints_total"]),
        "n": len(walls),
    }


def _cells(doc: Doc) -> dict[tuple[int, str], Doc]:
    cells = {(c["keys"], c["strategy"]): c for c in _suite(doc, "tradeoff")}
    return dict(sorted(cells.items(), key=lambda kv: kv[0][0]))


def _at(cell: Doc | None, fraction: float = 0.01) -> Doc | None:
    phases = cell["worker"]["phases"] if cell else []
    return next((phase_stats(p) for p in phases if p["fraction"] == fraction), None)


def _target_keys(cells: dict[tuple[int, str], Doc]) -> int:
    """The size the throughput targets are judged at: 1M keys if measured, else the largest."""
    sizes = {k for k, _ in cells}
    return TARGET_KEYS if TARGET_KEYS in sizes else max(sizes, default=0)


def _restarts(doc: Doc) -> dict[int, dict[str, Doc]]:
    """keys -> restore kind -> the restart suite's result."""
    out: dict[int, dict[str, Doc]] = {}
    for r in _suite(doc, "restart"):
        out.setdefault(r["keys"], {})[r["kind"]] = r
    return dict(sorted(out.items()))


def _restart_rows(doc: Doc) -> list[str]:
    rows, snap = [], {}
    for keys, runs in _restarts(doc).items():
        if "snapshot" not in runs or "replay" not in runs:
            continue
        a, b = runs["snapshot"], runs["replay"]
        sa, sb = median(a["seconds"]), median(b["seconds"])
        snap[keys] = (sa, median(a["cpu_seconds"]))
        wall, cpu = ratio(sb, sa), ratio(median(b["cpu_seconds"]), snap[keys][1])
        rows.append(
            f"restart vs full replay, {size_id(keys)} keys | >= {RECOVERY_GOAL:g}x faster than "
            f"replaying the whole log | {wall:.1f}x ({sb:.3f} s vs {sa:.3f} s); CPU {cpu:.1f}x "
            f"| {verdict(wall, cpu, RECOVERY_GOAL)}"
        )
    big = [k for k in snap if k > TARGET_KEYS]
    if TARGET_KEYS in snap and big:
        (lo, lo_cpu), (hi, hi_cpu) = snap[TARGET_KEYS], snap[big[-1]]
        wall, cpu = ratio(hi, lo), ratio(hi_cpu, lo_cpu)
        ok = [x < RESTART_SCALE for x in (wall, cpu)]
        status = "**met**" if all(ok) else "**missed**" if not any(ok) else "**inconclusive**"
        rows.append(
            f"restart at {size_id(big[-1])} keys vs at 1M keys | < {RESTART_SCALE:g}x the time "
            f"(same tail) | {wall:.2f}x ({hi:.3f} s vs {lo:.3f} s); CPU {cpu:.2f}x | {status}"
        )
    return rows


def targets_section(doc: Doc) -> list[str]:
    cells = _cells(doc)
    keys = _target_keys(cells)
    note = "" if keys >= 1_000_000 else f" at {size_id(keys)} keys (the goal is stated at 1M)"
    mine, rows = _at(cells.get((keys, "statelog"))), []
    for other, goal in TARGETS:
        theirs = _at(cells.get((keys, other)))
        head = f"statelog commit vs {other} | >= {goal:g}x the updates/s at 1M keys, 1% dirty"
        if mine is None or theirs is None:
            rows.append(f"{head} | - | not measured in this run")
            continue
        wall, cpu = ratio(mine["rate"], theirs["rate"]), ratio(theirs["cpu_p50"], mine["cpu_p50"])
        rows.append(
            f"{head} | {wall:.1f}x ({rate(mine['rate'])} vs {rate(theirs['rate'])}); "
            f"CPU p50 ratio {cpu:.1f}x | {verdict(wall, cpu, goal)}{note}"
        )
    rows += _restart_rows(doc)
    return [
        "## Targets",
        table("target | goal | measured | status", rows, "llll"),
        "Throughput ratios use the sustained updates/s on wall time; the CPU p50 ratio does "
        "not count waiting for a core. A verdict is *met* or *missed* when both ratios agree, "
        "else *inconclusive*.",
    ]


def tradeoff_section(doc: Doc) -> list[str]:
    cells, run = _cells(doc), doc["statelog"]["sizes"]
    if not cells:
        return []
    sizes = sorted({k for k, _ in cells})
    summary = [k for k in sizes if k >= TARGET_KEYS] or sizes[-1:]
    fractions = ", ".join(f"{f:.1%}" for f in run["fractions"])
    out = [
        "## Durability strategy trade-off ("
        + " and ".join(size_id(k) for k in summary)
        + " keys, 1% dirty)",
        "Each strategy loaded the same seeded state in its own process, "
        f"took back-to-back checkpoints at each dirty fraction ({fractions}; about "
        f"{run['budget']:g} s each), then one 1%-dirty checkpoint every 250 ms for "
        f"{run['settle']:g} s, was killed with SIGKILL (its process group), and recovered in a "
        "fresh interpreter, which had to find the acknowledged offsets, watermark and every key.",
    ]
    for extra in doc["statelog"].get("extra_runs", []):
        other = extra["sizes"]
        if extra["size"] != doc["statelog"]["size"] and "tradeoff" in extra["command"]:
            out[-1] += (
                f" Cells from the `--bench-size {extra['size']}` run took about "
                f"{other['budget']:g} s per dirty fraction and {other['settle']:g} s of paced "
                "checkpoints."
            )
            break
    rows = []
    for (k, name), c in cells.items():
        s, rec = _at(c), c["recovery"]
        if k in summary and s is not None:
            label, guarantee = DESCRIPTIONS.get(name, (name, "-"))
            n = rec["replayed"]
            what = f"{n:,} updates replayed" if n else "nothing replayed"
            rows.append(
                f"{size_id(k)} | {label} | {rec['seconds']:.3f} s, {what} | "
                f"{ms(s['p50'])} / {ms(s['p99'])} ms, "
                f"{rate(s['rate'])} | {size(s['bytes'])} | {guarantee} "
                f"| {size(c['worker']['peak_rss'])} | {size(c['disk'])}"
            )
    head = "keys | strategy | recovery (after SIGKILL) | checkpoint p50 / p99, updates/s | "
    head += "bytes written / checkpoint | consistency guarantee | peak RSS | disk"
    out.append(table(head, rows, "rlllllrr"))
    if sizes[-1] > run.get("json_keys", sizes[-1]):
        out.append(
            f"Above {run['json_keys']:,} keys only {', '.join(LARGE)} ran: the others rewrite "
            "the whole state per checkpoint (JSON, SQLite at this dirty fraction) or replay "
            "everything on recovery, hours at 10M keys (earlier full-size figures for them at "
            "1M keys are at the end of this report)."
        )
    rows = [
        f"{size_id(k)} | {p['fraction']:.1%} | {name} | {s['n']} | {ms(s['p50'])} | "
        f"{ms(s['p99'])} | {ms(s['cpu_p50'])} | {rate(s['rate'])} | {size(s['bytes'])}"
        for (k, name), c in cells.items()
        for p in c["worker"]["phases"]
        if (s := phase_stats(p))
    ]
    head = "keys | dirty | strategy | checkpoints | p50 ms | p99 ms | CPU p50 ms | updates/s | "
    out.append("### Every size and dirty fraction")
    out.append(table(head + "bytes / checkpoint", rows, "rrlrrrrrr"))
    rows = [
        f"{size_id(k)} | {name} | {r['seconds']:.3f} | {r['cpu_seconds']:.3f} | "
        f"{r['replayed']:,} | {size(r['peak_rss'])} | {size(c['worker']['peak_rss'])} | "
        f"{size(c['disk'])} | {r['detail'] or '-'}"
        for (k, name), c in cells.items()
        if (r := c["recovery"])
    ]
    head = "keys | strategy | recovery s | CPU s | updates replayed | peak RSS (recovery) | "
    out.append("### Recovery after SIGKILL")
    head += "peak RSS (worker) | disk after the crash | recovered from"
    out.append(table(head, rows, "rl" + "r" * 6 + "l"))
    return [
        *out,
        "*updates/s*: updates over the summed checkpoint time plus the final flush. *bytes "
        "written*: `write_bytes` of `/proc/<pid>/io` of the worker and its children over the "
        "phase, warm-up included, per checkpoint, the source log's own bytes subtracted. "
        "*disk*: allocated size after the crash, the source log excluded.",
    ]


def commit_section(doc: Doc) -> list[str]:
    runs = sorted(_suite(doc, "commit"), key=lambda r: r["keys"])
    if not runs:
        return []
    base = {r["keys"]: r["stats"]["median"] for r in runs if r["strategy"] == "statelog"}
    rows = [
        f"{size_id(r['keys'])} | {r['strategy']} | {st['rounds']} | {ms(st['median'])} | "
        f"{ms(st['max'])} | {ms(r['cpu_p50'])} | {rate(r['updates'] / st['median'])} | "
        f"{size(r['bytes_per_checkpoint'])} | "
        + (f"{ratio(st['median'], base[r['keys']]):.1f}x" if r["keys"] in base else "-")
        for r in runs
        if (st := r["stats"])
    ]
    head = "keys | strategy | rounds | p50 ms | max ms | CPU p50 ms | updates/s at p50 | "
    out = [
        "## Checkpoint cost by state size (one process, no compactor)",
        f"Each round is one durable checkpoint of {runs[0]['updates']:,} updates "
        "(pytest-benchmark `pedantic`; the data is made outside the timed span).",
        table(head + "bytes written / checkpoint | p50 vs statelog", rows, "rlrrrrrrr"),
    ]
    sizes = sorted(base)
    if len(sizes) > 1:
        lo, hi = base[sizes[0]], base[sizes[-1]]
        out.append(
            f"statelog's p50 goes from {ms(lo)} ms at {size_id(sizes[0])} keys to {ms(hi)} ms "
            f"at {size_id(sizes[-1])} keys ({ratio(hi, lo):.2f}x)."
        )
    return out


def restart_section(doc: Doc) -> list[str]:
    out = []
    for keys, runs in _restarts(doc).items():
        r0 = next(iter(runs.values()))
        a = median(runs["snapshot"]["seconds"]) if "snapshot" in runs else float("nan")
        rows = [
            f"{RESTORES[kind]} | {median(r['seconds']):.3f} | {min(r['seconds']):.3f}-"
            f"{max(r['seconds']):.3f} | {median(r['cpu_seconds']):.3f} | "
            f"{ratio(median(r['seconds']), a):.1f}x | {size(r['rss_anon'])} | "
            f"{r['replayed_commits']}"
            for kind, r in runs.items()
        ]
        json = r0.get("json_bytes")
        json_note = (
            f", the JSON snapshot {size(json)}" if json else " (no JSON restore at this size)"
        )
        head = "restore | median s | range s | CPU s | vs (a) | RssAnon after | commits replayed"
        out += [
            f"### {size_id(keys)} keys",
            f"State: {keys:,} keys in one snapshot after {r0['history_updates']:,} updates of "
            f"history; then a writer committed a {r0['tail_updates']:,}-update tail and was "
            f"killed with SIGKILL. The whole log is {size(r0['log_bytes'])}, the tail after the "
            f"snapshot {size(r0['tail_bytes'])} ({ratio(r0['log_bytes'], r0['tail_bytes']):.1f}x)"
            f"{json_note}. Each restore ran {len(r0['seconds'])} time(s), each in a fresh "
            "interpreter, with the files in the page cache.",
            table(head, rows, "lrrrrrr"),
        ]
    return ["## Restart after SIGKILL", *out] if out else []


def compaction_section(doc: Doc) -> list[str]:
    out: list[str] = []
    for p in _suite(doc, "compaction"):
        st = p["stats"]
        out += [
            "## Compaction",
            f"A pass folding a {p['tail_updates']:,}-update tail into a {p['keys']:,}-key "
            f"snapshot: median {st['median']:.3f} s over {st['rounds']} rounds (range "
            f"{st['min']:.3f}-{st['max']:.3f} s), writing a {size(p['snapshot_bytes'])} snapshot.",
        ]
    by = {r["daemon"]: r for r in _suite(doc, "daemon")}
    rows = [
        ("with the daemon" if d else "without")
        + f" | {len(r['walls'])} | {ms(percentile(r['walls'], 50))} | "
        f"{ms(percentile(r['walls'], 99))} | {ms(max(r['walls']))} | "
        f"{ms(percentile(r['cpus'], 50))} | "
        + (f"{r['snapshots']} | {r['daemon_status']} | {r['errors']}" if d else "- | - | -")
        for d, r in sorted(by.items())
    ]
    if rows:
        head = "condition | commits | p50 ms | p99 ms | max ms | thread CPU p50 ms | "
        head += "snapshots written meanwhile | daemon exit status | ERROR lines"
        out += ["### Commit latency with the compaction daemon", table(head, rows, "l" + "r" * 8)]
    if len(by) == 2:
        w, wo = (percentile(by[d]["walls"], 99) for d in (True, False))
        out += [f"p99 with the daemon / p99 without: {ratio(w, wo):.2f}x."]
    return out


def memory_section(doc: Doc) -> list[str]:
    rows = [
        f"{size_id(r['keys'])} | {size(r['snapshot_bytes'])} | {size(r['rss_anon_before'])} | "
        f"{size(r['rss_anon_open'])} | {size(r['rss_file_open'])} | {r['open_seconds']:.3f} | "
        f"{r['updates']:,} | {size(r['rss_anon_updated'])} | "
        f"{size((r['rss_anon_updated'] - r['rss_anon_open']) / r['updates'])}"
        for r in sorted(_suite(doc, "memory"), key=lambda r: r["keys"])
    ]
    if not rows:
        return []
    head = "base keys | snapshot | RssAnon before open | RssAnon after open | RssFile after open "
    head += "| open s | updates | RssAnon after them | per update"
    return [
        "## Memory: a file-backed base, and the overlay",
        "The writer in a fresh interpreter opens a store whose whole state is in one snapshot, "
        "then rewrites existing keys (`/proc/self/status` after `gc.collect()`).",
        table(head, rows, "r" * 9),
    ]


def remote_section(doc: Doc) -> list[str]:
    rows = []
    for g in _suite(doc, "remote-lag"):
        rows += [
            f"commits (100 puts each) | {g['commits']:,}",
            f"lag before a ship, bytes p50 / max | {g['lag_bytes_p50']:,} / {g['lag_bytes_max']:,}",
            f"lag before a ship, seconds p50 / max | {g['lag_seconds_p50']:.2f} / "
            f"{g['lag_seconds_max']:.2f}",
            f"bytes uploaded per checkpoint | {g['bytes_uploaded'] / max(1, g['commits']):,.0f}",
        ]
    for r in _suite(doc, "remote-restore"):
        med, after = r["stats"]["median"], r["open_after_restore_seconds"]
        rows += [
            f"store of {r['keys']:,} keys: bytes shipped | {r['bytes_shipped']:,}",
            f"first ship, s | {r['first_ship_seconds']:.3f}",
            f"local restart (open), s | {r['local_open_seconds']:.3f}",
            f"restore, s (median of {r['stats']['rounds']}) | {med:.3f}",
            f"open after the restore, s | {after:.3f}",
            f"restore + open vs local restart | {ratio(med + after, r['local_open_seconds']):.1f}x",
        ]
    if not rows:
        return []
    return [
        "## Remote tier: shipping lag, restore, bytes per checkpoint",
        "Against moto's S3 server on loopback, which holds the objects in its memory on the "
        "same host: no network lies between the store and the objects.",
        table("measure | value", rows, "lr"),
    ]


def machine_section(run: Doc) -> list[str]:
    def pressure(m: Doc) -> str:
        p = m.get("cpu_pressure")
        return "not available" if p is None else f"{p[0]:g}% / {p[1]:g}%"

    b, a = run["before"], run["after"]
    la = [" / ".join(f"{x:.2f}" for x in m["loadavg"]) for m in (b, a)]
    rows = [
        f"CPU | {run['cpu']}",
        f"cores | {run['cores']} logical ({run['usable_cores']} usable by this process)",
        f"memory | {size(run['memory_bytes'])}",
        f"kernel | {run['kernel']}",
        f"Python | {run['python']}",
        "libraries | " + ", ".join(f"{k} {v}" for k, v in run["versions"].items()),
        f"load average (1, 5, 15 min) | {la[0]} at the start, {la[1]} at the end",
        f"CPU pressure, some avg60 / avg300 | {pressure(b)} at the start, {pressure(a)} at the end",
    ]
    return ["## Machine", table(" | ", rows, "ll")]


def render(doc: Doc, out_dir: Path, kept: str = "") -> str:
    """The whole report; the plots go to ``out_dir``. ``kept``: a previous-full section."""
    run = doc["statelog"]
    when = datetime.fromisoformat(run["started"]).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Benchmarks: statelog against the durability strategies a reconciler could pick",
        "<!-- Generated by benchmarks/render.py from pytest-benchmark's JSON; edit the suites "
        "or the renderer, not this file. -->",
        f"Generated by `{run['command']}` (`--bench-size {run['size']}`) on {when} in "
        f"{run['seconds']:.0f} s, then `python -m benchmarks.render`.",
    ]
    for extra in run.get("extra_runs", []):
        at = datetime.fromisoformat(extra["started"]).strftime("%Y-%m-%d %H:%M UTC")
        out[-1] += (
            f" Cells of `--bench-size {extra['size']}` come from `{extra['command']}`, run on "
            f"{at} in {extra['seconds']:.0f} s on the same machine (1-minute load average "
            f"{extra['before']['loadavg'][0]:.2f} at its start, "
            f"{extra['after']['loadavg'][0]:.2f} at its end)."
        )
    for section in (targets_section, tradeoff_section, commit_section, restart_section):
        out += section(doc)
    for section in (
        compaction_section, pass_section, sustained_section, overlay_section,
        memory_section, remote_section,
        build_section, standby_section, pit_section, engines_section, anchors_section,
    ):  # fmt: skip
        out += section(doc)
    cells = _cells(doc)
    series = {
        "commit": [
            (r["strategy"], r["keys"], r["stats"]["median"] * 1e3) for r in _suite(doc, "commit")
        ]
    }
    series["bytes"] = [(n, k, s["bytes"]) for (k, n), c in cells.items() if (s := _at(c))]
    series["recovery"] = [(n, k, c["recovery"]["seconds"]) for (k, n), c in cells.items()]
    drawn = [*plots(series, out_dir), *anchors_plot(_suite(doc, "anchor_replication"), out_dir)]
    out += ["## Plots", "\n".join(drawn), *machine_section(run)]
    out += [
        "## Reproduce",
        "```\nmake bench-quick   # make bench: the full sizes\n"
        "python -m pytest benchmarks/ --bench-size quick --benchmark-json=.benchmarks/quick.json\n"
        "python -m benchmarks.render .benchmarks/quick.json --out docs/benchmarks.md\n"
        "# one suite at the full sizes, its cells added to the report:\n"
        "python -m pytest benchmarks/bench_pass_scale.py --bench-size full "
        "--benchmark-json=.benchmarks/pass-full.json\n"
        "python -m benchmarks.render .benchmarks/quick.json .benchmarks/pass-full.json "
        "--out docs/benchmarks.md\n```",
    ]
    if kept and run["size"] != "full":
        out.append(kept.strip())
    return "\n\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Render docs/benchmarks.md from the suites' JSON.")
    ap.add_argument(
        "results",
        type=Path,
        nargs="+",
        help="the --benchmark-json file of the suites; more files add their cells "
        "(a full-size run of one suite, say), the first file's run describes the report",
    )
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = ap.parse_args(argv)
    old = args.out.read_text() if args.out.exists() else ""
    kept = ""
    if KEEP_START in old and KEEP_END in old:
        kept = KEEP_START + old.split(KEEP_START, 1)[1].split(KEEP_END, 1)[0] + KEEP_END
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(args.results[0].read_text())
    for more in args.results[1:]:
        other = json.loads(more.read_text())
        doc["benchmarks"] += other["benchmarks"]
        doc["statelog"].setdefault("extra_runs", []).append(other["statelog"])
    args.out.write_text(render(doc, args.out.parent, kept))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
