"""The point-in-time sections of ``docs/benchmarks.md`` (``bench_point_in_time.py``)."""

from __future__ import annotations

from typing import Any

from .conftest import size_id
from .render_text import Doc, ms, ratio, size, suite, table

__all__ = ["pit_section"]


def pit_section(doc: Doc) -> list[str]:
    """Views of the past against the newest state; what a retention window keeps."""
    return _views(doc) + _window(doc)


def _views(doc: Doc) -> list[str]:
    runs = sorted(suite(doc, "pit_views"), key=lambda r: r["keys"])
    if not runs:
        return []
    rows = [
        f"{size_id(r['keys'])} | {r['snapshots']} ({r['full_snapshots']}) | "
        f"{r['oldest_epoch']:,}..{r['newest_epoch']:,} | {r['samples']} | "
        f"{ms(r['newest_p50'])} | {ms(r['newest_p90'])} | {ms(r['view_p50'])} | "
        f"{ms(r['view_p90'])} | {r['ratio_p50']:.1f}x | {r['ratio_p90']:.1f}x"
        for r in runs
    ]
    head = "keys | snapshots kept (full) | epochs retained | rounds | newest p50 ms | p90 ms | "
    head += "view p50 ms | p90 ms | view / newest, p50 | p90"
    why = [
        f"{size_id(r['keys'])} | {r['base_images']} | "
        f"{r['newest_images']} ({r['newest_extracted']} extracted), {r['newest_replayed']} | "
        f"{r['copied_views']} | {ms(r['copied_p50'])} | {r['extracting_views']} | "
        f"{ms(r['extracting_p50'])} | {r['extracted_mean']:.1f} | {r['images_mean']:.1f} | "
        f"{r['replayed_mean']:.1f} / {r['replayed_max']}"
        for r in runs
    ]
    whead = "keys | images in `STORE/base` | newest: chain images, records replayed | "
    whead += "views copying every image | p50 ms | "
    whead += "views extracting | p50 ms | images extracted, mean | chain images, mean | "
    whead += "records replayed, mean / max"
    r0 = runs[0]
    return [
        "## Point in time: a view at a past epoch against the newest state",
        "A clone of a compacted store of that many keys (one full snapshot) gains "
        f"{r0['checkpoints']} checkpoints of 1% of its keys "
        f'(`durability="commit"`), a compaction pass after every {r0["every"]}th with the '
        "default chain policy (delta snapshots, a full one once the deltas outweigh half "
        "of it), every snapshot kept; then the writer closes. Then, in one process, rounds "
        "of `statelog.open(STORE, readonly=True)` (the newest state) and "
        "`statelog.open(STORE, readonly=True, at=N)` at a random epoch N of the retained "
        "range, in alternating order, each timed until the open returns, its epoch checked. "
        "The files are in the page cache. *view / newest* divides the two percentiles "
        "of the same run.",
        table(head, rows, "r" * 10),
        "How they recovered. A read-only open maps private copies of the images of its "
        "snapshot chain (the full snapshot and the deltas above it): each copied from "
        "`STORE/base` if the writer or the compactor left an intact image of that snapshot "
        "there, else extracted from the snapshot (decompressed, every byte verified); then "
        "it replays the log records (one per checkpoint) from the snapshot up to its epoch.",
        table(whead, why, "r" * 10),
    ]


def _window(doc: Doc) -> list[str]:
    runs = sorted(suite(doc, "pit_window"), key=lambda r: (r["keys"], r["remote"]))
    if not runs:
        return []
    rows = [_kept_row(r) for r in runs]
    head = "keys | shipped | run s | window W s | commits/s | log written R | "
    head += "passes | snapshots written (full) | mean S | between snapshots P s | snapshots kept | "
    head += "log kept | kept, mean / max | per s of W | `base/` images | bucket, mean / max"
    formula = [_formula_row(r) for r in runs]
    fhead = "keys | shipped | P estimated / measured s | log kept / `R * (W + P)` | "
    fhead += "snapshots kept / `S * (W / P + 1)` | "
    fhead += "kept / formula | 1 h: `R * (3600 + P)` | `S * (3600 / P + 1)` | 1 h, total"
    r0 = runs[0]
    return [
        "## The cost of retention by time (`--retain-for`)",
        "A clone of a compacted store of that many keys; a writer commits checkpoints of 1% "
        f'of the keys back to back (`durability="commit"`, {size(r0["segment_bytes"])} '
        "segments) while the compaction daemon (`python -m compactor --retain 1 "
        f"--retain-for W --interval {r0['interval']:g} --min-tail-bytes` one segment) runs "
        "beside it; *shipped*: with `--remote` to the loopback S3 server of the tests and "
        "`--remote-retain 1 --remote-retain-for W`. The daemon starts its next pass at once "
        "after one that wrote a snapshot, else after the interval; *passes* counts them all. "
        "Every half second a thread sums the sizes of `snapshots/`, `wal/` and `base/` "
        "(and lists the bucket). *R*: the log bytes written (every segment at its largest "
        "size seen) over the run's seconds; *S*: the mean size of the snapshots the daemon "
        "wrote, *P* the mean time between them (its log). *Kept*: `snapshots/` plus `wal/`, "
        "over the samples from 1.5 W into the run on; `base/` (the images the writer and "
        "the compactor keep, a cache) is shown apart.",
        table(head, rows, "rl" + "r" * 14),
        "Against the sizing formula of "
        "[compactor.md](compactor.md#retention-by-time---retain-for) and the runbook, with "
        "the R, S and P this run measured: log kept about `R * (W + P)`, snapshots kept "
        "about `S * (W / P + 1)`. Its other terms are left out here: the chain under the "
        "oldest snapshot kept (the measured snapshots kept include it) and up to "
        "`R * interval` of log written since the last pass. *P estimated*: the formula's "
        "own estimate of P, `max(interval, max(min-tail-bytes, segment_bytes) / R)`, beside "
        "the P measured. The one-hour figures put W = 3600 s into the same formula (the log "
        "written in an hour plus the snapshots kept): an extrapolation, not a measurement.",
        table(fhead, formula, "rl" + "r" * 7),
    ]


def _kept_row(r: dict[str, Any]) -> str:
    shipped = "yes" if r["remote"] else "no"
    bucket = f"{size(r['bucket_mean'])} / {size(r['bucket_max'])}" if r["remote"] else "-"
    return (
        f"{size_id(r['keys'])} | {shipped} | {r['seconds']:.0f} | {r['window']:g} | "
        f"{r['commits'] / r['seconds']:,.0f} | {size(r['log_bytes_per_s'])}/s | {r['passes']} | "
        f"{r['snapshots_written']} ({r['full_written']}) | {size(r['snapshot_bytes_mean'])} | "
        f"{r['period']:.2f} | {size(r['kept_snapshots_mean'])} | {size(r['kept_log_mean'])} | "
        f"{size(r['kept_mean'])} / {size(r['kept_max'])} | {size(r['kept_per_window_s'])}/s | "
        f"{size(r['images_mean'])} | {bucket}"
    )


def _formula_row(r: dict[str, Any]) -> str:
    # The daemon's trigger is one segment (--min-tail-bytes segment_bytes).
    estimate = max(r["interval"], r["segment_bytes"] / r["log_bytes_per_s"])
    return (
        f"{size_id(r['keys'])} | {'yes' if r['remote'] else 'no'} | "
        f"{estimate:.2f} / {r['period']:.2f} | "
        f"{size(r['kept_log_mean'])} / {size(r['formula_log'])} | "
        f"{size(r['kept_snapshots_mean'])} / {size(r['formula_snapshots'])} | "
        f"{ratio(r['kept_mean'], r['formula']):.2f}x | {size(r['hour_log'])} | "
        f"{size(r['hour_snapshots'])} | {size(r['hour'])}"
    )
