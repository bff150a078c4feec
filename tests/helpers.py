"""Tiny helpers that build damaged inputs and describe stores declaratively.

Each damages a file in place and returns what it did, so a test reads as a
row of a failure-mode table: build a store, damage it, reopen, assert what
survived and what was dropped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c

import statelog
from statelog.format.wal import FRAME_HEADER, FRAME_HEADER_SIZE, HEADER_SIZE, frame_crc, padding
from statelog.log.segments import list_segments


def segments(store: Path) -> list[Path]:
    """Segment files of ``store`` in log order."""
    return [p for _, _, p in list_segments(store / "wal")]


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    """Invert one bit of ``path`` at byte ``offset``."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def truncate(path: Path, size: int) -> None:
    """Cut ``path`` to ``size`` bytes (negative: that many bytes off the end)."""
    data = path.read_bytes()
    path.write_bytes(data[:size] if size >= 0 else data[: len(data) + size])


def zero_fill(path: Path, start: int, length: int) -> None:
    """Overwrite ``length`` bytes at ``start`` with zeros, extending the file if needed."""
    data = bytearray(path.read_bytes())
    end = start + length
    if end > len(data):
        data.extend(bytes(end - len(data)))
    data[start:end] = bytes(length)
    path.write_bytes(bytes(data))


def poke(path: Path, offset: int, fmt: str, *values: Any) -> None:
    """Overwrite a packed struct at ``offset`` (e.g. a frame's length field)."""
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, *values)
    path.write_bytes(bytes(data))


@dataclass(frozen=True)
class FrameInfo:
    offset: int
    length: int
    ftype: int
    end: int


def frames(path: Path) -> list[FrameInfo]:
    """Every frame of a segment, parsed without verification (for aiming damage)."""
    data = path.read_bytes()
    out = []
    off = HEADER_SIZE
    while off + FRAME_HEADER_SIZE <= len(data):
        _crc, length, ftype, pad, _res, _prev = FRAME_HEADER.unpack_from(data, off)
        if ftype == 0:
            break
        end = off + FRAME_HEADER_SIZE + length + pad
        out.append(FrameInfo(off, length, ftype, end))
        off = end
    return out


def fix_crc(path: Path, frame_offset: int) -> None:
    """Recompute the crc of the frame at ``frame_offset`` after a deliberate edit.

    Lets a test build a frame that verifies on its own but breaks the chain
    or carries a payload that is not a commit record.
    """
    data = bytearray(path.read_bytes())
    _crc, length, _t, _p, _r, _prev = FRAME_HEADER.unpack_from(data, frame_offset)
    start = frame_offset + FRAME_HEADER_SIZE
    crc = frame_crc(bytes(data[frame_offset + 4 : start]), bytes(data[start : start + length]))
    struct.pack_into("<I", data, frame_offset, crc)
    path.write_bytes(bytes(data))


assert padding(0) == 0 and crc32c.crc32c(b"") == 0


@dataclass
class Commit:
    """One commit of a declarative store spec."""

    put: dict[Any, Any] = field(default_factory=dict)
    delete: tuple[Any, ...] = ()
    table: str = "default"
    offsets: dict[str, int] | None = None
    watermark: int | None = None


def build_store(path: Path, commits: Iterable[Commit], **options: Any) -> list[dict[str, Any]]:
    """Create a store from ``commits``; return the model state after each epoch (index = epoch).

    Each model is ``{"offsets":..., "low_watermark_ms":..., "tables": {table: {key: value}}}``.
    """
    models: list[dict[str, Any]] = [{"offsets": {}, "low_watermark_ms": 0, "tables": {}}]
    with statelog.open(path, **options) as store:
        for c in commits:
            commit_with_model(store, models, c)
    return models


def commit_with_model(
    store: statelog.StateStore, models: list[dict[str, Any]], commit: Commit
) -> int:
    """Commit a :class:`Commit` as ``build_store`` does; on success extend ``models``.

    ``models[e]`` is the model at epoch ``e`` (as ``build_store`` returns), so
    ``len(models) - 1`` is always the last acknowledged epoch.
    """
    nxt = model_of(models[-1], commit, len(models))
    epoch = store.commit(
        offsets=commit.offsets if commit.offsets is not None else {"p0": len(models)},
        low_watermark_ms=nxt["low_watermark_ms"],
        put=commit.put,
        delete=commit.delete,
        table=commit.table,
    )
    models.append(nxt)
    return epoch


def model_of(prev: dict[str, Any], commit: Commit, epoch: int) -> dict[str, Any]:
    """The model after applying ``commit`` as epoch ``epoch`` on top of ``prev``."""
    offsets = commit.offsets if commit.offsets is not None else {"p0": epoch}
    wm = commit.watermark if commit.watermark is not None else epoch * 10
    tables = {t: dict(kv) for t, kv in prev["tables"].items()}
    t = tables.setdefault(commit.table, {})
    for k in commit.delete:
        t.pop(k, None)
    t.update(commit.put)
    return {"offsets": {**prev["offsets"], **offsets}, "low_watermark_ms": wm, "tables": tables}


def snapshot_of(store: statelog.StateStore) -> dict[str, Any]:
    """The store's whole visible state in the model's shape."""
    return {
        "offsets": store.offsets,
        "low_watermark_ms": store.low_watermark_ms,
        "tables": {t: dict(store.items(t)) for t in store.tables() if store.count(t)},
    }


def model_at(models: list[dict[str, Any]], epoch: int) -> dict[str, Any]:
    """The model at ``epoch`` with empty tables dropped (to compare with :func:`snapshot_of`)."""
    m = models[epoch]
    return {**m, "tables": {t: kv for t, kv in m["tables"].items() if kv}}


def simple_commits(n: int, *, width: int = 3, value_size: int = 8) -> list[Commit]:
    """``n`` commits, each putting ``width`` keys and deleting one older key."""
    out = []
    for i in range(1, n + 1):
        put = {f"k{i}-{j}": {"i": i, "j": j, "pad": "x" * value_size} for j in range(width)}
        delete = (f"k{i - 1}-0",) if i > 1 else ()
        out.append(Commit(put=put, delete=delete))
    return out
