"""The read side of a store: its epoch, offsets, watermark, keys, and the changes feed.

:class:`StoreReads` is the half of :class:`~statelog.store.store.StateStore` that
never writes: every read takes the view lock, so it sees whole commits only and
a base swap entirely before or after it (:mod:`statelog.state.live`). The
changes feed reads the log instead (:mod:`statelog.log.changes`).
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Generator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from statelog.errors import UnknownTableError
from statelog.log.changes import Change, read_changes
from statelog.recovery.readonly import ReadOnlyRecovery
from statelog.recovery.timeline import epoch_at
from statelog.state.live import Key, LiveState, read_value
from statelog.store.options import StoreOptions
from statelog.store.writer import StoreWriter

__all__ = ["StoreReads"]


class StoreReads:
    """Reads of a store; :class:`~statelog.store.store.StateStore` sets the attributes."""

    path: Path
    _options: StoreOptions
    _state: LiveState
    _view: threading.Lock
    _writer: StoreWriter | None
    _ro: ReadOnlyRecovery | None
    _closed: bool
    _known_tables: set[str]  # "default", the declared tables, and those seen to exist

    @property
    def durable_epoch(self) -> int:
        """The highest epoch known to be synced to disk (for a read-only store: its epoch)."""
        if self._writer is None:
            return self._state.epoch
        return self._writer.durable_epoch

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

    @property
    def committed_at(self) -> datetime | None:
        """When the commit at :attr:`epoch` was made (UTC; None: not recorded, or epoch 0)."""
        ms = self._state.commit_ms
        return datetime.fromtimestamp(ms / 1000, UTC) if ms else None

    def epoch_at(self, when: datetime) -> int:
        """The last epoch committed at or before ``when`` that this store's files retain.

        Read from the snapshots' metas and the retained log (verified), so it
        may name an epoch older than a read-only view's; ``statelog.open(path,
        readonly=True, at=epoch)`` then opens the state as of it.

        :raises InvalidOptionError: ``when`` is not a datetime with a time zone.
        :raises EpochUnavailableError: every retained commit is after ``when``.
        """
        return epoch_at(self.path, when, self._options.file_layer)

    def get(self, key: Key, default: Any = None, table: str = "default") -> Any:
        """The value of ``key`` in ``table`` (a fresh object), or ``default``.

        :raises UnknownTableError: ``table`` was never written nor declared (``tables=``).
        :raises CorruptionError: the stored value does not decode (damage past every check).
        """
        with self._view:
            if table not in self._known_tables:
                self._check_table(table)
            raw = self._state.get(table, key)
        return default if raw is None else read_value(raw, self.path, table, key)

    def items(self, table: str = "default", prefix: Key | None = None) -> Iterator[tuple[Key, Any]]:
        """``(key, value)`` pairs of ``table`` in key order (bytes keys first, then str).

        The pairs are taken at the call, so later commits do not show up
        mid-iteration; values are decoded as they are yielded.

        :raises UnknownTableError: ``table`` was never written nor declared (``tables=``),
            at the call.
        :raises CorruptionError: a stored value does not decode (as :meth:`get`).
        """
        with self._view:
            if table not in self._known_tables:
                self._check_table(table)
            pairs = list(self._state.items(table, prefix))
        return self._decoded(table, pairs)

    def _decoded(self, table: str, pairs: list[tuple[Key, bytes]]) -> Iterator[tuple[Key, Any]]:
        for k, raw in pairs:
            yield k, read_value(raw, self.path, table, k)

    def count(self, table: str = "default") -> int:
        """Number of live keys in ``table``.

        :raises UnknownTableError: ``table`` was never written nor declared (``tables=``).
        """
        with self._view:
            if table not in self._known_tables:
                self._check_table(table)
            return self._state.count(table)

    def tables(self) -> list[str]:
        """Names of the tables that were ever written or are declared (``tables=``), sorted."""
        with self._view:
            return sorted({*self._state.tables(), *self._options.tables})

    def has_table(self, table: str) -> bool:
        """Whether ``table`` may be read: it was written, is declared, or is ``"default"``."""
        with self._view:
            if table in self._known_tables:
                return True
            if table in self._state.tables():
                self._known_tables.add(table)  # stays readable (empty at worst): a set lookup next
                return True
            return False

    def _check_table(self, table: str) -> None:
        """Remember ``table`` as known once it exists; the caller holds the view lock.

        :raises UnknownTableError: it does not: the message lists the tables there are.
        """
        names = self._state.tables()
        if table in names:
            self._known_tables.add(table)
            return
        known = sorted({*names, *self._known_tables})
        close = difflib.get_close_matches(str(table), known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UnknownTableError(
            f"table {table!r} does not exist in {self.path} (tables: {', '.join(known)})",
            hint=hint + "declare the tables the code reads before it first writes them: "
            "statelog.open(path, tables=(...))",
        )

    def changes(
        self, since: int = 0, *, follow: bool = False, poll: timedelta | float = 0.5
    ) -> Generator[Change, None, None]:
        """Every committed epoch after ``since``, in order, read back from the retained log.

        Each :class:`~statelog.log.changes.Change` holds the epoch, the offsets
        it advanced, its watermark and per table the keys put (values decoded)
        and deleted; every record is verified as recovery verifies it. A
        writer's feed yields only durable epochs (``durable_epoch``); a
        read-only store's yields what the files hold, commits made after it
        was opened included. With ``follow`` the feed waits ``poll`` at the
        end of the log for more, until the store is closed or the caller stops
        iterating. A view of the past (``at=``) yields epochs up to its own only.
        Close the iterator (or read it to its end) to release the pin it holds on
        the segment it reads.

        :raises InvalidOptionError: ``since`` is not an int >= 0, or ``poll`` is not positive.
        :raises ChangesUnavailableError: compaction folded epoch ``since + 1`` into a
            snapshot and retention deleted its log; the error names the oldest epoch left.
        :raises CorruptionError: damage in the log; the changes before it were yielded.
        :raises StorageError: an I/O error.
        """
        seconds = poll.total_seconds() if isinstance(poll, timedelta) else poll
        upto = None if self._writer is None else (lambda: self.durable_epoch)
        held = self._ro.upto if self._ro is not None else None
        if held is not None:  # a view of the past (or a pending rewind): nothing after it
            upto = lambda: held  # noqa: E731
        return read_changes(
            self.path, since, files=self._options.file_layer, follow=follow, poll=seconds,
            upto=upto, stop=lambda: self._closed,
        )  # fmt: skip
