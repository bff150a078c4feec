"""The anchors side by side: statelog shipping to S3 against SQLite replicated by Litestream.

Both sides hold ``keys`` keys of 100-byte values, then commit durable
checkpoints of 1% of the keys back to back for ``seconds`` while their
replicator ships to the same loopback S3 server (moto, in a process of its
own):

- statelog: ``statelog.open(durability="commit")`` (each checkpoint fsynced
  before it returns), and ``statelog-compactor --remote --max-ship-lag 1s``;
- SQLite in WAL mode with ``synchronous=FULL``, one transaction per
  checkpoint, and ``litestream replicate`` (sync interval 1 s).

A sampler (:mod:`benchmarks.anchor_sampler`, a process of its own, so that
it shares no interpreter with the writer) restores from the bucket about
once a second (``statelog.remote.restore``; ``litestream restore``) and
reads the newest checkpoint there; its *lag* is how long the oldest
acknowledged checkpoint the bucket lacked when the look began had waited
(0 when it had them all). After the run: the bytes in the bucket, its
objects, and a timed restore of the whole state, its content checked.
SlateDB's side of the same workload is :mod:`benchmarks.anchor_slatedb`.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import statelog
from statelog.remote import RemoteClient, restore
from tests.s3server import S3Server

__all__ = ["run_litestream", "run_litestream_unsampled", "run_statelog", "run_statelog_unsampled"]
__all__ += ["run_statelog_unshipped"]

VALUE = b"v" * 100
ROOT = Path(__file__).resolve().parent.parent


def _key(i: int) -> str:
    return f"k{i:08d}"


class _Acks:
    """Commit times of the checkpoints, and the sampler that measures what the bucket lacks."""

    def __init__(self) -> None:
        self.times: list[float] = []  # checkpoint n (1-based) acknowledged at times[n - 1]
        self.lags: list[float] = []
        self._proc: subprocess.Popen[str] | None = None
        self._out: IO[str] | None = None

    def ack(self) -> None:
        self.times.append(time.time())

    def sample(self, args: list[str], env: dict[str, str] | None = None) -> None:
        """Start :mod:`benchmarks.anchor_sampler` with ``args``, in a process of its own."""
        self._out = tempfile.NamedTemporaryFile("w+", suffix=".jsonl")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.anchor_sampler", *args],
            cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip

    def stop(self) -> None:
        """Stop the sampler; each look becomes a lag: how long the oldest acknowledged
        checkpoint the bucket lacked when the look began had waited (0: none lacked)."""
        if self._proc is None or self._out is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:  # blocked in a binding's call: signals wait for it
            self._proc.kill()
            self._proc.wait(60)
        self._out.seek(0)
        for line in self._out:
            look = json.loads(line)
            started, have = float(look["started"]), int(look["have"])
            waiting = [t for t in self.times[have:] if t <= started]
            self.lags.append(started - waiting[0] if waiting else 0.0)
        self._out.close()


def _bucket_usage(s3: S3Server, bucket: str, prefix: str) -> tuple[int, int]:
    client = s3.boto()
    pages = client.get_paginator("list_objects_v2")  # type: ignore[attr-defined]
    size = count = 0
    for page in pages.paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            size += obj["Size"]
            count += 1
    return size, count


def _checkpoints(keys: int, seconds: float, commit: Callable[[int, list[str]], object],
                 acks: _Acks) -> int:  # fmt: skip
    """Checkpoints of 1% of the keys, back to back for ``seconds``; returns how many.

    Checkpoint ``n`` writes keys ``(n - 1 + 97 j) mod keys`` for ``j`` below the batch,
    sliced from names made before the clock starts: formatting 10,000 names per
    checkpoint is the harness's cost, the same for every side, and not a store's.
    """
    batch = max(1, keys // 100)
    names = [_key(i) for i in range(keys)]
    names += names  # a slice wraps around without a modulo per key
    n, deadline, cursor = 0, time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        n += 1
        start = cursor % keys  # below keys, and 97 x batch is at most 0.97 x keys
        chunk = names[start : start + batch * 97 : 97]
        cursor += 1
        commit(n, chunk)
        acks.ack()
    return n


def _load_statelog(store_dir: Path, keys: int) -> None:
    """The ``keys`` keys, committed in batches of 100,000 (one epoch each)."""
    with statelog.open(store_dir) as st:
        for start in range(0, keys, 100_000):
            chunk = {_key(i): VALUE for i in range(start, min(keys, start + 100_000))}
            st.commit(offsets={"load": start + 1}, low_watermark_ms=0, put=chunk)


def _statelog_checkpoints(
    st: statelog.StateStore, keys: int, seconds: float, acks: _Acks
) -> tuple[int, float]:
    """statelog's back-to-back checkpoints: how many, and the seconds they took."""
    started = time.monotonic()
    n = _checkpoints(
        keys,
        seconds,
        lambda i, ks: st.commit(
            offsets={"ckpt": i}, low_watermark_ms=i, put=dict.fromkeys(ks, VALUE)
        ),
        acks,
    )
    return n, time.monotonic() - started


def _daemon(store_dir: Path, env: dict[str, str], url: str | None) -> subprocess.Popen[bytes]:
    """``statelog-compactor`` on ``store_dir``, shipping to ``url`` (None: compacting only)."""
    ship = [] if url is None else ["--remote", url, "--max-ship-lag", "1s"]
    return subprocess.Popen(
        [sys.executable, "-m", "compactor", *ship, "--interval", "5",
         "--min-tail-bytes", "4MiB", str(store_dir)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def run_statelog_unshipped(s3: S3Server, work: Path, keys: int, seconds: float) -> dict[str, Any]:
    """statelog's side with nothing shipping (the same daemon, compacting only): what
    shipping costs the writer's throughput."""
    store_dir = work / "statelog-unshipped"
    _load_statelog(store_dir, keys)
    daemon = _daemon(store_dir, dict(os.environ), None)
    acks = _Acks()
    try:
        with statelog.open(store_dir) as st:
            time.sleep(2.0)  # as the shipping side waits for its first ship
            n, elapsed = _statelog_checkpoints(st, keys, seconds, acks)
    finally:
        daemon.terminate()
        daemon.wait(60)
    return _result("statelog-unshipped", keys, n, elapsed, acks, 0, 0, float("nan"), n)


def run_statelog_unsampled(s3: S3Server, work: Path, keys: int, seconds: float) -> dict[str, Any]:
    """statelog's side shipping as :func:`run_statelog` does, with no lag sampler restoring
    from the bucket beside it: shipping's own cost, against :func:`run_statelog_unshipped`."""
    return run_statelog(s3, work, keys, seconds, sampled=False)


def run_statelog(
    s3: S3Server, work: Path, keys: int, seconds: float, *, sampled: bool = True
) -> dict[str, Any]:
    """statelog shipping to a new bucket, its lag sampled (unless not ``sampled``), then
    restored; the result dict of :func:`_result` and the restore's tail and bytes."""
    system = "statelog" if sampled else "statelog-unsampled"
    bucket = s3.new_bucket()
    url = f"s3://{bucket}/statelog"
    env = {**os.environ, **s3.env()}
    store_dir = work / system
    _load_statelog(store_dir, keys)
    daemon = _daemon(store_dir, env, url)
    acks = _Acks()
    client = RemoteClient.from_url(url, env=s3.env())
    loads = -(-keys // 100_000)
    try:
        with statelog.open(store_dir) as st:
            time.sleep(2.0)  # the daemon's first ship
            if sampled:
                acks.sample(["statelog", url, str(loads)], env)
            n, elapsed = _statelog_checkpoints(st, keys, seconds, acks)
            time.sleep(3.0)
            acks.stop()
    finally:
        daemon.terminate()
        daemon.wait(60)
    size, objects = _bucket_usage(s3, bucket, "statelog")
    t = time.monotonic()
    got = restore(url, work / f"{system}-restored", client=client)
    restore_s = time.monotonic() - t
    with statelog.open(work / f"{system}-restored", readonly=True) as ro:
        assert ro.count() == keys and ro.offsets["ckpt"] == n, (ro.count(), ro.offsets)
        snapshot = ro.recovery.snapshot
    done = _result(system, keys, n, elapsed, acks, size, objects, restore_s, got.epoch)
    # What the restore replayed after its snapshot: its time follows this tail, which
    # depends on where the compactor's last pass fell.
    base = int(snapshot.name.split("-")[0], 16) if snapshot is not None else 0
    return {**done, "restore_tail_commits": got.epoch - base, "restore_bytes": got.bytes_downloaded}


def run_litestream_unsampled(s3: S3Server, work: Path, keys: int, seconds: float) -> dict[str, Any]:
    """Litestream's side with no lag sampler restoring beside it: its durable updates/s
    against *statelog, no sampler*, neither paying for the instrument."""
    return run_litestream(s3, work, keys, seconds, sampled=False)


def run_litestream(
    s3: S3Server, work: Path, keys: int, seconds: float, *, sampled: bool = True
) -> dict[str, Any]:
    """SQLite in WAL mode replicated by ``litestream replicate``, its lag sampled (unless
    not ``sampled``), then restored with ``litestream restore`` and checked."""
    system = "litestream" if sampled else "litestream-unsampled"
    work = work / system
    work.mkdir(parents=True, exist_ok=True)
    bucket = s3.new_bucket()
    env = s3.env()
    db_path = work / "litestream.sqlite"
    cfg = work / "litestream.yml"
    cfg.write_text(
        f"dbs:\n  - path: {db_path}\n    replicas:\n      - type: s3\n        bucket: {bucket}\n"
        f"        path: litestream\n        endpoint: {s3.endpoint}\n        region: us-east-1\n"
        f"        access-key-id: {env['AWS_ACCESS_KEY_ID']}\n"
        f"        secret-access-key: {env['AWS_SECRET_ACCESS_KEY']}\n"
        "        force-path-style: true\n        sync-interval: 1s\n"
    )
    db = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB)")
    db.execute("CREATE TABLE meta (id INTEGER PRIMARY KEY, ckpt INTEGER)")
    db.execute("BEGIN")
    db.executemany("INSERT INTO kv VALUES (?, ?)", ((_key(i), VALUE) for i in range(keys)))
    db.execute("INSERT INTO meta VALUES (1, 0)")
    db.execute("COMMIT")
    litestream = shutil.which("litestream", path=str(Path(sys.executable).parent)) or "litestream"
    # Litestream's S3 client refuses to start while AWS_CA_BUNDLE is set.
    penv = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    proc = subprocess.Popen([litestream, "replicate", "-config", str(cfg)], env=penv,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def restored_to(out: Path) -> None:
        subprocess.run([litestream, "restore", "-config", str(cfg), "-o", str(out), str(db_path)],
                       env=penv, check=True, capture_output=True, timeout=600)  # fmt: skip

    def commit(i: int, ks: list[str]) -> None:
        db.execute("BEGIN")
        db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", ((k, VALUE) for k in ks))
        db.execute("UPDATE meta SET ckpt = ?", (i,))
        db.execute("COMMIT")

    acks = _Acks()
    try:
        time.sleep(2.0)  # its first snapshot
        if sampled:
            acks.sample(["litestream", litestream, str(cfg), str(db_path)], penv)
        started = time.monotonic()
        n = _checkpoints(keys, seconds, commit, acks)
        elapsed = time.monotonic() - started
        time.sleep(3.0)
        acks.stop()
    finally:
        proc.terminate()
        proc.wait(60)
        db.close()
    size, objects = _bucket_usage(s3, bucket, "litestream")
    out = work / "litestream-restored.sqlite"
    t = time.monotonic()
    restored_to(out)
    restore_s = time.monotonic() - t
    with sqlite3.connect(out) as r:
        count = r.execute("SELECT count(*) FROM kv").fetchone()[0]
        ckpt = r.execute("SELECT ckpt FROM meta").fetchone()[0]
    assert (count, ckpt) == (keys, n), (count, ckpt, n)
    return _result(system, keys, n, elapsed, acks, size, objects, restore_s, ckpt)


def _result(
    system: str, keys: int, n: int, elapsed: float, acks: _Acks, size: int, objects: int,
    restore_s: float, restored: int,
) -> dict[str, Any]:  # fmt: skip
    lags = sorted(acks.lags) or [float("nan")]

    def pct(p: float) -> float:
        return lags[min(len(lags) - 1, int(p * len(lags)))]

    return {
        "system": system, "keys": keys, "checkpoints": n, "seconds": elapsed,
        "updates_per_s": n * max(1, keys // 100) / elapsed, "lag_samples": len(acks.lags),
        "lag_p50": pct(0.5), "lag_p99": pct(0.99), "lag_max": lags[-1],
        "bucket_bytes": size, "bucket_objects": objects,
        "objects_per_hour": objects / elapsed * 3600, "restore_seconds": restore_s,
        "bytes_per_checkpoint": size / n if n else float("nan"),
        "restored_checkpoint": restored,
    }  # fmt: skip
