"""Failover to a standby against a cold start from the store's files; the changes feed's speed.

``test_failover``: for each size of ``standby_keys`` a template store (``probe
template``) is cloned as the primary and ``python -m benchmarks.failover promote``
runs on it in a fresh interpreter (:mod:`benchmarks.failover`): a standby's
first sync, a writer that commits a 100,000-update tail and is SIGKILLed, then
the time from the kill to the promoted standby's first durable commit, and,
side by side, the time to copy the primary's files into an empty directory,
open them and make the first durable commit (what a restore costs before any
download), and a real ``statelog restore`` from the loopback S3 server of the
tests (the primary shipped there first, untimed), its open and first commit.
``test_standby_lag``: a standby following a writer that commits 1%-dirty
checkpoints back to back (:mod:`benchmarks.standby_lag`): its lag in epochs and
seconds, sampled every 20 ms, and its RssAnon. ``test_changes``:
``changes_commits`` checkpoints read back through ``store.changes()``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.s3server import S3Server

from .conftest import Sizes, parametrize_keys
from .probe import _ENV, ROOT, clone_store, run_probe


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_keys(metafunc, "standby_keys", "standby_keys")


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server()
    yield server
    server.stop()


def _failover(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.failover", *args], cwd=ROOT, env={**_ENV, **(env or {})},
        capture_output=True, text=True, check=True, timeout=4 * 3600,
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def test_failover(
    benchmark: Any, standby_keys: int, sizes: Sizes, s3: S3Server, tmp_path: Path
) -> None:
    keys = standby_keys
    run_probe(["template", str(tmp_path / "t"), "--keys", str(keys)], timeout=4 * 3600)
    clone_store(tmp_path / "t" / "store", tmp_path / "run" / "primary")
    docs: list[dict[str, Any]] = []
    commits = max(1, min(10, keys // 10_000))
    args = ["promote", str(tmp_path / "run"), "--keys", str(keys), "--commits", str(commits)]
    args += ["--remote", f"s3://{s3.new_bucket()}/shard"]
    benchmark.pedantic(lambda: docs.append(_failover(args, s3.env())), rounds=1, iterations=1)
    doc = docs[-1]
    benchmark.extra_info.update(suite="failover", **doc)
    assert doc["promoted_epoch"] >= doc["acked_epoch"] == doc["cold_epoch"]


@pytest.mark.parametrize("poll_ms", [100, 500], ids=["poll100ms", "poll500ms"])
def test_standby_lag(benchmark: Any, poll_ms: int, sizes: Sizes, tmp_path: Path) -> None:
    keys, seconds = sizes.standby_keys[0], sizes.standby_seconds
    run_probe(["template", str(tmp_path / "t"), "--keys", str(keys)], timeout=4 * 3600)
    clone_store(tmp_path / "t" / "store", tmp_path / "run" / "primary")
    args = ["-m", "benchmarks.standby_lag", "lag", str(tmp_path / "run"), "--keys", str(keys)]
    args += ["--seconds", str(seconds), "--poll-ms", str(poll_ms)]
    docs: list[dict[str, Any]] = []

    def run() -> None:
        out = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=_ENV, capture_output=True, text=True,
            check=True, timeout=3600,
        )  # fmt: skip
        docs.append(json.loads(out.stdout.strip().splitlines()[-1]))

    benchmark.pedantic(run, rounds=1, iterations=1)
    doc = docs[-1]
    benchmark.extra_info.update(suite="standby_lag", **doc)
    assert doc["caught_up"] and doc["commits"] > 0


def test_changes(benchmark: Any, sizes: Sizes, tmp_path: Path) -> None:
    keys = max(sizes.standby_keys[0], 10_000)
    args = ["changes", str(tmp_path), "--keys", str(keys)]
    args += ["--commits", str(sizes.changes_commits)]
    docs: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: docs.append(_failover(args)), rounds=1, iterations=1)
    doc = docs[-1]
    benchmark.extra_info.update(suite="changes", **doc)
    assert doc["epochs"] == sizes.changes_commits
