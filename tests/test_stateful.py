"""A Hypothesis state machine drives one store against a dict model.

Rules: single-table commits and multi-table transactions (some raising inside
the block, so discarded) with str and bytes keys, advancing offsets and
watermark; clean reopen; crash (the store abandoned without ``close``: its
lock released and its segment fd closed, as a dead process leaves them);
crash followed by a torn tail (zeros or garbage appended to the last
segment, or the last record cut short); invalid commits that must raise
:class:`statelog.InvalidCommitError` and change nothing, on disk included;
and read-only opens beside the writer.

The model keeps the state after every epoch, so a torn tail that drops the
last commit is checked against the model one epoch back. After every step
the store's epoch, offsets, watermark and every table (contents and key
order) must equal the model's.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import statelog
from statelog import Outcome
from tests.helpers import frames, segments, snapshot_of

Key = str | bytes

OPTIONS: dict[str, Any] = {
    "durability": "commit",
    "segment_bytes": 4096,  # the smallest allowed: segments roll every few commits
    "fragment_bytes": 256,  # values above this are split into several frames
    "tables": ("orders", "payments"),  # read before they are first written
}
TABLE_NAMES = ("default", "orders", "payments")
PARTITION_NAMES = ("p0", "p1", "p2")

keys = st.one_of(
    st.text(alphabet="abé☃", max_size=3),
    st.binary(max_size=2),
)
tables = st.sampled_from(TABLE_NAMES)
partitions = st.sampled_from(PARTITION_NAMES)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.binary(max_size=12),
)
small_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
big_values = st.one_of(
    st.binary(min_size=300, max_size=3000),  # fragmented, and fills segments fast
    st.integers(300, 3000).map(lambda n: {"pad": "p" * n}),
)
values = st.one_of(small_values, small_values, small_values, big_values)


_NO_KEY = object()


class Boom(Exception):
    """Raised inside a transaction block to discard it."""


@dataclass
class State:
    """The model at one epoch."""

    offsets: dict[str, int] = field(default_factory=dict)
    low_watermark_ms: int = 0
    tables: dict[str, dict[Key, Any]] = field(default_factory=dict)

    def next(self) -> State:
        """A copy to fold the next commit into (values are never mutated in place)."""
        return State(
            dict(self.offsets),
            self.low_watermark_ms,
            {t: dict(kv) for t, kv in self.tables.items()},
        )

    def snapshot(self) -> dict[str, Any]:
        return {
            "offsets": dict(self.offsets),
            "low_watermark_ms": self.low_watermark_ms,
            "tables": {t: dict(kv) for t, kv in self.tables.items() if kv},
        }


def key_order(kv: dict[Key, Any]) -> list[Key]:
    """The documented key order: bytes keys first, then str keys, each bytewise."""
    return sorted((k for k in kv if isinstance(k, bytes)), key=bytes) + sorted(
        (k for k in kv if isinstance(k, str)), key=lambda s: s.encode("utf-8")
    )


def wal_files(path: Path) -> dict[str, bytes]:
    """Every file of the store's ``wal/`` directory with its bytes."""
    return {p.name: p.read_bytes() for p in sorted((path / "wal").iterdir())}


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="statelog-stateful-"))
        self.path = self.dir / "store"
        self.store = statelog.open(self.path, **OPTIONS)
        self.history: list[State] = [State()]  # index = epoch
        self.since_open = 0  # commits since the store was last opened

    # -- model helpers -------------------------------------------------------
    @property
    def model(self) -> State:
        return self.history[-1]

    @property
    def epoch(self) -> int:
        return len(self.history) - 1

    def draw_offsets(self, data: st.DataObject) -> dict[str, int]:
        advances = data.draw(st.dictionaries(partitions, st.integers(0, 5), max_size=3))
        return {p: self.model.offsets.get(p, 0) + d for p, d in advances.items()}

    def draw_watermark(self, data: st.DataObject) -> int:
        return self.model.low_watermark_ms + data.draw(st.integers(0, 50))

    def expect_unchanged(self, attempt: Callable[[], object]) -> None:
        """``attempt`` must raise InvalidCommitError and change nothing, in memory or on disk."""
        before_disk = wal_files(self.path)
        before = snapshot_of(self.store)
        tables_before = self.store.tables()
        with pytest.raises(statelog.InvalidCommitError):
            attempt()
        assert self.store.epoch == self.epoch
        assert snapshot_of(self.store) == before
        assert self.store.tables() == tables_before
        assert wal_files(self.path) == before_disk, "a refused commit changed the log"

    def reopen_after(self, *, clean: bool) -> statelog.StateStore:
        """Abandon (crash) or close the store and open it again; returns the new store."""
        tables_before = self.store.tables()
        if clean:
            self.store.close()
            self.since_open = 0
        else:
            self.abandon()
        self.store = statelog.open(self.path, **OPTIONS)
        assert self.store.tables() == tables_before  # replay rebuilds exactly the live view
        return self.store

    def abandon(self) -> None:
        """Leave the store as a killed process would: no seal, no flush, lock and fd gone.

        A dead process has no threads either: the background snapshot watcher
        (it only reads and never writes the log) is stopped so abandoned
        stores do not pile up threads over thousands of steps.
        """
        store = self.store
        writer = store._writer
        assert writer is not None
        if writer.watcher is not None:
            writer.watcher.stop()
        writer.file_lock.release()
        writer.wal.close()
        self.since_open = 0

    def check_recovered(self, outcome: Outcome, *, truncated: int = 0) -> None:
        rep = self.store.recovery
        assert rep.outcome is outcome, rep
        assert rep.epoch == self.epoch == self.store.epoch, (rep.epoch, self.epoch)
        assert rep.replayed == self.epoch  # no snapshots yet: the whole log is replayed
        assert rep.truncated_bytes == truncated, rep
        assert not rep.lost_epochs, rep

    # -- rules ---------------------------------------------------------------
    @rule(data=st.data(), table=tables)
    def commit(self, data: st.DataObject, table: str) -> None:
        self.one_commit(data, table)

    @rule(data=st.data(), n=st.integers(2, 8))
    def commit_burst(self, data: st.DataObject, n: int) -> None:
        """Several commits in a row, so the log grows and segments roll between reopens."""
        for _ in range(n):
            self.one_commit(data, data.draw(tables))

    def one_commit(self, data: st.DataObject, table: str) -> None:
        put = data.draw(st.dictionaries(keys, values, max_size=4))
        delete = data.draw(st.lists(keys.filter(lambda k: k not in put), max_size=3))
        offsets = self.draw_offsets(data)
        wm = self.draw_watermark(data)
        epoch = self.store.commit(
            offsets=offsets, low_watermark_ms=wm, put=put, delete=delete, table=table
        )
        assert epoch == self.epoch + 1
        nxt = self.model.next()
        t = nxt.tables.setdefault(table, {})
        for k in delete:
            t.pop(k, None)
        t.update(put)
        nxt.offsets.update(offsets)
        nxt.low_watermark_ms = wm
        self.history.append(nxt)
        self.since_open += 1

    @rule(data=st.data(), raise_inside=st.booleans())
    def transaction(self, data: st.DataObject, raise_inside: bool) -> None:
        ops = data.draw(
            st.lists(
                st.tuples(tables, keys, st.one_of(st.none(), values)),  # None value: delete
                max_size=8,
            )
        )
        offsets = self.draw_offsets(data)
        wm = data.draw(st.one_of(st.none(), st.just(self.draw_watermark(data))))
        before_disk = wal_files(self.path)

        def body() -> int | None:
            with self.store.transaction() as tx:
                for table, key, value in ops:
                    if value is None:
                        tx.delete(key, table=table)
                    else:
                        tx.put(key, value, table=table)
                for p, off in offsets.items():
                    tx.set_offset(p, off)
                if wm is not None:
                    tx.low_watermark_ms = wm
                if raise_inside:
                    raise Boom
            return tx.epoch

        if raise_inside:
            with pytest.raises(Boom):
                body()
            assert self.store.epoch == self.epoch
            assert wal_files(self.path) == before_disk, "a discarded transaction was written"
            return
        assert body() == self.epoch + 1
        nxt = self.model.next()
        for table, key, value in ops:
            t = nxt.tables.setdefault(table, {})
            if value is None:
                t.pop(key, None)
            else:
                t[key] = value
        nxt.offsets.update(offsets)
        if wm is not None:
            nxt.low_watermark_ms = wm
        self.history.append(nxt)
        self.since_open += 1

    @precondition(lambda self: self.since_open > 0)
    @rule()
    def reopen(self) -> None:
        self.reopen_after(clean=True)
        self.check_recovered(Outcome.CLEAN)

    @precondition(lambda self: self.since_open > 0)
    @rule()
    def crash(self) -> None:
        self.reopen_after(clean=False)
        # durability="commit": every commit that returned is on disk, whole.
        self.check_recovered(Outcome.CLEAN)

    @rule(data=st.data(), damage=st.sampled_from(["zeros", "garbage", "truncate"]))
    def torn_tail(self, data: st.DataObject, damage: str) -> None:
        self.abandon()
        last = segments(self.path)[-1]
        size = last.stat().st_size
        kept = last.read_bytes()
        fr = frames(last)
        starts = [f.offset for f in fr if f.ftype in (1, 2)]  # FULL or FIRST: a record begins
        if damage == "truncate" and not starts:
            damage = "zeros"  # the last segment holds no record to cut
        if damage == "truncate":
            record_start = starts[-1]
            assert fr[-1].end == size and fr[-1].ftype in (1, 4), fr[-1]
            cut = data.draw(st.integers(1, size - record_start), label="bytes cut")
            with last.open("r+b") as fh:
                fh.truncate(size - cut)
            self.store = statelog.open(self.path, **OPTIONS)
            self.history.pop()  # the last commit is gone: it was never whole on disk
            if cut == size - record_start:
                self.check_recovered(Outcome.CLEAN)  # cut exactly at a record boundary
            else:
                self.check_recovered(Outcome.TORN_TAIL, truncated=size - cut - record_start)
                saved = [p.read_bytes() for p in self.store.recovery.saved_aside]
                assert saved == [kept[record_start : size - cut]]
            assert last.read_bytes()[:record_start] == kept[:record_start]
            return
        if damage == "zeros":
            tail = bytes(data.draw(st.integers(1, 600), label="zero bytes"))
        else:
            tail = data.draw(st.binary(min_size=1, max_size=600), label="garbage")
        with last.open("ab") as fh:
            fh.write(tail)
        self.store = statelog.open(self.path, **OPTIONS)
        rep = self.store.recovery
        # Nothing whole was damaged: no acknowledged commit may be dropped.
        assert rep.epoch == self.epoch == self.store.epoch, rep
        if damage == "zeros":
            self.check_recovered(Outcome.TORN_TAIL, truncated=len(tail))
        else:
            assert rep.outcome in (Outcome.TORN_TAIL, Outcome.CORRUPTION), rep
        # The damaged bytes were cut from the log and kept aside, exactly.
        assert [p.read_bytes() for p in rep.saved_aside] == [tail], rep
        assert last.read_bytes()[:size] == kept

    @rule(data=st.data())
    def invalid_commit(self, data: st.DataObject) -> None:
        store = self.store
        m = self.model
        put = data.draw(st.dictionaries(keys, small_values, min_size=1, max_size=3))
        wm = self.draw_watermark(data)
        offsets = self.draw_offsets(data)
        table = data.draw(tables)
        advanced = sorted(p for p, o in m.offsets.items() if o > 0)
        kinds = [
            "negative_offset",
            "negative_watermark",
            "bad_put_key",
            "bad_delete_key",
            "unencodable_value",
            "put_and_delete",
            "bad_table",
            "single_key_delete",
            "tx_bad_key",
            "tx_negative_offset",
        ]
        if advanced:
            kinds += ["backwards_offset", "tx_backwards_offset"]
        if m.low_watermark_ms > 0:
            kinds += ["backwards_watermark", "tx_backwards_watermark"]
        kind = data.draw(st.sampled_from(kinds), label="invalid kind")
        bad_key = data.draw(
            st.sampled_from([1, 2.5, None, ("a",), True, frozenset({b"x"})]), label="bad key"
        )

        def plain(**override: Any) -> Callable[[], object]:
            kwargs: dict[str, Any] = {
                "offsets": offsets,
                "low_watermark_ms": wm,
                "put": put,
                "delete": (),
                "table": table,
            }
            kwargs.update(override)
            return lambda: store.commit(**kwargs)

        def tx(
            offset: tuple[str, int] | None = None,
            watermark: int | None = None,
            key: object = _NO_KEY,
        ) -> Callable[[], object]:
            def run() -> None:
                with store.transaction() as t:
                    for k, v in put.items():
                        t.put(k, v, table=table)
                    if key is not _NO_KEY:
                        t.put(key, 1, table=table)  # type: ignore[arg-type]
                    if offset is not None:
                        t.set_offset(*offset)
                    if watermark is not None:
                        t.low_watermark_ms = watermark

            return run

        some_p = data.draw(partitions)
        attempts: dict[str, Callable[[], Callable[[], object]]] = {
            "negative_offset": lambda: plain(offsets={**offsets, some_p: -1}),
            "negative_watermark": lambda: plain(low_watermark_ms=-1 - m.low_watermark_ms),
            "bad_put_key": lambda: plain(put={**put, bad_key: "v"}),
            "bad_delete_key": lambda: plain(delete=[bad_key, bytearray(b"k")][: 1 + (wm % 2)]),
            "unencodable_value": lambda: plain(
                put={**put, "k": data.draw(st.sampled_from([object(), 1 << 70, -(1 << 64), 1j]))}
            ),
            "put_and_delete": lambda: plain(delete=[next(iter(put))]),
            "bad_table": lambda: plain(table=data.draw(st.sampled_from(["", 7, "a\x00b"]))),
            "single_key_delete": lambda: plain(delete="k"),
            # Unhashable keys too: a caller may well hold a bytearray or a list.
            "tx_bad_key": lambda: tx(
                key=data.draw(st.sampled_from([bad_key, bytearray(b"k"), [b"k"]]), label="tx key")
            ),
            "tx_negative_offset": lambda: tx(offset=(some_p, -5)),
            "backwards_offset": lambda: plain(offsets={advanced[0]: m.offsets[advanced[0]] - 1}),
            "tx_backwards_offset": lambda: tx(offset=(advanced[-1], m.offsets[advanced[-1]] - 1)),
            "backwards_watermark": lambda: plain(low_watermark_ms=m.low_watermark_ms - 1),
            "tx_backwards_watermark": lambda: tx(watermark=m.low_watermark_ms - 1),
        }
        self.expect_unchanged(attempts[kind]())

    @rule()
    def readonly_view(self) -> None:
        """A read-only open beside the writer sees the last durable commit, and takes no lock."""
        with statelog.open(self.path, readonly=True) as ro:
            assert ro.epoch == self.epoch
            assert snapshot_of(ro) == self.model.snapshot()
        assert self.store.commit(offsets={}, low_watermark_ms=self.model.low_watermark_ms) == (
            self.epoch + 1
        )  # the writer still holds its lock and still commits
        self.history.append(self.model.next())
        self.since_open += 1

    @rule(table=tables, prefix=keys)
    def read_prefix(self, table: str, prefix: Key) -> None:
        kv = self.model.tables.get(table, {})
        want = [k for k in key_order(kv) if type(k) is type(prefix) and k.startswith(prefix)]  # type: ignore[arg-type]
        got = list(self.store.items(table, prefix=prefix))
        assert [k for k, _ in got] == want
        assert all(v == kv[k] for k, v in got)
        for k in want[:2]:
            assert self.store.get(k, table=table) == kv[k]
        missing = object()
        if prefix not in kv:
            assert self.store.get(prefix, missing, table=table) is missing

    # -- invariants ----------------------------------------------------------
    @invariant()
    def matches_model(self) -> None:
        store = self.store
        assert store.epoch == self.epoch
        assert store.offsets == self.model.offsets
        assert store.low_watermark_ms == self.model.low_watermark_ms
        assert snapshot_of(store) == self.model.snapshot()
        for t, kv in self.model.tables.items():
            got = [k for k, _ in store.items(t)]
            assert got == key_order(kv)
            assert [type(k) for k in got] == [type(k) for k in key_order(kv)]
            assert store.count(t) == len(kv)

    def teardown(self) -> None:
        try:
            if not self.store.closed:
                self.store.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


_QUICK = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_STRESS = settings(
    max_examples=1000,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_store_against_model() -> None:
    run_state_machine_as_test(StoreMachine, settings=_QUICK)


@pytest.mark.stress
def test_store_against_model_stress() -> None:
    run_state_machine_as_test(StoreMachine, settings=_STRESS)
