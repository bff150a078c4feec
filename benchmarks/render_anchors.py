"""The anchors section of ``docs/benchmarks.md`` (``bench_anchors.py``).

One column per side that ran, one row per metric, then one sentence per
metric naming the side that wins it among the sides on the S3 server. A
pure function of the JSON: the same results render the same text.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .render_text import Doc, rate, ratio, size, suite, table

__all__ = ["anchors_section"]

_NAMES = {
    "statelog": "statelog", "statelog-unsampled": "statelog, no sampler",
    "statelog-unshipped": "statelog, not shipped",
    "litestream": "Litestream", "litestream-unsampled": "Litestream, no sampler",
    "slatedb": "SlateDB", "slatedb-local": "SlateDB, local store",
}  # fmt: skip
_ON_S3 = ("statelog", "litestream", "slatedb")
_ACKED = {
    "statelog": "local fsync", "statelog-unsampled": "local fsync",
    "statelog-unshipped": "local fsync (never shipped)",
    "litestream": "local fsync", "litestream-unsampled": "local fsync",
    "slatedb": "in the bucket",
    "slatedb-local": "in its directory, no fsync",
}  # fmt: skip
"""What each side's acknowledgement of a checkpoint means (see ``benchmarks/anchors.py`` and
``benchmarks/anchor_slatedb.py``)."""

_Fmt = Callable[[float], str]


def _secs(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}"


def _count(v: float) -> str:
    return f"{v:,.0f}"


# (row label, result key, format, higher is better or None when no side "wins" it)
_ROWS: tuple[tuple[str, str, _Fmt, bool | None], ...] = (
    ("durable updates/s", "updates_per_s", rate, True),
    ("checkpoints", "checkpoints", _count, None),
    ("lag samples", "lag_samples", _count, None),
    ("lag p50 s", "lag_p50", _secs, None),
    ("lag p99 s", "lag_p99", _secs, False),
    ("lag max s", "lag_max", _secs, None),
    ("bucket bytes", "bucket_bytes", size, False),
    ("bucket bytes per checkpoint", "bytes_per_checkpoint", size, False),
    ("objects", "bucket_objects", _count, None),
    ("objects per hour", "objects_per_hour", _count, False),
    ("restore s", "restore_seconds", _secs, False),
)


def _cell(run: Doc, key: str, fmt: _Fmt) -> str:
    """One side's value; a restore stopped before its end shows as a lower bound."""
    shown = fmt(float(run[key]))
    stopped = key == "restore_seconds" and run.get("restore_complete") is False
    return f"> {shown}" if stopped else shown


def _wins(runs: dict[str, Doc], label: str, key: str, fmt: _Fmt, higher: bool) -> str:
    """Which of the sides on S3 wins ``key``, as shown (equal shown values tie)."""
    sides = [s for s in _ON_S3 if s in runs]
    vals = {s: float(runs[s][key]) for s in sides}
    best = (max if higher else min)(vals.values())
    winners = [s for s in sides if fmt(vals[s]) == fmt(best)]
    rest = [s for s in sides if s not in winners]
    who = " and ".join(_NAMES[s] for s in winners)
    if not rest:
        return f"- {label}: {who} tie at {fmt(best)}."
    runner = (max if higher else min)(vals[s] for s in rest)
    factor = ratio(best, runner) if higher else ratio(runner, best)
    by = f", {factor:.1f}x better than the next" if math.isfinite(factor) else ""
    others = ", ".join(f"{_NAMES[s]} {_cell(runs[s], key, fmt)}" for s in rest)
    verb = "wins" if len(winners) == 1 else "win"
    return f"- {label}: {who} {verb} with {fmt(best)} ({others}){by}."


def _notes(runs: dict[str, Doc]) -> list[str]:
    out = []
    on, off = runs.get("statelog"), runs.get("statelog-unshipped")
    quiet = runs.get("statelog-unsampled")
    if quiet is not None and off is not None:
        share = ratio(quiet["updates_per_s"], off["updates_per_s"])
        out.append(
            f"Shipping on, statelog's durable updates/s were {share:.2f}x those of the same "
            "writer and daemon with nothing shipping, both without a sampler (the columns "
            "*statelog, no sampler* and *statelog, not shipped*), in this run."
        )
    lite, lite_quiet = runs.get("litestream"), runs.get("litestream-unsampled")
    if quiet is not None and lite_quiet is not None:
        both = ratio(quiet["updates_per_s"], lite_quiet["updates_per_s"])
        sampled = ""
        if on is not None and lite is not None:
            sampled = (
                f"; each beside its lag sampler (*statelog* and *Litestream*), "
                f"{ratio(on['updates_per_s'], lite['updates_per_s']):.1f}x"
            )
        out.append(
            f"Without a lag sampler on either side (the columns *statelog, no sampler* and "
            f"*Litestream, no sampler*), statelog's durable updates/s were {both:.1f}x "
            f"Litestream's{sampled}, in this run."
        )
    if quiet is not None and on is not None:
        share = ratio(on["updates_per_s"], quiet["updates_per_s"])
        out.append(
            f"With the lag sampler restoring from the bucket beside it (a restore about once "
            f"a second, on the same two cores), the shipping writer ran at {share:.2f}x its "
            "rate without one: the *statelog* column pays for the lag it reports."
        )
    if on is not None and on.get("restore_tail_commits") is not None:
        also = ""
        if quiet is not None and quiet.get("restore_tail_commits") is not None:
            also = (
                f" (*statelog, no sampler*: {quiet['restore_tail_commits']:,} checkpoints, "
                f"{quiet['restore_seconds']:.2f} s)"
            )
        out.append(
            f"statelog's restore replayed {on['restore_tail_commits']:,} checkpoints of log "
            f"after the snapshot it started from{also}: its time follows that tail, which "
            "depends on where the compactor's last pass (`--interval 5`) fell before the "
            "restore, and on how far the passes fell behind a faster writer."
        )
    elif on is not None:
        out.append(
            "statelog's restore time follows the log tail it replays after its snapshot, "
            "which depends on where the compactor's last pass (`--interval 5`) fell; this "
            "run did not record that tail."
        )
    for s in ("slatedb", "slatedb-local"):
        r = runs.get(s, {})
        if r.get("restore_complete") is False:
            out.append(
                f"{_NAMES[s]}'s restore scan was stopped after {r['restore_seconds']:.0f} s, "
                f"having read {r['restore_keys_read']:,} of {r['keys']:,} keys (all of them "
                "correct): its restore time is a lower bound."
            )
    if "slatedb" in runs:
        out.append(
            "SlateDB's lag is 0 by construction: it acknowledges a checkpoint only once the "
            "bucket holds it, where the other two acknowledge after a local fsync and ship "
            "afterwards (their lag rows)."
        )
    parts = []
    for s, where in (("slatedb", "on S3"), ("slatedb-local", "on its local store")):
        r = runs.get(s, {})
        if r.get("batch_build_seconds") is not None:
            share = ratio(r["batch_build_seconds"], r["seconds"]) * 100
            rest = r["seconds"] - r["batch_build_seconds"]
            engine = ratio(r["updates_per_s"] * r["seconds"], rest)
            parts.append(f"{share:.0f}% of SlateDB's run {where} ({rate(engine)} without it)")
    if parts:
        out.append(
            "Building the write batches (`WriteBatch.put`, one call into SlateDB's Python "
            f"binding per key) took {' and '.join(parts)}."
        )
    return out


def anchors_section(doc: Doc) -> list[str]:
    """statelog shipping to S3 against SQLite with Litestream and against SlateDB."""
    runs = {
        r["system"]: {"bytes_per_checkpoint": r["bucket_bytes"] / max(1, r["checkpoints"]), **r}
        for r in suite(doc, "anchor_replication")
    }
    order = [s for s in _NAMES if s in runs]
    if not order:
        return []
    k = runs[order[0]]
    rows = [
        f"{label} | " + " | ".join(_cell(runs[s], key, fmt) for s in order)
        for label, key, fmt, _ in _ROWS
    ]
    rows.append("acknowledged when | " + " | ".join(_ACKED[s] for s in order))
    head = "metric | " + " | ".join(_NAMES[s] for s in order)
    out = [
        "## The anchors: statelog against SQLite with Litestream and against SlateDB, on S3",
        f"Each side holds {k['keys']:,} keys of 100-byte values and commits durable "
        "checkpoints of 1% of them back to back for the same time, against the same "
        "loopback S3 server (moto, in a process of its own). statelog: "
        '`statelog.open(durability="commit")`, each checkpoint fsynced before it returns, '
        "and `statelog-compactor --remote --max-ship-lag 1s` (the writer seals its segment "
        "once its oldest commit is 0.5 s old, half the bound; the daemon ships every 0.25 s, "
        "each sealed segment one zstd frame); *statelog, no sampler* is the same without "
        "the lag sampler, and *statelog, not shipped* runs the same daemon without "
        "`--remote`, compacting only, also without a sampler. "
        "SQLite: WAL mode, "
        "`synchronous=FULL`, one transaction per checkpoint, `litestream replicate` with a "
        "1 s sync interval; *Litestream, no sampler* is the same without the lag sampler. "
        "SlateDB (its Python binding): one `WriteBatch` per checkpoint, "
        "`db.write(batch)`, then `db.flush_with_options(FlushOptions(flush_type=FlushType.WAL))` "
        "to upload the WAL at once, then `handle.await_durable()`: the checkpoint is in the "
        "bucket when it returns; otherwise SlateDB's default settings. *SlateDB, local store* "
        "is the same on SlateDB's local object store (a directory, written without fsync). "
        "About once a second a sampler in a process of its own (no interpreter shared with "
        "the writer) restores from the bucket (SlateDB: opens a fresh "
        "reader) and reads the newest checkpoint there; the *lag* is how long the oldest "
        "acknowledged checkpoint the bucket lacked had waited (0 when it had them all). "
        "After the run: what the bucket holds, and a timed restore of the whole state "
        "(SlateDB: a fresh reader scanning every key), its content checked. *objects per "
        "hour* extrapolates the objects present at the end over the run; each deletes "
        "superseded objects on its own schedule (SlateDB's garbage collector nothing younger "
        "than 300 s). Every side compresses what it ships, and the values here are 100 "
        "identical bytes, which compress far better than most real values: bytes shipped, "
        "upload time and so lag gain more from compression here than they would on real "
        "data.",
        table(head, rows, "l" + "r" * len(order)),
    ]
    if len([s for s in _ON_S3 if s in runs]) >= 2:
        out.append("Where each wins, among the sides on S3:")
        out.append(
            "\n".join(
                _wins(runs, label, key, fmt, higher)
                for label, key, fmt, higher in _ROWS
                if higher is not None
            )
        )
    out.extend(_notes(runs))
    return out
