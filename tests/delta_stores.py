"""Real stores with delta chains, their model, and the damage the delta tests aim at them.

:func:`build_chain` makes the store most delta tests start from: an older
full snapshot, a newer one, three deltas on the newer one, and more log
after the last delta, with nothing deleted (``retain`` 10). Its
:class:`ChainStore` knows each snapshot's name and the model of every epoch,
so a test damages one link and asserts the exact state recovery reaches.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

import statelog
from statelog.compaction.fold import CompactionResult, compact
from statelog.format.snapshot import FOOTER_SIZE, HEADER_SIZE, pack_footer
from statelog.log.segments import list_segments

__all__ = [
    "DELTA",
    "FULL",
    "SEG",
    "ChainStore",
    "Model",
    "build_chain",
    "commit_round",
    "contents",
    "copy_store",
    "drop_segments_through",
    "passed",
    "twin",
]

SEG = 4096
FULL: dict[str, Any] = {"max_chain": 0, "retain": 10}
"""Compaction options that write a full snapshot and delete nothing a test looks at."""
DELTA: dict[str, Any] = {"max_chain": 8, "full_ratio": 10.0, "retain": 10}
"""Compaction options under which a small tail is written as a delta."""


@dataclass
class Model:
    """The plain-dict fold of every commit made through :meth:`commit`."""

    tables: dict[str, dict[Any, Any]] = field(default_factory=dict)
    epoch: int = 0

    def commit(
        self,
        store: statelog.StateStore,
        put: dict[Any, Any],
        delete: tuple[Any, ...] = (),
        table: str = "default",
    ) -> None:
        self.epoch = store.commit(
            offsets={"p0": self.epoch + 1},
            low_watermark_ms=self.epoch + 1,
            put=put,
            delete=delete,
            table=table,
        )
        t = self.tables.setdefault(table, {})
        for k in delete:
            t.pop(k, None)
        t.update(put)

    def state(self) -> dict[str, dict[Any, Any]]:
        return {t: dict(kv) for t, kv in self.tables.items() if kv}


def contents(store: statelog.StateStore) -> dict[str, dict[Any, Any]]:
    """What ``store`` holds, read three ways that must agree: items, count and get."""
    got = {t: dict(store.items(t)) for t in store.tables()}
    for t, kv in got.items():
        assert store.count(t) == len(kv), t
        for k, v in kv.items():
            assert store.get(k, table=t) == v, (t, k)
    return {t: kv for t, kv in got.items() if kv}


def commit_round(root: Path, model: Model, r: int, *, width: int = 12) -> None:
    """Open the writer, make round ``r``'s commits, close it (which seals its last segment).

    Round 0 fills two tables; every later round overwrites a few keys, adds
    new ones and deletes some the state holds, in both tables.
    """
    with statelog.open(root, segment_bytes=SEG) as store:
        if r == 0:
            for i in range(0, 240, 40):
                model.commit(store, {f"k{j}": {"v": j, "pad": "x" * 30} for j in range(i, i + 40)})
            model.commit(store, {b"b%d" % j: j for j in range(60)}, table="other")
            return
        for j in range(width):
            key = f"k{(r * 37 + j * 11) % 300}"
            model.commit(store, {key: {"v": r, "j": j}}, delete=(f"k{(r * 53 + j) % 240}",))
        model.commit(store, {b"b%d" % (r + 100): r}, delete=(b"b%d" % r,), table="other")


@dataclass
class ChainStore:
    """A closed store: ``names`` = [older full, full, delta 1, delta 2, delta 3]; the last
    round of commits after delta 3 is only in the log."""

    root: Path
    names: list[str]
    models: dict[str, dict[str, dict[Any, Any]]]  # snapshot name -> the state it restores
    final: dict[str, dict[Any, Any]]
    epoch: int

    def snap(self, i: int) -> Path:
        return self.root / "snapshots" / self.names[i]


def passed(root: Path, **options: Any) -> CompactionResult:
    """One compaction pass that must write a snapshot."""
    result = compact(root, **options)
    assert result.snapshot is not None, result.skipped
    return result


def build_chain(root: Path) -> ChainStore:
    model = Model()
    names: list[str] = []
    models: dict[str, dict[str, dict[Any, Any]]] = {}
    for r in range(5):
        commit_round(root, model, r)
        result = passed(root, **(FULL if r < 2 else DELTA))
        assert result.snapshot is not None
        assert result.full == (r < 2) and result.depth == max(0, r - 1), (r, result)
        names.append(result.snapshot.name)
        models[result.snapshot.name] = model.state()
    commit_round(root, model, 9)
    return ChainStore(root, names, models, model.state(), model.epoch)


def copy_store(src: ChainStore, dest: Path) -> ChainStore:
    shutil.copytree(src.root, dest, symlinks=True)
    return ChainStore(dest, list(src.names), src.models, src.final, src.epoch)


def twin(path: Path) -> None:
    """Make ``path`` another valid snapshot of the same name: its ``created_ms`` moved on by
    one and its footer recomputed, so it verifies but hashes to another digest."""
    data = bytearray(path.read_bytes())
    meta_len, body_len = struct.unpack_from("<IQ", data, 52)
    meta = msgspec.msgpack.decode(bytes(data[HEADER_SIZE : HEADER_SIZE + meta_len]))
    meta["created_ms"] += 1
    raw = msgspec.msgpack.encode(meta)
    body = bytes(data[HEADER_SIZE + meta_len : HEADER_SIZE + meta_len + body_len])
    head = bytearray(data[:HEADER_SIZE])
    struct.pack_into("<I", head, 52, len(raw))
    out = bytes(head) + raw + body
    out += pack_footer(hashlib.sha256(out).digest())
    assert len(out) == len(data) - meta_len + len(raw) and FOOTER_SIZE == 40
    path.write_bytes(out)


def drop_segments_through(root: Path, lsn: int) -> list[Path]:
    """Delete every segment all of whose records are at or below ``lsn`` (never the last)."""
    segs = list_segments(root / "wal")
    gone = [p for (_s, _f, p), nxt in itertools.pairwise(segs) if nxt[1] - 1 <= lsn]
    for p in gone:
        p.unlink()
    return gone
