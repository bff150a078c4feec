"""The failover and changes-feed sections of ``docs/benchmarks.md`` (``bench_standby.py``)."""

from __future__ import annotations

from typing import Any

from .conftest import size_id
from .render_text import Doc, ratio, size, suite, table

__all__ = ["standby_section"]


def standby_section(doc: Doc) -> list[str]:
    """Failover to a standby against a cold start and a restore; standby lag; ``changes()``."""
    out: list[str] = []
    rows = [_failover_row(r) for r in sorted(suite(doc, "failover"), key=lambda r: r["keys"])]
    if rows:
        head = "keys | tail updates | standby first sync s | standby RssAnon | promote s | "
        head += "kill to first commit s | (b) copy s | (b) open s | (b) to first commit s | "
        head += "(b) / promote | (c) restore s | (c) to first commit s | (c) epoch / acked | "
        out += [
            "## Failover: a standby promoted, against a cold start and a restore",
            "A store of that many keys (one snapshot) is the primary; a standby of it is "
            "opened in a fresh interpreter; a writer commits a tail of 10,000-update "
            "checkpoints to the primary and is killed with SIGKILL once they are "
            "acknowledged. Timed from the kill: `standby.promote()` (its last look, the "
            "lock check, the claim, the writer's open of the copy) and the promoted "
            "writer's first durable commit. (b): the primary's files copied into an empty "
            "directory, opened by a writer, and its first durable commit: what a restore "
            "costs before any download. (c): the primary shipped to the loopback S3 "
            "server of the tests (untimed: what its daemon had shipped, snapshots and "
            "sealed segments; the tail's live segment is not shipped, so the restore "
            "reaches an older epoch than the standby), then `statelog restore` into an "
            "empty directory, the writer's open and its first durable commit. The S3 server "
            "runs on this host, in memory: a real bucket adds network time to (c) only.",
            table(head + "(c) / promote", rows, "rr" + "r" * 12),
        ]
    rows = [
        f"{size_id(r['keys'])} | {r['poll_ms']} | {r['commits_per_second']:,.0f} | "
        f"{r['updates_per_commit']:,} | {r['lag_epochs_p50']:,.0f} | {r['lag_epochs_p99']:,.0f} | "
        f"{r['lag_epochs_max']:,.0f} | {r['lag_seconds_p50']:.2f} | {r['lag_seconds_p99']:.2f} | "
        f"{r['lag_seconds_max']:.2f} | {size(r['standby_rss_anon_max'])} | {r['drain_seconds']:.2f}"
        for r in sorted(suite(doc, "standby_lag"), key=lambda r: (r["keys"], r["poll_ms"]))
    ]
    if rows:
        head = "keys | follow_poll ms | commits/s | updates per commit | lag epochs p50 | p99 | "
        head += "max | lag s p50 | p99 | max | standby RssAnon max | drain s"
        out += [
            "## Standby lag under sustained commits",
            "A writer process commits checkpoints of 1% of the keys back to back "
            '(`durability="commit"`, its in-process compactor running) for the seconds of '
            "the run; a standby of it in another process is sampled every 20 ms: the lag in "
            "epochs (the writer's last acknowledged epoch minus the standby's) and in seconds "
            "(since the acknowledgement of the oldest epoch it has not applied). Drain: from "
            "the writer's last commit until the standby has applied it.",
            table(head, rows, "r" * 12),
        ]
    rows = [
        f"{size_id(r['keys'])} | {r['epochs']:,} | {r['updates']:,} | {r['seconds']:.3f} | "
        f"{r['cpu_seconds']:.3f} | {r['epochs'] / r['seconds']:,.0f} | "
        f"{r['updates'] / r['seconds']:,.0f}"
        for r in sorted(suite(doc, "changes"), key=lambda r: r["keys"])
    ]
    if rows:
        out += [
            "## The changes feed",
            "`store.changes()` of a read-only store, read from the first epoch to the last: "
            "every record verified and every value decoded. Each checkpoint holds 10,000 "
            "updates of the workload.",
            table("keys | epochs | updates | s | CPU s | epochs/s | updates/s", rows, "r" * 7),
        ]
    return out


def _failover_row(r: dict[str, Any]) -> str:
    row = (
        f"{size_id(r['keys'])} | {r['tail_updates']:,} | {r['first_sync_seconds']:.3f} "
        f"| {size(r['standby_rss_anon'])} | {r['promote_seconds']:.3f} | "
        f"{r['promote_to_commit_seconds']:.3f} | {r['cold_copy_seconds']:.3f} | "
        f"{r['cold_open_seconds']:.3f} | {r['cold_to_commit_seconds']:.3f} | "
        f"{ratio(r['cold_to_commit_seconds'], r['promote_to_commit_seconds']):.1f}x"
    )
    if "restore_seconds" not in r:
        return row + " | - | - | - | -"
    return row + (
        f" | {r['restore_seconds']:.3f} | {r['restore_to_commit_seconds']:.3f} | "
        f"{r['restored_epoch']:,} / {r['acked_epoch']:,} | "
        f"{ratio(r['restore_to_commit_seconds'], r['promote_to_commit_seconds']):.1f}x"
    )
