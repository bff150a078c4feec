"""The durability strategies of the trade-off table (issue 6), one class each.

Every engine keeps a reconciler's state (``S`` keys), takes durable
checkpoints of a :class:`~benchmarks.workload.Checkpoint` (dirty keys plus
offsets and the watermark) and, in a fresh process after a SIGKILL, recovers
the offsets, the watermark and the state
(:func:`benchmarks.tradeoff_probe.recover`).

Two engines make nothing but the offsets durable and rebuild the state by
re-reading the source: ``zstd-interval`` (a full snapshot every
``INTERVAL`` checkpoints) and ``none`` (no checkpoint at all). The source is
modelled by :class:`SourceLog`, a file of length-prefixed msgpack records that
the benchmark appends outside the timed span (it stands for the broker's
retained topic, whose durability is the broker's cost, not the reconciler's).

The engines a user would pick instead of statelog encode each value with
msgspec's msgpack (the cheapest encoder in the dependency set), store it
under the key as UTF-8, and keep offsets and watermark in the same
transaction as the state, so each of them is an atomic checkpoint too.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import lmdb
import msgspec
import rocksdict
import zstandard

import statelog

from .strategies import JsonSnapshotStrategy, commit_checkpoint
from .workload import Checkpoint, Value

__all__ = ["ENGINES", "GUARANTEES", "INTERVAL", "META", "Engine", "Recovered", "SourceLog"]

INTERVAL = 10
"""Checkpoints between two full snapshots of ``zstd-interval``."""
META = b"\x00meta"
"""The key under which key-value engines keep offsets, watermark and epoch (sorts first)."""

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()
_LEN = struct.Struct("<I")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _meta(cp: Checkpoint | None, epoch: int) -> bytes:
    offsets = cp.offsets if cp is not None else {}
    wm = cp.low_watermark_ms if cp is not None else 0
    return _enc.encode({"offsets": offsets, "wm": wm, "epoch": epoch})


class SourceLog:
    """The replayable source: one record per load chunk or checkpoint (offsets, watermark, puts)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = open(path, "ab")  # noqa: SIM115 (closed by close())

    def append(self, offsets: dict[str, int], wm: int, put: dict[str, Value]) -> int:
        """Append one record; returns the position after it (the consumer offset)."""
        body = _enc.encode([offsets, wm, put])
        self._fh.write(_LEN.pack(len(body)) + body)
        self._fh.flush()
        return self._fh.tell()

    def close(self) -> None:
        self._fh.close()

    @staticmethod
    def read(path: Path, start: int = 0) -> Iterator[tuple[dict[str, int], int, dict[str, Any]]]:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read()
        pos = 0
        while pos + 4 <= len(data):
            (n,) = _LEN.unpack_from(data, pos)
            if pos + 4 + n > len(data):
                break  # a record the killed process had not finished writing
            offsets, wm, put = _dec.decode(memoryview(data)[pos + 4 : pos + 4 + n])
            yield offsets, wm, put
            pos += 4 + n


@dataclass(frozen=True)
class Recovered:
    """What a recovery found: enough to check it against the acknowledged checkpoint."""

    offsets: dict[str, int]
    low_watermark_ms: int
    count: Callable[[], int]
    """Keys in the recovered state; called after the timed span (some engines scan)."""
    replayed: int
    """State updates re-applied from a log or the source (0: none replayed)."""
    detail: str = ""


class Engine:
    """Base: the interface the trade-off runner drives."""

    name: ClassVar[str]
    uses_source: ClassVar[bool] = False

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.epoch = 0

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        raise NotImplementedError

    def checkpoint(self, cp: Checkpoint, source_pos: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Make everything acknowledged durable (group commit); a no-op for most engines."""

    def children(self) -> list[int]:
        """Pids of helper processes the engine started (their writes count too)."""
        return []

    def close(self) -> None:
        """Release files and locks (not called before a SIGKILL)."""


class JsonEngine(Engine):
    """(1) Seed style: the whole state as sorted JSON at every checkpoint, atomic rename."""

    name = "json"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.js = JsonSnapshotStrategy(directory)

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        self.js.load(chunks)

    def checkpoint(self, cp: Checkpoint, source_pos: int) -> None:
        self.js.apply(cp)
        self.js.snapshot()


class _DictEngine(Engine):
    """State in a dict, rebuilt from the source (and a snapshot) on recovery."""

    uses_source = True

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.state: dict[str, Value] = {}

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        for chunk in chunks:
            self.state.update(chunk)

    def apply(self, cp: Checkpoint) -> None:
        self.state.update(cp.put)
        for k in cp.delete:
            self.state.pop(k, None)
        self.epoch += 1


class NoCheckpointEngine(_DictEngine):
    """(4) Nothing durable: recovery re-reads the source from its start."""

    name = "none"

    def checkpoint(self, cp: Checkpoint, source_pos: int) -> None:
        self.apply(cp)


class ZstdIntervalEngine(_DictEngine):
    """(2) A full msgpack+zstd snapshot every INTERVAL checkpoints, with its source position."""

    name = "zstd-interval"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.snaps = directory / "snapshots"
        self.snaps.mkdir(parents=True)
        self._cctx = zstandard.ZstdCompressor(level=3)
        self._written: list[Path] = []

    def snapshot(self, cp: Checkpoint | None, source_pos: int) -> None:
        doc = {"pos": source_pos, "meta": _meta(cp, self.epoch), "state": self.state}
        body = self._cctx.compress(_enc.encode(doc))
        final = self.snaps / f"snap-{self.epoch:012d}.zst"
        tmp = final.with_name(final.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, final)
        _fsync_dir(self.snaps)
        self._written.append(final)
        while len(self._written) > 2:  # keep a predecessor, as the seed advises
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._written.pop(0))

    def loaded(self, source_pos: int) -> None:
        """Snapshot the loaded state, so recovery does not re-read the load from the source."""
        self.snapshot(None, source_pos)

    def checkpoint(self, cp: Checkpoint, source_pos: int) -> None:
        self.apply(cp)
        if self.epoch % INTERVAL == 0:
            self.snapshot(cp, source_pos)


class StatelogEngine(Engine):
    """(3) statelog with the compactor running as a child process (the daemon deployment)."""

    name = "statelog"
    durability: ClassVar[statelog.Durability] = "commit"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.store = statelog.open(
            directory / "store",
            durability=self.durability,
            compactor="process",
            compactor_interval=timedelta(seconds=1),
            min_tail_bytes=8 << 20,
            segment_bytes=8 << 20,
        )
        self.schedule: list[int] = []
        """Updates per epoch, so recovery can count the updates it replayed."""

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        for chunk in chunks:
            self.store.commit(offsets={}, low_watermark_ms=0, put=chunk)
            self.schedule.append(len(chunk))
        self.store.flush()

    def checkpoint(self, cp: Checkpoint, source_pos: int) -> None:
        commit_checkpoint(self.store, cp)
        self.schedule.append(cp.updates)

    def finish(self) -> None:
        self.store.flush()
        (self.dir / "schedule.json").write_text(json.dumps(self.schedule))

    def children(self) -> list[int]:
        try:
            text = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def close(self) -> None:
        self.store.close()


class StatelogGroupEngine(StatelogEngine):
    """statelog ``durability="group"``: ``commit`` returns before the fsync; flushed at the end."""

    name = "statelog-group"
    durability = "group"


class _StoreEngine(Engine):
    """An engine that writes each checkpoint as one synced transaction of its store."""

    def _write(self, put: dict[str, Value], cp: Checkpoint | None) -> None:
        raise NotImplementedError

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        for chunk in chunks:
            self._write(chunk, None)

    def checkpoint(self, cp: Checkpoint, source_pos: int) -> None:
        self.epoch += 1
        self._write(cp.put, cp)


class SqliteEngine(_StoreEngine):
    """(5a) SQLite in WAL mode with ``synchronous=FULL``: one transaction per checkpoint."""

    name = "sqlite"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.db = self.connect(directory)
        self.db.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB NOT NULL)")
        self.db.execute("CREATE TABLE meta (id INTEGER PRIMARY KEY, doc BLOB NOT NULL)")

    @staticmethod
    def connect(directory: Path) -> sqlite3.Connection:
        db = sqlite3.connect(directory / "state.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def _write(self, put: dict[str, Value], cp: Checkpoint | None) -> None:
        enc = _enc.encode
        db = self.db
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
            [(k, enc(v)) for k, v in put.items()],
        )
        if cp is not None and cp.delete:
            db.executemany("DELETE FROM kv WHERE k = ?", [(k,) for k in cp.delete])
        db.execute("INSERT OR REPLACE INTO meta (id, doc) VALUES (0, ?)", (_meta(cp, self.epoch),))
        db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


class LmdbEngine(_StoreEngine):
    """(5b) LMDB, one write transaction per checkpoint, synced at commit (``sync=True``)."""

    name = "lmdb"

    def __init__(self, directory: Path, map_size: int = 64 << 30) -> None:
        super().__init__(directory)
        self.env = lmdb.open(str(directory / "lmdb"), map_size=map_size, sync=True)

    def _write(self, put: dict[str, Value], cp: Checkpoint | None) -> None:
        enc = _enc.encode
        # Sorted keys: LMDB's cheapest insertion order, which a careful user would pick.
        items = sorted((k.encode(), enc(v)) for k, v in put.items())
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)
            if cp is not None:
                for k in cp.delete:
                    txn.delete(k.encode())
            txn.put(META, _meta(cp, self.epoch))

    def close(self) -> None:
        self.env.close()


class RocksEngine(_StoreEngine):
    """(5c) RocksDB through rocksdict: one WriteBatch per checkpoint, written with ``sync``."""

    name = "rocksdb"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.db = self.open(directory)
        self._sync = rocksdict.WriteOptions()
        self._sync.sync = True

    @staticmethod
    def open(directory: Path) -> Any:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        return rocksdict.Rdict(str(directory / "rocksdb"), opts)

    def _write(self, put: dict[str, Value], cp: Checkpoint | None) -> None:
        enc = _enc.encode
        wb = rocksdict.WriteBatch(raw_mode=True)
        for k, v in put.items():
            wb.put(k.encode(), enc(v))
        if cp is not None:
            for k in cp.delete:
                wb.delete(k.encode())
        wb.put(META, _meta(cp, self.epoch))
        self.db.write(wb, self._sync)

    def close(self) -> None:
        self.db.close()


ENGINES: dict[str, type[Engine]] = {
    e.name: e
    for e in (
        JsonEngine,
        ZstdIntervalEngine,
        StatelogEngine,
        StatelogGroupEngine,
        NoCheckpointEngine,
        SqliteEngine,
        LmdbEngine,
        RocksEngine,
    )
}
"""Engine name -> class, in the order of the report."""

GUARANTEES: dict[str, str] = {
    "json": "every acknowledged checkpoint, on one host; state, offsets and watermark together",
    "zstd-interval": (
        "state as of the last snapshot; the rest is re-derived, so only if the source "
        "still holds every event since it and processing is deterministic"
    ),
    "statelog": "every acknowledged commit (fsync before return); prefix-exact, verified",
    "statelog-group": (
        "every commit that `wait_durable` confirmed (a few ms after return); prefix-exact"
    ),
    "none": "none of its own: correct only if the source retains everything since the start",
    "sqlite": "every committed transaction (WAL fsync at commit)",
    "lmdb": "every committed transaction (meta page fsync at commit)",
    "rocksdb": "every synced batch (WAL fsync at write)",
}
"""What survives a SIGKILL or power loss, per engine (the table's consistency column)."""
