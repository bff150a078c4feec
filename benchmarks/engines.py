"""Running a stream processor's stateful pipeline on a store, for ``bench_engines.py``.

The pipelines are the tests' applications (``tests/quix_app.py``), run as
processes against the tests' broker: per-key counts and a reconciliation
buffer keyed by entity. A run reads what the application reports on a
clean stop (``--report``): when it was ready (imports done), when it
processed its first and its last message, and how many.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.broker import Broker
from tests.quix_run import REPO as ROOT
from tests.quix_run import App, events, kafka_committed, produce, setup_topics, wait_for

__all__ = ["FaustPipeline", "Pipeline"]

IDLE = 3.0
"""Seconds without input after which a measured run stops itself."""


class Pipeline:
    """One engine and one store kind on one broker: its topics, group and state directory."""

    def __init__(self, broker: Broker, root: Path, store: str, events_n: int, entities: int):
        self.broker, self.store = broker, store
        self.prefix = f"{store}.{time.monotonic_ns()}."
        self.group = f"bench-{store}"
        self.state_dir = root / store
        self.n = events_n
        setup_topics(broker, self.prefix)
        produce(broker, self.prefix, events(events_n, seed=7, entities=entities))

    def _app(self, *args: str) -> App:
        store = "rocksdb" if self.store.startswith("rocksdb") else "statelog"
        return App(self.broker, self.state_dir, self.group, self.prefix, "--store", store, *args)

    def _report(self, *args: str) -> dict[str, Any]:
        out = self.state_dir / "report.json"
        out.unlink(missing_ok=True)
        with self._app("--idle", str(IDLE), "--report", str(out), *args) as app:
            rc = app.wait(timeout=3600)
            assert rc == 0, app.errors()
        doc: dict[str, Any] = json.loads(out.read_text())
        return doc

    def throughput(self, *args: str) -> dict[str, Any]:
        """Process every event from the start; events/s between the first and the last."""
        doc = self._report(*args)
        assert doc["count"] == self.n, doc
        return {"events": doc["count"], "seconds": doc["last"] - doc["first"]}

    def recovery(self, *, lose_local_state: bool) -> dict[str, Any]:
        """SIGKILL a running application, then the time its restart takes to its first event.

        The application runs over everything already processed plus one
        more checkpoint, is killed, gets one new event, and is restarted
        (``lose_local_state``: with its state directory deleted, so the
        engine restores the state from its changelog topic) once the broker
        has dropped the killed member. ``seconds``: from the restarted
        process being ready (imports done) to its first processed message,
        the group join included; ``after_assign``: from the partitions'
        assignment (where the changelog is checked and replayed) to it.
        """
        topic = self.prefix + "events"
        extra = events(50, seed=8, entities=50)
        with self._app("--commit-interval", "0.5") as app:
            produce(self.broker, self.prefix, extra)
            done = self.n + len(extra)
            wait_for("the last checkpoint", lambda: kafka_committed(
                self.broker, self.group, topic) == done, timeout=600)  # fmt: skip
            time.sleep(1.0)  # and statelog's record after Kafka's commit
            app.kill()
        time.sleep(3.0)  # the broker drops the killed member after its session timeout
        if lose_local_state:
            shutil.rmtree(self.state_dir / self.group, ignore_errors=True)
        produce(self.broker, self.prefix, events(1, seed=9, entities=1))
        doc = self._report()
        first = doc["first"]
        return {
            "seconds": first - doc["started"], "after_assign": first - doc["assigned"],
            "count": doc["count"],
        }  # fmt: skip


class FaustPipeline:
    """The Faust worker of ``tests/faust_app.py`` on one store kind: topics, data directory."""

    def __init__(self, broker: Broker, root: Path, store: str, events_n: int, entities: int):
        self.broker, self.store, self.n = broker, store, events_n
        self.prefix = f"f{store}.{time.monotonic_ns()}."
        self.datadir = root / f"faust-{store}"
        for name in ("events", "app-reconcile-changelog"):
            broker.create_topic(f"{self.prefix}{name}", 3, {"retention.ms": "-1"})
        produce(broker, self.prefix, events(events_n, seed=7, entities=entities))

    def _worker(self, report: Path) -> subprocess.Popen[bytes]:
        self.datadir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ, "FAUST_APP_BROKER": self.broker.bootstrap,
            "FAUST_APP_DIR": str(self.datadir), "FAUST_APP_PREFIX": self.prefix,
            "FAUST_APP_STORE": "rocksdb" if self.store.startswith("rocksdb") else "statelog",
            "FAUST_APP_REPORT": str(report),
        }  # fmt: skip
        with (self.datadir / "worker.log").open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "tests.faust_app"], cwd=ROOT, env=env,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def _run_until(self, count: int, *, kill: bool) -> dict[str, Any]:
        report = self.datadir / "report.json"
        report.unlink(missing_ok=True)
        proc = self._worker(report)
        try:

            def done() -> bool:
                with contextlib.suppress(FileNotFoundError, ValueError):
                    return int(json.loads(report.read_text())["count"]) >= count
                return False

            wait_for(f"{count} events", done, timeout=3600)
            time.sleep(0.5)  # a last report after the last event
            doc: dict[str, Any] = json.loads(report.read_text())
        finally:
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            proc.wait(120)
        return doc

    def throughput(self) -> dict[str, Any]:
        """Every event from the start; events/s between the first and the last."""
        doc = self._run_until(self.n, kill=False)
        return {"events": doc["count"], "seconds": doc["last"] - doc["first"]}

    def recovery(self, *, lose_local_state: bool) -> dict[str, Any]:
        """After :meth:`throughput`: SIGKILL a running worker, one new event, restart; the
        time from the restarted worker being ready to its first event (the join included).
        ``lose_local_state``: the table directory deleted first (a restore from the changelog).
        """
        produce(self.broker, self.prefix, events(50, seed=8, entities=50))
        self._run_until(50, kill=True)
        time.sleep(3.0)  # the broker drops the killed member after its session timeout
        if lose_local_state:
            for path in self.datadir.iterdir():
                if path.is_dir():
                    shutil.rmtree(path)
        produce(self.broker, self.prefix, events(1, seed=9, entities=1))
        doc = self._run_until(1, kill=False)
        return {"seconds": doc["first"] - doc["started"], "after_assign": float("nan"),
                "count": doc["count"]}  # fmt: skip
