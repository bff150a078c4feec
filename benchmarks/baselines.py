"""The baselines statelog is measured against, each a :class:`~benchmarks.strategy.Strategy`.

``json`` (a full snapshot per checkpoint), ``zstd-interval`` (a full snapshot every
:data:`INTERVAL` checkpoints, the rest replayed from the source), ``none`` (replay the
source from the start), and the key-value stores SQLite, LMDB and RocksDB, which keep
msgpack values and, under :data:`~benchmarks.strategy.META`, offsets and watermark in
the same transaction. RocksDB needs rocksdict.
"""

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lmdb
import zstandard

from .workload import Checkpoint, Value

try:
    import rocksdict
except ImportError:  # an optional extra: the comparison runs without it
    rocksdict = None  # type: ignore[assignment]
from .strategy import (
    DEC,
    ENC,
    META,
    InMemory,
    Recovered,
    SourceLog,
    Strategy,
    meta_bytes,
    write_atomic,
)

__all__ = ["INTERVAL", "JsonSnapshot", "Lmdb", "NoCheckpoint", "Rocks", "Sqlite", "ZstdInterval"]

INTERVAL = 10  # checkpoints between two full snapshots of zstd-interval


class JsonSnapshot(InMemory):
    """The whole state as sorted compact JSON with its sha256, written atomically."""

    name = "json"
    label = "(1) JSON full snapshot every checkpoint, atomic rename"
    guarantee = "every acknowledged checkpoint, on one host; state, offsets and watermark together"
    _PREFIX, _MIDDLE = b'{"sha256":"', b'","checkpoint":'

    def checkpoint(self, cp: Checkpoint, source_pos: int = 0) -> None:
        self.apply(cp)
        self.snapshot()

    def snapshot(self) -> Path:
        """Write the full snapshot of the current epoch (serialised once: a lower bound)."""
        self.snaps.mkdir(parents=True, exist_ok=True)
        doc = {"epoch": self.epoch, "offsets": self.offsets, "state": self.state}
        doc["low_watermark_ms"] = self.low_watermark_ms
        body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        head = self._PREFIX + hashlib.sha256(body).hexdigest().encode() + self._MIDDLE
        final = self.snaps / f"snapshot-{self.epoch:012d}.json"
        write_atomic(final, (head, body, b"}"), self._written)
        return final

    @classmethod
    def restore(cls, path: Path) -> dict[str, Any]:
        """Read a snapshot, verify its sha256, parse it.

        :raises ValueError: not such a snapshot, truncated, or the hash does not match.
        """
        data = path.read_bytes()
        start = len(cls._PREFIX) + 64 + len(cls._MIDDLE)
        if not data.startswith(cls._PREFIX) or not data.endswith(b"}"):
            raise ValueError(f"{path}: not a whole JSON snapshot of this strategy")
        body = memoryview(data)[start:-1]
        if (
            hashlib.sha256(body).hexdigest().encode()
            != data[len(cls._PREFIX) : start - len(cls._MIDDLE)]
        ):
            raise ValueError(f"{path}: sha256 mismatch")
        doc: dict[str, Any] = json.loads(body.tobytes())
        return doc

    @classmethod
    def recover(cls, directory: Path) -> Recovered:
        for snap in sorted((directory / "snapshots").glob("snapshot-*.json"), reverse=True):
            with contextlib.suppress(ValueError):
                doc = cls.restore(snap)
                n = len(doc["state"])
                return Recovered(doc["offsets"], doc["low_watermark_ms"], n.__int__, 0)
        raise RuntimeError(f"no JSON snapshot in {directory} verifies")


def replay_source(
    state: dict[str, Any], path: Path, start: int = 0
) -> tuple[dict[str, int], int, int]:
    """Apply source records from ``start``; the last offsets and watermark seen, and the updates."""
    offsets: dict[str, int] = {}
    wm = n = 0
    for rec_offsets, rec_wm, put in SourceLog.read(path, start):
        state.update(put)
        n += len(put)
        if rec_offsets:
            offsets, wm = rec_offsets, rec_wm
    return offsets, wm, n


class NoCheckpoint(InMemory):
    """Nothing durable: recovery re-reads the source from its start."""

    name = "none"
    label = "(4) no checkpoint: replay the source from the start"
    guarantee = "none of its own: correct only if the source retains everything since the start"
    uses_source = True

    @classmethod
    def recover(cls, directory: Path) -> Recovered:
        state: dict[str, Any] = {}
        offsets, wm, n = replay_source(state, directory / "source.log")
        return Recovered(offsets, wm, lambda: len(state), n)


class ZstdInterval(InMemory):
    """A full msgpack+zstd snapshot every INTERVAL checkpoints, with its source position."""

    name = "zstd-interval"
    label = f"(2) zstd full snapshot every {INTERVAL} checkpoints + source replay"
    guarantee = (
        "state as of the last snapshot; the rest is re-derived, so only if the source "
        "still holds every event since it and processing is deterministic"
    )
    uses_source = True

    def _snapshot(self, cp: Checkpoint | None, source_pos: int) -> None:
        self.snaps.mkdir(parents=True, exist_ok=True)
        doc = {"pos": source_pos, "meta": meta_bytes(cp, self.epoch), "state": self.state}
        body = zstandard.ZstdCompressor(level=3).compress(ENC.encode(doc))
        write_atomic(self.snaps / f"snap-{self.epoch:012d}.zst", (body,), self._written)

    def loaded(self, source_pos: int) -> None:
        self._snapshot(None, source_pos)  # recovery need not re-read the load from the source

    def checkpoint(self, cp: Checkpoint, source_pos: int = 0) -> None:
        self.apply(cp)
        if self.epoch % INTERVAL == 0:
            self._snapshot(cp, source_pos)

    @classmethod
    def recover(cls, directory: Path) -> Recovered:
        newest = sorted((directory / "snapshots").glob("snap-*.zst"))[-1]
        doc = DEC.decode(zstandard.ZstdDecompressor().decompress(newest.read_bytes()))
        state: dict[str, Any] = doc["state"]
        offsets, wm, n = replay_source(state, directory / "source.log", doc["pos"])
        if not offsets:
            meta = DEC.decode(doc["meta"])
            offsets, wm = meta["offsets"], meta["wm"]
        return Recovered(offsets, wm, lambda: len(state), n)


class _KeyValue(Strategy):
    """One synced transaction of the store per checkpoint: the state and META together."""

    handle: Any

    def _write(self, put: dict[str, Value], cp: Checkpoint | None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.handle.close()

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        for chunk in chunks:
            self._write(chunk, None)

    def checkpoint(self, cp: Checkpoint, source_pos: int = 0) -> None:
        self.epoch += 1
        self._write(cp.put, cp)

    @classmethod
    def _open_meta(cls, directory: Path) -> tuple[bytes, Callable[[], int]]:
        raise NotImplementedError

    @classmethod
    def recover(cls, directory: Path) -> Recovered:
        meta, count = cls._open_meta(directory)
        m = DEC.decode(meta)
        return Recovered(m["offsets"], m["wm"], count, 0)


class Sqlite(_KeyValue):
    """SQLite in WAL mode with ``synchronous=FULL``: one transaction per checkpoint."""

    name = "sqlite"
    label = "(5) SQLite WAL, `synchronous=FULL`"
    guarantee = "every committed transaction (WAL fsync at commit)"

    def __init__(self, directory: Path, *, compactor: bool = False) -> None:
        super().__init__(directory)
        self.handle = self.db = self._connect(directory)
        self.db.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB NOT NULL)")
        self.db.execute("CREATE TABLE meta (id INTEGER PRIMARY KEY, doc BLOB NOT NULL)")

    @staticmethod
    def _connect(directory: Path) -> sqlite3.Connection:
        db = sqlite3.connect(directory / "state.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def _write(self, put: dict[str, Value], cp: Checkpoint | None) -> None:
        db = self.db
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
            [(k, ENC.encode(v)) for k, v in put.items()],
        )
        db.executemany("DELETE FROM kv WHERE k = ?", [(k,) for k in (cp.delete if cp else ())])
        db.execute(
            "INSERT OR REPLACE INTO meta (id, doc) VALUES (0, ?)", (meta_bytes(cp, self.epoch),)
        )
        db.execute("COMMIT")

    @classmethod
    def _open_meta(cls, directory: Path) -> tuple[bytes, Callable[[], int]]:
        db = cls._connect(directory)
        meta: bytes = db.execute("SELECT doc FROM meta WHERE id = 0").fetchone()[0]
        return meta, lambda: int(db.execute("SELECT count(*) FROM kv").fetchone()[0])


class Lmdb(_KeyValue):
    """LMDB, one write transaction per checkpoint, synced at commit (``sync=True``)."""

    name = "lmdb"
    label = "(5) LMDB, synced commit per checkpoint"
    guarantee = "every committed transaction (meta page fsync at commit)"

    def __init__(self, directory: Path, *, compactor: bool = False) -> None:
        super().__init__(directory)
        self.handle = self.env = lmdb.open(str(directory / "lmdb"), map_size=64 << 30, sync=True)

    def _write(self, put: dict[str, Value], cp: Checkpoint | None) -> None:
        # Sorted keys: LMDB's cheapest insertion order, which a careful user would pick.
        items = sorted((k.encode(), ENC.encode(v)) for k, v in put.items())
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)
            for k in cp.delete if cp is not None else ():
                txn.delete(k.encode())
            txn.put(META, meta_bytes(cp, self.epoch))

    @classmethod
    def _open_meta(cls, directory: Path) -> tuple[bytes, Callable[[], int]]:
        env = lmdb.open(str(directory / "lmdb"), map_size=64 << 30)
        with env.begin() as txn:
            meta = txn.get(META)
        if meta is None:
            raise RuntimeError(f"LMDB in {directory} holds no checkpoint")
        return meta, lambda: int(env.stat()["entries"]) - 1


class Rocks(_KeyValue):
    """RocksDB through rocksdict: one WriteBatch per checkpoint, written with ``sync``."""

    name = "rocksdb"
    label = "(5) RocksDB (rocksdict), synced WriteBatch"
    guarantee = "every synced batch (WAL fsync at write)"

    def __init__(self, directory: Path, *, compactor: bool = False) -> None:
        super().__init__(directory)
        self.handle = self.db = self._open(directory)
        self._sync = rocksdict.WriteOptions()
        self._sync.sync = True

    @staticmethod
    def _open(directory: Path) -> Any:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        return rocksdict.Rdict(str(directory / "rocksdb"), opts)

    def _write(self, put: dict[str, Value], cp: Checkpoint | None) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        for k, v in put.items():
            wb.put(k.encode(), ENC.encode(v))
        for k in cp.delete if cp is not None else ():
            wb.delete(k.encode())
        wb.put(META, meta_bytes(cp, self.epoch))
        self.db.write(wb, self._sync)

    @classmethod
    def _open_meta(cls, directory: Path) -> tuple[bytes, Callable[[], int]]:
        db = cls._open(directory)
        return db[META], lambda: sum(1 for _ in db.keys()) - 1  # noqa: SIM118 (a scan)
