"""Per-entity counts and a reconciliation buffer in Quix Streams, kept in statelog.

The pipeline reads CDC changes ``{"entity": ..., "side": "src" | "tgt",
"amount": n}`` keyed by entity from ``cdc.changes``, counts them per entity,
holds the side that arrived first until the other one comes, and writes a
verdict per matched pair to ``cdc.verdicts``. Its state, the processed
offsets and the changelog offsets are one statelog record per checkpoint.

Against a local broker (``make broker`` starts one on 127.0.0.1:9092)::

    python examples/quix_counts.py --bootstrap 127.0.0.1:9092 --produce 1000
    python examples/quix_counts.py --bootstrap 127.0.0.1:9092 --idle 5

The first command also produces 1,000 random changes; ``--idle 5`` stops
after five seconds without input. Kill it (``kill -9``) and start it again:
it resumes from statelog's offsets, with the state that goes with them.
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

from quixstreams.models import TopicConfig
from quixstreams.state import State

import statelog
from statelog.integrations.quix import Application

# Explicit topic settings: some brokers (the tests' among them) do not report
# retention, and Quix derives its changelog topics' settings from them.
TOPIC = TopicConfig(
    num_partitions=3, replication_factor=1,
    extra_config={"retention.ms": "-1", "retention.bytes": "-1"},
)  # fmt: skip


def reconcile(change: dict[str, Any], state: State) -> dict[str, Any] | None:
    """Count the change; match it against the other side's waiting one, if any."""
    state.set("count", state.get("count", 0) + 1)
    side = change["side"]
    other = "tgt" if side == "src" else "src"
    waiting = state.get(other)
    if waiting is None:
        state.set(side, change)  # the buffer: this side waits for the other
        return None
    state.delete(other)
    return {"entity": change["entity"], "equal": waiting["amount"] == change["amount"]}


def build(bootstrap: str, state_dir: str) -> Application:
    app = Application(
        broker_address=bootstrap,
        consumer_group="cdc-counts",
        state_dir=state_dir,
        auto_offset_reset="earliest",
        # `make broker`'s high watermark counts record batches; Quix's changelog
        # check trusts it, so one record per batch (not needed against Kafka).
        producer_extra_config={"batch.num.messages": 1},
        # It also holds a group's join for about a session timeout: keep it short.
        consumer_extra_config={"session.timeout.ms": 6000},
        statelog=statelog.StoreOptions(durability="commit", compactor="process"),
    )
    changes = app.topic("cdc.changes", value_deserializer="json", config=TOPIC)
    verdicts = app.topic("cdc.verdicts", value_serializer="json", config=TOPIC)
    sdf = app.dataframe(changes)
    sdf = sdf.apply(reconcile, stateful=True).filter(lambda verdict: verdict is not None)
    sdf.to_topic(verdicts)
    return app


def produce(app: Application, n: int, seed: int = 1) -> None:
    """Produce ``n`` random changes over 100 entities."""
    rng = random.Random(seed)
    topic = app.topic("cdc.changes", value_serializer="json", config=TOPIC)
    with app.get_producer() as producer:
        for _ in range(n):
            entity = f"order-{rng.randrange(100)}"
            change = {
                "entity": entity,
                "side": rng.choice(["src", "tgt"]),
                "amount": rng.randrange(3),
            }
            msg = topic.serialize(key=entity, value=change)
            producer.produce(topic=topic.name, key=msg.key, value=msg.value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--state-dir", default="state-quix")
    parser.add_argument("--produce", type=int, default=0, help="first produce this many changes")
    parser.add_argument("--idle", type=float, default=0.0, help="stop after this long idle")
    args = parser.parse_args()
    app = build(args.bootstrap, args.state_dir)
    if args.produce:
        produce(app, args.produce)
    app.run(timeout=args.idle)
    with statelog.open(app.statelog.path, readonly=True) as store:
        print(json.dumps({"epoch": store.epoch, "offsets": store.offsets}))


if __name__ == "__main__":
    main()
