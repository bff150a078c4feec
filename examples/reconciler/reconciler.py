"""A streaming parity reconciler whose state lives in statelog and whose verdicts go to a sink.

Loop, one checkpoint per turn:

1. read up to ``batch`` events from every partition of both streams, from
   the offsets the store holds (after a restart: the recovered offsets, so
   the consumers rewind to exactly what the last durable commit covered);
2. fold them into the in-flight comparison buffer (table ``buffer``: per
   entity, the source and target amounts seen and the earliest event time)
   and advance each partition's high-water event time (table ``aligner``);
3. the aligner's low watermark is the slowest partition's high-water time
   minus the tolerated lateness; an entity whose earliest event is older
   than the watermark minus the largest replication lag can receive no more
   events: it is closed with a verdict (match, mismatch, missing_in_target,
   missing_in_source) and leaves the buffer;
4. the verdicts are written to the sink (an idempotent upsert keyed by the
   entity, version 1), then offsets, watermark, buffer and aligner changes
   and the sink's applied marks are committed to statelog as one record.

A crash anywhere replays from the last commit: the same events, the same
verdicts, the same upserts, which the sink turns into no-ops.

Run as ``python -m examples.reconciler.reconciler STORE SINK --seed S``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import statelog
from statelog.sinks import Output, SinkedStore, SQLiteSink

from .streams import LATENESS_MS, MAX_LAG_MS, Event, Streams, generate

__all__ = ["reconcile", "verdict_of"]

DONE = 2**62  # an exhausted partition holds the watermark back no longer
TABLES = ("buffer", "aligner")  # read back at every start, before the first write


def verdict_of(entry: dict[str, Any]) -> str:
    """The parity verdict of a closed buffer entry."""
    src, tgt = entry.get("src"), entry.get("tgt")
    if src is None:
        return "missing_in_source"
    if tgt is None:
        return "missing_in_target"
    return "match" if src == tgt else "mismatch"


def reconcile(
    store_path: Path,
    sink_path: Path,
    streams: Streams,
    *,
    batch: int = 25,
    pause_s: float = 0.0,
    stats: Path | None = None,
    segment_bytes: int = 1 << 20,
) -> int:
    """Reconcile ``streams`` to the end, resuming from whatever the store recovered.

    :returns: the number of checkpoints committed by this call.
    """
    with (
        statelog.open(
            store_path, durability="commit", segment_bytes=segment_bytes, tables=TABLES
        ) as store,
        SQLiteSink(sink_path, table="verdicts") as sink,
    ):
        if stats is not None:
            _record(stats, store)
        sinked = SinkedStore(store, sink)
        # The in-flight buffer and the aligner's marks, as recovered: read once,
        # then kept in step with every commit (the store is the durable copy).
        open_entries: dict[str, dict[str, Any]] = dict(store.items(table="buffer"))
        high: dict[str, int] = {p: int(t) for p, t in store.items(table="aligner")}
        commits = 0
        while True:
            offsets = {p: store.offsets.get(p, 0) for p in streams.partitions}
            read = {
                p: evs[offsets[p] : offsets[p] + batch] for p, evs in streams.partitions.items()
            }
            if not any(read.values()) and not open_entries:
                return commits
            touched: dict[str, dict[str, Any]] = {}
            moved: dict[str, int] = {}
            for p, evs in read.items():
                for ev in evs:
                    _fold(touched, open_entries, ev)
                    moved[p] = max(moved.get(p, high.get(p, 0)), ev.time_ms)
                if offsets[p] + len(evs) >= len(streams.partitions[p]):
                    moved[p] = DONE
            marks = {p: moved.get(p, high.get(p, 0)) for p in streams.partitions}
            wm = max(store.low_watermark_ms, min(marks.values()) - LATENESS_MS, 0)
            entries = {**open_entries, **touched}
            closed = {k: e for k, e in entries.items() if e["t"] + MAX_LAG_MS < wm}
            outputs = [
                Output(key, 1, {"verdict": verdict_of(e), "src": e.get("src"), "tgt": e.get("tgt")})
                for key, e in sorted(closed.items())
            ]
            with sinked.transaction() as tx:
                tx.emit(*outputs)
                for p, evs in read.items():
                    tx.set_offset(p, offsets[p] + len(evs))
                tx.low_watermark_ms = wm
                for key, entry in touched.items():
                    if key not in closed:
                        tx.put(key, entry, table="buffer")
                for key in closed:
                    if key in open_entries:
                        tx.delete(key, table="buffer")
                for p, t in moved.items():
                    tx.put(p, t, table="aligner")
            for key, entry in touched.items():
                open_entries[key] = entry
            for key in closed:
                del open_entries[key]
            high.update(moved)
            commits += 1
            if pause_s:
                time.sleep(pause_s)


def _fold(
    touched: dict[str, dict[str, Any]], open_entries: dict[str, dict[str, Any]], ev: Event
) -> None:
    entry = touched.get(ev.key)
    if entry is None:
        entry = dict(open_entries.get(ev.key, {}))
        touched[ev.key] = entry
    entry[ev.side] = ev.amount
    entry["t"] = min(entry.get("t", ev.time_ms), ev.time_ms)


def _record(stats: Path, store: statelog.StateStore) -> None:
    """Append this start's recovery to ``stats`` (one JSON line, fsynced)."""
    r = store.recovery
    line = {
        "pid": os.getpid(),
        "epoch": r.epoch,
        "seconds": r.seconds,
        "replayed": r.replayed,
        "snapshot": r.snapshot.name if r.snapshot else None,
        "walk_backs": sum(1 for x in r.rejected if x.path.suffix == ".snap"),
        "outcome": str(r.outcome),
    }
    with open(stats, "a") as fh:
        fh.write(json.dumps(line) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("sink", type=Path)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--entities", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between checkpoints")
    ap.add_argument("--stats", type=Path)
    ap.add_argument("--segment-bytes", type=int, default=1 << 20)
    a = ap.parse_args(argv)
    streams = generate(a.seed, a.entities, a.partitions)
    reconcile(
        a.store, a.sink, streams, batch=a.batch, pause_s=a.pause, stats=a.stats,
        segment_bytes=a.segment_bytes,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
