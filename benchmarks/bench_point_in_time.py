"""Point in time: a view at a past epoch against the newest state; the cost of a window.

Both run :mod:`benchmarks.point_in_time` in a fresh interpreter on a clone of a
template store of ``pit_keys`` keys (``probe template``: one snapshot).
``test_views``: ``pit_checkpoints`` checkpoints of 1% of the keys, a
compaction pass after every tenth (full and delta snapshots, all kept), then
25 rounds of a read-only open of the newest state and a read-only view at a
random retained epoch, side by side. ``test_window``: checkpoints of 1% of the
keys back to back for the first of ``pit_window``'s seconds while the
compaction daemon keeps a window of the second (``--retain 1 --retain-for``;
its third is the daemon's ``--interval``), on the store alone (``local``) or
shipping every pass to the loopback S3 server of the tests with the same
window (``s3``); the bytes kept against the documented formula.
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

from .conftest import Sizes
from .probe import _ENV, ROOT, clone_store, run_probe

SAMPLES = 25
"""Rounds of the views probe: a newest-state open and a view each."""
_PREFIX = "pit-window"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server()
    yield server
    server.stop()


def _probe(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.point_in_time", *args], cwd=ROOT,
        env={**_ENV, **(env or {})}, capture_output=True, text=True, check=True, timeout=4 * 3600,
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def _empty(s3: S3Server, bucket: str) -> None:
    """Delete what the run shipped: moto holds every object in this process's memory."""
    client = s3.boto()
    pages = client.get_paginator("list_objects_v2")  # type: ignore[attr-defined]
    for page in pages.paginate(Bucket=bucket, Prefix=_PREFIX):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})  # type: ignore[attr-defined]


def _store(tmp_path: Path, keys: int) -> Path:
    run_probe(["template", str(tmp_path / "t"), "--keys", str(keys)], timeout=4 * 3600)
    clone_store(tmp_path / "t" / "store", tmp_path / "run" / "store")
    return tmp_path / "run"


def test_views(benchmark: Any, sizes: Sizes, tmp_path: Path) -> None:
    d = _store(tmp_path, sizes.pit_keys)
    args = ["views", str(d), "--keys", str(sizes.pit_keys)]
    args += ["--checkpoints", str(sizes.pit_checkpoints), "--samples", str(SAMPLES)]
    docs: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: docs.append(_probe(args)), rounds=1, iterations=1)
    doc = docs[-1]
    benchmark.extra_info.update(suite="pit_views", **doc)
    assert doc["snapshots"] >= 2 and doc["newest_epoch"] > doc["oldest_epoch"]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_window(
    benchmark: Any, where: str, sizes: Sizes, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    seconds, window, interval = sizes.pit_window
    d = _store(tmp_path, sizes.pit_keys)
    args = ["window", str(d), "--keys", str(sizes.pit_keys), "--seconds", f"{seconds:g}"]
    args += ["--window", f"{window:g}", "--interval", f"{interval:g}"]
    s3: S3Server | None = request.getfixturevalue("s3") if where == "s3" else None
    bucket = s3.new_bucket() if s3 is not None else ""
    if s3 is not None:  # moto's buckets outlive its server: a prefix no other suite uses
        args += ["--remote", f"s3://{bucket}/{_PREFIX}"]
    docs: list[dict[str, Any]] = []
    try:
        env = s3.env() if s3 is not None else None
        benchmark.pedantic(lambda: docs.append(_probe(args, env)), rounds=1, iterations=1)
    finally:
        if s3 is not None:
            _empty(s3, bucket)
    doc = docs[-1]
    benchmark.extra_info.update(suite="pit_window", **doc)
    assert doc["snapshots_written"] > 0 and not doc["errors"] and doc["daemon_status"] == 0
