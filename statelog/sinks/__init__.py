"""Idempotent sinks: outputs written downstream exactly once in effect.

A reconciler's outputs (verdicts, alerts, materialised rows) go to a target
database as upserts keyed by a deterministic output id and a version that
never moves backwards; the marks of what was applied are committed to
statelog in the same atomic record as the state and the offsets::

    from statelog.sinks import Output, SinkedStore, SQLiteSink

    with statelog.open("state/") as store, SQLiteSink("verdicts.db", "verdicts") as sink:
        sinked = SinkedStore(store, sink)
        sinked.commit(
            outputs=[Output("order:17", version=1042, payload={"verdict": "match"})],
            offsets={"orders-0": 1042},
            low_watermark_ms=1_700_000_000_000,
            put={"order:17": {"src": 99.5}},
        )

A crash between the sink write and the statelog commit, or a walk-back to
an older epoch, replays into the sink as a no-op. See ``docs/sinks.md``.
"""

from statelog.sinks.base import InvalidOutputError, Output, Row, Sink, TransactionalSink
from statelog.sinks.postgres import PostgresSink
from statelog.sinks.sinked import (
    MARKS_PREFIX,
    MAX_SINK_NAME_BYTES,
    SinkCommit,
    SinkedStore,
    SinkTransaction,
)
from statelog.sinks.sqlite import SQLiteSink

__all__ = [
    "MARKS_PREFIX",
    "MAX_SINK_NAME_BYTES",
    "InvalidOutputError",
    "Output",
    "PostgresSink",
    "Row",
    "SQLiteSink",
    "Sink",
    "SinkCommit",
    "SinkTransaction",
    "SinkedStore",
    "TransactionalSink",
]
