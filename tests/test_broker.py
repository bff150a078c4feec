"""The tests' Kafka-protocol broker (:mod:`tests.broker`) does what the engines need.

| situation                                          | expected                                 |
|----------------------------------------------------|------------------------------------------|
| messages produced to a two-partition topic         | every one consumed, in order per key     |
| a consumer group commits, closes, and comes back   | it resumes at the committed offsets      |
| the broker stopped                                 | its process is gone                      |
"""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.broker import Broker, kafka  # noqa: F401

N = 500


def _consume(bootstrap: str, topic: str, group: str, want: int) -> list[tuple[int, int, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    c.subscribe([topic])
    got: list[tuple[int, int, bytes]] = []
    misses = 0
    while len(got) < want and misses < 60:
        msg = c.poll(0.5)
        if msg is None:
            misses += 1
            continue
        assert msg.error() is None, msg.error()
        got.append((msg.partition(), msg.offset(), msg.value()))
    c.commit(asynchronous=False)
    c.close()
    return got


def test_produce_consume_and_resume_from_committed_offsets(kafka: Broker) -> None:  # noqa: F811
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(N):
        p.produce(topic, key=f"k{i % 7}".encode(), value=str(i).encode())
    assert p.flush(30) == 0
    first = _consume(kafka.bootstrap, topic, group, N // 2)
    rest = _consume(kafka.bootstrap, topic, group, N - len(first))
    values = sorted(int(v) for _p, _o, v in first + rest)
    assert values == list(range(N))  # each once: the second consumer resumed, not restarted
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    c.close()
    assert sum(tp.offset for tp in committed) == N


def test_a_stopped_broker_is_gone() -> None:
    broker = Broker()
    broker.stop()
    assert broker.proc.poll() is not None
