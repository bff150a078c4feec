"""The embedded default target: an idempotent upsert into a SQLite table.

The database runs in WAL mode with ``synchronous=FULL``, so a sink write is
durable when it returns: statelog records the applied marks only after
that, and a power loss can never leave marks for rows the file lost.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

from statelog.errors import SinkError
from statelog.sinks.base import EncodedOutput, Row, TransactionalSink, decode_payload

__all__ = ["SQLiteSink"]

_COLUMNS = ("id", "version", "epoch", "payload")


class SQLiteSink(TransactionalSink):
    """Outputs upserted into ``table`` of the SQLite database at ``path``.

    The table (created if absent) has columns ``id TEXT PRIMARY KEY``,
    ``version INTEGER``, ``epoch INTEGER`` and ``payload TEXT`` (canonical
    JSON, keys sorted). Use the sink from the thread that opened it.
    """

    def __init__(
        self,
        path: str | Path,
        table: str = "outputs",
        *,
        name: str | None = None,
        busy_timeout: timedelta = timedelta(seconds=5),
    ) -> None:
        """Open (creating if needed) the database and the table.

        :param name: the sink's name in the store's marks (default: ``table``).
        :param busy_timeout: how long a write waits for another connection's lock.
        :raises InvalidOutputError: ``table`` or ``name`` is not a plain identifier.
        :raises SinkError: the file cannot be opened, or ``table`` exists with
            other columns.
        """
        super().__init__(table, name)
        self.path = Path(path)
        if not isinstance(busy_timeout, timedelta) or busy_timeout < timedelta(0):
            raise SinkError(f"busy_timeout={busy_timeout!r}", hint="a timedelta >= 0")
        self._q = f'"{self.table}"'
        try:
            # isolation_level=None: this class issues BEGIN/COMMIT itself, so the
            # transaction boundary is exactly the one write() documents.
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, timeout=busy_timeout.total_seconds()
            )
        except sqlite3.Error as exc:
            raise SinkError(
                f"cannot open SQLite database {self.path}: {exc}", hint=self._failure_hint()
            ) from exc
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self._q} (id TEXT PRIMARY KEY NOT NULL, "
                "version INTEGER NOT NULL, epoch INTEGER NOT NULL, payload TEXT NOT NULL)"
            )
            cols = tuple(r[1] for r in self._conn.execute(f"PRAGMA table_info({self._q})"))
        except sqlite3.Error as exc:
            self._conn.close()
            raise SinkError(
                f"cannot prepare table {self.table!r} in {self.path}: {exc}",
                hint=self._failure_hint(),
            ) from exc
        if cols != _COLUMNS:
            self._conn.close()
            raise SinkError(
                f"table {self.table!r} in {self.path} has columns {cols}, not {_COLUMNS}",
                hint="name a table the sink owns (it creates it), or drop the foreign one",
            )
        self._upsert_sql = (
            f"INSERT INTO {self._q} (id, version, epoch, payload) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET version = excluded.version, "
            "epoch = excluded.epoch, payload = excluded.payload "
            f"WHERE excluded.version > {self._q}.version"
        )

    def _begin(self) -> None:
        # IMMEDIATE takes the write lock now, so a busy database fails here,
        # before any row is sent, rather than at COMMIT.
        self._conn.execute("BEGIN IMMEDIATE")

    def _upsert(self, outputs: list[EncodedOutput], epoch: int) -> int:
        before = self._conn.total_changes
        self._conn.executemany(
            self._upsert_sql, [(o.id, o.version, epoch, o.payload) for o in outputs]
        )
        # total_changes counts inserted and updated rows only: an upsert whose
        # WHERE refused the update (same or lower version) adds nothing.
        return self._conn.total_changes - before

    def _commit(self) -> None:
        self._conn.execute("COMMIT")

    def _rollback(self) -> None:
        if not self._closed and self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _target_errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def _failure_hint(self) -> str:
        return (
            "check the SQLite file (path, permissions, free space, another writer holding "
            "it); the statelog commit was not made, so retrying the same commit is safe"
        )

    def _read(self, sql: str, *args: object) -> list[tuple[str, int, int, str]]:
        if self._closed:
            raise SinkError(f"sink {self.name!r} is closed", hint="open a new sink")
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise SinkError(f"reading {self.path}: {exc}", hint=self._failure_hint()) from exc

    def rows(self) -> list[Row]:
        """Every row of the table, in id order (byte order of UTF-8, as SQLite sorts)."""
        got = self._read(f"SELECT id, version, epoch, payload FROM {self._q} ORDER BY id")
        return [Row(i, v, e, decode_payload(p)) for i, v, e, p in got]

    def get(self, output_id: str) -> Row | None:
        """The row of ``output_id``, or None."""
        got = self._read(
            f"SELECT id, version, epoch, payload FROM {self._q} WHERE id = ?", output_id
        )
        return Row(got[0][0], got[0][1], got[0][2], decode_payload(got[0][3])) if got else None

    def close(self) -> None:
        """Close the connection (an open transaction is rolled back); idempotent."""
        if not self._closed:
            self._closed = True
            self._conn.close()

    def __repr__(self) -> str:
        return f"SQLiteSink({str(self.path)!r}, table={self.table!r})"
