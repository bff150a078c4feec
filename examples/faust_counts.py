"""Per-entity counts and a reconciliation buffer in a Faust table, kept in statelog.

The agent reads CDC changes ``{"entity": ..., "side": "src" | "tgt",
"amount": n, "seq": i}`` keyed by entity from ``cdc.changes`` and keeps one
table row per entity: a count, the last sequence applied (a change that
comes again after a crash is not counted twice), and the side waiting for
its other half. The table's store is statelog, one store per partition
under ``state-faust/tables``; each table write is one statelog commit,
synced in the background (``durability=group``).

Against a local broker (``make broker`` starts one on 127.0.0.1:9092, or set
``BROKER``; ``--produce`` creates the topics up front, with three partitions)::

    python examples/faust_counts.py --produce 1000
    python examples/faust_counts.py worker -l info --without-web
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import faust

BROKER = os.environ.get("BROKER", "127.0.0.1:9092")
DATA = Path("state-faust").absolute()

app = faust.App(
    "cdc-counts",
    broker=f"kafka://{BROKER}",
    datadir=str(DATA),
    store=f"statelog://{DATA}/tables?durability=group",
    topic_partitions=3,
    topic_replication_factor=1,
    # `make broker`'s high watermark counts record batches and Faust's recovery
    # checks the persisted offset against it: one record per batch there.
    producer_max_batch_size=1,
    broker_session_timeout=6.0,  # it also holds a group's join for about this long
)
changes = app.topic("cdc.changes", key_type=str, value_type=bytes, value_serializer="json")
rows = app.Table("rows", default=None, partitions=3, key_type=str)


def apply(row: dict[str, Any] | None, change: dict[str, Any]) -> dict[str, Any] | None:
    """The row after ``change``; None if it was applied before."""
    row = dict(row or {"count": 0, "last": -1, "matched": 0, "waiting": None})
    if change["seq"] <= row["last"]:
        return None
    row["count"] += 1
    row["last"] = change["seq"]
    waiting = row["waiting"]
    if waiting is not None and waiting["side"] != change["side"]:
        row["matched"] += 1
        row["waiting"] = None  # the pair is complete: the buffer lets it go
    else:
        row["waiting"] = {"side": change["side"], "amount": change["amount"]}
    return row


@app.agent(changes)
async def reconcile(stream: Any) -> None:
    async for entity, change in stream.items():
        row = apply(rows.get(entity), change)
        if row is not None:
            rows[entity] = row


def produce(n: int, seed: int = 1) -> None:
    """Create the topics and produce ``n`` random changes over 100 entities."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": BROKER})
    config = {"retention.ms": "-1", "retention.bytes": "-1"}
    names = ["cdc.changes", "cdc-counts-rows-changelog"]
    for future in admin.create_topics([NewTopic(t, 3, 1, config=config) for t in names]).values():
        try:
            future.result(10)
        except Exception as exc:  # already there from an earlier run
            if "EXISTS" not in str(exc).upper():
                raise
    rng = random.Random(seed)
    base = time.time_ns() // 1000  # sequence numbers keep growing across runs
    producer = Producer({"bootstrap.servers": BROKER, "enable.idempotence": True})
    for seq in range(n):
        entity = f"order-{rng.randrange(100)}"
        change = {"entity": entity, "side": rng.choice(["src", "tgt"]), "amount": rng.randrange(3),
                  "seq": base + seq}  # fmt: skip
        producer.produce("cdc.changes", key=entity, value=json.dumps(change))
    producer.flush(30)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--produce"]:
        produce(int(sys.argv[2]))
    else:
        app.main()
