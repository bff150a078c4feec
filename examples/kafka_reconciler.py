"""A reconciler that reads two CDC topics with confluent-kafka and keeps its state in statelog.

This is the code ``docs/guide.md`` walks through: every Python block of the
guide is an excerpt of this file (``tests/test_guide.py`` checks it), and the
tests run it against an in-memory Kafka, so no broker is needed for them.

The job: ``cdc.source`` carries a source database's changes and
``cdc.target`` its replica's. Both are keyed by entity id and
co-partitioned (same partition count, same key-to-partition mapping), so
source partition ``p`` and target partition ``p`` hold the same entities.
A message value is JSON ``{"ts": event time in ms, "amount": n}``; a
heartbeat (no ``amount``) only advances its partition's event time. Once
the low watermark guarantees that no more events of an entity can come,
the reconciler compares its two sides and writes a parity verdict (match,
mismatch, missing_in_target, missing_in_source) to an idempotent sink.

Against a broker::

    python -m examples.kafka_reconciler --bootstrap-servers localhost:9092 \
        --group reconciler --store state --sink verdicts.sqlite [--sharded]

``confluent_kafka`` is imported where it is used, so this module imports
without it (the tests install an in-memory stand-in under that name).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import prometheus_client

import statelog
import statelog.ops.metrics
from statelog.sinks import Output, Sink, SinkCommit, SinkedStore, SQLiteSink

__all__ = [
    "EXIT_RESNAPSHOT",
    "LATENESS_MS",
    "MAX_LAG_MS",
    "SOURCE_TOPIC",
    "TARGET_TOPIC",
    "TOPICS",
    "Change",
    "ConsumerLike",
    "MessageLike",
    "Reconciler",
    "ShardedMember",
    "commit_to_kafka",
    "consumer_config",
    "decode",
    "kafka_partition",
    "main",
    "make_consumer",
    "open_store",
    "partition_name",
    "poll_batch",
    "reconcile",
    "resnapshot_required",
    "run",
    "serve_metrics",
    "source_partitions",
    "start_positions",
    "verdict",
]

log = logging.getLogger("kafka_reconciler")

SOURCE_TOPIC = "cdc.source"
TARGET_TOPIC = "cdc.target"
TOPICS = (SOURCE_TOPIC, TARGET_TOPIC)
TABLES = ("buffer", "aligner")  # read back at every start, before the first write
SIDES = {SOURCE_TOPIC: "src", TARGET_TOPIC: "tgt"}
LATENESS_MS = 2_000  # an event is at most this much older than any event before it in its partition
MAX_LAG_MS = 1_500  # the target's copy of a change trails the source's by less than this
EXIT_RESNAPSHOT = 3  # the store cannot be recovered: an operator must restore or rebuild it


# -- what the reconciler uses of confluent-kafka --------------------------------------


class KafkaErrorLike(Protocol):
    """The part of ``confluent_kafka.KafkaError`` used here."""

    def code(self) -> int: ...


class MessageLike(Protocol):
    """The part of ``confluent_kafka.Message`` used here."""

    def error(self) -> KafkaErrorLike | None: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...


RebalanceCallback = Callable[[Any, list[Any]], None]


class ConsumerLike(Protocol):
    """The part of ``confluent_kafka.Consumer`` used here."""

    def poll(self, timeout: float = -1) -> MessageLike | None: ...
    def assign(self, partitions: list[Any]) -> None: ...
    def unassign(self) -> None: ...
    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None: ...
    def commit(self, *, offsets: list[Any], asynchronous: Literal[True] = ...) -> None: ...
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...
    def close(self) -> Any: ...


# -- offsets: statelog's partition names and Kafka's TopicPartitions ------------------


def partition_name(topic: str, partition: int) -> str:
    """The key of a Kafka partition in ``store.offsets``: ``"cdc.source-3"``."""
    return f"{topic}-{partition}"


def kafka_partition(name: str) -> tuple[str, int]:
    """The ``(topic, partition)`` of an offsets key (topic names may contain ``-``)."""
    topic, _, number = name.rpartition("-")
    return topic, int(number)


def consumer_config(bootstrap_servers: str, group_id: str) -> dict[str, Any]:
    """The consumer settings the guarantees of docs/guide.md rely on."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "group.id": group_id,
        # statelog's commit is the one record of what was folded into the state:
        # Kafka must neither commit nor store offsets on its own.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # A resume offset the broker no longer holds (retention, a recreated
        # topic) must stop the reconciler, never move it somewhere else.
        "auto.offset.reset": "error",
        # Source partition p and target partition p go to the same member.
        "partition.assignment.strategy": "range",
        # Never fold a change whose producer transaction was aborted.
        "isolation.level": "read_committed",
    }


def make_consumer(bootstrap_servers: str, group_id: str) -> ConsumerLike:
    """A ``confluent_kafka.Consumer`` with :func:`consumer_config`."""
    from confluent_kafka import Consumer

    consumer: ConsumerLike = Consumer(consumer_config(bootstrap_servers, group_id))
    return consumer


def source_partitions(consumer: ConsumerLike, timeout_s: float = 10.0) -> list[tuple[str, int]]:
    """Every ``(topic, partition)`` of both topics, from the cluster's metadata.

    :raises RuntimeError: a topic is missing, or the two are not co-partitioned.
    """
    topics = consumer.list_topics(timeout=timeout_s).topics
    counts = {t: len(topics[t].partitions) if t in topics else 0 for t in TOPICS}
    if 0 in counts.values() or len(set(counts.values())) != 1:
        raise RuntimeError(f"topics must exist with the same partition count: {counts}")
    return [(t, p) for t in TOPICS for p in range(counts[t])]


def start_positions(offsets: Mapping[str, int], partitions: Iterable[tuple[str, int]]) -> list[Any]:
    """Where each partition resumes: the next offset statelog committed for it.

    A partition statelog never committed starts at the beginning of its
    topic: nothing of it is in the state yet.
    """
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    return [
        TopicPartition(topic, p, offsets.get(partition_name(topic, p), OFFSET_BEGINNING))
        for topic, p in partitions
    ]


def poll_batch(consumer: ConsumerLike, max_messages: int, timeout_s: float) -> list[MessageLike]:
    """Up to ``max_messages`` messages: waits ``timeout_s`` for the first, then takes what is ready.

    :raises KafkaException: the consumer reported an error, for example
        ``_AUTO_OFFSET_RESET``: a resume offset the broker no longer holds.
    """
    from confluent_kafka import KafkaException

    batch: list[MessageLike] = []
    while len(batch) < max_messages:
        msg = consumer.poll(timeout_s if not batch else 0)
        if msg is None:
            break
        if msg.error() is not None:
            raise KafkaException(msg.error())
        batch.append(msg)
    return batch


def commit_to_kafka(consumer: ConsumerLike, offsets: Mapping[str, int]) -> None:
    """Report progress to the consumer group, after statelog committed it.

    For lag monitoring only: no restart reads these offsets (it rewinds to
    ``store.offsets``), so the commit is asynchronous and a failed one is harmless.
    """
    from confluent_kafka import TopicPartition

    consumer.commit(
        offsets=[TopicPartition(*kafka_partition(n), o) for n, o in sorted(offsets.items())],
        asynchronous=True,
    )


# -- the state of one store -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    """One data message, decoded: where it was read and what it says."""

    topic: str
    partition: int
    offset: int
    key: str | None  # None: a heartbeat
    ts: int
    amount: int | None

    @property
    def name(self) -> str:
        """Its partition's key in ``store.offsets``."""
        return partition_name(self.topic, self.partition)


def decode(msg: MessageLike) -> Change:
    """Decode a data message (one whose ``error()`` is None).

    :raises ValueError: the message lacks a topic, partition, offset or value.
    """
    topic, partition, offset, value = msg.topic(), msg.partition(), msg.offset(), msg.value()
    if topic is None or partition is None or offset is None or value is None:
        raise ValueError(f"not a data message: {topic}/{partition}@{offset}")
    event = json.loads(value)
    raw_key = msg.key()
    if "amount" not in event or raw_key is None:
        return Change(topic, partition, offset, None, int(event["ts"]), None)
    return Change(topic, partition, offset, raw_key.decode(), int(event["ts"]), event["amount"])


def verdict(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The parity verdict of a closed buffer entry, as the sink's payload."""
    src, tgt = entry.get("src"), entry.get("tgt")
    if src is None:
        v = "missing_in_source"
    elif tgt is None:
        v = "missing_in_target"
    else:
        v = "match" if src == tgt else "mismatch"
    return {"verdict": v, "src": src, "tgt": tgt}


class Reconciler:
    """The comparison state of one store and the partitions it covers, folded batch by batch.

    The buffer (table ``buffer``: per entity, the amounts seen and the earliest
    event time) and the aligner (table ``aligner``: per partition, the highest
    event time read) are loaded once, as recovered, and kept in step with
    every commit. After an exception from :meth:`process`, drop the object:
    reopen the store and rewind the consumer, as a restart does.
    """

    def __init__(
        self, store: statelog.StateStore, sink: Sink, partitions: Iterable[tuple[str, int]]
    ) -> None:
        self.store = store
        self.sinked = SinkedStore(store, sink)
        self.partitions = sorted(partition_name(t, p) for t, p in partitions)
        self.buffer = {str(k): v for k, v in store.items(table="buffer")}
        self.aligner = {str(k): int(v) for k, v in store.items(table="aligner")}
        self.sealed: list[str] = []  # emitted by the last commit: final, their marks can go
        self.commits = 0
        self.rows = 0

    def process(self, changes: Iterable[Change]) -> SinkCommit | None:
        """Fold ``changes`` into the state and commit them as one checkpoint.

        In order: fold; close what the low watermark seals; write their
        verdicts to the sink; then ONE statelog commit of the offsets, the
        watermark, the buffer and aligner changes and the sink's applied
        marks. A change below its partition's committed offset is already in
        the state and is skipped.

        :returns: what the commit did, or None when every change was skipped.
        """
        committed = self.store.offsets
        offsets: dict[str, int] = {}
        touched: dict[str, dict[str, Any]] = {}
        high = dict(self.aligner)
        for change in changes:
            if change.offset < offsets.get(change.name, committed.get(change.name, 0)):
                continue  # already folded: delivered again before a rewind took effect
            offsets[change.name] = change.offset + 1  # statelog keeps the NEXT offset to read
            high[change.name] = max(high.get(change.name, 0), change.ts)
            if change.key is not None:
                entry = touched.setdefault(change.key, dict(self.buffer.get(change.key, {})))
                entry[SIDES[change.topic]] = change.amount
                entry["t"] = min(entry.get("t", change.ts), change.ts)
        if not offsets:
            return None
        # The aligner: no partition will deliver an event older than its highest
        # event time minus the lateness, so the slowest partition bounds them all.
        slowest = min(high.get(p, 0) for p in self.partitions)
        watermark = max(self.store.low_watermark_ms, slowest - LATENESS_MS)
        entries = {**self.buffer, **touched}
        closed = {k for k, e in entries.items() if e["t"] + MAX_LAG_MS < watermark}
        outputs = [Output(k, 1, verdict(entries[k])) for k in sorted(closed)]

        with self.sinked.transaction() as tx:  # on exit: the sink write, then the commit
            tx.emit(*outputs)
            for name, offset in offsets.items():
                tx.set_offset(name, offset)
            tx.low_watermark_ms = watermark
            for key, entry in touched.items():
                if key not in closed:
                    tx.put(key, entry, table="buffer")
            for key in closed & self.buffer.keys():
                tx.delete(key, table="buffer")
            for name in offsets:
                tx.put(name, high[name], table="aligner")
            for output_id in self.sealed:
                tx.forget(output_id)  # a sealed verdict is never revised: drop its mark

        # Durable now; only from here does the in-memory copy move on.
        self.buffer.update(touched)
        for key in closed:
            del self.buffer[key]
        self.aligner = high
        self.sealed = sorted(closed)
        assert tx.result is not None
        self.commits += 1
        self.rows += tx.result.rows
        return tx.result


# -- one store for every partition ----------------------------------------------------


def open_store(path: Path, durability: statelog.Durability = "commit") -> statelog.StateStore:
    """Open (recover) the store and log how far back recovery went."""
    store = statelog.open(path, durability=durability, tables=TABLES)
    r = store.recovery
    log.info("store=%s epoch=%d outcome=%s replayed=%d", path, r.epoch, r.outcome, r.replayed)
    if r.rejected or r.lost_epochs:
        lost = f"{r.lost_epochs.start}-{r.lost_epochs.stop - 1}" if r.lost_epochs else "none"
        log.warning(
            "store=%s recovery rejected %d file(s), lost epochs: %s; resuming from epoch %d: "
            "the consumers rewind to its offsets and the sink absorbs any replay",
            path,
            len(r.rejected),
            lost,
            r.epoch,
        )
    return store


def run(
    consumer: ConsumerLike,
    store: statelog.StateStore,
    sink: Sink,
    *,
    batch: int = 500,
    poll_timeout_s: float = 1.0,
    idle_exit: int | None = None,
    stop: threading.Event | None = None,
) -> Reconciler:
    """Reconcile every partition of both topics into one store, until ``stop`` is set.

    :param idle_exit: return after this many empty polls in a row (for a
        backfill or a test); None polls for ever.
    """
    partitions = source_partitions(consumer)
    reconciler = Reconciler(store, sink, partitions)
    consumer.assign(start_positions(store.offsets, partitions))  # rewind to statelog's offsets
    idle = 0
    while stop is None or not stop.is_set():
        messages = poll_batch(consumer, batch, poll_timeout_s)
        idle = 0 if messages else idle + 1
        if idle_exit is not None and idle >= idle_exit:
            break
        if messages and reconciler.process(map(decode, messages)) is not None:
            commit_to_kafka(consumer, store.offsets)  # after statelog, for monitoring
    return reconciler


# -- one shard per partition number, opened and closed by rebalances -------------------


class ShardedMember:
    """A consumer-group member whose state is a :class:`statelog.ShardedStore`.

    Shard ``p`` holds source partition ``p`` and target partition ``p``: their
    offsets, their buffer and their aligner marks, committed together. A
    shard's store is opened (recovered) when the group assigns its partitions
    to this member and closed when they are revoked, so its lock, and its
    recovery, move with the partitions.
    """

    def __init__(
        self,
        consumer: ConsumerLike,
        root: Path,
        sink: Sink,
        *,
        shards: int,
        standby: statelog.ShardedStore | None = None,
        **store_options: Any,
    ) -> None:
        self.consumer = consumer
        self.sink = sink
        # With a standby root (one warm copy per shard, following the group's root),
        # the member takes its shards over by promotion instead of recovering them.
        self.sharded = standby or statelog.ShardedStore(
            root, shards=shards, lazy=True, tables=TABLES, **store_options
        )
        self.owned: dict[int, Reconciler] = {}
        self.generation = 0  # bumped by every rebalance callback
        consumer.subscribe(
            list(TOPICS), on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_revoke
        )

    def on_assign(self, consumer: ConsumerLike, partitions: list[Any]) -> None:
        """Open the shard of every assigned partition number; resume from its offsets."""
        self.generation += 1
        groups: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for tp in partitions:
            groups[tp.partition].append((tp.topic, tp.partition))
        for shard, parts in sorted(groups.items()):
            if len(parts) != len(TOPICS):
                raise RuntimeError(f"partition {shard} is not assigned for every topic: {parts}")
            self.owned[shard] = Reconciler(self.take(shard), self.sink, parts)
        self.rewind()

    def rewind(self) -> None:
        """Assign every owned partition at the next offset its shard committed."""
        positions = []
        for reconciler in self.owned.values():
            parts = [kafka_partition(name) for name in reconciler.partitions]
            positions += start_positions(reconciler.store.offsets, parts)
        self.consumer.assign(positions)

    def on_revoke(self, consumer: ConsumerLike, partitions: list[Any]) -> None:
        """Close every owned shard (eager rebalancing revokes the whole assignment)."""
        self.generation += 1
        for shard in sorted(self.owned):
            self.sharded.close_shard(shard)
        self.owned.clear()
        consumer.unassign()

    def take(self, shard: int) -> statelog.StateStore:
        """The shard's store: its standby promoted if this member keeps one, else recovered."""
        if shard in self.sharded.standbys:
            # Claims the shard from its dead owner (refused while the owner still holds
            # its lock); the owner's directory can no longer be opened by a writer.
            self.sharded.promote(shard)
        return self.sharded.open_shard(shard)  # recovers this shard alone

    def step(self, batch: int = 500, poll_timeout_s: float = 1.0) -> int:
        """Poll one batch and commit it, one commit per shard it touches.

        :returns: the number of messages polled.
        """
        generation = self.generation
        messages = poll_batch(self.consumer, batch, poll_timeout_s)
        if self.generation != generation:
            # A rebalance ran inside poll: the batch mixes messages from before it
            # and after it. Drop it all and read again from the shards' offsets.
            self.rewind()
            return len(messages)
        by_shard: dict[int, list[Change]] = defaultdict(list)
        for change in map(decode, messages):
            by_shard[change.partition].append(change)
        for shard, changes in sorted(by_shard.items()):
            reconciler = self.owned[shard]
            if reconciler.process(changes) is not None:
                commit_to_kafka(self.consumer, reconciler.store.offsets)
        return len(messages)

    def close(self) -> None:
        """Close every shard and the root; close the consumer after this."""
        self.owned.clear()
        self.sharded.close()


def buffer_activity(store: statelog.StateStore, since: int) -> Iterator[tuple[int, int, int]]:
    """``(epoch, entries put, entries closed)`` of the buffer, per checkpoint after ``since``.

    What a downstream job (an audit copy, a dashboard) follows through the store's
    changes feed instead of polling the store; it keeps the last epoch it handled.
    """
    for change in store.changes(since=since):
        buffer = change.tables.get("buffer")
        if buffer is not None:
            yield change.epoch, len(buffer.puts), len(buffer.deletes)


# -- the program --------------------------------------------------------------------


def serve_metrics(port: int, addr: str = "127.0.0.1") -> None:
    """Serve statelog's Prometheus series (``statelog.ops.metrics.REGISTRY``) over HTTP."""
    prometheus_client.start_http_server(port, addr=addr, registry=statelog.ops.metrics.REGISTRY)


def resnapshot_required(error: statelog.StatelogError) -> int:
    """Log why the store cannot be recovered and what the operator does next."""
    log.critical(
        "%s. Restore the store from a backup (the consumers rewind to its offsets and "
        "the sink absorbs the replay), or move it aside and rebuild it from the topics "
        "if they still hold every message since the first offset.",
        error.message,
    )
    return EXIT_RESNAPSHOT


def main(argv: Sequence[str] | None = None) -> int:
    """The reconciler as a program; see the module docstring. Exit 3: ResnapshotRequired."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--store", type=Path, required=True, help="a store, or a sharded root")
    ap.add_argument("--sink", type=Path, required=True, help="the SQLite verdicts database")
    ap.add_argument("--sharded", action="store_true", help="one shard per partition number")
    ap.add_argument("--durability", choices=("commit", "group"), default="commit")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--metrics-port", type=int)
    ap.add_argument("--idle-exit", type=int, help="stop after this many empty polls")
    ap.add_argument(
        "--consumer-config", action="append", default=[], metavar="KEY=VALUE",
        help="a further librdkafka consumer setting (repeatable), e.g. session.timeout.ms=6000",
    )  # fmt: skip
    args = ap.parse_args(argv)
    for item in args.consumer_config:
        if "=" not in item:
            ap.error(f"--consumer-config {item!r}: expected KEY=VALUE")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.metrics_port is not None:
        serve_metrics(args.metrics_port)
    stop = threading.Event()  # SIGTERM: finish the batch in hand, close, exit 0
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        return reconcile(args, stop)
    finally:
        signal.signal(signal.SIGTERM, previous)


def reconcile(args: argparse.Namespace, stop: threading.Event) -> int:
    """Run the reconciler :func:`main` configured until ``stop`` is set (or it idles out)."""
    if args.consumer_config:
        from confluent_kafka import Consumer

        extra = dict(item.split("=", 1) for item in args.consumer_config)
        config = {**consumer_config(args.bootstrap_servers, args.group), **extra}
        consumer: ConsumerLike = Consumer(config)
    else:
        consumer = make_consumer(args.bootstrap_servers, args.group)
    try:
        with SQLiteSink(args.sink, table="verdicts") as sink:
            if not args.sharded:
                with open_store(args.store, args.durability) as store:
                    run(
                        consumer, store, sink, batch=args.batch, stop=stop, idle_exit=args.idle_exit
                    )
                return 0
            shards = len(source_partitions(consumer)) // len(TOPICS)
            member = ShardedMember(
                consumer, args.store, sink, shards=shards, durability=args.durability
            )
            try:
                idle = 0
                while not stop.is_set() and (args.idle_exit is None or idle < args.idle_exit):
                    idle = 0 if member.step(args.batch) else idle + 1
            finally:
                member.close()
            return 0
    except statelog.ResnapshotRequired as exc:
        return resnapshot_required(exc)
    except statelog.ShardOpenError as exc:
        if isinstance(exc.cause, statelog.ResnapshotRequired):
            return resnapshot_required(exc)
        raise
    finally:
        consumer.close()  # leaves the group; statelog already holds every offset


if __name__ == "__main__":
    sys.exit(main())
