"""A stateful Quix Streams application for the tests and the benchmark, run as a process.

It reads JSON events ``{"entity": "e17", "side": "src" | "tgt", "amount": n,
"seq": i}`` keyed by entity, keeps per-key counts and a reconciliation buffer
(the side that arrived first waits for the other), and emits a verdict per
matched pair to the output topic. ``--store statelog`` keeps its state in
statelog (``statelog.integrations.quix.Application``), ``--store rocksdb`` in
Quix's own RocksDB store. It runs until stopped (SIGTERM) or, with
``--idle S``, until no message arrived for S seconds (then it stops cleanly).

``--report FILE`` writes when the first and the last message were processed
(the benchmark's events/s, and its time to the first message after a restart).

Faults for the tests, by environment variable (one per process):
``QUIX_APP_CRASH_AFTER_KAFKA_COMMIT=N``: SIGKILL itself at the first
checkpoint whose committed offsets, summed over partitions, pass N, after
Kafka's commit and before statelog's (by offset, not by count of
checkpoints, so how the input straddles checkpoints does not move it);
``QUIX_APP_LOSE_KAFKA_COMMIT=1``: Kafka commits are silently dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from quixstreams import Application as QuixApplication
from quixstreams.models import TopicConfig

import statelog

IN_TOPIC = "events"
OUT_TOPIC = "verdicts"
PARTITIONS = 3
TOPIC_EXTRA = {"retention.ms": "-1", "retention.bytes": "-1"}
# The test broker holds a group's join for about a session timeout; a short
# one makes (re)starts quick, and lets a SIGKILLed member leave soon.
CONSUMER_EXTRA = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 200}
# The test broker's high watermark is the base offset of a partition's last
# record batch plus one, not its last offset plus one; Quix's changelog
# recovery trusts it, so every record goes in a batch of its own.
PRODUCER_EXTRA = {"batch.num.messages": 1}


def topic_config() -> TopicConfig:
    """The topics' config, given in full: the test broker returns configs without retention."""
    return TopicConfig(num_partitions=PARTITIONS, replication_factor=1, extra_config=TOPIC_EXTRA)


def reconcile(value: dict[str, Any], state: Any) -> dict[str, Any] | None:
    """Count the event and match it against the other side's waiting one."""
    state.set("count", state.get("count", 0) + 1)
    side, other = value["side"], "tgt" if value["side"] == "src" else "src"
    waiting = state.get(other)
    if waiting is None:
        state.set(side, value)
        return None
    state.delete(other)
    matched = state.get("matched", 0) + 1
    state.set("matched", matched)
    return {
        "entity": value["entity"], "pair": matched, "count": state.get("count"),
        "equal": waiting["amount"] == value["amount"],
    }  # fmt: skip


class Report:
    """When the first and the last message were processed, for the benchmark (``--report``)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.assigned = self.first = self.last = 0.0
        self.count = 0

    def processed(self, topic: str, partition: int, offset: int) -> None:
        now = time.time()
        if not self.count:
            self.first = now
        self.last = now
        self.count += 1

    def write(self, path: str) -> None:
        doc = {"started": self.started, "assigned": self.assigned, "first": self.first}
        doc.update(last=self.last, count=self.count)
        Path(path).write_text(json.dumps(doc))


def build(args: argparse.Namespace, report: Report | None = None) -> QuixApplication:
    common: dict[str, Any] = dict(
        broker_address=args.bootstrap, consumer_group=args.group, state_dir=args.state_dir,
        auto_offset_reset="earliest", commit_interval=args.commit_interval, loglevel=args.loglevel,
        consumer_extra_config=CONSUMER_EXTRA, producer_extra_config=PRODUCER_EXTRA,
        use_changelog_topics=not args.no_changelog,
        on_message_processed=report.processed if report else None,
    )  # fmt: skip
    if args.store == "statelog":
        from statelog.integrations.quix import Application

        app: QuixApplication = Application(
            **common, statelog=statelog.StoreOptions(durability=args.durability)
        )
    else:
        app = QuixApplication(**common)
    events = app.topic(args.prefix + IN_TOPIC, value_deserializer="json", config=topic_config())
    verdicts = app.topic(args.prefix + OUT_TOPIC, value_serializer="json", config=topic_config())
    if report is not None:
        assign = app._on_assign

        def on_assign(*a: Any) -> None:
            report.assigned = report.assigned or time.time()
            assign(*a)

        app._on_assign = on_assign  # type: ignore[method-assign,assignment]
    sdf = app.dataframe(events)
    sdf = sdf.apply(reconcile, stateful=True).filter(lambda v: v is not None)
    sdf.to_topic(verdicts)
    return app


def _install_faults(app: QuixApplication) -> None:
    crash_beyond = int(os.environ.get("QUIX_APP_CRASH_AFTER_KAFKA_COMMIT", "0"))
    lose = os.environ.get("QUIX_APP_LOSE_KAFKA_COMMIT") == "1"
    if not (crash_beyond or lose):
        return
    consumer = app._consumer
    real_commit = consumer.commit
    committed: dict[tuple[str, int], int] = {}

    def commit(*a: Any, **kw: Any) -> Any:
        if lose:
            return []
        out = real_commit(*a, **kw)
        for tp in kw.get("offsets") or []:
            committed[(tp.topic, tp.partition)] = tp.offset
        if sum(committed.values()) > crash_beyond:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    consumer.commit = commit  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--store", choices=("statelog", "rocksdb"), default="statelog")
    p.add_argument("--durability", default="commit")
    p.add_argument("--commit-interval", type=float, default=0.5)
    p.add_argument("--loglevel", default="WARNING")
    p.add_argument("--prefix", default="", help="prefix of the topic names")
    p.add_argument("--no-changelog", action="store_true", help="without changelog topics")
    p.add_argument("--idle", type=float, default=0.0, help="stop after this long without input")
    p.add_argument("--report", help="write the processing times here (JSON) on a clean stop")
    args = p.parse_args(argv)
    report = Report() if args.report else None
    app = build(args, report)
    _install_faults(app)
    app.run(timeout=args.idle)
    if report is not None:
        report.write(args.report)


if __name__ == "__main__":
    main()
