"""The server target: an idempotent upsert into a PostgreSQL table through psycopg.

A batch is one statement (``INSERT ... SELECT FROM unnest(...) ON CONFLICT
(id) DO UPDATE ... WHERE excluded.version > t.version``) inside an explicit
transaction, so the row count the server reports is exactly the rows that
changed, and a batch costs one round trip whatever its size.

A lost connection is reopened on the next write. If it was lost during
COMMIT, the outcome on the server is unknown; retrying the same statelog
commit is still exact, because the upsert of an applied batch changes
nothing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from statelog.errors import SinkError
from statelog.sinks.base import EncodedOutput, Row, TransactionalSink, log

try:
    import psycopg
except ImportError:  # pragma: no cover - psycopg is the "postgres" extra
    psycopg = None  # type: ignore[assignment]

__all__ = ["PostgresSink"]

_COLUMNS = ("id", "version", "epoch", "payload")


class PostgresSink(TransactionalSink):
    """Outputs upserted into ``table`` of the PostgreSQL database named by ``dsn``.

    The table (created if absent, in the connection's current schema) has
    columns ``id text PRIMARY KEY``, ``version bigint``, ``epoch bigint`` and
    ``payload jsonb``. Use the sink from the thread that opened it.
    """

    def __init__(
        self,
        dsn: str,
        table: str = "outputs",
        *,
        name: str | None = None,
        connect_timeout: timedelta = timedelta(seconds=10),
    ) -> None:
        """Connect, and create the table if it does not exist.

        :param dsn: a libpq connection string or URI (``postgresql://...``).
        :param name: the sink's name in the store's marks (default: ``table``).
        :raises InvalidOutputError: ``table`` or ``name`` is not a plain identifier.
        :raises SinkError: psycopg is missing, the server cannot be reached, or
            ``table`` exists with other columns.
        """
        super().__init__(table, name)
        if psycopg is None:  # pragma: no cover
            raise SinkError("PostgresSink needs psycopg", hint="pip install 'statelog[postgres]'")
        if not isinstance(dsn, str):
            raise SinkError(f"dsn must be a str, not {type(dsn).__name__}")
        if not isinstance(connect_timeout, timedelta) or connect_timeout <= timedelta(0):
            raise SinkError(f"connect_timeout={connect_timeout!r}", hint="a positive timedelta")
        self._dsn = dsn
        self._timeout = max(1, round(connect_timeout.total_seconds()))
        self._q = f'"{self.table}"'
        self._conn: Any = self._connect()
        try:
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self._q} (id text PRIMARY KEY, "
                "version bigint NOT NULL, epoch bigint NOT NULL, payload jsonb NOT NULL)"
            )
            cols = tuple(
                r[0]
                for r in self._conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = %s "
                    "ORDER BY ordinal_position",
                    (self.table,),
                )
            )
        except psycopg.Error as exc:
            self.close()
            raise SinkError(
                f"cannot prepare table {self.table!r}: {exc}", hint=self._failure_hint()
            ) from exc
        if cols != _COLUMNS:
            self.close()
            raise SinkError(
                f"table {self.table!r} has columns {cols}, not {_COLUMNS}",
                hint="name a table the sink owns (it creates it), or drop the foreign one",
            )
        self._upsert_sql = (
            f"INSERT INTO {self._q} AS t (id, version, epoch, payload) "
            "SELECT u.id, u.version, %s, u.payload::jsonb "
            "FROM unnest(%s::text[], %s::bigint[], %s::text[]) AS u(id, version, payload) "
            "ON CONFLICT (id) DO UPDATE SET version = excluded.version, "
            "epoch = excluded.epoch, payload = excluded.payload "
            "WHERE excluded.version > t.version"
        )

    def _connect(self) -> Any:
        try:
            # autocommit: this class issues BEGIN/COMMIT itself, and reads do
            # not leave an idle transaction open on the server.
            return psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._timeout)
        except psycopg.Error as exc:
            raise SinkError(
                f"cannot connect to PostgreSQL for sink {self.name!r}: {exc}",
                hint=self._failure_hint(),
            ) from exc

    def _live(self) -> Any:
        if self._closed:
            raise SinkError(f"sink {self.name!r} is closed", hint="open a new sink")
        if self._conn.closed or self._conn.broken:
            log.warning("sink reconnecting sink=%s", self.name)
            self._conn = self._connect()
        return self._conn

    def _begin(self) -> None:
        self._live().execute("BEGIN")

    def _upsert(self, outputs: list[EncodedOutput], epoch: int) -> int:
        cur = self._conn.execute(
            self._upsert_sql,
            (
                epoch,
                [o.id for o in outputs],
                [o.version for o in outputs],
                [o.payload for o in outputs],
            ),
        )
        # The server counts inserted and updated rows only; a row whose
        # version did not grow is skipped by the WHERE and not counted.
        return int(cur.rowcount)

    def _commit(self) -> None:
        self._conn.execute("COMMIT")

    def _rollback(self) -> None:
        conn = self._conn
        if conn.closed or conn.broken:
            return  # the server rolls back a transaction whose session ended
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")

    def _target_errors(self) -> tuple[type[BaseException], ...]:
        return (psycopg.Error,)

    def _failure_hint(self) -> str:
        return (
            "check the PostgreSQL server (the DSN, that it is up and reachable, the role's "
            "rights on the table); the statelog commit was not made, so retrying the same "
            "commit is safe"
        )

    def _read(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        try:
            return list(self._live().execute(sql, args).fetchall())
        except psycopg.Error as exc:
            raise SinkError(
                f"reading sink {self.name!r}: {exc}", hint=self._failure_hint()
            ) from exc

    def rows(self) -> list[Row]:
        """Every row of the table, in id order (byte order, as SQLite sorts)."""
        got = self._read(
            f'SELECT id, version, epoch, payload FROM {self._q} ORDER BY id COLLATE "C"'
        )
        return [Row(i, v, e, p) for i, v, e, p in got]

    def get(self, output_id: str) -> Row | None:
        """The row of ``output_id``, or None."""
        got = self._read(
            f"SELECT id, version, epoch, payload FROM {self._q} WHERE id = %s", output_id
        )
        return Row(*got[0]) if got else None

    def close(self) -> None:
        """Close the connection (an open transaction is rolled back by the server)."""
        if not self._closed:
            self._closed = True
            self._conn.close()

    def __repr__(self) -> str:
        return f"PostgresSink(table={self.table!r}, name={self.name!r})"
