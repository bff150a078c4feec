"""The anchors section of ``docs/benchmarks.md`` (``bench_anchors.py``)."""

from __future__ import annotations

from .render_text import Doc, rate, ratio, size, suite, table

__all__ = ["anchors_section"]


def anchors_section(doc: Doc) -> list[str]:
    """statelog shipping to S3 against SQLite with Litestream, side by side."""
    runs = {r["system"]: r for r in suite(doc, "anchor_replication")}
    if not runs:
        return []
    order = [s for s in ("statelog", "litestream") if s in runs]
    k = runs[order[0]]
    rows = [
        f"{s} | {rate(r['updates_per_s'])} | {r['checkpoints']:,} | {r['lag_samples']} | "
        f"{r['lag_p50']:.2f} | {r['lag_p99']:.2f} | {r['lag_max']:.2f} | "
        f"{size(r['bucket_bytes'])} | {r['bucket_objects']} | {r['objects_per_hour']:,.0f} | "
        f"{r['restore_seconds']:.2f}"
        for s in order
        for r in [runs[s]]
    ]
    head = "system | durable updates/s | checkpoints | lag samples | lag p50 s | p99 s | max s | "
    head += "bucket bytes | objects | objects per hour | restore s"
    out = [
        "## The anchors: statelog against SQLite with Litestream, replicated to S3",
        f"Both hold {k['keys']:,} keys of 100-byte values and commit durable checkpoints of "
        "1% of them back to back for the same time while their replicator ships to the same "
        "loopback S3 server (moto, in the benchmark's process). statelog: "
        '`statelog.open(durability="commit")`, each checkpoint fsynced before it returns, '
        "and `statelog-compactor --remote --max-ship-lag 1s` (the writer seals its segment "
        "once its oldest commit is 1 s old; the daemon ships every 0.5 s). SQLite: WAL mode, "
        "`synchronous=FULL`, one transaction per checkpoint, `litestream replicate` with a "
        "1 s sync interval. About once a second a sampler restores from the bucket and "
        "reads the newest checkpoint there; the *lag* is how long the oldest acknowledged "
        "checkpoint the bucket lacked had waited (0 when it had them all). After the run: "
        "what the bucket holds, and a timed restore of the whole state, its content checked. "
        "*objects per hour* extrapolates the objects present at the end over the run; both "
        "delete superseded objects on their own schedules.",
        table(head, rows, "lrrrrrrrrrr"),
    ]
    if len(order) == 2:
        s, lt = runs["statelog"], runs["litestream"]
        out.append(
            "In this run: statelog's durable updates/s "
            f"{ratio(s['updates_per_s'], lt['updates_per_s']):.1f}x Litestream's, its lag "
            f"p99 {s['lag_p99']:.2f} s against {lt['lag_p99']:.2f} s, its restore "
            f"{ratio(lt['restore_seconds'], s['restore_seconds']):.1f}x as fast, and "
            f"{ratio(s['bucket_bytes'], lt['bucket_bytes']):.1f}x the bytes in the bucket."
        )
    return out
