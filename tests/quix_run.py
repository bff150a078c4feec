"""Driving ``tests/quix_app.py`` against the test broker: input, processes, state, outputs.

One seeded stream of events (:func:`events`), its exact outcome computed by
a model (:func:`model`: the app's own ``reconcile`` over each entity's events
in order, which is what per-partition order guarantees), and what a run
left behind: the state in statelog (:func:`statelog_state`) and the distinct
verdicts on the output topic (:func:`verdicts`). A run equals the model when
both are equal: a lost event or one counted twice changes a count, and so
the state and some verdict.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import statelog
from tests import quix_app
from tests.broker import Broker

__all__ = [
    "App", "events", "kafka_committed", "model", "produce", "setup_topics", "statelog_state",
    "store_progress", "verdicts", "wait_for",
]  # fmt: skip

REPO = Path(__file__).resolve().parent.parent
Event = dict[str, Any]


def events(n: int, seed: int, entities: int = 150) -> list[Event]:
    rng = random.Random(seed)
    out = []
    for seq in range(n):
        entity = f"e{rng.randrange(entities)}"
        side = rng.choice(("src", "tgt"))
        out.append({"entity": entity, "side": side, "amount": rng.randrange(4), "seq": seq})
    return out


class _State:
    """A dict standing in for Quix's State in the model."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


def model(stream: Iterable[Event]) -> tuple[dict[tuple[str, str], Any], set[str]]:
    """The state ``{(entity, name): value}`` and the verdicts a crash-free run leaves."""
    states: dict[str, _State] = {}
    outs: set[str] = set()
    for event in stream:
        st = states.setdefault(event["entity"], _State())
        out = quix_app.reconcile(event, st)
        if out is not None:
            outs.add(json.dumps(out, sort_keys=True))
    flat = {(e, k): v for e, st in states.items() for k, v in st.data.items()}
    return flat, outs


def setup_topics(broker: Broker, prefix: str) -> None:
    for name in (quix_app.IN_TOPIC, quix_app.OUT_TOPIC):
        broker.create_topic(prefix + name, quix_app.PARTITIONS, dict(quix_app.TOPIC_EXTRA))


def produce(broker: Broker, prefix: str, batch: Iterable[Event]) -> None:
    from confluent_kafka import Producer

    # Idempotent: a retried request neither duplicates nor reorders a key's events.
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    for event in batch:
        producer.produce(prefix + quix_app.IN_TOPIC, key=event["entity"], value=json.dumps(event))
    assert producer.flush(30) == 0


def verdicts(broker: Broker, prefix: str, expected: int, timeout: float = 30.0) -> set[str]:
    """The distinct verdicts on the output topic; reads until ``expected`` distinct or idle."""
    from confluent_kafka import Consumer

    consumer = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False, **quix_app.CONSUMER_EXTRA,
    })  # fmt: skip
    consumer.subscribe([prefix + quix_app.OUT_TOPIC])
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    idle_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                if len(seen) >= expected and time.monotonic() - idle_since > 1.0:
                    break
                continue
            idle_since = time.monotonic()
            seen.add(json.dumps(json.loads(msg.value()), sort_keys=True))
    finally:
        consumer.close()
    return seen


def statelog_state(store_dir: Path) -> dict[tuple[str, str], Any]:
    """The app's per-entity state as statelog holds it, across partitions."""
    flat: dict[tuple[str, str], Any] = {}
    with statelog.open(store_dir, readonly=True) as store:
        for table in store.tables():
            if not table.endswith("/default") or not table.startswith("quix/"):
                continue
            for key, value in store.items(table):
                assert isinstance(key, bytes) and isinstance(value, bytes)
                prefix, _, name = key.partition(b"|")
                flat[(prefix.decode(), json.loads(name))] = json.loads(value)
    return flat


def store_progress(store_dir: Path) -> int:
    """How many events statelog's offsets say were processed (0 before the store exists)."""
    try:
        with statelog.open(store_dir, readonly=True) as store:
            return sum(store.offsets.values())
    except (statelog.StoreNotFoundError, statelog.NotAStoreError):
        return 0


def kafka_committed(broker: Broker, group: str, topic: str) -> int:
    """The sum of the group's offsets committed to Kafka for ``topic`` (missing ones as 0)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in range(quix_app.PARTITIONS)]
        return sum(max(tp.offset, 0) for tp in consumer.committed(tps, timeout=10))
    finally:
        consumer.close()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class App:
    """One ``tests/quix_app.py`` process."""

    def __init__(
        self, broker: Broker, state_dir: Path, group: str, prefix: str, *args: str,
        env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.store_dir = state_dir / group / "statelog"
        state_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "tests.quix_app", "--bootstrap", broker.bootstrap,
            "--group", group, "--state-dir", str(state_dir), "--prefix", prefix, *args,
        ]  # fmt: skip
        self.log = state_dir / f"{group}.log"  # a file: a pipe nobody reads fills and blocks
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env={**os.environ, **(env or {})},
                stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # a failed test leaves no process behind
            self.kill()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def wait(self, timeout: float = 90.0) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return rc

    def errors(self) -> str:
        """The end of what the app wrote to stderr, for a failing assertion's message."""
        return self.log.read_text(errors="replace")[-4000:]
