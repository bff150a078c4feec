"""The read side of :class:`~statelog.store.store.StateStore`.

Reads never touch the log: they go to the newest overlay generation first,
then older ones, then the memory-mapped base (:mod:`statelog.state.live`). Each
read holds the store's view lock, so it sees whole commits only, and a base
swap happens entirely before or after it. Values are decoded per read, so
the caller always gets a fresh object.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from statelog.format.records import Key, decode_value
from statelog.state.live import LiveState

__all__ = ["StoreReads"]


class StoreReads:
    """Mixed into StateStore, which sets ``_state`` and ``_view``."""

    _state: LiveState
    _view: threading.Lock

    @property
    def epoch(self) -> int:
        """The epoch of the last commit (0 for a new store)."""
        return self._state.epoch

    @property
    def offsets(self) -> dict[str, int]:
        """A copy of the committed consumer offsets."""
        with self._view:
            return dict(self._state.offsets)

    @property
    def low_watermark_ms(self) -> int:
        return self._state.low_watermark_ms

    def get(self, key: Key, default: Any = None, table: str = "default") -> Any:
        """The value of ``key`` in ``table`` (a fresh object), or ``default``."""
        with self._view:
            raw = self._state.get(table, key)
        return default if raw is None else decode_value(raw)

    def items(self, table: str = "default", prefix: Key | None = None) -> Iterator[tuple[Key, Any]]:
        """``(key, value)`` pairs of ``table`` in key order (bytes keys first, then str).

        The pairs are taken at the call, so later commits do not show up mid-iteration.
        """
        with self._view:
            pairs = list(self._state.items(table, prefix))
        for k, raw in pairs:
            yield k, decode_value(raw)

    def count(self, table: str = "default") -> int:
        """Number of live keys in ``table``."""
        with self._view:
            return self._state.count(table)

    def tables(self) -> list[str]:
        """Names of the tables that have ever been written."""
        with self._view:
            return self._state.tables()
