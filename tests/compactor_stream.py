"""A deterministic commit stream, its model, and the processes the compactor tests run.

Commit ``i`` is a pure function of ``i`` (:func:`spec`): two tables, str and
bytes keys side by side (``"k7"`` and ``b"k7"`` are different keys), puts,
deletes of earlier keys, offset advances and a rising watermark. The model
(:func:`model_at`) is the plain-dict fold of commits ``1..E``; a snapshot at
epoch E must hold exactly it (:func:`assert_snapshot_is_model`).

Run as a script it is one of two subprocesses of the kill test::

    python tests/compactor_stream.py writer STORE STOPFILE [--segment-bytes N]
        commits until STOPFILE exists; prints "open <epoch>", then "ack <i>"
        after every commit returns, then "done <epoch>" after close()
    python tests/compactor_stream.py die-at K -- DAEMON-ARGS...
        runs the compactor daemon with a file layer that SIGKILLs the
        process at its K-th durable step (create, append, sync, rename,
        remove, fsync of a directory)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import statelog
from statelog.format.records import decode_value
from statelog.storage.fileio import AppendFile, Buffer, FileLayer
from statelog.storage.image import BaseLevel
from statelog.storage.snapshots import SnapshotMeta, extract_snapshot

TABLES = ("default", "other")
KEYSPACE = 400

Model = dict[str, Any]


def spec(i: int) -> dict[str, Any]:
    """Keyword arguments of ``store.commit`` for commit ``i`` (1-based)."""
    table = TABLES[i % 3 == 0]
    put: dict[Any, Any] = {}
    for j in range(4):
        n = (i * 7 + j * 13) % KEYSPACE
        key: str | bytes = f"k{n}" if (i + j) % 2 else b"k%d" % n
        put[key] = {"i": i, "j": j, "pad": "x" * (i % 23)} if j != 3 else [i, b"\x00\xff"]
    n = (i * 5) % KEYSPACE
    delete = [f"k{n}", b"k%d" % ((n + 1) % KEYSPACE)]
    delete = [k for k in delete if k not in put]
    return {
        "offsets": {f"p{i % 3}": i, **({"p9": i // 10} if i % 10 == 0 else {})},
        "low_watermark_ms": 1_000 * i,
        "put": put,
        "delete": delete,
        "table": table,
    }


def empty_model() -> Model:
    return {"epoch": 0, "offsets": {}, "low_watermark_ms": 0, "tables": {}}


def apply(model: Model, i: int) -> None:
    """Fold commit ``i`` into ``model`` (which must be at epoch ``i - 1``)."""
    assert model["epoch"] == i - 1
    s = spec(i)
    t = model["tables"].setdefault(s["table"], {})
    for k in s["delete"]:
        t.pop(k, None)
    t.update(s["put"])
    model["offsets"].update(s["offsets"])
    model["low_watermark_ms"] = s["low_watermark_ms"]
    model["epoch"] = i


def model_at(epoch: int) -> Model:
    model = empty_model()
    for i in range(1, epoch + 1):
        apply(model, i)
    return model


def commit(store: statelog.StateStore, i: int) -> int:
    return store.commit(**spec(i))


def snapshot_model(path: Path, scratch: Path, store_id: Any = None) -> tuple[SnapshotMeta, Model]:
    """Verify ``path`` while extracting it; return its meta and its content in model shape."""
    scratch.mkdir(parents=True, exist_ok=True)
    dest = scratch / (path.name + ".mdb")
    if dest.exists():
        dest.unlink()
    meta = extract_snapshot(FileLayer(), path, dest, store_id=store_id)
    with BaseLevel(dest) as base:
        tables = {t: {k: decode_value(v) for k, v in base.items(t)} for t in base.tables()}
    dest.unlink()
    tables = {t: kv for t, kv in tables.items() if kv}
    model = {
        "epoch": meta.epoch,
        "offsets": dict(meta.offsets),
        "low_watermark_ms": meta.low_watermark_ms,
        "tables": tables,
    }
    return meta, model


def comparable(model: Model) -> Model:
    """``model`` with empty tables dropped (an image lists every table ever written)."""
    return {**model, "tables": {t: kv for t, kv in model["tables"].items() if kv}}


def assert_snapshot_is_model(path: Path, scratch: Path, store_id: Any = None) -> SnapshotMeta:
    meta, got = snapshot_model(path, scratch, store_id)
    assert meta.epoch == meta.lsn
    want = comparable(model_at(meta.epoch))
    assert got == want, f"{path.name}: the snapshot differs from the fold of 1..{meta.epoch}"
    assert {t: n for t, n in meta.tables.items() if n} == {
        t: len(kv) for t, kv in got["tables"].items()
    }
    return meta


# -- subprocesses ---------------------------------------------------------------


def _writer(store: Path, stop: Path, segment_bytes: int) -> int:
    s = statelog.open(store, segment_bytes=segment_bytes, durability="commit")
    _say(f"open {s.epoch}")
    i = s.epoch
    while not stop.exists():
        i += 1
        got = commit(s, i)
        assert got == i, (got, i)
        _say(f"ack {i}")
    s.close()
    _say(f"done {s.epoch}")
    return 0


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write: a kill never leaves half a line


class DieAt(FileLayer):
    """A file layer that SIGKILLs its own process at its ``k``-th durable step."""

    def __init__(self, k: int) -> None:
        self.left = k

    def _step(self) -> None:
        self.left -= 1
        if self.left <= 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def create_durable(self, path: Path, data: Buffer) -> None:
        self._step()
        super().create_durable(path, data)

    def open_append(self, path: Path) -> AppendFile:
        layer = self
        f = super().open_append(path)

        class Dying(AppendFile):
            def write(self, chunks: Sequence[Buffer]) -> None:
                layer._step()
                super().write(chunks)

            def sync(self) -> None:
                layer._step()
                super().sync()

        dying = Dying(f.path, os.dup(f._fd), f.size)
        f.close()
        return dying

    def rename(self, src: Path, dst: Path) -> None:
        self._step()
        super().rename(src, dst)

    def remove(self, path: Path) -> None:
        self._step()
        super().remove(path)

    def fsync_dir(self, path: Path) -> None:
        self._step()
        super().fsync_dir(path)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("writer")
    w.add_argument("store", type=Path)
    w.add_argument("stop", type=Path)
    w.add_argument("--segment-bytes", type=int, default=16 * 1024)
    d = sub.add_parser("die-at")
    d.add_argument("k", type=int)
    d.add_argument("rest", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.cmd == "writer":
        return _writer(args.store, args.stop, args.segment_bytes)
    from compactor.daemon import main as daemon_main

    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    return daemon_main(rest, files=DieAt(args.k))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
