"""Idempotent sinks on SQLite and PostgreSQL: a table of failure modes.

Every test runs on both targets; the PostgreSQL ones are skipped with the
reason "STATELOG_PG_DSN not set" when no server is named (``.ci/run`` starts
one). The reference for "no lost and no duplicated output" is always a
crash-free run of the same seeded reconciler (``tests/sink_fixtures.py``):
the sink table must equal it row for row (id, version, epoch, payload), the
store must equal it table for table, and the rows changed must add up.

| failure                                          | test                               |
|--------------------------------------------------|------------------------------------|
| crash at each step of a sinked commit            | test_crash_at_every_step           |
| SIGKILL inside the target txn / before commit    | test_sigkill_between_write_and_commit |
| walk-back over two epochs (copy, damaged log)    | test_walk_back_replays_zero_rows   |
| a lower or equal version arrives                 | test_versions_never_move_backwards |
| bad outputs, bad state input                     | test_bad_input_changes_nothing     |
| bad sink arguments                               | test_bad_sink_arguments            |
| the target fails, then recovers                  | test_target_failure_then_retry     |
| a table that is not the sink's                   | test_foreign_table_refused         |
| PostgreSQL session killed under the sink         | test_pg_connection_lost_then_retry |
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.kit import FaultyFiles
from statelog.sinks import (
    InvalidOutputError,
    Output,
    PostgresSink,
    Row,
    SinkCommit,
    SinkedStore,
    SQLiteSink,
)
from statelog.sinks.base import TransactionalSink
from tests.helpers import flip_bit, frames, segments
from tests.sink_fixtures import (
    BATCHES,
    KINDS,
    PG_DSN,
    Crash,
    drop_pg_table,
    new_table,
    open_target,
    run_batches,
    store_state,
)
from tests.sink_fixtures import step as step_batch

REPO = Path(__file__).resolve().parent.parent


class Target:
    """Where one test's sinks write: a SQLite file or a PostgreSQL table of its own."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.where: Path | str = tmp / "sink.db" if kind == "sqlite" else str(PG_DSN)
        self.tables: list[str] = []

    def open(self, table: str | None = None, **kw: Any) -> TransactionalSink:
        table = new_table() if table is None else table
        sink = open_target(self.kind, self.where, table, **kw)
        if table not in self.tables:
            self.tables.append(table)
        return sink


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "postgres" and not PG_DSN:
        pytest.skip("STATELOG_PG_DSN not set")
    t = Target(request.param, tmp_path)
    yield t
    if t.kind == "postgres":
        for table in t.tables:
            drop_pg_table(table)


def reference(target: Target, tmp: Path) -> tuple[list[Row], dict[str, Any], dict[int, int]]:
    """A crash-free run: the sink's rows, the store's state and the rows changed per batch."""
    with statelog.open(tmp / "ref-store") as store, target.open() as sink:
        results = run_batches(SinkedStore(store, sink))
        assert sorted(results) == list(range(1, BATCHES + 1))
        assert all(r.epoch == b for b, r in results.items())
        return sink.rows(), store_state(store), {b: r.rows for b, r in results.items()}


# Steps of one sinked commit, in order, and whether the target had committed
# the batch's rows when the crash came (the replay must then change no row).
STEPS = {
    "computed": False,
    "before-sink": False,
    "target-begun": False,
    "target-upserted": False,
    "target-committed": True,
    "sink-written": True,
    "store-write-failed": True,
    "store-committed": True,
}
CRASH_BATCH = 4


@pytest.mark.parametrize("step", list(STEPS))
def test_crash_at_every_step(target: Target, tmp_path: Path, step: str) -> None:
    ref_rows, ref_state, ref_changed = reference(target, tmp_path)
    path = tmp_path / "store"
    files = FaultyFiles(path)
    table = new_table()
    store = statelog.open(path, file_layer=files)

    def hook(at: str, n: int) -> None:
        if n != CRASH_BATCH:
            return
        if step == "store-write-failed" and at == "sink-written":
            files.fail("write", match=".wal")  # the commit record's append fails (ENOSPC)
        elif at == step:
            raise Crash(step)

    sink = target.open(table, hook=hook)
    sinked = SinkedStore(store, sink)
    before: dict[int, SinkCommit] = {}
    expected_exc: type[BaseException] = (
        statelog.StorageError if step == "store-write-failed" else Crash
    )
    with pytest.raises(expected_exc):
        for b in range(1, BATCHES + 1):
            before[b] = step_batch(sinked, b, hook)
    files.abandon(store)  # dead: lock, threads and descriptors gone, no seal
    sink.close()
    assert sorted(before) == list(range(1, CRASH_BATCH))

    committed = CRASH_BATCH if step == "store-committed" else CRASH_BATCH - 1
    with statelog.open(path) as store, target.open(table) as sink:
        assert store.epoch == committed, store.recovery
        sinked = SinkedStore(store, sink)
        after = run_batches(sinked)
        assert sorted(after) == list(range(committed + 1, BATCHES + 1))
        if step != "store-committed":
            # The crashed batch, redone: a no-op if its rows had reached the target.
            assert after[CRASH_BATCH].rows == (0 if STEPS[step] else ref_changed[CRASH_BATCH])
        # No lost and no duplicated output: same rows, same store, same total change.
        assert sink.rows() == ref_rows
        assert store_state(store) == ref_state
        # Rows the crashed attempt changed were never reported; every other
        # change is reported exactly once.
        counted = sum(r.rows for r in before.values()) + sum(r.rows for r in after.values())
        unreported = ref_changed[CRASH_BATCH] if STEPS[step] else 0
        assert counted + unreported == sum(ref_changed.values())
        for row in ref_rows:
            assert sinked.applied(row.id) == row.version


@pytest.mark.parametrize("step", ["target-upserted", "sink-written"])
def test_sigkill_between_write_and_commit(target: Target, tmp_path: Path, step: str) -> None:
    """A real process dies (SIGKILL) with the target transaction open, or after it committed."""
    ref_rows, ref_state, ref_changed = reference(target, tmp_path)
    path, table = tmp_path / "store", new_table()
    target.tables.append(table)
    child = subprocess.run(
        [sys.executable, "-m", "tests.sink_fixtures", str(path), target.kind, str(target.where),
         table, "--die", f"{step}:{CRASH_BATCH}"],
        cwd=REPO, capture_output=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == -9, child.stderr.decode()
    with statelog.open(path) as store, target.open(table) as sink:
        assert store.epoch == CRASH_BATCH - 1, store.recovery
        landed = step == "sink-written"
        assert sink.high_epoch() == (CRASH_BATCH if landed else CRASH_BATCH - 1)
        after = run_batches(SinkedStore(store, sink))
        assert after[CRASH_BATCH].rows == (0 if landed else ref_changed[CRASH_BATCH])
        assert sink.rows() == ref_rows
        assert store_state(store) == ref_state


@pytest.mark.parametrize("how", ["copy", "damaged-log"])
def test_walk_back_replays_zero_rows(target: Target, tmp_path: Path, how: str) -> None:
    """Recovery lands two epochs back; replaying them into the sink writes no row."""
    ref_rows, ref_state, ref_changed = reference(target, tmp_path)
    path, table = tmp_path / "store", new_table()
    files = FaultyFiles(path)
    store = statelog.open(path, file_layer=files)
    sink = target.open(table)
    sinked = SinkedStore(store, sink)
    last = BATCHES - 2
    run_batches(sinked, last - 2)
    if how == "copy":
        shutil.copytree(path, tmp_path / "older")
    run_batches(sinked, last)
    rows_at_last = sink.rows()
    files.abandon(store)
    if how == "copy":
        shutil.rmtree(path)
        (tmp_path / "older").rename(path)
    else:
        seg = segments(path)[-1]
        flip_bit(seg, frames(seg)[-2].offset + 20)  # record of epoch last-1: chain and crc break

    with statelog.open(path) as store:
        assert store.epoch == last - 2, store.recovery
        if how == "damaged-log":
            assert list(store.recovery.lost_epochs) == [last - 1, last], store.recovery
        sinked = SinkedStore(store, sink)
        assert sink.high_epoch() == last
        replay = run_batches(sinked, last)
        assert {b: r.rows for b, r in replay.items()} == {last - 1: 0, last: 0}
        assert sink.rows() == rows_at_last  # not a row touched, epochs included
        rest = run_batches(sinked)
        assert {b: r.rows for b, r in rest.items()} == {
            b: ref_changed[b] for b in range(last + 1, BATCHES + 1)
        }
        assert sink.rows() == ref_rows
        assert store_state(store) == ref_state
    sink.close()


def test_versions_never_move_backwards(target: Target, tmp_path: Path) -> None:
    with target.open() as sink:
        assert sink.write([Output("a", 5, {"v": 5}), Output("b", 0, {"v": 0})], epoch=1) == 2
        assert sink.write([Output("a", 3, {"v": 3})], epoch=2) == 0  # lower version
        assert sink.write([Output("a", 5, {"v": "other"})], epoch=3) == 0  # equal version
        assert sink.get("a") == Row("a", 5, 1, {"v": 5})
        assert sink.write([Output("a", 6, {"v": 6}), Output("b", 0, {})], epoch=4) == 1
        assert sink.rows() == [Row("a", 6, 4, {"v": 6}), Row("b", 0, 1, {"v": 0})]
        assert sink.write([], epoch=5) == 0
        assert sink.high_epoch() == 4


class _Weird:
    pass


def _deep(n: int) -> Any:
    v: Any = 0
    for _ in range(n):
        v = [v]
    return v


GOOD = Output("ok", 1, {"x": 1})
BAD_OUTPUTS: dict[str, Any] = {
    "id not a str": [GOOD, Output(7, 1, {})],  # type: ignore[arg-type]
    "empty id": [Output("", 1, {})],
    "id with NUL": [Output("a\x00b", 1, {})],
    "id lone surrogate": [Output("a\ud800", 1, {})],
    "id too long": [Output("x" * 501, 1, {})],
    "negative version": [GOOD, Output("n", -1, {})],
    "bool version": [Output("n", True, {})],
    "float version": [Output("n", 1.0, {})],  # type: ignore[arg-type]
    "version over int64": [Output("n", 1 << 63, {})],
    "payload not a mapping": [Output("n", 1, [1, 2])],  # type: ignore[arg-type]
    "payload set": [GOOD, Output("n", 1, {"s": {1, 2}})],
    "payload bytes": [Output("n", 1, {"b": b"x"})],
    "payload NaN": [Output("n", 1, {"f": float("nan")})],
    "payload object": [Output("n", 1, {"o": _Weird()})],
    "payload int key": [Output("n", 1, {1: "x"})],  # type: ignore[dict-item]
    "payload NUL": [Output("n", 1, {"s": "a\x00"})],
    "payload too deep": [Output("n", 1, {"d": _deep(80)})],
    "duplicate id": [Output("d", 1, {}), Output("d", 2, {})],
    "not a list": GOOD,
    "a str": "outputs",
}


BAD_STATE: dict[str, dict[str, Any]] = {
    "offset backwards": {"offsets": {"in-0": 0}},
    "watermark backwards": {"low_watermark_ms": 1},
    "key not str or bytes": {"put": {3: "x"}},
    "value not encodable": {"put": {"k": _Weird()}},
    "put and delete same key": {"put": {"k": 1}, "delete": ["k"]},
    "reserved table": {"table": "__sink__:t"},
}


@pytest.mark.parametrize("case", list(BAD_OUTPUTS) + list(BAD_STATE))
def test_bad_input_changes_nothing(target: Target, tmp_path: Path, case: str) -> None:
    path = tmp_path / "store"
    with statelog.open(path) as store, target.open() as sink:
        sinked = SinkedStore(store, sink)
        sinked.commit(
            outputs=[Output("seed", 1, {"x": 0})],
            offsets={"in-0": 5},
            low_watermark_ms=100,
            put={"k0": 0},
        )
        state, rows = store_state(store), sink.rows()
        wal = {p.name: p.read_bytes() for p in segments(path)}
        args: dict[str, Any] = {
            "outputs": [Output("fine", 2, {"y": 1})],
            "offsets": {"in-0": 6},
            "low_watermark_ms": 200,
            "put": {"k1": 1},
        }
        if case in BAD_OUTPUTS:
            args["outputs"] = BAD_OUTPUTS[case]
            with pytest.raises(InvalidOutputError) as err:
                sinked.commit(**args)
            with pytest.raises(InvalidOutputError):
                sink.write(BAD_OUTPUTS[case], epoch=9)
        else:
            args.update(BAD_STATE[case])
            with pytest.raises(statelog.InvalidCommitError) as err:  # type: ignore[assignment]
                sinked.commit(**args)
        assert err.value.hint
        assert sink.rows() == rows
        assert store_state(store) == state
        assert {p.name: p.read_bytes() for p in segments(path)} == wal
        # Still usable: the same commit with good input goes through.
        good = sinked.commit(
            outputs=[Output("fine", 2, {"y": 1})], offsets={"in-0": 6}, low_watermark_ms=200
        )
        assert (good.epoch, good.rows) == (2, 1)


def test_commit_too_large_for_the_store_writes_nothing_to_the_sink(
    target: Target, tmp_path: Path
) -> None:
    path = tmp_path / "store"
    with statelog.open(path, max_record_bytes=4096) as store, target.open() as sink:
        sinked = SinkedStore(store, sink)
        with pytest.raises(statelog.InvalidCommitError, match="max_record_bytes"):
            sinked.commit(
                outputs=[Output("big", 1, {"x": 1})],
                offsets={"in-0": 1},
                low_watermark_ms=1,
                put={"k": "v" * 10_000},
            )
        assert sink.rows() == [] and store.epoch == 0
        done = sinked.commit(
            outputs=[Output("big", 1, {"x": 1})], offsets={"in-0": 1}, low_watermark_ms=1
        )
        assert (done.epoch, done.rows) == (1, 1)


@pytest.mark.parametrize(
    "case", ["table with space", "table empty", "table quote", "table too long", "epoch 0",
             "epoch bool", "epoch str"],
)  # fmt: skip
def test_bad_sink_arguments(target: Target, case: str) -> None:
    tables = {"table with space": "a b", "table empty": "", "table quote": 'a"b',
              "table too long": "t" * 64}  # fmt: skip
    if case in tables:
        with pytest.raises(InvalidOutputError):
            target.open(tables[case])
        return
    epoch: Any = {"epoch 0": 0, "epoch bool": True, "epoch str": "1"}[case]
    with target.open() as sink:
        with pytest.raises(InvalidOutputError):
            sink.write([GOOD], epoch=epoch)
        assert sink.rows() == []


def test_target_failure_then_retry(target: Target, tmp_path: Path) -> None:
    """The target refuses the write: SinkError, the store is not committed, a retry works."""
    table = new_table()
    with statelog.open(tmp_path / "store") as store, target.open(table) as sink:
        sinked = SinkedStore(store, sink)
        sinked.commit(outputs=[GOOD], offsets={"p": 1}, low_watermark_ms=1)
        if target.kind == "sqlite":
            blocker = __import__("sqlite3").connect(target.where, isolation_level=None, timeout=0)
            blocker.execute("BEGIN EXCLUSIVE")
            sink._conn.execute("PRAGMA busy_timeout=0")  # type: ignore[attr-defined]
            release = blocker.rollback
        else:
            drop_pg_table(table)
            release = lambda: None  # noqa: E731
        with pytest.raises(statelog.SinkError) as err:
            sinked.commit(outputs=[Output("b", 1, {})], offsets={"p": 2}, low_watermark_ms=2)
        assert "retrying the same commit is safe" in err.value.hint
        assert store.epoch == 1 and store.offsets == {"p": 1}
        assert sinked.applied("b") is None
        release()
        if target.kind == "postgres":
            sink = target.open(table)  # recreates the table
            sinked = SinkedStore(store, sink)
        done = sinked.commit(outputs=[Output("b", 1, {})], offsets={"p": 2}, low_watermark_ms=2)
        assert (done.epoch, done.rows) == (2, 1)
        assert sinked.applied("b") == 1
        sink.close()


def test_foreign_table_refused(target: Target) -> None:
    table = new_table()
    target.tables.append(table)
    if target.kind == "sqlite":
        import sqlite3

        with sqlite3.connect(target.where) as conn:
            conn.execute(f"CREATE TABLE {table} (id TEXT PRIMARY KEY, other INTEGER)")
    else:
        import psycopg

        with psycopg.connect(str(PG_DSN), autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (id text PRIMARY KEY, other int)")
    with pytest.raises(statelog.SinkError, match="has columns"):
        target.open(table)


def test_pg_connection_lost_then_retry(target: Target, tmp_path: Path) -> None:
    """The server ends the sink's session: one SinkError, then the sink reconnects."""
    if target.kind != "postgres":
        pytest.skip("PostgreSQL only")
    import psycopg

    with statelog.open(tmp_path / "store") as store, target.open() as sink:
        assert isinstance(sink, PostgresSink)
        sinked = SinkedStore(store, sink)
        sinked.commit(outputs=[GOOD], offsets={"p": 1}, low_watermark_ms=1)
        pid = sink._conn.info.backend_pid
        with psycopg.connect(str(PG_DSN), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        args: dict[str, Any] = {
            "outputs": [Output("b", 1, {})],
            "offsets": {"p": 2},
            "low_watermark_ms": 2,
        }
        with pytest.raises(statelog.SinkError):
            sinked.commit(**args)
        assert store.epoch == 1
        assert sinked.commit(**args) == SinkCommit(2, 1, 1)
        assert sink.get("b") == Row("b", 1, 2, {})


def test_sqlite_sink_is_durable_wal(tmp_path: Path) -> None:
    """The SQLite target syncs every commit (WAL, synchronous=FULL) before the store commits."""
    with SQLiteSink(tmp_path / "s.db", "t") as sink:
        mode = sink._conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = sink._conn.execute("PRAGMA synchronous").fetchone()[0]
    assert (mode, sync) == ("wal", 2)
