"""SlateDB beside the anchors: the same checkpoints, durable in the object store when acknowledged.

The workload of :mod:`benchmarks.anchors`: ``keys`` keys of 100-byte values
loaded first, then durable checkpoints of 1% of the keys back to back for
``seconds``, against the same loopback S3 server. Each checkpoint is one
``WriteBatch`` (its keys, and the checkpoint's number under ``meta:ckpt``)
and is made durable by three calls:

1. ``await db.write(batch)``: applies the batch to the memtable and the
   current WAL buffer, and returns a ``WriteHandle`` at once;
2. ``await db.flush_with_options(FlushOptions(flush_type=FlushType.WAL))``:
   uploads the WAL buffer now as one WAL object, rather than at the next
   ``flush_interval`` tick (100 ms by default: waiting for the tick alone
   caps one writer at about 13 checkpoints a second);
3. ``await handle.await_durable()``: returns once the write's WAL object is
   stored (at once here, after the flush). SlateDB's promise: a write whose
   ``await_durable`` returned is in the object store, so a reader or a new
   writer opening the database from the bucket sees it, whatever happens to
   the writer's process or machine afterwards.

So unlike the other two sides (acknowledged after a local fsync, in the
bucket within about a second), SlateDB acknowledges a checkpoint only once
the bucket holds it. Every other setting is SlateDB's default (compactor in
the writer's process; the garbage collector deletes nothing younger than
300 s, so a short run's bucket keeps every WAL object).

The sampler (:mod:`benchmarks.anchor_sampler`) opens a fresh ``DbReader``
(``ReaderMode.FOLLOW_LATEST``, which writes nothing to the bucket) about
once a second and reads ``meta:ckpt``: the newest checkpoint the bucket
holds; lag as in :class:`benchmarks.anchors._Acks`.
The restore opens one more reader and scans every key, content checked; a
scan still running after ``RESTORE_LIMIT`` seconds is stopped and reported
as such (on the S3 server it can take many minutes at 1M keys), its time a
lower bound and the keys it read checked.

``local=True`` runs the same on SlateDB's local object store (a directory,
``ObjectStoreType.LOCAL``): there the ``object_store`` crate renames a
written file into place without fsync, so an acknowledged checkpoint
survives the process but not the machine.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

from tests.s3server import S3Server

from .anchors import VALUE, _Acks, _bucket_usage, _checkpoints, _key, _result

__all__ = [
    "RESTORE_LIMIT",
    "newest_checkpoint",
    "run_slatedb",
    "slatedb_installed",
    "store_from_spec",
    "store_spec",
]

_PATH = "slatedb"  # the database's prefix in the bucket (or directory)
_META = b"meta:ckpt"  # sorts after every ``k...`` key
_LOAD = 100_000  # keys per durable write batch of the initial load
_SCAN = 10_000  # rows per call while scanning
RESTORE_LIMIT = 180.0  # seconds after which the restore scan is stopped


def slatedb_installed() -> bool:
    """Whether SlateDB's Python binding (the ``anchors`` extra) can be imported."""
    return importlib.util.find_spec("slatedb") is not None


def _sdb() -> Any:
    import slatedb.uniffi  # callers check slatedb_installed()

    return slatedb.uniffi


def store_spec(s3: S3Server, work: Path, local: bool) -> dict[str, Any]:
    """A new bucket of ``s3`` (or a directory in ``work``) as a JSON-able object-store spec."""
    if local:
        root = work / "slatedb-store"
        root.mkdir(parents=True)
        return {"local_path": str(root)}
    bucket, env = s3.new_bucket(), s3.env()
    return {
        "bucket": bucket, "endpoint": s3.endpoint, "region": env["AWS_DEFAULT_REGION"],
        "access_key_id": env["AWS_ACCESS_KEY_ID"],
        "secret_access_key": env["AWS_SECRET_ACCESS_KEY"], "allow_http": "true",
    }  # fmt: skip


def store_from_spec(spec: dict[str, Any]) -> Any:
    """A fresh object-store handle on what :func:`store_spec` describes."""
    sdb = _sdb()
    kind = sdb.ObjectStoreType.LOCAL if "local_path" in spec else sdb.ObjectStoreType.S3
    builder = sdb.ObjectStoreBuilder(kind)
    for key, value in spec.items():
        builder.with_config(key, value)
    return builder.build()


def _usage(s3: S3Server, spec: dict[str, Any]) -> tuple[int, int]:
    if "local_path" in spec:
        files = [p for p in Path(spec["local_path"]).rglob("*") if p.is_file()]
        return sum(p.stat().st_size for p in files), len(files)
    return _bucket_usage(s3, spec["bucket"], _PATH)


def _batch(keys: list[str], ckpt: int) -> Any:
    """The write batch of one checkpoint: ``keys`` set to ``VALUE``, and its number."""
    batch = _sdb().WriteBatch()
    for key in keys:
        batch.put(key.encode(), VALUE)
    batch.put(_META, str(ckpt).encode())
    return batch


async def _durable(db: Any, batch: Any) -> None:
    """Write ``batch``; returns once it is in the object store (module docstring)."""
    sdb = _sdb()
    handle = await db.write(batch)
    await db.flush_with_options(sdb.FlushOptions(flush_type=sdb.FlushType.WAL))
    await handle.await_durable()


async def _reader(store: Any) -> Any:
    sdb = _sdb()
    builder = sdb.DbReaderBuilder(_PATH, store)
    builder.with_reader_mode(sdb.ReaderMode.FOLLOW_LATEST())
    return await builder.build()


async def newest_checkpoint(store: Any) -> int:
    """The newest checkpoint a fresh reader of the bucket sees.

    :raises LookupError: the bucket holds no checkpoint number yet.
    """
    reader = await _reader(store)
    try:
        value = await reader.get(_META)
    finally:
        await reader.shutdown()
    if value is None:
        raise LookupError("no checkpoint in the bucket yet")
    return int(value)


async def _restore(store: Any) -> tuple[int, int, int, bool]:
    """Every key through a fresh reader: (keys, checkpoint, values that are not ``VALUE``,
    whether the scan ended before ``RESTORE_LIMIT``)."""
    sdb = _sdb()
    reader = await _reader(store)
    count = wrong = 0
    ckpt = -1
    stop = time.monotonic() + RESTORE_LIMIT
    try:
        everything = sdb.KeyRange(start=None, start_inclusive=True, end=None, end_inclusive=False)
        rows = await reader.scan(everything)
        while True:
            batch = await rows.next_batch(_SCAN)
            for kv in batch:
                if kv.key == _META:
                    ckpt = int(kv.value)
                else:
                    count += 1
                    wrong += kv.value != VALUE
            if len(batch) < _SCAN:
                break
            if time.monotonic() > stop:
                return count, ckpt, wrong, False
    finally:
        await reader.shutdown()
    return count, ckpt, wrong, True


def run_slatedb(
    s3: S3Server, work: Path, keys: int, seconds: float, *, local: bool = False
) -> dict[str, Any]:
    """SlateDB's side of the anchors: the result dict of :func:`benchmarks.anchors.run_statelog`,
    and ``batch_build_seconds``, the part of the run spent building write batches.

    :param local: on SlateDB's local object store in ``work`` instead of a new bucket of ``s3``
        (system ``slatedb-local``).
    :raises AssertionError: the restored state is not the one written.
    """
    sdb = _sdb()
    spec = store_spec(s3, work, local)

    def store() -> Any:
        return store_from_spec(spec)

    loop = asyncio.new_event_loop()
    try:
        db = loop.run_until_complete(sdb.DbBuilder(_PATH, store()).build())
        for start in range(0, keys, _LOAD):
            load = [_key(i) for i in range(start, min(keys, start + _LOAD))]
            loop.run_until_complete(_durable(db, _batch(load, 0)))
        building = [0.0]  # seconds in ``WriteBatch.put``: one call into the binding per key

        def commit(i: int, ks: list[str]) -> None:
            t = time.monotonic()
            batch = _batch(ks, i)
            building[0] += time.monotonic() - t
            loop.run_until_complete(_durable(db, batch))

        acks = _Acks()
        acks.sample(["slatedb", json.dumps(spec)])
        started = time.monotonic()
        n = _checkpoints(keys, seconds, commit, acks)
        elapsed = time.monotonic() - started
        time.sleep(3.0)
        acks.stop()
        # Measured with the writer still open, as a crash would leave the bucket.
        size, objects = _usage(s3, spec)
        t = time.monotonic()
        count, ckpt, wrong, complete = loop.run_until_complete(_restore(store()))
        restore_s = time.monotonic() - t
        loop.run_until_complete(db.shutdown())
    finally:
        loop.close()
    if complete:
        assert (count, ckpt, wrong) == (keys, n, 0), (count, ckpt, wrong, n)
    else:  # the checkpoint number sorts last: a stopped scan has not reached it (every
        # key may have been read already, the limit falling between their last batch and it)
        assert wrong == 0 and count <= keys and ckpt == -1, (count, wrong, ckpt)
    system = "slatedb-local" if local else "slatedb"
    result = _result(system, keys, n, elapsed, acks, size, objects, restore_s, ckpt)
    extra = {"restore_complete": complete, "restore_keys_read": count}
    return {**result, "batch_build_seconds": building[0], **extra}
