"""The integration guide (docs/guide.md) and its Kafka reconciler, against an in-memory Kafka.

``examples/kafka_reconciler.py`` is written against confluent-kafka's consumer
API and imports ``confluent_kafka`` where it uses it. These tests install the
in-memory stand-in of :mod:`tests.fakes` under that name (:func:`fake_kafka`).
Every Python block of the guide is a verbatim excerpt of the example, so the
tests below execute each of them; ``tests/test_docs_examples.py`` holds the
guide's blocks to that.

| case                                               | expected                                 |
|----------------------------------------------------|------------------------------------------|
| every Python block of the guide                    | verbatim in the example; edits caught    |
| the stand-in vs the real confluent_kafka           | same names and constants; config valid   |
| crash-free run                                     | sink == verdicts computed from the input |
| exception before / after the sink write, or after  | sink == reference, each row written once |
|   the statelog commit; restart, rewind             |                                          |
| SIGKILL between sink write and commit, twice       | sink == reference, each row written once |
| walk-back (older copy; damaged log record)         | consumer rewound further, zero new rows  |
| resume from Kafka's auto-committed offsets instead | verdicts lost: the comparison catches it |
| resume offset deleted by retention                 | KafkaException, nothing written          |
| sharded: a member joins, then leaves               | shards move; sink == reference           |
| sharded: a member crashes mid-commit               | taken over; each row written once        |
| main(): one store and sharded, metrics served      | exit 0, sink == reference, series served |
| main(): the store lost its log                     | exit 3, store untouched; rebuild: 0 rows |
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import statelog  # noqa: E402
from examples import kafka_reconciler as kr  # noqa: E402
from examples.reconciler import streams  # noqa: E402
from statelog.sinks import Output, Row, SQLiteSink  # noqa: E402
from tests.fakes import (  # noqa: E402
    CLUSTERS,
    OFFSET_BEGINNING,
    OFFSET_STORED,
    Cluster,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
    fake_kafka,
)
from tests.helpers import flip_bit, frames, segments  # noqa: E402

GUIDE = ROOT / "docs" / "guide.md"
EXAMPLE = ROOT / "examples" / "kafka_reconciler.py"
SEED = 5
ENTITIES = 700
PARTITIONS = 3
BATCH = 40
BOOTSTRAP = "fake-kafka:9092"

# -- the input and what it must produce ---------------------------------------------------


def build_cluster(seed: int = SEED, entities: int = ENTITIES) -> Cluster:
    """Both topics from the demo's seeded CDC streams, with offset gaps and closing heartbeats.

    Each partition ends with a heartbeat far enough ahead that the low
    watermark seals every entity.
    """
    data = streams.generate(seed, entities, PARTITIONS)
    rng = random.Random(seed)
    last = max(ev.time_ms for evs in data.partitions.values() for ev in evs)
    heartbeat = last + kr.LATENESS_MS + kr.MAX_LAG_MS + 1
    topics: dict[str, list[list[Message]]] = {kr.SOURCE_TOPIC: [], kr.TARGET_TOPIC: []}
    for side, topic in (("src", kr.SOURCE_TOPIC), ("tgt", kr.TARGET_TOPIC)):
        for p in range(PARTITIONS):
            msgs, offset = [], 0
            for ev in data.partitions[f"{side}-{p}"]:
                value = json.dumps({"ts": ev.time_ms, "amount": ev.amount}).encode()
                msgs.append(Message(topic, p, offset, ev.key.encode(), value))
                offset += rng.choice((1, 1, 1, 2))  # a gap: a transaction marker's offset
            msgs.append(Message(topic, p, offset, None, json.dumps({"ts": heartbeat}).encode()))
            topics[topic].append(msgs)
    return Cluster(topics, seed)


def expected_verdicts(seed: int = SEED, entities: int = ENTITIES) -> dict[str, dict[str, Any]]:
    """The verdict of every entity, computed straight from the streams (no Kafka, no store)."""
    seen: dict[str, dict[str, Any]] = {}
    for evs in streams.generate(seed, entities, PARTITIONS).partitions.values():
        for ev in evs:
            seen.setdefault(ev.key, {})[ev.side] = ev.amount
    return {key: kr.verdict(entry) for key, entry in seen.items()}


def sink_rows(path: Path) -> list[Row]:
    with SQLiteSink(path, table="verdicts") as sink:
        return sink.rows()


def verdicts_of(path: Path) -> dict[str, dict[str, Any]]:
    rows = sink_rows(path)
    assert all(r.version == 1 for r in rows)
    return {r.id: r.payload for r in rows}


class Crash(Exception):
    """The injected failure: the process 'dies' here."""


class CountingSink:
    """A SQLiteSink that adds up the rows each write changed and can fail around a write."""

    def __init__(
        self,
        path: Path,
        *,
        before: int | None = None,
        after: int | None = None,
        stop: threading.Event | None = None,
        stop_after: int | None = None,
    ) -> None:
        self.inner = SQLiteSink(path, table="verdicts")
        self.writes = 0
        self.rows_changed = 0
        self.before, self.after = before, after
        self.stop, self.stop_after = stop, stop_after

    @property
    def name(self) -> str:
        return self.inner.name

    def write(self, outputs: Sequence[Output], epoch: int) -> int:
        self.writes += 1
        if self.writes == self.before:
            raise Crash(f"before sink write {self.writes}")
        rows = self.inner.write(outputs, epoch)
        self.rows_changed += rows
        if self.writes == self.after:
            raise Crash(f"after sink write {self.writes}, before the statelog commit")
        if self.stop is not None and self.writes == self.stop_after:
            self.stop.set()  # this commit completes; the loop then stops
        return rows

    def rows(self) -> list[Row]:
        return self.inner.rows()

    def high_epoch(self) -> int:
        return self.inner.high_epoch()

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The in-memory Kafka, installed as ``confluent_kafka``, with the seeded topics."""
    cluster = build_cluster()
    monkeypatch.setitem(sys.modules, "confluent_kafka", fake_kafka())
    CLUSTERS[BOOTSTRAP] = cluster
    yield cluster
    CLUSTERS.pop(BOOTSTRAP, None)


def consumer(config: dict[str, Any] | None = None) -> Consumer:
    """A consumer built by the example's own factory, optionally with other settings."""
    c = kr.make_consumer(BOOTSTRAP, "reconciler")
    assert isinstance(c, Consumer)
    c.config.update(config or {})
    return c


def fake(c: kr.ConsumerLike) -> Consumer:
    assert isinstance(c, Consumer)
    return c


def run_once(
    store_path: Path,
    sink: CountingSink,
    stop: threading.Event | None = None,
    config: dict[str, Any] | None = None,
) -> tuple[Consumer, kr.Reconciler]:
    """One process lifetime: open, rewind, reconcile until idle or stopped (or crash)."""
    c = consumer(config)
    with kr.open_store(store_path) as store:
        rec = kr.run(c, store, sink, batch=BATCH, poll_timeout_s=0, idle_exit=2, stop=stop)
    c.close()
    return c, rec


def assert_finished(store_path: Path, cluster: Cluster) -> None:
    """Every partition read to its end; nothing left in the buffer."""
    with statelog.open(store_path, readonly=True) as store:
        assert store.offsets == cluster.ends()
        assert store.count("buffer") == 0


# -- the guide is the example ------------------------------------------------------------


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


def missing_blocks(markdown: str, source: str) -> list[str]:
    """The guide's Python blocks that are not verbatim excerpts of ``source``."""
    return [b for b in python_blocks(markdown) if b not in source]


def _sources() -> str:
    """The example, and the stream-processor examples its last sections quote."""
    others = [EXAMPLE.with_name(n) for n in ("quix_counts.py", "faust_counts.py")]
    return "\n".join(p.read_text() for p in (EXAMPLE, *others) if p.exists())


def test_every_python_block_of_the_guide_is_an_excerpt_of_the_example() -> None:
    guide, source = GUIDE.read_text(), _sources()
    blocks = python_blocks(guide)
    assert len(blocks) >= 8, "the guide shows the reconciler's code"
    assert missing_blocks(guide, source) == []


def test_an_edited_block_is_caught() -> None:
    guide, source = GUIDE.read_text(), _sources()
    first = python_blocks(guide)[0]
    edited = guide.replace(first, first.replace("(", "( ", 1), 1)
    assert missing_blocks(edited, source) == [first.replace("(", "( ", 1)]


def test_the_stand_in_has_confluent_kafkas_names_and_the_config_is_accepted() -> None:
    real = pytest.importorskip("confluent_kafka")
    for name in ("poll", "assign", "unassign", "assignment", "subscribe", "commit", "committed",
                 "list_topics", "close"):  # fmt: skip
        assert hasattr(real.Consumer, name) and hasattr(Consumer, name), name
    for name in ("error", "topic", "partition", "offset", "key", "value", "timestamp"):
        assert hasattr(real.Message, name) and hasattr(Message, name), name
    for name in ("OFFSET_BEGINNING", "OFFSET_END", "OFFSET_STORED", "OFFSET_INVALID"):
        assert getattr(real, name) == getattr(fake_kafka(), name), name
    assert real.KafkaError._AUTO_OFFSET_RESET == KafkaError._AUTO_OFFSET_RESET
    assert real.TopicPartition("t", 1, 5) == real.TopicPartition("t", 1, 9)
    assert TopicPartition("t", 1, 5) == TopicPartition("t", 1, 9)
    # The example's settings are valid for librdkafka, and its rewind builds real
    # TopicPartitions that assign() takes (no broker is needed for either).
    c: Any = kr.make_consumer("127.0.0.1:1", "guide-test")
    try:
        positions = kr.start_positions({"cdc.source-0": 42}, [("cdc.source", 0), ("cdc.target", 0)])
        assert [(tp.topic, tp.partition, tp.offset) for tp in positions] == [
            ("cdc.source", 0, 42), ("cdc.target", 0, real.OFFSET_BEGINNING)
        ]  # fmt: skip
        c.assign(positions)
        assert sorted((tp.topic, tp.partition) for tp in c.assignment()) == [
            ("cdc.source", 0), ("cdc.target", 0)
        ]  # fmt: skip
    finally:
        c.close()


def test_the_stand_in_honours_assigned_offsets_and_resets(kafka: Cluster) -> None:
    c = consumer()
    log = kafka.logs[(kr.SOURCE_TOPIC, 1)]
    gap = next(m.offset() for a, m in zip(log.messages, log.messages[1:], strict=False)
               if (m.offset() or 0) - (a.offset() or 0) == 2)  # fmt: skip
    c.assign([TopicPartition(kr.SOURCE_TOPIC, 1, (gap or 0) - 1)])  # a marker's offset
    msg = c.poll(0)
    assert msg is not None and msg.offset() == gap and msg.partition() == 1
    c.assign([TopicPartition(kr.SOURCE_TOPIC, 1, log.end + 5)])
    event = c.poll(0)
    error = event.error() if event is not None else None
    assert error is not None and error.code() == KafkaError._AUTO_OFFSET_RESET
    assert c.poll(0) is None  # the partition is stalled, not moved
    c.close()


# -- one store ---------------------------------------------------------------------------


def test_a_crash_free_run_writes_exactly_the_verdicts_of_the_input(
    kafka: Cluster, tmp_path: Path
) -> None:
    sink = CountingSink(tmp_path / "verdicts.sqlite")
    c, rec = run_once(tmp_path / "store", sink)
    expected = expected_verdicts()
    assert verdicts_of(tmp_path / "verdicts.sqlite") == expected
    assert sink.rows_changed == len(expected) and rec.commits > 10
    assert_finished(tmp_path / "store", kafka)
    # Kafka got the offsets too, after statelog, for lag monitoring.
    assert {kr.partition_name(t, p): o for (g, t, p), o in kafka.committed.items()} == kafka.ends()
    assert c.assigns[0] == [TopicPartition(t, p) for t in kr.TOPICS for p in range(PARTITIONS)]
    assert {tp.offset for tp in c.assigns[0]} == {OFFSET_BEGINNING}
    sink.close()
    # The buffer's activity, read back through the changes feed: every checkpoint's
    # puts and closes, and the closes add up to one per verdict.
    with statelog.open(tmp_path / "store", readonly=True) as store:
        activity = list(kr.buffer_activity(store, since=0))
        assert [e for e, _p, _c in activity] == sorted({e for e, _p, _c in activity})
        assert sum(closed for _e, _p, closed in activity) == len(expected)
        assert list(kr.buffer_activity(store, since=store.epoch)) == []


CRASHES = {  # (crash before sink write N, after sink write N, at Kafka commit N, lives)
    "before-sink-write": (6, None, None, 2),
    "after-sink-write": (None, 6, None, 2),
    "after-sink-write-twice": (None, 3, None, 3),
    "after-statelog-commit": (None, None, 6, 2),
}


@pytest.mark.parametrize("where", sorted(CRASHES))
def test_a_crash_around_the_sink_write_loses_and_doubles_nothing(
    kafka: Cluster, tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_path, sink_path = tmp_path / "store", tmp_path / "verdicts.sqlite"
    before, after, kafka_commit, lives = CRASHES[where]
    if kafka_commit is not None:
        calls = {"n": 0}
        real_commit = Consumer.commit

        def failing_commit(self: Consumer, *args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == kafka_commit:
                raise Crash("after the statelog commit, before Kafka's")
            return real_commit(self, *args, **kwargs)

        monkeypatch.setattr(Consumer, "commit", failing_commit)
    total = 0
    epochs_at_crash = []
    for life in range(lives):
        last = life == lives - 1
        sink = CountingSink(
            sink_path, before=None if last else before, after=None if last else after
        )
        try:
            run_once(store_path, sink)
            assert life == lives - 1, "the injected crash did not happen"
        except Crash:
            with statelog.open(store_path, readonly=True) as store:
                epochs_at_crash.append(store.epoch)
        finally:
            total += sink.rows_changed
            sink.close()
    assert verdicts_of(sink_path) == expected_verdicts()
    assert total == len(expected_verdicts())  # each verdict written once, replays changed nothing
    assert_finished(store_path, kafka)
    assert all(e > 0 for e in epochs_at_crash)


def test_sigkill_between_sink_write_and_commit_then_restart(kafka: Cluster, tmp_path: Path) -> None:
    store_path, sink_path, counts = (
        tmp_path / "store",
        tmp_path / "verdicts.sqlite",
        tmp_path / "rows",
    )
    for kill_at in (4, 7):
        done = subprocess.run(
            [sys.executable, "-m", "tests.test_guide", str(store_path), str(sink_path), str(counts),
             str(kill_at)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == -signal.SIGKILL, done.stderr
    with statelog.open(store_path, readonly=True) as store:
        # Killed after its 7th sink write: the store holds 6 commits of the second life.
        assert store.epoch == 3 + 6
    with statelog.open(store_path, readonly=True) as store:
        recovered = store.offsets
    sink = CountingSink(sink_path)
    c, _rec = run_once(store_path, sink)
    assert recovered and {kr.partition_name(tp.topic, tp.partition): tp.offset
                          for tp in c.assigns[0] if tp.offset >= 0} == recovered  # fmt: skip
    written = sum(int(x) for x in counts.read_text().split()) + sink.rows_changed
    sink.close()
    assert verdicts_of(sink_path) == expected_verdicts()
    assert written == len(expected_verdicts())
    assert_finished(store_path, kafka)


def _child(store: Path, sink_path: Path, counts: Path, kill_at: int) -> None:
    """A reconciler process SIGKILLed right after its ``kill_at``-th sink write returns."""
    sys.modules["confluent_kafka"] = fake_kafka()
    CLUSTERS[BOOTSTRAP] = build_cluster()

    class KillingSink(CountingSink):
        def write(self, outputs: Sequence[Output], epoch: int) -> int:
            rows = super().write(outputs, epoch)
            with open(counts, "a") as fh:
                fh.write(f"{rows}\n")
                fh.flush()
                os.fsync(fh.fileno())
            if self.writes == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return rows

    run_once(store, KillingSink(sink_path))


@pytest.mark.parametrize("how", ["older-copy", "damaged-log-record"])
def test_a_walk_back_rewinds_the_consumer_further_and_writes_no_row(
    kafka: Cluster, tmp_path: Path, how: str
) -> None:
    store_path, sink_path = tmp_path / "store", tmp_path / "verdicts.sqlite"
    stop = threading.Event()
    sink = CountingSink(sink_path, stop=stop, stop_after=8)
    run_once(store_path, sink, stop=stop)
    shutil.copytree(store_path, tmp_path / "older")  # a backup at epoch 8
    sink.stop = None
    run_once(store_path, sink)  # to the end
    sink.close()
    assert_finished(store_path, kafka)
    final_rows = sink_rows(sink_path)
    with statelog.open(store_path, readonly=True) as store:
        final_epoch, final_offsets = store.epoch, store.offsets

    if how == "older-copy":
        shutil.rmtree(store_path)
        shutil.move(tmp_path / "older", store_path)  # restored from the backup
        back_to = 8
    else:
        seg = segments(store_path)[-1]
        flip_bit(seg, frames(seg)[-3].offset + 20)  # the last two records, before the seal
        back_to = final_epoch - 2
    replay = CountingSink(sink_path)
    c, rec = run_once(store_path, replay)
    replay.close()
    assert rec.store.recovery.epoch == back_to
    rewound = {kr.partition_name(tp.topic, tp.partition): tp.offset for tp in c.assigns[0]}
    assert all(rewound[p] <= final_offsets[p] for p in final_offsets)
    assert any(rewound[p] < final_offsets[p] for p in final_offsets)  # further back than before
    assert replay.writes > 0 and replay.rows_changed == 0
    assert sink_rows(sink_path) == final_rows  # not one row touched, epochs included
    assert verdicts_of(sink_path) == expected_verdicts()
    assert_finished(store_path, kafka)


def test_resuming_from_kafkas_auto_committed_offsets_loses_verdicts(
    kafka: Cluster, tmp_path: Path
) -> None:
    """The control: Kafka's group offsets as the source of truth lose what a crash interrupted."""
    store_path, sink_path = tmp_path / "store", tmp_path / "verdicts.sqlite"
    naive = {"enable.auto.commit": True, "enable.auto.offset.store": True}
    with pytest.raises(Crash):
        run_once(store_path, CountingSink(sink_path, after=6), config=naive)
    c, sink = consumer(naive), CountingSink(sink_path)
    with statelog.open(store_path) as store:
        parts = kr.source_partitions(c)
        rec = kr.Reconciler(store, sink, parts)
        c.assign([TopicPartition(t, p, OFFSET_STORED) for t, p in parts])  # the group's offsets
        while batch := kr.poll_batch(c, BATCH, 0):
            rec.process(map(kr.decode, batch))
    c.close()
    sink.close()
    got, expected = verdicts_of(sink_path), expected_verdicts()
    assert got != expected  # events of the interrupted batch never reached the buffer


def test_a_resume_offset_deleted_by_retention_stops_the_reconciler(
    kafka: Cluster, tmp_path: Path
) -> None:
    store_path, sink_path = tmp_path / "store", tmp_path / "verdicts.sqlite"
    stop = threading.Event()
    sink = CountingSink(sink_path, stop=stop, stop_after=5)
    run_once(store_path, sink, stop=stop)
    sink.close()
    with statelog.open(store_path, readonly=True) as store:
        epoch, offset = store.epoch, store.offsets[f"{kr.TARGET_TOPIC}-2"]
    kafka.logs[(kr.TARGET_TOPIC, 2)].delete_before(offset + 10)
    before = sink_rows(sink_path)
    with pytest.raises(KafkaException) as err:
        run_once(store_path, CountingSink(sink_path))
    assert err.value.args[0].code() == KafkaError._AUTO_OFFSET_RESET
    assert sink_rows(sink_path) == before
    with statelog.open(store_path, readonly=True) as store:
        assert store.epoch == epoch


# -- sharded: one shard per partition number, moved by rebalances --------------------------


def drive(members: list[kr.ShardedMember], rounds: int = 10_000) -> None:
    """Step every member in turn until three rounds in a row poll nothing."""
    idle = 0
    for _ in range(rounds):
        polled = sum(m.step(BATCH, 0) for m in members)
        idle = 0 if polled else idle + 1
        if idle == 3:
            return
    raise AssertionError("the members never went idle")


def member(root: Path, sink: CountingSink) -> kr.ShardedMember:
    return kr.ShardedMember(consumer(), root, sink, shards=PARTITIONS)


def assert_shards_finished(root: Path, cluster: Cluster) -> None:
    with statelog.ShardedStore(root, readonly=True) as sharded:
        for shard in range(PARTITIONS):
            store = sharded.shard(shard)
            assert store.offsets == {
                kr.partition_name(t, shard): cluster.logs[(t, shard)].end for t in kr.TOPICS
            }
            assert store.count("buffer") == 0


def test_sharded_members_hand_shards_over_on_rebalance(kafka: Cluster, tmp_path: Path) -> None:
    root, sink_path = tmp_path / "root", tmp_path / "verdicts.sqlite"
    sink_a, sink_b = CountingSink(sink_path), CountingSink(sink_path)
    a = member(root, sink_a)
    for _ in range(6):
        a.step(BATCH, 0)
    assert sorted(a.owned) == [0, 1, 2]
    b = member(root, sink_b)  # joins: everything is revoked, then split by the range assignor
    for _ in range(8):
        a.step(BATCH, 0)
        b.step(BATCH, 0)
    assert sorted(a.owned) == [0, 1] and sorted(b.owned) == [2]
    assert b.owned[2].store.recovery.epoch > 0  # b recovered what a committed in shard 2
    assert any(tp.offset > 0 for tp in fake(b.consumer).assigns[-1])  # resumed, not restarted
    a.consumer.close()  # a leaves: b takes every shard
    a.close()
    drive([b])
    assert sorted(b.owned) == [0, 1, 2]
    b.consumer.close()
    b.close()
    assert verdicts_of(sink_path) == expected_verdicts()
    assert sink_a.rows_changed + sink_b.rows_changed == len(expected_verdicts())
    assert_shards_finished(root, kafka)


def test_a_sharded_member_crashing_mid_commit_is_taken_over(kafka: Cluster, tmp_path: Path) -> None:
    root, sink_path = tmp_path / "root", tmp_path / "verdicts.sqlite"
    sink_a, sink_b = CountingSink(sink_path, after=12), CountingSink(sink_path)
    a = member(root, sink_a)
    b = member(root, sink_b)
    with pytest.raises(Crash):
        drive([a, b])
    crashed = sorted(a.owned)
    assert crashed
    # The process is gone: its locks go with it and the group drops it at session timeout.
    fake(a.consumer).crash()
    a.close()
    drive([b])
    assert sorted(b.owned) == [0, 1, 2]
    b.consumer.close()
    b.close()
    assert verdicts_of(sink_path) == expected_verdicts()
    assert sink_a.rows_changed + sink_b.rows_changed == len(expected_verdicts())
    assert_shards_finished(root, kafka)


# -- the program ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main_args(store: Path, sink: Path, *extra: str) -> list[str]:
    return ["--bootstrap-servers", BOOTSTRAP, "--group", "reconciler", "--store", str(store),
            "--sink", str(sink), "--batch", str(BATCH), "--idle-exit", "2", *extra]  # fmt: skip


@pytest.mark.parametrize("sharded", [False, True], ids=["one-store", "sharded"])
def test_main_reconciles_and_serves_metrics(kafka: Cluster, tmp_path: Path, sharded: bool) -> None:
    port = free_port()
    extra = ["--metrics-port", str(port)] + (["--sharded"] if sharded else [])
    assert kr.main(main_args(tmp_path / "store", tmp_path / "v.sqlite", *extra)) == 0
    assert verdicts_of(tmp_path / "v.sqlite") == expected_verdicts()
    if sharded:
        assert_shards_finished(tmp_path / "store", kafka)
    else:
        assert_finished(tmp_path / "store", kafka)
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert re.search(r'^statelog_commits_total\{store="[^"]*store[^"]*"\} [1-9]', page, re.M)


def test_main_refuses_a_store_that_needs_a_resnapshot_then_rebuilds(
    kafka: Cluster, tmp_path: Path
) -> None:
    store, sink = tmp_path / "store", tmp_path / "v.sqlite"
    assert kr.main(main_args(store, sink)) == 0
    rows = sink_rows(sink)
    for seg in segments(store):
        seg.unlink()  # the log is gone and there is no snapshot
    listing = sorted(p.relative_to(store) for p in store.rglob("*"))
    assert kr.main(main_args(store, sink)) == kr.EXIT_RESNAPSHOT
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == listing
    shutil.move(store, tmp_path / "damaged")  # kept as evidence
    assert kr.main(main_args(store, sink)) == 0  # rebuilt from the topics' first offsets
    assert sink_rows(sink) == rows  # every verdict replayed as a no-op, epochs included
    assert_finished(store, kafka)


if __name__ == "__main__":
    _child(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))


def test_a_member_with_a_standby_per_shard_takes_over_by_promotion(
    kafka: Cluster, tmp_path: Path
) -> None:
    """The standby root follows every shard while the first member runs; it crashes mid-commit;
    the second member joins with the standbys and promotes each shard it is assigned."""
    root, copy, sink_path = tmp_path / "root", tmp_path / "copy", tmp_path / "verdicts.sqlite"
    statelog.ShardedStore(root, shards=PARTITIONS).close()
    standby = statelog.ShardedStore(copy, follow=root, follow_poll=timedelta(milliseconds=10))
    sink_a, sink_b = CountingSink(sink_path, after=20), CountingSink(sink_path)
    a = member(root, sink_a)
    with pytest.raises(Crash):
        drive([a])
    fake(a.consumer).crash()  # the process is gone, and its locks with it
    a.close()
    assert standby.standbys == [0, 1, 2]
    b = kr.ShardedMember(consumer(), copy, sink_b, shards=PARTITIONS, standby=standby)
    drive([b])
    assert sorted(b.owned) == [0, 1, 2] and standby.standbys == []
    assert any(tp.offset > 0 for tp in fake(b.consumer).assigns[0])  # resumed, not restarted
    b.consumer.close()
    b.close()
    assert verdicts_of(sink_path) == expected_verdicts()
    assert sink_a.rows_changed + sink_b.rows_changed == len(expected_verdicts())
    assert_shards_finished(copy, kafka)
    with pytest.raises(statelog.ShardOpenError):
        statelog.ShardedStore(root)  # the old root was claimed, shard by shard
