"""The public contract of ``statelog`` as a reconciler author meets it.

Each test names one promise of the API: what ``open``, ``commit``, the reads,
transactions, durability modes, ``close`` and read-only opens guarantee.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time as time_module
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog import Outcome
from statelog.log.reader import scan_segment
from tests.helpers import segments

REPO = Path(__file__).resolve().parent.parent


# -- helpers ------------------------------------------------------------------


def tree_bytes(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` by relative path: file bytes, or None for a directory."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = None if p.is_dir() else p.read_bytes()
    return out


def wal_bytes(store: Path) -> dict[str, bytes | None]:
    return tree_bytes(store / "wal")


def sealed_lsn(path: Path) -> int | None:
    """The LSN named by ``path``'s SEAL frame, or None if the segment is not sealed."""
    scan = scan_segment(path, path.read_bytes(), store_id=None, prev_crc=None, is_last=True)
    return scan.sealed_lsn


def run_python(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )


def commit(store: statelog.StateStore, **kwargs: Any) -> int:
    """A commit with harmless defaults for offsets and watermark."""
    kwargs.setdefault("offsets", {})
    kwargs.setdefault("low_watermark_ms", store.low_watermark_ms)
    return store.commit(**kwargs)


# -- open, close, context manager ----------------------------------------------


def test_open_creates_a_new_store(store_path: Path) -> None:
    assert not store_path.exists()
    store = statelog.open(store_path)
    try:
        assert isinstance(store, statelog.StateStore)
        assert store_path.is_dir()
        assert (store_path / "wal").is_dir()
        assert store.epoch == 0
        assert store.offsets == {}
        assert store.low_watermark_ms == 0
        assert store.count() == 0
        assert list(store.items()) == []
        assert store.get("anything") is None
    finally:
        store.close()


def test_open_recovers_an_existing_store(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, offsets={"p0": 7}, low_watermark_ms=70, put={"k": "v"})
    with statelog.open(store_path) as store:
        assert store.epoch == 1
        assert store.offsets == {"p0": 7}
        assert store.low_watermark_ms == 70
        assert store.get("k") == "v"
        assert store.recovery.replayed == 1
        assert store.recovery.epoch == 1


def test_open_accepts_an_existing_empty_directory(store_path: Path) -> None:
    store_path.mkdir()
    with statelog.open(store_path) as store:
        assert commit(store, put={"a": 1}) == 1


def test_open_accepts_str_paths(store_path: Path) -> None:
    with statelog.open(str(store_path)) as store:
        assert commit(store, put={"a": 1}) == 1


def test_context_manager_closes_and_releases_the_lock(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        assert not store.closed
        commit(store, put={"a": 1})
    assert store.closed
    # The lock is free again: a new writer may open at once.
    with statelog.open(store_path) as again:
        assert again.get("a") == 1


def test_context_manager_closes_on_exception(store_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), statelog.open(store_path) as store:
        commit(store, put={"a": 1})
        raise RuntimeError("boom")
    assert store.closed
    with statelog.open(store_path) as again:
        assert again.epoch == 1


def test_statestore_open_is_an_alias_of_statelog_open(store_path: Path) -> None:
    opener = getattr(statelog.StateStore, "open")  # noqa: B009 (assigned after the class)
    with opener(store_path) as store:
        assert isinstance(store, statelog.StateStore)
        assert commit(store, put={"a": 1}) == 1
    with statelog.open(store_path) as store:
        assert store.get("a") == 1


# -- commit: epochs, offsets, watermark ------------------------------------------


def test_commit_returns_previous_epoch_plus_one_from_one(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        for expected in range(1, 6):
            assert commit(store, put={f"k{expected}": expected}) == expected
            assert store.epoch == expected
    with statelog.open(store_path) as store:
        assert store.epoch == 5
        assert commit(store) == 6
        assert store.epoch == 6


def test_commit_with_nothing_to_put_still_makes_an_epoch(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        assert store.commit(offsets={}, low_watermark_ms=0) == 1
        assert store.commit(offsets={"p": 3}, low_watermark_ms=5) == 2
        assert store.offsets == {"p": 3}


def test_offsets_merge_and_unnamed_partitions_keep_their_offset(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, offsets={"a-0": 10, "a-1": 20})
        commit(store, offsets={"a-1": 25, "b-0": 1})
        assert store.offsets == {"a-0": 10, "a-1": 25, "b-0": 1}
        commit(store, offsets={})
        assert store.offsets == {"a-0": 10, "a-1": 25, "b-0": 1}
        # An offset may stay where it is (a re-commit of the same position).
        commit(store, offsets={"a-0": 10})
        assert store.offsets == {"a-0": 10, "a-1": 25, "b-0": 1}
    with statelog.open(store_path) as store:
        assert store.offsets == {"a-0": 10, "a-1": 25, "b-0": 1}


def test_offsets_property_is_a_copy(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, offsets={"p": 1})
        got = store.offsets
        got["p"] = 999
        got["intruder"] = 5
        assert store.offsets == {"p": 1}
        assert store.offsets is not store.offsets
        # The caller's mapping is not kept either.
        mine = {"p": 2}
        commit(store, offsets=mine)
        mine["p"] = 1000
        assert store.offsets == {"p": 2}


def test_low_watermark_is_committed_and_may_stay(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        assert store.low_watermark_ms == 0
        store.commit(offsets={}, low_watermark_ms=1_700_000_000_000)
        assert store.low_watermark_ms == 1_700_000_000_000
        store.commit(offsets={}, low_watermark_ms=1_700_000_000_000)
        assert store.low_watermark_ms == 1_700_000_000_000
        store.commit(offsets={}, low_watermark_ms=1_700_000_000_001)
    with statelog.open(store_path) as store:
        assert store.low_watermark_ms == 1_700_000_000_001


# -- reads ------------------------------------------------------------------------


def test_get_default_and_table(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, put={"k": "in default", "none": None})
        commit(store, put={"k": "in other"}, table="other")
        assert store.get("k") == "in default"
        assert store.get("k", table="other") == "in other"
        assert store.get("missing") is None
        assert store.get("missing", 42) == 42
        assert store.get("missing", default="d", table="other") == "d"
        # A stored None is a value, not an absence.
        assert store.get("none", default="d") is None


def test_items_key_order_bytes_before_str(store_path: Path) -> None:
    str_keys = ["A", "a", "ab", "b", "z", "\u00e9", "\u20ac", "\ue000", "\uffff", "\U0001f600"]
    bytes_keys = [b"", b"\x00", b"\x00\x01", b"a", b"ab", b"b", b"\x7f", b"\x80", b"\xff"]
    put: dict[str | bytes, Any] = {}
    for i, k in enumerate(reversed(str_keys)):
        put[k] = i
    for i, kb in enumerate(reversed(bytes_keys)):
        put[kb] = -i
    with statelog.open(store_path) as store:
        commit(store, put=put)
        got = [k for k, _ in store.items()]
        assert got == [*bytes_keys, *str_keys]
        assert dict(store.items()) == put
    with statelog.open(store_path) as store:
        assert [k for k, _ in store.items()] == [*bytes_keys, *str_keys]


def test_items_with_prefix_of_either_type(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(
            store,
            put={"ab": 1, "a": 2, "abc": 3, "b": 4, b"ab": 5, b"a": 6, b"b": 7, b"abc": 8},
        )
        assert list(store.items(prefix="a")) == [("a", 2), ("ab", 1), ("abc", 3)]
        assert list(store.items(prefix="ab")) == [("ab", 1), ("abc", 3)]
        assert list(store.items(prefix=b"a")) == [(b"a", 6), (b"ab", 5), (b"abc", 8)]
        assert list(store.items(prefix=b"b")) == [(b"b", 7)]
        assert list(store.items(prefix="zz")) == []
        commit(store, put={"a1": "t"}, table="t")
        assert list(store.items("t", prefix="a")) == [("a1", "t")]
        assert list(store.items(table="t", prefix=b"a")) == []


def test_items_is_taken_at_the_call(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, put={"a": 1, "b": 2})
        it = store.items()
        first = next(it)
        commit(store, put={"c": 3}, delete=("b",))
        assert [first, *it] == [("a", 1), ("b", 2)]


def test_count_and_tables(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        assert store.tables() == []
        assert store.count() == 0
        commit(store, put={"a": 1, "b": 2, b"a": 3})
        commit(store, put={"x": 1}, table="orders")
        assert store.count() == 3
        assert store.count("orders") == 1
        assert store.count(table="orders") == 1
        assert store.tables() == ["default", "orders"]
        commit(store, delete=("a", "absent"))
        assert store.count() == 2
    with statelog.open(store_path) as store:
        assert store.count() == 2
        assert store.tables() == ["default", "orders"]


def test_str_and_bytes_keys_are_distinct(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, put={"k": "str", b"k": "bytes"})
        assert store.count() == 2
        assert store.get("k") == "str"
        assert store.get(b"k") == "bytes"
        commit(store, delete=("k",))
        assert store.get("k") is None
        assert store.get(b"k") == "bytes"
    with statelog.open(store_path) as store:
        items = list(store.items())
        assert items == [(b"k", "bytes")]
        assert type(items[0][0]) is bytes


def test_keys_come_back_as_the_type_given(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, put={"s": 1, b"b": 2, "\u00fc": 3, b"\xff\x00": 4})
    with statelog.open(store_path) as store:
        kinds = {k: type(k) for k, _ in store.items()}
        assert kinds == {"s": str, b"b": bytes, "\u00fc": str, b"\xff\x00": bytes}


def test_key_of_500_bytes_is_accepted(store_path: Path) -> None:
    k_str = "\U0001f600" * 125  # 4 bytes each in UTF-8: exactly 500
    k_bytes = b"x" * 500
    with statelog.open(store_path) as store:
        commit(store, put={k_str: 1, k_bytes: 2})
    with statelog.open(store_path) as store:
        assert store.get(k_str) == 1
        assert store.get(k_bytes) == 2


VALUES: dict[str, Any] = {
    "none": None,
    "true": True,
    "false": False,
    "zero": 0,
    "int_min": -(2**63),
    "uint_max": 2**64 - 1,
    "float": 3.25,
    "neg_float": -1e300,
    "str": "h\u00e9llo \U0001f600",
    "empty_str": "",
    "bytes": b"\x00\xff bytes",
    "list": [1, "two", None, [3.5, b"four"]],
    "dict": {"a": 1, "nested": {"b": [True, False]}},
    "int_keyed": {1: "one", 2: "two"},
    "empty": {},
    "naive_datetime": datetime(2024, 2, 29, 23, 59, 59, 999999),
    "aware_datetime": datetime(2024, 5, 1, 12, 30, tzinfo=timezone(timedelta(hours=-3))),
    "utc_datetime": datetime(1970, 1, 1, tzinfo=UTC),
    "date": date(2020, 2, 29),
    "decimal": Decimal("1.10"),
    "decimal_exp": Decimal("-0E+3"),
    "decimal_nan": Decimal("NaN"),
    "in_a_dict": {"at": date(1999, 12, 31), "amount": Decimal("0.005")},
}


def test_values_round_trip_as_their_own_types(store_path: Path) -> None:
    def same(a: Any, b: Any) -> bool:  # equal, and of the same type all the way down
        if isinstance(a, dict):
            return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return type(b) is list and len(a) == len(b) and all(map(same, a, b))
        if isinstance(a, Decimal) and a.is_nan():
            return type(b) is Decimal and b.is_nan()
        return type(a) is type(b) and a == b and str(a) == str(b)

    with statelog.open(store_path) as store:
        commit(store, put=VALUES)
        for k, v in VALUES.items():
            assert same(v, store.get(k)), k
        # msgpack has arrays only: tuples come back as lists.
        commit(store, put={"tuple": (1, 2, (3,))})
        assert store.get("tuple") == [1, 2, [3]]
    with statelog.open(store_path) as store:
        for k, v in VALUES.items():
            assert same(v, store.get(k)), k
    aware = VALUES["aware_datetime"]
    assert store.get("aware_datetime").utcoffset() == aware.utcoffset()


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({3, 1, 2}, id="set"),
        pytest.param(frozenset("ab"), id="frozenset"),
        pytest.param(time(12, 30), id="time"),
        pytest.param(timedelta(seconds=5), id="timedelta"),
        pytest.param(uuid.UUID(int=7), id="uuid"),
        pytest.param(Outcome.CLEAN, id="str-enum"),
        pytest.param(bytearray(b"x"), id="bytearray"),
        pytest.param({"nested": [object()]}, id="nested-object"),
        pytest.param({(1, 2): "tuple key"}, id="tuple-key"),
        pytest.param({date(2020, 1, 1): "date key"}, id="date-key"),
    ],
)
def test_a_value_that_would_come_back_as_another_type_is_refused(
    store_path: Path, value: Any
) -> None:
    with statelog.open(store_path) as store:
        with pytest.raises(statelog.InvalidCommitError, match="cannot be stored") as err:
            commit(store, put={"k": value})
        assert "Decimal" in err.value.hint and store.epoch == 0
        refused = pytest.raises(statelog.InvalidCommitError, match="cannot be stored")
        with refused, store.transaction() as tx:
            tx.put("k", value)
        assert store.epoch == 0


def test_get_returns_a_fresh_object_each_time(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, put={"k": {"list": [1, 2], "d": {"x": 1}}})
        a = store.get("k")
        b = store.get("k")
        assert a == b and a is not b
        a["list"].append(3)
        a["d"]["x"] = 99
        a["new"] = True
        assert store.get("k") == {"list": [1, 2], "d": {"x": 1}}
        # items() hands out fresh objects too.
        (_, v), *_ = store.items()
        v["list"].clear()
        assert store.get("k") == {"list": [1, 2], "d": {"x": 1}}


def test_mutating_the_callers_value_after_commit_changes_nothing(store_path: Path) -> None:
    value: dict[str, Any] = {"n": 1, "tags": ["a"]}
    put: dict[str | bytes, Any] = {"k": value}
    with statelog.open(store_path) as store:
        commit(store, put=put)
        value["n"] = 2
        value["tags"].append("b")
        put["other"] = "sneaked in"
        assert store.get("k") == {"n": 1, "tags": ["a"]}
        assert store.get("other") is None
    with statelog.open(store_path) as store:
        assert store.get("k") == {"n": 1, "tags": ["a"]}
        assert store.get("other") is None


def test_delete_of_absent_keys_is_fine(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        assert commit(store, delete=("never", b"never")) == 1
        commit(store, put={"a": 1})
        assert commit(store, delete=["a", "a-again"], table="other-table") == 3
        assert store.get("a") == 1
        assert commit(store, delete=iter(["a"])) == 4
        assert store.get("a") is None
    with statelog.open(store_path) as store:
        assert store.epoch == 4
        assert store.count() == 0


# -- transactions ------------------------------------------------------------------


def test_transaction_spanning_tables_commits_one_epoch(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, offsets={"p0": 1, "p1": 1}, low_watermark_ms=10, put={"old": 0})
        with store.transaction() as tx:
            tx.put("a", 1)
            tx.put("b", {"x": 2}, table="left")
            tx.put(b"c", [3], table="right")
            tx.delete("old")
            tx.set_offset("p0", 5)
            tx.low_watermark_ms = 20
        assert tx.epoch == 2
        assert store.epoch == 2
        assert store.get("a") == 1
        assert store.get("old") is None
        assert store.get("b", table="left") == {"x": 2}
        assert store.get(b"c", table="right") == [3]
        assert store.offsets == {"p0": 5, "p1": 1}
        assert store.low_watermark_ms == 20
    with statelog.open(store_path) as store:
        assert store.epoch == 2
        assert store.recovery.replayed == 2
        assert store.get("b", table="left") == {"x": 2}
        assert store.get(b"c", table="right") == [3]
        assert store.get("old") is None
        assert store.offsets == {"p0": 5, "p1": 1}


def test_transaction_last_operation_on_a_key_wins(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, put={"k": "before", "d": "before"})
        with store.transaction() as tx:
            tx.put("k", 1)
            tx.delete("k")
            tx.delete("d")
            tx.put("d", 2)
        assert store.get("k") is None
        assert store.get("d") == 2


def test_transaction_that_raises_commits_nothing(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, offsets={"p": 1}, low_watermark_ms=5, put={"keep": 1})
        before = wal_bytes(store_path)
        with pytest.raises(KeyError), store.transaction() as tx:
            tx.put("a", 1)
            tx.put("b", 2, table="other")
            tx.delete("keep")
            tx.set_offset("p", 9)
            tx.low_watermark_ms = 50
            raise KeyError("abort")
        assert store.epoch == 1
        assert wal_bytes(store_path) == before
        assert store.get("a") is None
        assert store.get("keep") == 1
        assert store.offsets == {"p": 1}
        assert store.low_watermark_ms == 5
        assert tx.epoch is None
        # The next commit takes the next epoch: no gap left by the discarded one.
        assert commit(store, put={"after": 1}) == 2
    with statelog.open(store_path) as store:
        assert store.epoch == 2
        assert store.get("a") is None
        assert "other" not in store.tables()


def test_transaction_without_watermark_keeps_it(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, offsets={"p0": 3, "p1": 4}, low_watermark_ms=123)
        with store.transaction() as tx:
            tx.set_offset("p1", 8)
            tx.set_offset("p2", 1)
            tx.put("k", "v")
        assert store.low_watermark_ms == 123
        assert store.offsets == {"p0": 3, "p1": 8, "p2": 1}
        assert tx.low_watermark_ms is None
    with statelog.open(store_path) as store:
        assert store.low_watermark_ms == 123
        assert store.offsets == {"p0": 3, "p1": 8, "p2": 1}


def test_empty_transaction_block(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        with store.transaction() as tx:
            pass
        # A clean exit commits, even with nothing staged: one epoch, like commit().
        assert tx.epoch == 1
        assert store.epoch == 1


# -- recovery report ---------------------------------------------------------------


def test_recovery_report_of_a_fresh_store(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        r = store.recovery
        assert isinstance(r, statelog.RecoveryReport)
        assert r.epoch == 0
        assert r.snapshot is None
        assert r.replayed == 0
        assert r.truncated_bytes == 0
        assert len(r.rejected) == 0
        assert len(r.lost_epochs) == 0
        assert r.seconds >= 0


def test_recovery_report_after_a_clean_close(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        for i in range(3):
            commit(store, put={f"k{i}": i})
    with statelog.open(store_path) as store:
        r = store.recovery
        assert (r.epoch, r.replayed, r.truncated_bytes) == (3, 3, 0)
        assert r.snapshot is None
        assert len(r.rejected) == 0 and len(r.lost_epochs) == 0
        assert r.outcome is statelog.Outcome.CLEAN


# -- durability modes --------------------------------------------------------------


def test_group_durability(store_path: Path) -> None:
    with statelog.open(store_path, durability="group") as store:
        epochs = [commit(store, offsets={"p": i}, put={f"k{i}": i}) for i in range(1, 6)]
        assert epochs == [1, 2, 3, 4, 5]
        assert store.wait_durable(3, timeout=timedelta(seconds=10)) is True
        assert store.durable_epoch >= 3
        assert store.wait_durable(5, timeout=10.0) is True
        assert store.durable_epoch == 5
        e = commit(store, offsets={"p": 6})
        store.flush()
        assert store.durable_epoch == e == 6
        assert store.wait_durable(e) is True
    with statelog.open(store_path) as store:
        assert store.epoch == 6
        assert store.offsets == {"p": 6}
        assert store.get("k5") == 5


def test_group_durability_catches_up_without_being_asked(store_path: Path) -> None:
    with statelog.open(
        store_path, durability="group", group_delay=timedelta(milliseconds=5)
    ) as store:
        e = commit(store, put={"a": 1})
        # The flusher syncs within the bounded delay; wait_durable only observes it.
        assert store.wait_durable(e, timeout=10.0)
        assert store.durable_epoch == e


def test_durability_none_survives_a_clean_close(store_path: Path) -> None:
    with statelog.open(store_path, durability="none") as store:
        for i in range(1, 11):
            assert commit(store, offsets={"p": i}, low_watermark_ms=i, put={f"k{i}": i}) == i
        store.flush()
        assert store.wait_durable(10) is True
    with statelog.open(store_path) as store:
        assert store.epoch == 10
        assert store.offsets == {"p": 10}
        assert store.low_watermark_ms == 10
        assert dict(store.items()) == {f"k{i}": i for i in range(1, 11)}


def test_durability_commit_wait_durable_and_flush(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        e = commit(store, put={"a": 1})
        store.flush()
        assert store.wait_durable(e) is True
        assert store.durable_epoch == e


# -- segments: close, seal, reopen, roll ------------------------------------------------


def test_close_is_idempotent(store_path: Path) -> None:
    store = statelog.open(store_path)
    commit(store, put={"a": 1})
    store.close()
    after_first = tree_bytes(store_path)
    store.close()
    store.close()
    assert store.closed
    assert tree_bytes(store_path) == after_first


def test_close_seals_the_active_segment(store_path: Path) -> None:
    store = statelog.open(store_path)
    for i in range(3):
        commit(store, put={f"k{i}": i})
    segs = segments(store_path)
    assert len(segs) == 1
    assert sealed_lsn(segs[-1]) is None  # the active segment is open while writing
    store.close()
    segs = segments(store_path)
    assert len(segs) == 1
    assert sealed_lsn(segs[-1]) == 3


def test_close_of_an_empty_store_seals_too(store_path: Path) -> None:
    with statelog.open(store_path):
        pass
    segs = segments(store_path)
    assert len(segs) == 1
    assert sealed_lsn(segs[0]) == 0


def test_reopen_starts_a_new_segment(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, put={"a": 1})
    first = segments(store_path)
    first_bytes = {p.name: p.read_bytes() for p in first}
    with statelog.open(store_path) as store:
        now = segments(store_path)
        assert len(now) == len(first) + 1
        assert now[: len(first)] == first
        assert {p.name: p.read_bytes() for p in first} == first_bytes  # sealed: untouched
        assert sealed_lsn(now[-1]) is None
        assert commit(store, put={"b": 2}) == 2
    segs = segments(store_path)
    assert len(segs) == 2
    assert [sealed_lsn(p) for p in segs] == [1, 2]
    with statelog.open(store_path) as store:
        assert dict(store.items()) == {"a": 1, "b": 2}


def test_segments_roll_at_segment_bytes(store_path: Path) -> None:
    pad = "x" * 600
    with statelog.open(store_path, segment_bytes=4096) as store:
        for i in range(1, 31):
            commit(store, offsets={"p": i}, put={f"k{i}": {"i": i, "pad": pad}})
        segs = segments(store_path)
        assert len(segs) >= 4
        # Every segment but the active one is sealed, and the seals run in LSN order.
        seals = [sealed_lsn(p) for p in segs]
        assert seals[-1] is None
        closed = [s for s in seals[:-1] if s is not None]
        assert len(closed) == len(segs) - 1
        assert closed == sorted(closed) and closed[-1] < 30
        for p in segs[:-1]:
            # A roll happens once a segment reaches the limit, so no segment grows far past it.
            assert p.stat().st_size < 4096 + 2048
    with statelog.open(store_path, segment_bytes=4096) as store:
        assert store.epoch == 30
        assert store.recovery.replayed == 30
        assert store.offsets == {"p": 30}
        assert store.count() == 30
        assert store.get("k17") == {"i": 17, "pad": pad}


# -- read-only opens -----------------------------------------------------------------------

READER = """
    import json, sys
    import statelog
    with statelog.open(sys.argv[1] if len(sys.argv) > 1 else {path!r}, readonly=True) as ro:
        out = {{
            "epoch": ro.epoch,
            "offsets": ro.offsets,
            "wm": ro.low_watermark_ms,
            "items": [[k, v] for k, v in ro.items()],
            "readonly": ro.readonly,
        }}
        try:
            ro.commit(offsets={{}}, low_watermark_ms=ro.low_watermark_ms, put={{"x": 1}})
        except statelog.ReadOnlyStoreError as exc:
            out["refused"] = [type(exc).__name__, isinstance(exc, statelog.StatelogError),
                              exc.hint]
        else:
            out["refused"] = None
        try:
            with ro.transaction() as tx:
                tx.put("y", 1)
        except statelog.ReadOnlyStoreError:
            out["tx_refused"] = True
        else:
            out["tx_refused"] = False
        out["epoch_after"] = ro.epoch
    print(json.dumps(out))
"""


def test_readonly_from_another_process_sees_the_last_commit(store_path: Path) -> None:
    with statelog.open(store_path) as writer:
        commit(writer, offsets={"p": 1}, low_watermark_ms=10, put={"a": 1})
        commit(writer, offsets={"p": 2}, low_watermark_ms=20, put={"b": [2]}, delete=("a",))
        lock_before = (store_path / "LOCK").read_bytes()
        assert lock_before.strip() == str(os.getpid()).encode()
        before = tree_bytes(store_path)

        proc = run_python(READER.format(path=str(store_path)))
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["epoch"] == 2
        assert out["offsets"] == {"p": 2}
        assert out["wm"] == 20
        assert out["items"] == [["b", [2]]]
        assert out["readonly"] is True
        assert out["refused"] is not None
        assert out["refused"][0] == "ReadOnlyStoreError"
        assert out["refused"][1] is True and out["refused"][2]
        assert out["tx_refused"] is True
        assert out["epoch_after"] == 2

        # The reader changed no byte, including the writer's LOCK file.
        assert tree_bytes(store_path) == before
        # The writer is unaffected and keeps committing.
        assert commit(writer, offsets={"p": 3}) == 3

        proc = run_python(READER.format(path=str(store_path)))
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["epoch"] == 3


def test_readonly_never_takes_the_lock(store_path: Path) -> None:
    with statelog.open(store_path) as writer:
        commit(writer, put={"a": 1})
    code = f"""
        import sys
        import statelog
        ro = statelog.open({str(store_path)!r}, readonly=True)
        print(ro.epoch, flush=True)
        sys.stdin.readline()
        print(ro.epoch, ro.get("a"), flush=True)
        ro.close()
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "1"
        # While the reader is open, a writer gets the lock at once.
        with statelog.open(store_path) as writer:
            assert commit(writer, put={"a": 2}) == 2
        proc.stdin.write("go\n")
        proc.stdin.flush()
        # The reader keeps the state it opened with.
        assert proc.stdout.readline().split() == ["1", "1"]
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_readonly_never_repairs_a_torn_tail(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, put={"a": 1})
        commit(store, put={"b": 2})
        last = segments(store_path)[-1]
        # The writer is still open: its active segment gets a torn, zero-filled tail.
        with last.open("ab") as f:
            f.write(bytes(64))
        before = tree_bytes(store_path)
        with statelog.open(store_path, readonly=True) as ro:
            assert ro.epoch == 2
            assert dict(ro.items()) == {"a": 1, "b": 2}
        assert tree_bytes(store_path) == before


def test_readonly_store_refuses_commits_in_process(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        commit(store, put={"a": 1})
    before = tree_bytes(store_path)
    with statelog.open(store_path, readonly=True) as ro:
        with pytest.raises(statelog.ReadOnlyStoreError) as info:
            ro.commit(offsets={}, low_watermark_ms=0, put={"b": 2})
        assert info.value.hint and info.value.hint in str(info.value)
        assert ro.get("b") is None and ro.epoch == 1
    assert tree_bytes(store_path) == before


def test_readonly_on_a_missing_store(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    with pytest.raises(statelog.StoreNotFoundError) as info:
        statelog.open(missing, readonly=True)
    assert isinstance(info.value, statelog.StatelogError)
    assert info.value.hint and info.value.hint in str(info.value)
    assert not missing.exists()


def test_readonly_on_an_empty_directory(store_path: Path) -> None:
    store_path.mkdir()
    with pytest.raises(statelog.StoreNotFoundError):
        statelog.open(store_path, readonly=True)
    assert list(store_path.iterdir()) == []


# -- tables that do not exist, the commit signature, wait_durable --------------


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda s: s.get("k", table="bufer"), id="get"),
        pytest.param(lambda s: s.items(table="bufer"), id="items"),
        pytest.param(lambda s: s.count("bufer"), id="count"),
    ],
)
def test_reading_a_table_that_does_not_exist_is_an_error(store_path: Path, read: Any) -> None:
    with statelog.open(store_path, tables=("staged",)) as store:
        commit(store, put={"k": 1}, table="buffer")
        with pytest.raises(statelog.UnknownTableError, match="buffer") as err:
            read(store)  # at the call, not at the first item
        assert "did you mean 'buffer'" in err.value.hint
        assert isinstance(err.value, LookupError)
        assert store.get("k", table="staged") is None  # declared: empty, not an error
        assert list(store.items(table="staged")) == [] and store.count("staged") == 0
        assert store.get("k") is None and store.count() == 0  # "default" always exists
        assert store.tables() == ["buffer", "staged"]
        assert store.has_table("buffer") and not store.has_table("bufer")
    with statelog.open(store_path, readonly=True) as ro:
        assert ro.get("k", table="buffer") == 1
        with pytest.raises(statelog.UnknownTableError):
            ro.get("k", table="staged")  # declared by the writer, not by this reader


@pytest.mark.parametrize(
    "tables,why",
    [
        pytest.param("buffer", "single name", id="a-str"),
        pytest.param(("ok", ""), "empty", id="empty-name"),
        pytest.param(("ok", 3), "must be a str", id="not-a-str"),
        pytest.param(5, "a tuple of table names", id="not-iterable"),
    ],
)
def test_bad_declared_tables_are_refused(store_path: Path, tables: Any, why: str) -> None:
    with pytest.raises(statelog.InvalidOptionError, match=why):
        statelog.open(store_path, tables=tables)
    assert not store_path.exists()


def test_commit_takes_offsets_and_watermark_as_optional(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        assert store.commit({"a": 1}) == 1  # put positional, nothing else
        assert store.offsets == {} and store.low_watermark_ms == 0
        store.commit(offsets={"p": 3}, low_watermark_ms=10)
        store.commit(put={"b": 2})  # omitted: unchanged
        assert store.offsets == {"p": 3} and store.low_watermark_ms == 10
        store.commit(offsets={"q": 1})
        assert store.offsets == {"p": 3, "q": 1} and store.low_watermark_ms == 10
    with statelog.open(store_path) as store:
        assert store.epoch == 4 and store.offsets == {"p": 3, "q": 1}
        assert store.low_watermark_ms == 10 and store.get("a") == 1


@pytest.mark.parametrize("durability", ["commit", "group", "none"])
def test_wait_durable_refuses_an_epoch_never_committed_at_once(
    store_path: Path, durability: str
) -> None:
    with statelog.open(store_path, durability=durability) as store:
        e = store.commit({"a": 1})
        started = time_module.monotonic()
        with pytest.raises(statelog.EpochNotCommittedError, match=f"latest epoch .* is {e}"):
            store.wait_durable(e + 10)
        assert time_module.monotonic() - started < 1.0
        assert store.wait_durable(e, timeout=5) is True
        assert store.wait_durable(e, timeout=timedelta(seconds=5)) is True


@pytest.mark.parametrize(
    "epoch,timeout",
    [("1", None), (1.0, None), (1, -1), (1, "5"), (1, float("nan")), (1, timedelta(seconds=-1))],
)
def test_wait_durable_refuses_bad_arguments(store_path: Path, epoch: Any, timeout: Any) -> None:
    with statelog.open(store_path, durability="group") as store:
        store.commit({"a": 1})
        with pytest.raises(statelog.InvalidOptionError):
            store.wait_durable(epoch, timeout)


@pytest.mark.parametrize(
    "name,seconds",
    [("group_delay", 0.005), ("compactor_interval", 30), ("overlay_wait", 2.5)],
)
def test_durations_are_taken_as_seconds_too(store_path: Path, name: str, seconds: float) -> None:
    opts = statelog.StoreOptions(**{name: seconds})
    assert getattr(opts, name) == timedelta(seconds=seconds)
