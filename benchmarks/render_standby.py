"""The failover and changes-feed sections of ``docs/benchmarks.md`` (``bench_standby.py``)."""

from __future__ import annotations

from .conftest import size_id
from .render_text import Doc, ratio, size, suite, table

__all__ = ["standby_section"]


def standby_section(doc: Doc) -> list[str]:
    """Failover to a standby against a cold start from the store's files; ``changes()``."""
    out: list[str] = []
    rows = [
        f"{size_id(r['keys'])} | {r['tail_updates']:,} | {r['first_sync_seconds']:.3f} "
        f"| {size(r['standby_rss_anon'])} | {r['promote_seconds']:.3f} | "
        f"{r['promote_to_commit_seconds']:.3f} | {r['cold_copy_seconds']:.3f} | "
        f"{r['cold_open_seconds']:.3f} | {r['cold_to_commit_seconds']:.3f} | "
        f"{ratio(r['cold_to_commit_seconds'], r['promote_to_commit_seconds']):.1f}x"
        for r in sorted(suite(doc, "failover"), key=lambda r: r["keys"])
    ]
    if rows:
        head = "keys | tail updates | standby first sync s | standby RssAnon | promote s | "
        head += "kill to first commit s | (b) copy s | (b) open s | (b) to first commit s | "
        out += [
            "## Failover: a standby promoted, against a cold start",
            "A store of that many keys (one snapshot) is the primary; a standby of it is "
            "opened in a fresh interpreter; a writer commits a tail of 10,000-update "
            "checkpoints to the primary and is killed with SIGKILL once they are "
            "acknowledged. Timed from the kill: `standby.promote()` (its last look, the "
            "lock check, the writer's open of the copy) and the promoted writer's first "
            "durable commit. (b): the primary's files copied into an empty directory, "
            "opened by a writer, and its first durable commit: what a restore costs "
            "before any download.",
            table(head + "(b) / promote", rows, "rr" + "r" * 8),
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
