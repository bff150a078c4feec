"""The live state: epoch, offsets, watermark and an in-memory overlay of tables.

Values are kept msgpack-encoded (see :mod:`statelog.records`), so a reader
gets a fresh object on every read and can never mutate stored state. The
overlay is the top level of the two-level design in ``docs/architecture.md``;
the memory-mapped base snapshot slots in beneath it.

Key order: within a table, ``bytes`` keys sort before ``str`` keys; each kind
sorts bytewise (``str`` by code point, which is its UTF-8 byte order).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .records import CommitRecord

__all__ = ["Key", "LiveState"]

Key = str | bytes


class LiveState:
    """Everything a reader sees. Mutated only by :meth:`apply` (commit and replay)."""

    __slots__ = ("epoch", "low_watermark_ms", "offsets", "tables")

    def __init__(self) -> None:
        self.epoch = 0
        self.offsets: dict[str, int] = {}
        self.low_watermark_ms = 0
        self.tables: dict[str, dict[Key, bytes]] = {}

    def apply(
        self,
        epoch: int,
        offsets: Mapping[str, int],
        low_watermark_ms: int,
        deltas: Iterable[tuple[str, Sequence[Key], Sequence[bytes], Sequence[Key]]],
    ) -> None:
        """Apply one verified commit. The caller has checked ``epoch == self.epoch + 1``."""
        for name, keys, values, deletes in deltas:
            table = self.tables.get(name)
            if table is None:
                table = self.tables[name] = {}
            if deletes:
                pop = table.pop
                for k in deletes:
                    pop(k, None)
            if keys:
                table.update(zip(keys, values, strict=True))
        self.offsets.update(offsets)
        self.low_watermark_ms = low_watermark_ms
        self.epoch = epoch

    def apply_record(self, rec: CommitRecord) -> None:
        self.apply(
            rec.epoch,
            rec.offsets,
            rec.low_watermark_ms,
            ((t.name, t.keys, t.values, t.deletes) for t in rec.tables),
        )

    def get(self, table: str, key: Any) -> bytes | None:
        t = self.tables.get(table)
        return None if t is None else t.get(key)

    def count(self, table: str) -> int:
        t = self.tables.get(table)
        return 0 if t is None else len(t)

    def keys(self, table: str, prefix: Key | None = None) -> list[Key]:
        """Keys of ``table`` in key order, optionally only those starting with ``prefix``."""
        t = self.tables.get(table)
        if not t:
            return []
        if prefix is None:
            bkeys = sorted(k for k in t if type(k) is bytes)
            skeys = sorted(k for k in t if type(k) is str)
            return [*bkeys, *skeys]
        kind = type(prefix)
        return sorted(k for k in t if type(k) is kind and k.startswith(prefix))  # type: ignore[arg-type]

    def items(self, table: str, prefix: Key | None = None) -> Iterator[tuple[Key, bytes]]:
        t = self.tables.get(table, {})
        for k in self.keys(table, prefix):
            v = t.get(k)
            if v is not None:
                yield k, v
