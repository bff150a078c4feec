"""The compactor tests' commit stream, its model, and the processes the kill test runs.

The stream is the kit's (:class:`statelog.kit.Stream`) over two tables and
a wide key space with small values: str and bytes keys side by side, puts,
deletes of earlier keys, offset advances and a rising watermark. The model
(:func:`model_at`) is the plain-dict fold of commits ``1..E``; a snapshot at
epoch E must hold exactly it (:func:`assert_snapshot_is_model`).

Run as a script it is one of two subprocesses of the kill test::

    python tests/compactor_stream.py writer STORE STOPFILE [--segment-bytes N]
        commits until STOPFILE exists; prints "open <epoch>", then "ack <i>"
        after every commit returns, then "done <epoch>" after close()
    python tests/compactor_stream.py die-at K -- DAEMON-ARGS...
        runs the compactor daemon with the kit's fault layer SIGKILLing the
        process at its K-th durable step (mkdir, create, write, sync,
        rename, fsync of a directory, truncate, remove)
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import statelog
from statelog.format.records import decode_value
from statelog.kit import DURABLE, Crash, FaultyFiles, Stream, run_commit
from statelog.storage.fileio import FileLayer
from statelog.storage.image_stamp import stamp_of
from statelog.storage.levels import ImageSources, open_chain
from statelog.storage.snapshots import SnapshotMeta, verify_snapshot

STREAM = Stream(
    seed=20_261_129,
    tables=("default", "other"),
    partitions=("p0", "p1", "p2"),
    key_space=400,
    value_size=60,
    medium_ratio=0.0,
    blob_ratio=0.0,
)


def commit(store: statelog.StateStore, i: int) -> int:
    """Make commit ``i`` of the stream; the epoch the store returned."""
    return run_commit(store, STREAM.commit(i))


def model_at(epoch: int) -> dict[str, Any]:
    """The fold of commits ``1..epoch`` with its epoch, empty tables dropped."""
    return {"epoch": epoch, **STREAM.model(epoch).state()}


def snapshot_model(
    path: Path, scratch: Path, store_id: Any = None
) -> tuple[SnapshotMeta, dict[str, Any]]:
    """Verify ``path`` and its whole chain while extracting them; return its meta and the
    state the chain restores, in model shape.

    A delta snapshot holds only what its tail changed, so its state is read
    through its chain (every link verified, as recovery reads it), never
    from its own body alone.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    sid: uuid.UUID = (
        store_id
        if store_id is not None
        else verify_snapshot(FileLayer(), path, store_id=None).store_id
    )
    chain, base = open_chain(FileLayer(), path, sid, ImageSources(scratch))
    try:
        tables = {t: {k: decode_value(v) for k, v in base.items(t)} for t in base.tables()}
    finally:
        base.close()
        for image in chain.images:
            for p in (image, stamp_of(image)):
                p.unlink(missing_ok=True)
    meta = chain.meta
    model = {
        "epoch": meta.epoch,
        "offsets": dict(meta.offsets),
        "low_watermark_ms": meta.low_watermark_ms,
        "tables": {t: kv for t, kv in tables.items() if kv},
    }
    return meta, model


def assert_snapshot_is_model(path: Path, scratch: Path, store_id: Any = None) -> SnapshotMeta:
    meta, got = snapshot_model(path, scratch, store_id)
    assert meta.epoch == meta.lsn
    assert got == model_at(meta.epoch), (
        f"{path.name}: the snapshot differs from the fold of 1..{meta.epoch}"
    )
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
    return daemon_main(rest, files=FaultyFiles(None, [Crash(DURABLE, args.k)]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
