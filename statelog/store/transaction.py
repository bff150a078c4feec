"""Multi-table commits: ``with store.transaction() as tx: ...``.

A transaction gathers puts and deletes over any number of tables, offset
advances and a watermark, and commits them as one record (one epoch) when
the ``with`` block exits cleanly. On an exception nothing is written.

Each value is encoded when it is put, so a bad value fails at ``put`` (not
at the end of the block) and later mutation of the caller's object does not
change what is committed. Within one transaction the last operation on a
key wins.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from statelog.errors import InvalidCommitError
from statelog.format.records import CommitRecord, TableDelta, encode_record, encode_value
from statelog.format.values import VALUE_TYPES
from statelog.state.live import Key
from statelog.store.validate import (
    ENCODE_ERRORS,
    check_key,
    check_offsets,
    check_table_name,
    check_watermark,
)

if TYPE_CHECKING:
    from statelog.store.store import StateStore

__all__ = ["Transaction"]

_DELETED = object()


class Transaction:
    """Pending changes of one multi-table commit. Obtain from :meth:`StateStore.transaction`."""

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._tables: dict[str, dict[Key, Any]] = {}
        self.offsets: dict[str, int] = {}
        """Offset advances to commit (partition -> offset); others keep their value."""
        self.low_watermark_ms: int | None = None
        """The watermark to commit; None keeps the current one."""
        self.epoch: int | None = None
        """The committed epoch, once the block has exited cleanly."""
        self._done = False

    def _table(self, table: str) -> dict[Key, Any]:
        t = self._tables.get(table) if type(table) is str else None
        if t is None:
            name = check_table_name(table)  # before hashing it: a list is no table name
            t = self._tables.get(name)
            if t is None:
                t = self._tables[name] = {}
        return t

    def put(self, key: Key, value: Any, *, table: str = "default") -> None:
        """Stage ``key = value`` in ``table``.

        :raises InvalidCommitError: bad key or unencodable value (the
            transaction stays usable; nothing was staged).
        """
        self._check_open()
        t = self._table(table)
        k = check_key(key, table)
        try:
            t[k] = encode_value(value)
        except ENCODE_ERRORS as exc:
            raise InvalidCommitError(
                f"value of key {key!r} in table {table!r} cannot be stored: {exc}",
                hint=f"store only {VALUE_TYPES} (tuples come back as lists)",
            ) from exc

    def delete(self, key: Key, *, table: str = "default") -> None:
        """Stage the deletion of ``key`` from ``table`` (absent keys are fine)."""
        self._check_open()
        t = self._table(table)
        t[check_key(key, table)] = _DELETED

    def set_offset(self, partition: str, offset: int) -> None:
        """Stage an offset advance.

        :raises InvalidCommitError: a bad partition or offset, or an offset
            below the committed one (checked now, and again at commit).
        """
        self._check_open()
        checked = check_offsets({partition: offset}, self._store.offsets)
        self.offsets.update(checked)

    def _check_open(self) -> None:
        if self._done:
            raise InvalidCommitError(
                "the transaction has already ended", hint="start a new store.transaction()"
            )

    def prepare(self) -> int:
        """Check everything :meth:`commit` checks, without writing; returns the record's size.

        For callers that must know a commit will be accepted before doing
        something they cannot undo (an idempotent sink writes its outputs
        first). It checks the offsets and the watermark against the store's
        current state, and encodes the record to check it against
        ``max_record_bytes``; a later ``commit`` encodes it again.

        :raises InvalidCommitError: the commit would be refused; nothing was written.
        """
        self._check_open()
        store = self._store
        offsets = check_offsets(self.offsets, store.offsets)
        wm = store.low_watermark_ms if self.low_watermark_ms is None else self.low_watermark_ms
        wm = check_watermark(wm, store.low_watermark_ms)
        now_ms = time.time_ns() // 1_000_000  # its encoded size is the commit's
        record = CommitRecord(store.epoch + 1, offsets, wm, self._deltas(), now_ms)
        try:
            size = len(encode_record(record))
        except ENCODE_ERRORS as exc:
            raise InvalidCommitError(f"the commit cannot be encoded: {exc}") from exc
        limit = store.options.max_record_bytes
        if size > limit:
            raise InvalidCommitError(
                f"commit record is {size} bytes, over max_record_bytes={limit}",
                hint="split the commit into smaller ones or raise max_record_bytes",
            )
        return size

    def commit(self) -> int:
        """Commit now (the ``with`` block does this on a clean exit); returns the epoch."""
        self._check_open()
        deltas = self._deltas()
        self.epoch = self._store._commit_transaction(self.offsets, self.low_watermark_ms, deltas)
        self._done = True
        return self.epoch

    def _deltas(self) -> list[TableDelta]:
        deltas = []
        for name, staged in self._tables.items():
            keys = [k for k, v in staged.items() if v is not _DELETED]
            values = [staged[k] for k in keys]
            deletes = [k for k, v in staged.items() if v is _DELETED]
            deltas.append(TableDelta(name, keys, values, deletes))
        return deltas

    def discard(self) -> None:
        """Drop every staged change."""
        self._done = True
        self._tables.clear()

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None:
            self.discard()
        elif not self._done:
            self.commit()
