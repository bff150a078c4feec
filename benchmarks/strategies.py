"""The durability strategies a reconciler could pick: load, durable checkpoints, recovery.

A checkpoint (:class:`~benchmarks.workload.Checkpoint`) is durable when
:meth:`Strategy.checkpoint` returns (``statelog-group``: when :meth:`Strategy.finish`
returns); :meth:`Strategy.recover` finds it again in a fresh process after a SIGKILL.
``zstd-interval`` and ``none`` rebuild the state from :class:`SourceLog`, standing for
the broker's retained topic. The key-value stores keep msgpack values and, under
:data:`META`, offsets and watermark in the same transaction. RocksDB needs rocksdict.
"""

from __future__ import annotations

import contextlib
import hashlib
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
import zstandard

import statelog

from .workload import Checkpoint, Value

try:
    import rocksdict
except ImportError:  # an optional extra: the comparison runs without it
    rocksdict = None  # type: ignore[assignment]

__all__ = ["DESCRIPTIONS", "INTERVAL", "SKIPPED", "STRATEGIES", "JsonSnapshot", "SourceLog"]
__all__ += ["Strategy", "ZstdInterval", "commit_checkpoint"]

INTERVAL = 10  # checkpoints between two full snapshots of zstd-interval
META = b"\x00meta"  # the key-value stores' key of offsets, watermark and epoch (sorts first)

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()
_LEN = struct.Struct("<I")


def commit_checkpoint(store: statelog.StateStore, cp: Checkpoint) -> int:
    """``store.commit`` of one checkpoint; returns the new epoch."""
    return store.commit(
        offsets=cp.offsets, low_watermark_ms=cp.low_watermark_ms, put=cp.put, delete=cp.delete
    )


def _write_atomic(final: Path, chunks: Iterable[bytes], written: list[Path]) -> None:
    """Temp file, fsync, rename over ``final``, fsync of the directory; keep the newest two."""
    tmp = final.with_name(final.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.writelines(chunks)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    if final not in written:
        written.append(final)
    while len(written) > 2:  # a predecessor survives a damaged newest snapshot
        with contextlib.suppress(FileNotFoundError):
            os.unlink(written.pop(0))


def _meta(cp: Checkpoint | None, epoch: int) -> bytes:
    offsets, wm = (cp.offsets, cp.low_watermark_ms) if cp is not None else ({}, 0)
    return _enc.encode({"offsets": offsets, "wm": wm, "epoch": epoch})


class SourceLog:
    """The replayable source: one record per load chunk or checkpoint (offsets, watermark, puts)."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "ab")  # noqa: SIM115 (a killed writer never closes it)
        self.pos = 0  # after the last record appended: the consumer offset

    def append(self, offsets: dict[str, int], wm: int, put: dict[str, Value]) -> int:
        """Append one record; returns the position after it (the consumer offset)."""
        body = _enc.encode([offsets, wm, put])
        self._fh.write(_LEN.pack(len(body)) + body)
        self._fh.flush()
        self.pos = self._fh.tell()
        return self.pos

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
    """What a recovery found. ``count`` is called after the timed span (some stores scan);
    ``replayed`` counts the state updates re-applied from a log or the source."""

    offsets: dict[str, int]
    low_watermark_ms: int
    count: Callable[[], int]
    replayed: int
    detail: str = ""


class Strategy:
    """Base of the strategies; ``label`` and ``guarantee`` are the report's row and promise."""

    name: ClassVar[str]
    label: ClassVar[str]
    guarantee: ClassVar[str]
    uses_source: ClassVar[bool] = False

    def __init__(self, directory: Path, *, compactor: bool = False) -> None:
        """Own the empty ``directory``; ``compactor``: statelog runs its compactor process."""
        self.dir = directory
        self.epoch = 0

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        """Install the starting state (set-up, not a checkpoint)."""
        raise NotImplementedError

    def loaded(self, source_pos: int) -> None:
        """Called once after :meth:`load`, with the source position the load reached."""

    def checkpoint(self, cp: Checkpoint, source_pos: int = 0) -> None:
        """Apply ``cp`` and make it durable before returning (group commit: see the module)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Make every checkpoint taken so far durable, and recoverable by :meth:`recover`."""

    def close(self) -> None:
        """Release files and locks (not called before a SIGKILL)."""

    @classmethod
    def recover(cls, directory: Path) -> Recovered:
        """Recover what was made durable in ``directory``, as a fresh process would.

        :raises RuntimeError: nothing recoverable was found.
        """
        raise NotImplementedError


class _InMemory(Strategy):
    """State in a dict; ``epoch`` counts the checkpoints applied."""

    def __init__(self, directory: Path, *, compactor: bool = False) -> None:
        super().__init__(directory)
        self.state: dict[str, Value] = {}
        self.offsets: dict[str, int] = {}
        self.low_watermark_ms = 0
        self.snaps = directory / "snapshots"
        self._written: list[Path] = []

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        for chunk in chunks:
            self.state.update(chunk)

    def apply(self, cp: Checkpoint) -> None:
        """Apply ``cp`` to the in-memory state only; the epoch advances."""
        self.state.update(cp.put)
        for k in cp.delete:
            self.state.pop(k, None)
        self.offsets.update(cp.offsets)
        self.low_watermark_ms = cp.low_watermark_ms
        self.epoch += 1

    def checkpoint(self, cp: Checkpoint, source_pos: int = 0) -> None:
        self.apply(cp)


class JsonSnapshot(_InMemory):
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
        _write_atomic(final, (head, body, b"}"), self._written)
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


def _replay(state: dict[str, Any], path: Path, start: int = 0) -> tuple[dict[str, int], int, int]:
    """Apply source records from ``start``; the last offsets and watermark seen, and the updates."""
    offsets: dict[str, int] = {}
    wm = n = 0
    for rec_offsets, rec_wm, put in SourceLog.read(path, start):
        state.update(put)
        n += len(put)
        if rec_offsets:
            offsets, wm = rec_offsets, rec_wm
    return offsets, wm, n


class NoCheckpoint(_InMemory):
    """Nothing durable: recovery re-reads the source from its start."""

    name = "none"
    label = "(4) no checkpoint: replay the source from the start"
    guarantee = "none of its own: correct only if the source retains everything since the start"
    uses_source = True

    @classmethod
    def recover(cls, directory: Path) -> Recovered:
        state: dict[str, Any] = {}
        offsets, wm, n = _replay(state, directory / "source.log")
        return Recovered(offsets, wm, lambda: len(state), n)


class ZstdInterval(_InMemory):
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
        doc = {"pos": source_pos, "meta": _meta(cp, self.epoch), "state": self.state}
        body = zstandard.ZstdCompressor(level=3).compress(_enc.encode(doc))
        _write_atomic(self.snaps / f"snap-{self.epoch:012d}.zst", (body,), self._written)

    def loaded(self, source_pos: int) -> None:
        self._snapshot(None, source_pos)  # recovery need not re-read the load from the source

    def checkpoint(self, cp: Checkpoint, source_pos: int = 0) -> None:
        self.apply(cp)
        if self.epoch % INTERVAL == 0:
            self._snapshot(cp, source_pos)

    @classmethod
    def recover(cls, directory: Path) -> Recovered:
        newest = sorted((directory / "snapshots").glob("snap-*.zst"))[-1]
        doc = _dec.decode(zstandard.ZstdDecompressor().decompress(newest.read_bytes()))
        state: dict[str, Any] = doc["state"]
        offsets, wm, n = _replay(state, directory / "source.log", doc["pos"])
        if not offsets:
            meta = _dec.decode(doc["meta"])
            offsets, wm = meta["offsets"], meta["wm"]
        return Recovered(offsets, wm, lambda: len(state), n)


_SMALL: dict[str, Any] = {"segment_bytes": 8 << 20, "min_tail_bytes": 8 << 20}
_SMALL["compactor_interval"] = timedelta(seconds=1)  # the state here would not fill 64 MiB


class Statelog(Strategy):
    """statelog ``durability="commit"``: one checksummed record per checkpoint, fdatasync'd."""

    name = "statelog"
    label = '(3) statelog `durability="commit"` + compactor'
    guarantee = "every acknowledged commit (fsync before return); prefix-exact, verified"
    durability: ClassVar[statelog.Durability] = "commit"

    def __init__(self, directory: Path, *, compactor: bool = False) -> None:
        super().__init__(directory)
        mode = "process" if compactor else "none"
        self.store = statelog.open(
            directory / "store", durability=self.durability, compactor=mode, **_SMALL
        )
        self.schedule: list[int] = []  # updates per epoch: recovery counts what it replayed

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        for chunk in chunks:
            self.store.commit(offsets={}, low_watermark_ms=0, put=chunk)
            self.schedule.append(len(chunk))

    def checkpoint(self, cp: Checkpoint, source_pos: int = 0) -> None:
        commit_checkpoint(self.store, cp)
        self.schedule.append(cp.updates)

    def finish(self) -> None:
        self.store.flush()
        (self.dir / "schedule.json").write_text(json.dumps(self.schedule))

    def close(self) -> None:
        self.store.close()

    @classmethod
    def recover(cls, directory: Path) -> Recovered:
        store = statelog.open(directory / "store")
        rec, epoch = store.recovery, store.epoch
        schedule = json.loads((directory / "schedule.json").read_text())
        replayed = sum(schedule[epoch - rec.replayed : epoch])
        snap = rec.snapshot.name if rec.snapshot else "-"
        detail = f"snapshot {snap}, {rec.replayed} commits"
        return Recovered(dict(store.offsets), store.low_watermark_ms, store.count, replayed, detail)


class StatelogGroup(Statelog):
    """statelog ``durability="group"``: ``commit`` returns before the fsync; flushed at the end."""

    name = "statelog-group"
    label = '(3) statelog `durability="group"` + compactor'
    guarantee = "every commit that `wait_durable` confirmed (a few ms after return); prefix-exact"
    durability = "group"


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
        m = _dec.decode(meta)
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
            [(k, _enc.encode(v)) for k, v in put.items()],
        )
        db.executemany("DELETE FROM kv WHERE k = ?", [(k,) for k in (cp.delete if cp else ())])
        db.execute("INSERT OR REPLACE INTO meta (id, doc) VALUES (0, ?)", (_meta(cp, self.epoch),))
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
        items = sorted((k.encode(), _enc.encode(v)) for k, v in put.items())
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)
            for k in cp.delete if cp is not None else ():
                txn.delete(k.encode())
            txn.put(META, _meta(cp, self.epoch))

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
            wb.put(k.encode(), _enc.encode(v))
        for k in cp.delete if cp is not None else ():
            wb.delete(k.encode())
        wb.put(META, _meta(cp, self.epoch))
        self.db.write(wb, self._sync)

    @classmethod
    def _open_meta(cls, directory: Path) -> tuple[bytes, Callable[[], int]]:
        db = cls._open(directory)
        return db[META], lambda: sum(1 for _ in db.keys()) - 1  # noqa: SIM118 (a scan)


_ALL = (JsonSnapshot, ZstdInterval, Statelog, StatelogGroup, NoCheckpoint, Sqlite, Lmdb, Rocks)
SKIPPED: dict[str, str] = (
    {} if rocksdict is not None else {"rocksdb": "rocksdict is not installed (dev extra)"}
)
"""Strategies left out of this run, and why."""
DESCRIPTIONS = {s.name: (s.label, s.guarantee) for s in _ALL}
"""Strategy name -> (row label, consistency guarantee), installed or not."""
STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in _ALL if s.name not in SKIPPED}
"""Strategy name -> class, in the order of the report."""
