"""The report's section on what a compaction pass costs against the state's size
(``bench_pass_scale.py``). Every number comes from the suite ``pass-scale``; without
it the section is empty."""

from __future__ import annotations

from statistics import median

from .conftest import size_id
from .render_text import Doc, ratio, size, suite, table

__all__ = ["pass_section"]

KINDS = {
    "delta": "delta pass (default chain policy)",
    "full": "full pass (`max_chain=0`: the whole state rewritten)",
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
        "",
        "Each round: a clone of a store of that many keys with one full snapshot, the "
        "same-sized tail of random updates committed in 10 checkpoints, then one pass; "
        "3 rounds per cell (medians; CPU s is `time.process_time`).",
        "",
        table(
            "keys | pass | tail updates | median s | range s | CPU s | snapshot written | "
            "log folded | bytes read",
            rows,
            "rlrrrrrrr",
        ),
    ]
    if len(keys) > 1:
        lo, hi = keys[0], keys[-1]
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
        out += ["", *lines]
    return out
