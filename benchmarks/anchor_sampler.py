"""The anchors' lag sampler, in a process of its own.

About once a second it finds the newest checkpoint the bucket holds, the
way each side's operator would after losing the host, and prints one JSON
line ``{"started": <time.time() when the look began>, "have": <checkpoint>}``;
it runs until it is terminated. It has a process of its own so that its
restores share no interpreter (and no GIL) with the writer it measures.

- ``statelog URL LOADS``: ``statelog.remote.restore(check=False)`` into a temporary
  directory; the checkpoint is the restored epoch minus the ``LOADS``
  epochs of the initial load;
- ``litestream BINARY CONFIG DB``: ``litestream restore``, then the
  checkpoint number in the restored database;
- ``slatedb SPEC``: a fresh ``DbReader`` (``SPEC``: the JSON object-store
  spec of :func:`benchmarks.anchor_slatedb.store_spec`).

The parent turns the lines into lags (:class:`benchmarks.anchors._Acks`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.anchor_slatedb import newest_checkpoint, store_from_spec
from statelog.remote import RemoteClient, restore

__all__ = ["main"]


def _statelog(url: str, loads: str) -> Callable[[Path], int]:
    client = RemoteClient.from_url(url, env=dict(os.environ))

    def newest(tmp: Path) -> int:
        # check=False: every object is still downloaded and verified, the final
        # read-only open (a second replay of the tail) is left out.
        return max(0, restore(url, tmp / "r", client=client, check=False).epoch - int(loads))

    return newest


def _litestream(binary: str, config: str, db: str) -> Callable[[Path], int]:
    def newest(tmp: Path) -> int:
        out = tmp / "r.sqlite"
        subprocess.run([binary, "restore", "-config", config, "-o", str(out), db],
                       check=True, capture_output=True, timeout=600)  # fmt: skip
        with sqlite3.connect(out) as r:
            return int(r.execute("SELECT ckpt FROM meta").fetchone()[0])

    return newest


def _slatedb(spec: str) -> Callable[[Path], int]:
    def newest(tmp: Path) -> int:
        return asyncio.run(newest_checkpoint(store_from_spec(json.loads(spec))))

    return newest


_KINDS: dict[str, Callable[..., Callable[[Path], int]]] = {
    "statelog": _statelog, "litestream": _litestream, "slatedb": _slatedb,
}  # fmt: skip


def _stop(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> None:
    kind, *args = argv
    newest = _KINDS[kind](*args)
    signal.signal(signal.SIGTERM, _stop)
    with tempfile.TemporaryDirectory(prefix="anchor-sampler-") as work:
        while True:
            started = time.time()
            try:
                with tempfile.TemporaryDirectory(dir=work) as tmp:
                    have = newest(Path(tmp))
            except Exception:  # nothing restorable yet; the next look tries again
                have = -1
            if have >= 0:
                print(json.dumps({"started": started, "have": have}), flush=True)
            time.sleep(max(0.0, 1.0 - (time.time() - started)))


if __name__ == "__main__":
    main(sys.argv[1:])
