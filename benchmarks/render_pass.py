"""The report's section on what a compaction pass costs against the state's size
(``bench_pass_scale.py``). Every number comes from the suite ``pass-scale``; without
it the section is empty."""

from __future__ import annotations

from statistics import median

from .conftest import size_id
from .render_text import Doc, ratio, size, suite, table

__all__ = ["overlay_section", "pass_section", "sustained_section"]

KINDS = {
    "delta": "delta pass, the first after the full snapshot",
    "full": "full pass (`max_chain=0`: the whole state rewritten)",
    "delta-later": "delta pass after another in the same process",
}


def _med(r: Doc, key: str) -> float:
    return float(median(x[key] for x in r["rounds"]))


def pass_section(doc: Doc) -> list[str]:
    runs = {(r["keys"], r["kind"]): r for r in suite(doc, "pass-scale")}
    if not runs:
        return []
    keys = sorted({k for k, _ in runs})
    rows = []
    for (k, kind), r in sorted(runs.items()):
        s = [x["seconds"] for x in r["rounds"]]
        rows.append(
            f"{size_id(k)} | {KINDS.get(kind, kind)} | {r['tail_updates']:,} | "
            f"{median(s):.3f} | {min(s):.3f}-{max(s):.3f} | {_med(r, 'cpu_seconds'):.3f} | "
            f"{size(int(_med(r, 'written_bytes')))} | {size(int(_med(r, 'log_bytes')))} | "
            f"{size(int(_med(r, 'bytes_read')))}"
        )
    out = [
        "## What one compaction pass costs against the state's size",
        "Each round: a clone of a store of that many keys with one full snapshot, the "
        "same-sized tail of random updates committed in 10 checkpoints, then one pass; "
        "3 rounds per cell (medians; CPU s is `time.process_time`). The first pass after "
        "a full snapshot also deletes the log before it, so it hashes that full snapshot "
        "again (so that a bad one is never all that is left): once per full snapshot, a "
        "read of the state's size, made in a thread beside the fold (CPU s counts it). "
        "*After another in the same process*: the "
        "round first folds another tail of the same size, untimed, as a daemon's passes "
        "follow one another.",
        table(
            "keys | pass | tail updates | median s | range s | CPU s | snapshot written | "
            "log folded | bytes read",
            rows,
            "rlrrrrrrr",
        ),
    ]
    if len(keys) > 1:
        lo, hi = keys[-2], keys[-1]
        lines = []
        for kind in KINDS:
            a, b = runs.get((lo, kind)), runs.get((hi, kind))
            if a is None or b is None:
                continue
            t = ratio(_med(b, "seconds"), _med(a, "seconds"))
            w = ratio(_med(b, "written_bytes"), _med(a, "written_bytes"))
            lines.append(
                f"- {KINDS[kind]}: {size_id(hi)} keys against {size_id(lo)} keys: "
                f"{t:.2f}x the time, {w:.2f}x the bytes written."
            )
        out += ["\n".join(lines)]
    return out


def sustained_section(doc: Doc) -> list[str]:
    """The sustained-load suite: bytes per checkpoint, throughput, the writer's RssAnon."""
    # One row per size and bound: a later results file's run replaces an earlier one's.
    latest = {
        (r["keys"], r.get("max_overlay_bytes") or 0, r.get("compactor_interval", 1.0)): r
        for r in suite(doc, "sustained")
    }
    runs = [latest[k] for k in sorted(latest)]
    if not runs:
        return []
    rows, mem = [], []
    for r in runs:
        n = max(1, r["checkpoints"])
        log, comp = r["writer_bytes"] / n, r["compactor_bytes"] / n
        bound = r.get("max_overlay_bytes")
        cap = "none" if bound is None else size(bound)
        if r.get("compactor_interval", 1.0) != 1.0:
            cap += f", passes {r['compactor_interval']:g} s apart"
        # The store's time: the run's, less making the workload's data (older runs: 0).
        wall = r["seconds"] - r.get("generate_seconds", 0.0)
        cpu = r["writer_cpu_seconds"] - r.get("generate_cpu_seconds", 0.0)
        stalled = f"{r.get('stall_seconds', 0.0) / wall:.0%}"
        rows.append(
            f"{size_id(r['keys'])} | {cap} | {r['seconds']:.0f} | {r['checkpoints']:,} | "
            f"{r.get('generate_seconds', 0.0):.0f} | "
            f"{r['updates'] / wall:,.0f} | {r['updates'] / cpu:,.0f} | "
            f"{size(log)} | {size(comp)} | {ratio(log + comp, log):.2f}x | {r['snapshots']} | "
            f"{r['newest_depth']} | {stalled}"
        )
        anon = [x["rss_anon"] for x in r["samples"]]
        later = [x["rss_anon"] for x in r["samples"] if x["t"] >= 60] or anon
        mem.append(
            f"{size_id(r['keys'])} | {cap} | {size(anon[0])} | {size(max(later))} | "
            f"{size(anon[-1])}"
        )
    return [
        "## Sustained checkpoints with the compactor running",
        "A clone of a compacted store of that many keys; checkpoints of 10,000 random "
        'updates (`durability="commit"`) back to back for the time shown, the compactor a '
        "child process (8 MiB segments, an 8 MiB tail trigger, a pass every second unless "
        "the bound says otherwise, and one as soon as a segment is sealed). Bytes "
        "are `/proc/<pid>/io` `write_bytes`: the writer's are the log's, the compactor's "
        "are its snapshots, images and scratch. *Overlay bound* is the writer's "
        "`max_overlay_bytes` (none: unbounded); *stalled* is the share of the commits' "
        "time spent waiting for the compactor at that bound. Updates/s leave out "
        "*making data*, the seconds the loop spent making the checkpoints' random values "
        "(the trade-off table likewise times only its checkpoints): on wall time, and on "
        "the writer's CPU less its main thread's while it made them.",
        table(
            "keys | overlay bound | s | checkpoints | making data s | updates/s (wall) | "
            "updates/s (writer CPU) | log bytes / checkpoint | compactor bytes / checkpoint | "
            "all / log | snapshots left | newest chain depth | stalled",
            rows,
            "rrrrrrrrrrrrr",
        ),
        "The writer's RssAnon: after the open, the largest sample from the first minute on, "
        "and at the end of the run.",
        table(
            "keys | overlay bound | RssAnon at open | largest after 60 s | at the end",
            mem,
            "rrrrr",
        ),
    ]


def overlay_section(doc: Doc) -> list[str]:
    """The overlay suite: a read's walk and a merge's cost against the generations held."""
    runs = sorted(suite(doc, "overlay"), key=lambda r: (r["keys"], r["generations"]))
    if not runs:
        return []
    rows = [
        f"{size_id(r['keys'])} | {r['generations']} | {r['entries']:,} | "
        f"{r['stats']['median'] / r['probes'] * 1e9:,.0f} | {r['found']:.0%} | "
        f"{r['absent_ns']:,.0f} | {r['merge_ms']:.1f}"
        for r in runs
    ]
    return [
        "## The writer's overlay: reads and merges against the generations it holds",
        "The overlay holds one generation per log segment written since the base in use "
        "(a dict per table); a read walks them newest first, and a read that finds more "
        "than `MAX_GENERATIONS` first merges the adjacent sealed pair holding the fewest "
        "entries. Each row: a `LiveState` over an empty base "
        "holding that many generations of that many random keys of the workload each "
        "(one 8 MiB segment of the sustained load holds about 60,000); a `get` of each of "
        "100,000 random keys (median of 5 rounds; *found*: the share some generation "
        "holds, the rest walk every one), a `get` of keys no generation holds (best of 3), "
        "and the read after a roll past that many, which merges the smallest pair: two "
        "generations of that many entries, whatever their count (median of 3 in a row). "
        "Keys read are fresh `str` objects and every value a distinct `bytes`, as a "
        "caller's and a commit's are.",
        table(
            "keys | generations | entries each | get, random key ns | found | "
            "get, absent key ns | merge ms",
            rows,
            "rrrrrrr",
        ),
    ]
