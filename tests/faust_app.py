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
``FAUST_APP_STORE_OPTIONS`` (the statelog URL's query); faults for the tests:
``FAUST_APP_DROP_STATE_AFTER=N``: once a Kafka commit of the source passes
offset N (summed over partitions), no write reaches statelog any more: table
writes stay in memory, where reads see them (a write-back buffer never
flushed), changelog batches and persisted offsets are dropped; the next Kafka
commit SIGKILLs the worker: Kafka has offsets whose state statelog never got;
``FAUST_APP_LOSE_KAFKA_COMMIT=1``: Kafka commits are silently dropped; and for the benchmark
``FAUST_APP_REPORT``: a JSON file rewritten every 0.2 s with when the worker was
ready and when it processed its first and last event, and how many.
"""

from __future__ import annotations

import json
import os
import signal
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


def _install_faults() -> None:
    drop_after = int(os.environ.get("FAUST_APP_DROP_STATE_AFTER", "0"))
    lose = os.environ.get("FAUST_APP_LOSE_KAFKA_COMMIT") == "1"
    if not (drop_after or lose):
        return
    from faust.transport.consumer import Consumer

    from statelog.integrations.faust.store import Store

    real_commit = Consumer._commit_offsets
    dropping = [False]

    async def commit_offsets(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        if lose:
            return True
        did: bool = await real_commit(self, offsets, start_new_transaction)
        if did and dropping[0]:
            os.kill(os.getpid(), signal.SIGKILL)
        if did and sum(o for tp, o in offsets.items() if tp.topic == IN_TOPIC) > drop_after:
            dropping[0] = True
        return did

    Consumer._commit_offsets = commit_offsets  # type: ignore[method-assign]
    unflushed: dict[bytes, bytes | None] = {}
    real_get, real_set = Store._get, Store._set

    def get(self: Any, key: bytes) -> bytes | None:
        return unflushed[key] if key in unflushed else real_get(self, key)

    def set_(self: Any, key: bytes, value: bytes | None) -> None:
        if dropping[0]:
            unflushed[key] = value
        else:
            real_set(self, key, value)

    Store._get, Store._set = get, set_  # type: ignore[method-assign]
    for name in ("_del", "set_persisted_offset", "flush_offsets", "apply_changelog_batch"):
        real = getattr(Store, name)

        def dropped(self: Any, *a: Any, _real: Any = real, **kw: Any) -> Any:
            return None if dropping[0] else _real(self, *a, **kw)

        setattr(Store, name, dropped)


if __name__ == "__main__":
    _install_faults()
    level = os.environ.get("FAUST_APP_LOGLEVEL", "warn")
    sys.argv = [sys.argv[0], "worker", "-l", level, "--without-web"]
    app.main()
