"""What every durability strategy of the benchmarks is: load, durable checkpoints, recovery.

A checkpoint (:class:`~benchmarks.workload.Checkpoint`) is durable when
:meth:`Strategy.checkpoint` returns (``statelog-group``: when :meth:`Strategy.finish`
returns); :meth:`Strategy.recover` finds it again in a fresh process after a SIGKILL.
:class:`SourceLog` stands for the broker's retained topic, from which the strategies
without a checkpoint of their own rebuild the state.
"""

import contextlib
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from .workload import Checkpoint, Value

try:
    import rocksdict
except ImportError:  # an optional extra: the comparison runs without it
    rocksdict = None  # type: ignore[assignment]

__all__ = ["DEC", "ENC", "LEN", "META", "InMemory", "Recovered", "SourceLog", "Strategy"]
__all__ += ["meta_bytes", "write_atomic"]

META = b"\x00meta"  # the key-value stores' key of offsets, watermark and epoch (sorts first)

ENC = msgspec.msgpack.Encoder()
DEC = msgspec.msgpack.Decoder()
LEN = struct.Struct("<I")


def write_atomic(final: Path, chunks: Iterable[bytes], written: list[Path]) -> None:
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


def meta_bytes(cp: Checkpoint | None, epoch: int) -> bytes:
    offsets, wm = (cp.offsets, cp.low_watermark_ms) if cp is not None else ({}, 0)
    return ENC.encode({"offsets": offsets, "wm": wm, "epoch": epoch})


class SourceLog:
    """The replayable source: one record per load chunk or checkpoint (offsets, watermark, puts)."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "ab")  # noqa: SIM115 (a killed writer never closes it)
        self.pos = 0  # after the last record appended: the consumer offset

    def append(self, offsets: dict[str, int], wm: int, put: dict[str, Value]) -> int:
        """Append one record; returns the position after it (the consumer offset)."""
        body = ENC.encode([offsets, wm, put])
        self._fh.write(LEN.pack(len(body)) + body)
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
            (n,) = LEN.unpack_from(data, pos)
            if pos + 4 + n > len(data):
                break  # a record the killed process had not finished writing
            offsets, wm, put = DEC.decode(memoryview(data)[pos + 4 : pos + 4 + n])
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


class InMemory(Strategy):
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
