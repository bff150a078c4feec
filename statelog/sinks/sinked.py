"""A store tied to a sink: outputs, state, offsets and applied marks move together.

The order of one commit, and what a crash at each point leaves:

1. the caller computes its outputs and state changes from its input;
   everything is checked here (outputs, keys, values, offsets, watermark);
   a refusal writes nothing anywhere;
2. the outputs are upserted into the sink in one target transaction, each
   row marked with the epoch about to be committed;
3. the state, the offsets, the watermark and the applied marks (output id
   -> version, in the store table ``__sink__:<sink name>``) are committed to
   statelog as one record.

A crash before 2 commits nothing anywhere: redo. A crash between 2 and 3
leaves rows in the target and nothing in statelog: recovery returns the
previous epoch and offsets, the caller recomputes the same outputs, and the
upsert of the same ``(id, version)`` changes no row. A walk-back to an older
epoch is the same case over several commits. Nothing is lost (step 3 only
happens after 2 is durable) and nothing is doubled (the upsert is a no-op
for what was applied).
"""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statelog.errors import InvalidCommitError
from statelog.format.limits import MAX_TABLE_NAME_BYTES, table_name_problem
from statelog.sinks.base import Output, Sink, check_outputs
from statelog.store.validate import check_key, check_watermark, table_delta

if TYPE_CHECKING:
    from statelog.format.records import Key
    from statelog.store.store import StateStore
    from statelog.store.transaction import Transaction

__all__ = ["MARKS_PREFIX", "MAX_SINK_NAME_BYTES", "SinkCommit", "SinkTransaction", "SinkedStore"]

log = logging.getLogger("statelog.sinks")

MARKS_PREFIX = "__sink__"
"""Store tables named ``__sink__:<sink name>`` hold applied marks; user tables may not use it."""

MAX_SINK_NAME_BYTES = MAX_TABLE_NAME_BYTES - len(MARKS_PREFIX) - 1
"""Longest sink name, in UTF-8 bytes: its marks table stays within the table name limit."""

_EMPTY: Mapping[Any, Any] = types.MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SinkCommit:
    """What one sinked commit did."""

    epoch: int
    """The statelog epoch committed (also the ``epoch`` of every row written)."""
    outputs: int
    """Outputs sent to the sink."""
    rows: int
    """Rows the sink inserted or moved to a higher version: 0 when replaying applied work."""


class SinkedStore:
    """Commits to ``store`` that also write outputs to ``sink``, exactly once in effect.

    Commit through this object only while it is in use: it relies on the
    next epoch being ``store.epoch + 1`` when it marks the rows. It does not
    own the store or the sink; close them yourself.
    """

    def __init__(self, store: StateStore, sink: Sink) -> None:
        """Tie ``sink`` to ``store``; logs how far the sink is ahead (replay to come).

        :raises InvalidCommitError: ``sink`` is not a :class:`Sink`, or its name
            makes a marks table ``__sink__:<name>`` that breaks the table name
            limits (``statelog.format.limits``: at most
            :data:`MAX_SINK_NAME_BYTES` bytes of name).
        :raises SinkError: the sink's target cannot be read.
        """
        if not isinstance(sink, Sink):
            raise InvalidCommitError(f"{sink!r} does not implement statelog.sinks.Sink")
        self.store = store
        self.sink = sink
        self.marks_table = _marks_table(sink.name)
        self._lock = threading.Lock()
        ahead = sink.high_epoch() - store.epoch
        if ahead > 0:
            # Expected after a crash between the sink write and the commit, or
            # after a walk-back: the next commits replay into the sink as no-ops.
            log.info(
                "sink ahead of store sink=%s store_epoch=%d sink_epoch=%d ahead=%d",
                sink.name,
                store.epoch,
                store.epoch + ahead,
                ahead,
            )

    def applied(self, output_id: str) -> int | None:
        """The highest version of ``output_id`` committed as applied, or None.

        Marks move with the state: after a walk-back they are those of the
        recovered epoch, even though the sink may hold later rows.
        """
        store = self.store
        if not store.has_table(self.marks_table):  # nothing applied through this sink yet
            return None
        mark = store.get(output_id, table=self.marks_table)
        return mark if isinstance(mark, int) else None

    def commit(
        self,
        *,
        outputs: Sequence[Output] = (),
        offsets: Mapping[str, int],
        low_watermark_ms: int,
        put: Mapping[Any, Any] = _EMPTY,
        delete: Iterable[Key] = (),
        table: str = "default",
    ) -> SinkCommit:
        """Write ``outputs`` to the sink, then commit them as applied with the state.

        Order: (1) every argument is checked; (2) the sink upserts the
        outputs in one target transaction, durable on return; (3) one
        statelog commit holds ``put``/``delete`` on ``table``, the offsets,
        the watermark and the marks. See the module docstring for what a crash
        at each point leaves.

        :raises InvalidOutputError: a bad output; nothing was written anywhere.
        :raises InvalidCommitError: bad state input, or a reserved table; nothing
            was written anywhere.
        :raises SinkError: the target failed; the store was not committed, and
            retrying the same commit is safe.
        :raises StorageError: the store's append failed after the sink write;
            the next attempt replays the outputs as no-ops.
        """
        if isinstance(outputs, str | bytes | Output) or not isinstance(outputs, Sequence):
            check_outputs(outputs)  # raises; each output is checked at commit, once
        # table_delta refuses exactly what store.commit refuses, before anything is staged.
        delta = table_delta(_user_table(table), put, delete)
        if not isinstance(offsets, Mapping):
            raise InvalidCommitError(
                f"offsets= must be a mapping of partition to offset, not {type(offsets).__name__}"
            )
        with self.transaction() as tx:
            for k, v in zip(delta.keys, put.values(), strict=True):
                tx.put(k, v, table=table)
            for k in delta.deletes:
                tx.delete(k, table=table)
            for partition, offset in offsets.items():
                tx.set_offset(partition, offset)
            tx.low_watermark_ms = low_watermark_ms
            tx.emit(*outputs)
        assert tx.result is not None
        return tx.result

    def transaction(self) -> SinkTransaction:
        """A multi-table sinked commit: ``with sinked.transaction() as tx: tx.emit(...)``.

        Commits (sink write, then the statelog commit) on a clean exit of
        the ``with`` block; writes nothing anywhere on an exception.
        """
        return SinkTransaction(self, self.store.transaction())


class SinkTransaction:
    """Staged state changes and outputs of one sinked commit (:meth:`SinkedStore.transaction`)."""

    def __init__(self, owner: SinkedStore, tx: Transaction) -> None:
        self._owner = owner
        self._tx = tx
        self._outputs: list[Output] = []
        self.low_watermark_ms: int | None = None
        """The watermark to commit; None keeps the current one."""
        self.result: SinkCommit | None = None
        """What the commit did, once the block has exited cleanly."""

    def put(self, key: Key, value: Any, *, table: str = "default") -> None:
        """Stage ``key = value`` in ``table``.

        :raises InvalidCommitError: bad key or value, or a reserved table name.
        """
        self._tx.put(key, value, table=_user_table(table))

    def delete(self, key: Key, *, table: str = "default") -> None:
        """Stage the deletion of ``key`` from ``table``."""
        self._tx.delete(key, table=_user_table(table))

    def set_offset(self, partition: str, offset: int) -> None:
        """Stage an offset advance (checked now and at commit)."""
        self._tx.set_offset(partition, offset)

    def emit(self, *outputs: Output) -> None:
        """Stage outputs for the sink (checked as a batch at commit, before any write)."""
        self._outputs.extend(outputs)

    def forget(self, output_id: str) -> None:
        """Drop the applied mark of ``output_id`` in this commit (bounds the marks table).

        The sink's row stays; only ``applied()`` stops knowing it.
        """
        self._tx.delete(
            check_key(output_id, self._owner.marks_table), table=self._owner.marks_table
        )

    def commit(self) -> SinkCommit:
        """Check everything, write the sink, commit the store (see :meth:`SinkedStore.commit`)."""
        owner = self._owner
        store = owner.store
        with owner._lock:
            encoded = check_outputs(self._outputs)
            wm = self.low_watermark_ms
            if wm is not None:
                check_watermark(wm, store.low_watermark_ms)
                self._tx.low_watermark_ms = wm
            for o in encoded:
                prev = owner.applied(o.id)
                self._tx.put(
                    o.id,
                    o.version if prev is None else max(prev, o.version),
                    table=owner.marks_table,
                )
            # Everything the store would refuse is refused before the sink
            # writes: rows without their commit would only be undone by a replay.
            self._tx.prepare()
            epoch = store.epoch + 1
            rows = owner.sink.write(self._outputs, epoch)
            got = self._tx.commit()
            if got != epoch:
                log.error(
                    "sink rows carry the wrong epoch sink=%s marked=%d committed=%d",
                    owner.sink.name,
                    epoch,
                    got,
                )
        log.debug(
            "sinked commit sink=%s epoch=%d outputs=%d rows=%d",
            owner.sink.name,
            got,
            len(encoded),
            rows,
        )
        self.result = SinkCommit(got, len(encoded), rows)
        return self.result

    def discard(self) -> None:
        """Drop every staged change and output."""
        self._tx.discard()
        self._outputs.clear()

    def __enter__(self) -> SinkTransaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None:
            self.discard()
        elif self.result is None:
            try:
                self.commit()
            except BaseException:
                self._tx.discard()
                raise


def _marks_table(name: Any) -> str:
    """``__sink__:<name>``, checked: the marks table is a table like any other."""
    why = "a sink name must be a str" if not isinstance(name, str) else None
    table = f"{MARKS_PREFIX}:{name}"
    why = why or table_name_problem(table)
    if why is not None:
        raise InvalidCommitError(
            f"sink name {name!r:.80} cannot name its marks table: {why}",
            hint=f"name the sink with a non-empty str of at most {MAX_SINK_NAME_BYTES} bytes "
            "in UTF-8, without NUL",
        )
    return table


def _user_table(table: str) -> str:
    if isinstance(table, str) and table.startswith(MARKS_PREFIX):
        raise InvalidCommitError(
            f"table {table!r} is reserved for sink marks",
            hint=f"name state tables without the {MARKS_PREFIX!r} prefix",
        )
    return table
