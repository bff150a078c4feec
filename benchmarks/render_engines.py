"""The stream-processor section of ``docs/benchmarks.md`` (``bench_engines.py``)."""

from __future__ import annotations

from .render_text import Doc, rate, ratio, suite, table

__all__ = ["engines_section"]

_ENGINES = {"quix": "Quix Streams", "faust": "Faust"}
_RECOVERY = {
    "statelog": "statelog, its store kept",
    "rocksdb": "the engine's RocksDB store, kept",
    "rocksdb-changelog": "the engine's RocksDB store lost: restored from the changelog topic",
}


def engines_section(doc: Doc) -> list[str]:
    """Events/s of the stateful pipeline and restart time after SIGKILL, per engine and store."""
    thr = suite(doc, "engine_throughput")
    rec = suite(doc, "engine_recovery")
    if not thr and not rec:
        return []
    out = ["## Stream processors: statelog as the engine's state store"]
    out.append(
        "The tests' stateful pipeline (per-key counts and a reconciliation buffer keyed by "
        "entity; three partitions) against the tests' Tansu broker on "
        "loopback, on statelog and on the engine's own RocksDB store, side by side in one "
        "run. Quix Streams on statelog is `statelog.integrations.quix.Application` with its "
        'default options (`durability="commit"`: one fsync per checkpoint; a compactor '
        'process); Faust is `store="statelog://DIR?durability=group"` (every table write a '
        "commit, synced in the background within 10 ms; a compactor thread per partition "
        "store). Events/s counts from the "
        "first to the last processed message of a run over all the events (the group join "
        "excluded), best of two alternating runs per store, with the engine's changelog "
        "topics on (its default) and off (the store's own cost a larger part of the time). "
        "Every producer sends one record per batch (the test broker's high watermark counts "
        "batches, and the changelog recovery trusts it), which slows the changelog's "
        "production for both stores alike."
    )
    rows = []
    for r in thr:
        eps = r["events_per_s"]
        rows.append(
            f"{_ENGINES[r['engine']]} | {'on' if r.get('changelog', True) else 'off'} | "
            f"{r['events']:,} | {r['entities']:,} | "
            f"{rate(eps['statelog'])} | {rate(eps['rocksdb'])} | "
            f"{ratio(eps['rocksdb'], eps['statelog']):.2f}x"
        )
    if rows:
        head = "engine | changelog topics | events | entities | statelog events/s | "
        head += "RocksDB events/s | RocksDB / statelog"
        out.append(table(head, rows, "llrrrrr"))
    rows = [
        f"{_ENGINES[r['engine']]} | {_RECOVERY.get(r['store'], r['store'])} | "
        f"{r['events']:,} | {r['seconds']:.2f} | {_secs(r['after_assign'])}"
        for r in sorted(rec, key=lambda r: (r["engine"], list(_RECOVERY).index(r["store"])))
    ]
    if rows:
        out.append(
            "After a SIGKILL: the application processed every event, was killed, one more "
            "event arrived, and it was restarted once the broker had dropped the killed "
            "member. *Restart to first event* runs from the restarted process's imports done "
            "to its first processed message, the group join included; *after assignment* "
            "from the partitions' assignment (where the engine checks and replays its "
            "changelog) to it."
        )
        head = "engine | restart with | events before | restart to first event s | "
        head += "after assignment s"
        out.append(table(head, rows, "llrrr"))
    return out


def _secs(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"  # NaN: not measured for this engine
