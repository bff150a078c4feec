"""Durability strategies, each able to load a state and take durable checkpoints.

Every strategy times its own checkpoint, because each knows which part is
the durable checkpoint and which part is bookkeeping: statelog times
``store.commit`` (the whole commit path: validate, encode, frame, append,
fdatasync, apply); the JSON snapshot times the in-memory apply plus the full
snapshot, and reports the snapshot on its own too.

Add a strategy by writing a class with ``load``/``checkpoint``/``close`` and
registering a factory in :data:`STRATEGIES`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import statelog

from .workload import Checkpoint, Value

__all__ = [
    "STRATEGIES",
    "JsonSnapshotStrategy",
    "Sample",
    "StatelogStrategy",
    "Strategy",
    "commit_checkpoint",
    "make_strategy",
]


@dataclass(frozen=True)
class Sample:
    """One checkpoint as measured by its strategy.

    :param seconds: wall time of the durable checkpoint (returns durable).
    :param cpu_seconds: CPU time of this process over the same span.
    :param bytes_written: bytes the checkpoint added or rewrote on disk (file
        contents, not file-system metadata or journal).
    :param parts: wall time of named steps inside the checkpoint.
    """

    seconds: float
    cpu_seconds: float
    bytes_written: int
    parts: Mapping[str, float] = field(default_factory=dict)


class Strategy(Protocol):
    """A way to make a reconciler's state durable at each checkpoint."""

    name: ClassVar[str]
    description: ClassVar[str]

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        """Install the starting state (not timed as a checkpoint)."""

    def checkpoint(self, cp: Checkpoint) -> Sample:
        """Apply ``cp`` and make it durable before returning; measure it."""
        ...

    def close(self) -> None:
        """Release files and locks."""


def commit_checkpoint(store: statelog.StateStore, cp: Checkpoint) -> int:
    """``store.commit`` of one checkpoint; returns the new epoch."""
    return store.commit(
        offsets=cp.offsets, low_watermark_ms=cp.low_watermark_ms, put=cp.put, delete=cp.delete
    )


class StatelogStrategy:
    """statelog: one WAL record per checkpoint, fdatasync before ``commit`` returns."""

    name: ClassVar[str] = "statelog"
    description: ClassVar[str] = (
        'statelog `durability="commit"`: one checksummed WAL record per checkpoint, '
        "fdatasync before `commit` returns, then applied to the in-memory overlay"
    )

    def __init__(self, directory: Path, *, durability: statelog.Durability = "commit") -> None:
        self.path = directory / "store"
        self.store = statelog.open(self.path, durability=durability)
        self._wal = self.path / "wal"
        self._on_disk = self._wal_bytes()

    def _wal_bytes(self) -> int:
        with os.scandir(self._wal) as it:
            return sum(e.stat().st_size for e in it if e.name.endswith(".wal"))

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        for chunk in chunks:
            self.store.commit(offsets={}, low_watermark_ms=0, put=chunk)
        self._on_disk = self._wal_bytes()

    def checkpoint(self, cp: Checkpoint) -> Sample:
        store = self.store
        c0 = time.process_time()
        t0 = time.perf_counter()
        commit_checkpoint(store, cp)
        t1 = time.perf_counter()
        c1 = time.process_time()
        before, self._on_disk = self._on_disk, self._wal_bytes()
        return Sample(t1 - t0, c1 - c0, self._on_disk - before)

    def close(self) -> None:
        self.store.close()


class JsonSnapshotStrategy:
    """The seed's strategy: the whole state as sorted JSON, hashed, written atomically.

    Each checkpoint applies the updates to a dict, then writes a full
    snapshot: serialise with sorted keys, sha256 of the body (so a reader can
    verify it), write a temp file, fsync, rename over the final name, fsync
    the directory. The newest ``keep`` snapshots are kept, so a damaged newest
    one has a predecessor. The body is serialised once (a lower bound for a
    strategy that serialises once to hash and again to write).
    """

    name: ClassVar[str] = "json"
    description: ClassVar[str] = (
        "seed-style full snapshot: sorted compact JSON of the whole state, sha256, "
        "temp file, fsync, atomic rename, fsync of the directory; keeps 2"
    )

    def __init__(self, directory: Path, *, keep: int = 2) -> None:
        self.dir = directory / "snapshots"
        self.dir.mkdir(parents=True)
        self.keep = keep
        self.state: dict[str, Value] = {}
        self.offsets: dict[str, int] = {}
        self.low_watermark_ms = 0
        self.epoch = 0
        self._written: list[Path] = []

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        for chunk in chunks:
            self.state.update(chunk)

    def checkpoint(self, cp: Checkpoint) -> Sample:
        c0 = time.process_time()
        t0 = time.perf_counter()
        self.apply(cp)
        t1 = time.perf_counter()
        size, parts = self.snapshot()
        t2 = time.perf_counter()
        c1 = time.process_time()
        return Sample(t2 - t0, c1 - c0, size, {"apply": t1 - t0, "snapshot": t2 - t1, **parts})

    def apply(self, cp: Checkpoint) -> None:
        """Apply ``cp`` to the in-memory state only (no snapshot); the epoch advances."""
        state = self.state
        state.update(cp.put)
        for k in cp.delete:
            state.pop(k, None)
        self.offsets.update(cp.offsets)
        self.low_watermark_ms = cp.low_watermark_ms
        self.epoch += 1

    def snapshot(self) -> tuple[int, dict[str, float]]:
        """Write the full snapshot of the current epoch; returns its size and step times."""
        t0 = time.perf_counter()
        doc: dict[str, Any] = {
            "epoch": self.epoch,
            "offsets": self.offsets,
            "low_watermark_ms": self.low_watermark_ms,
            "state": self.state,
        }
        body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        t1 = time.perf_counter()
        head = b'{"sha256":"' + hashlib.sha256(body).hexdigest().encode() + b'","checkpoint":'
        t2 = time.perf_counter()
        final = self.dir / f"snapshot-{self.epoch:012d}.json"
        tmp = final.with_name(final.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            for chunk in (head, body, b"}"):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, final)
        _fsync_dir(self.dir)
        if not self._written or self._written[-1] != final:
            self._written.append(final)
        while len(self._written) > self.keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._written.pop(0))
        t3 = time.perf_counter()
        size = len(head) + len(body) + 1
        return size, {"serialize": t1 - t0, "hash": t2 - t1, "write+fsync+rename": t3 - t2}

    def newest(self) -> Path | None:
        """The newest snapshot file written, if any."""
        return self._written[-1] if self._written else None

    @staticmethod
    def restore(path: Path) -> tuple[dict[str, Any], dict[str, float]]:
        """Read a snapshot this strategy wrote, verify its sha256, parse it: the seed's restore.

        Returns the checkpoint document (``epoch``, ``offsets``,
        ``low_watermark_ms``, ``state``) and the wall time of each step.

        :raises ValueError: not such a snapshot, or the hash does not match.
        """
        t0 = time.perf_counter()
        with open(path, "rb") as fh:
            data = fh.read()
        t1 = time.perf_counter()
        prefix, middle = b'{"sha256":"', b'","checkpoint":'
        start = len(prefix) + 64 + len(middle)
        if not data.startswith(prefix) or data[start - len(middle) : start] != middle:
            raise ValueError(f"{path}: not a JSON snapshot of this strategy")
        if not data.endswith(b"}"):
            raise ValueError(f"{path}: truncated")
        body = memoryview(data)[start:-1]
        digest = hashlib.sha256(body).hexdigest().encode()
        if digest != data[len(prefix) : len(prefix) + 64]:
            raise ValueError(f"{path}: sha256 mismatch")
        t2 = time.perf_counter()
        doc: dict[str, Any] = json.loads(body.tobytes())
        t3 = time.perf_counter()
        return doc, {"read": t1 - t0, "verify sha256": t2 - t1, "json.loads": t3 - t2}

    def close(self) -> None:
        self.state = {}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


STRATEGIES: dict[str, Callable[[Path], Strategy]] = {
    JsonSnapshotStrategy.name: JsonSnapshotStrategy,
    StatelogStrategy.name: StatelogStrategy,
}
"""Strategy name -> factory taking an empty directory it may own."""


def make_strategy(name: str, directory: Path) -> Strategy:
    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None
    return factory(directory)
