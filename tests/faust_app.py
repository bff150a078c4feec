"""A stateful Faust app for the tests and the benchmark, run as ``python -m tests.faust_app``.

It reads JSON events ``{"entity": ..., "side": "src" | "tgt", "amount": n,
"seq": i}`` keyed by entity, and keeps one table row per entity: a count,
the last sequence number applied, pairs matched and the side waiting for
its other half (the reconciliation buffer). An event whose ``seq`` is not
past the row's last one was applied before (Faust processes at least once:
after a crash, events since its last offset commit come again) and is
skipped, so the table's final state is exact whatever the crashes.

Configured by the environment: ``FAUST_APP_BROKER`` (host:port),
``FAUST_APP_DIR`` (data directory), ``FAUST_APP_PREFIX`` (topic and app id
prefix), ``FAUST_APP_STORE`` (``statelog`` or ``rocksdb``),
``FAUST_APP_STORE_OPTIONS`` (the statelog URL's query), and for the benchmark
``FAUST_APP_REPORT``: a JSON file rewritten every 0.2 s with when the worker was
ready and when it processed its first and last event, and how many.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import faust

PARTITIONS = 3
TABLE = "reconcile"
_PREFIX = os.environ.get("FAUST_APP_PREFIX", "faust.")
APP_ID = f"{_PREFIX}app"
IN_TOPIC = f"{_PREFIX}events"
CHANGELOG = f"{APP_ID}-{TABLE}-changelog"

_DIR = os.environ.get("FAUST_APP_DIR", "faust-data")
_STORE = (
    f"statelog://{os.path.abspath(_DIR)}/tables?"
    f"{os.environ.get('FAUST_APP_STORE_OPTIONS', 'durability=group')}"
    if os.environ.get("FAUST_APP_STORE", "statelog") == "statelog"
    else "rocksdb://"
)


def apply(row: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any] | None:
    """The row after ``event``; None if the event was applied already."""
    row = dict(row or {"count": 0, "last": -1, "matched": 0, "waiting": None})
    if event["seq"] <= row["last"]:
        return None
    row["count"] += 1
    row["last"] = event["seq"]
    waiting = row["waiting"]
    if waiting is not None and waiting["side"] != event["side"]:
        row["matched"] += 1
        row["waiting"] = None
    else:
        row["waiting"] = {"side": event["side"], "amount": event["amount"]}
    return row


app = faust.App(
    APP_ID,
    broker=f"kafka://{os.environ.get('FAUST_APP_BROKER', '127.0.0.1:9092')}",
    datadir=_DIR,
    store=_STORE,
    topic_partitions=PARTITIONS,
    topic_replication_factor=1,
    topic_allow_declare=False,  # the topics are created up front, with their partitions
    broker_session_timeout=2.0,  # the test broker holds a join for about this long
    broker_heartbeat_interval=0.2,
    # The test broker holds a rebalance for a member that went away without leaving
    # until its poll interval passes (Faust's default: 1000 s), so bound it.
    broker_max_poll_interval=30.0,
    broker_rebalance_timeout=20.0,
    # The test broker's high watermark is the base offset of a partition's last record
    # batch plus one; Faust's recovery checks the persisted offset against it, so every
    # record goes in a batch of its own.
    producer_max_batch_size=1,
    web_enabled=False,
)
events = app.topic(IN_TOPIC, key_type=str, value_type=bytes, value_serializer="json")
rows = app.Table(TABLE, default=None, partitions=PARTITIONS, key_type=str)


_REPORT = os.environ.get("FAUST_APP_REPORT")
_seen: dict[str, float] = {"started": time.time(), "first": 0.0, "last": 0.0, "count": 0}


@app.agent(events)
async def reconcile(stream: Any) -> None:
    async for entity, event in stream.items():
        row = apply(rows.get(entity), event)
        if row is not None:
            rows[entity] = row
        if _REPORT:
            now = time.time()
            _seen["first"] = _seen["first"] or now
            _seen["last"] = now
            _seen["count"] += 1


if _REPORT:

    @app.timer(interval=0.2)
    async def report() -> None:
        tmp = f"{_REPORT}.tmp"
        with open(tmp, "w") as f:
            json.dump(_seen, f)
        os.replace(tmp, _REPORT)


if __name__ == "__main__":
    level = os.environ.get("FAUST_APP_LOGLEVEL", "warn")
    sys.argv = [sys.argv[0], "worker", "-l", level, "--without-web"]
    app.main()
