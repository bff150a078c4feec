"""The stored value types: the format's table of examples, hostile extensions, and what is refused.

``docs/format.md`` ("Value types") lists the bytes the encoder writes for
each extension; this module executes that table, then checks that a
reader refuses a bad extension as damage (never as a value of another
type) and that every accepted type survives a round trip through a store,
its log and its snapshot.
"""

from __future__ import annotations

import enum
import re
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import statelog
from compactor import compact
from statelog.format.records import DECODE_ERRORS
from statelog.format.values import check_values, decode_value, encode_value, encode_values

FORMAT = Path(__file__).resolve().parents[1] / "docs" / "format.md"


def _example_rows() -> list[tuple[str, str]]:
    section = FORMAT.read_text().split("**Value types.**", 1)[1].split("**Applying a record.**")[0]
    rows = re.findall(r"^\| `([^`]+)` \| `([0-9a-f ]+)`", section, flags=re.M)
    assert len(rows) == 4, "the table of examples changed shape"
    return rows


@pytest.mark.parametrize("expr,hex_bytes", _example_rows())
def test_the_formats_value_examples_are_what_the_encoder_writes(expr: str, hex_bytes: str) -> None:
    names = {"Decimal": Decimal, "date": date, "datetime": datetime}
    value = eval(expr, {**names, "timezone": timezone, "timedelta": timedelta})
    assert encode_value(value).hex(" ") == hex_bytes
    back = decode_value(bytes.fromhex(hex_bytes))
    assert back == value and type(back) is type(value)


def _ext(code: int, payload: bytes) -> bytes:
    return msgspec.msgpack.encode(msgspec.msgpack.Ext(code, payload))


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_ext(9, b"x"), id="unknown-type"),
        pytest.param(_ext(1, b"not a time"), id="datetime-garbage"),
        pytest.param(_ext(1, b"2024-13-01T00:00:00"), id="datetime-month-13"),
        pytest.param(_ext(1, b"2024-01-01T00:00:00" + b"0" * 80), id="datetime-too-long"),
        pytest.param(_ext(2, b"2021-02-29"), id="date-not-a-day"),
        pytest.param(_ext(2, b"\xff\xfe"), id="date-not-ascii"),
        pytest.param(_ext(3, b"1.2.3"), id="decimal-garbage"),
        pytest.param(_ext(3, b"\xff"), id="decimal-not-ascii"),
        pytest.param(_ext(0, b""), id="type-0"),
    ],
)
def test_a_bad_extension_is_refused_as_damage(data: bytes) -> None:
    with pytest.raises(DECODE_ERRORS):
        decode_value(data)
    with pytest.raises(DECODE_ERRORS):  # the check of replay, which keeps no value
        check_values([encode_value(1), data, encode_value(2)])
    check_values([encode_value(1), encode_value({"a": [1.5, None]})])


def test_the_timestamp_extension_of_older_stores_still_reads() -> None:
    when = datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    older = msgspec.msgpack.encode(when)  # what statelog wrote before its own extension
    assert older[0] == 0xD6 and older[1] == 0xFF
    assert decode_value(older) == when and decode_value(older).tzinfo == UTC


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.datetimes(timezones=st.one_of(st.none(), st.timezones())),
    st.dates(),
    st.decimals(allow_nan=False, places=3),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 99)), inner, max_size=4),
    ),
    max_leaves=12,
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return type(b) is list and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, datetime) and a.tzinfo is not None:
        # A fixed offset equal to the zone's at that instant: the same wall time and
        # offset. (Python never calls a time in a zone's fold equal to another zone's.)
        same_wall = a.replace(tzinfo=None) == b.replace(tzinfo=None)
        return type(b) is datetime and same_wall and a.utcoffset() == b.utcoffset()
    return type(a) is type(b) and a == b and str(a) == str(b)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_every_accepted_value_decodes_to_itself(value: Any) -> None:
    assert _same(value, decode_value(encode_value(value)))


@settings(max_examples=200, deadline=None)
@given(st.lists(_values, max_size=6))
def test_a_batch_encodes_to_the_bytes_of_each_value(values: list[Any]) -> None:
    assert encode_values(values) == [encode_value(v) for v in values]


class _Side(enum.IntEnum):
    LEDGER = 1


_PLAIN_ROWS = [{"id": n, "side": "ledger", "amt": 1.5, "raw": b"x", "ok": None} for n in range(50)]


@pytest.mark.parametrize(
    "odd",
    [
        pytest.param({"at": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)}, id="datetime-value"),
        pytest.param({"day": date(2024, 1, 2)}, id="date-value"),
        pytest.param({"amount": Decimal("-0.10")}, id="decimal-value"),
        pytest.param({"tags": ("a", "b")}, id="tuple-value"),
        pytest.param({"nested": {"k": [1, 2]}}, id="nested"),
        pytest.param(7, id="a-plain-value-among-dicts"),
    ],
)
def test_a_batch_with_one_value_needing_an_extension_encodes_it_as_alone(odd: Any) -> None:
    """msgspec would write a datetime or Decimal its own way: the batch must not take it raw."""
    batch = [*_PLAIN_ROWS, odd]
    assert encode_values(batch) == [encode_value(v) for v in batch]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"side": _Side.LEDGER}, id="int-enum-value"),
        pytest.param({"ids": {1, 2}}, id="set-value"),
        pytest.param({"id": uuid.UUID(int=1)}, id="uuid-value"),
        pytest.param({"buf": bytearray(b"x")}, id="bytearray-value"),
        pytest.param({_Side.LEDGER: 1}, id="int-enum-key"),
        pytest.param({(1, 2): 1}, id="tuple-key"),
        pytest.param(_Side.LEDGER, id="int-enum-alone"),
    ],
)
def test_a_batch_with_one_refused_value_is_refused(bad: Any) -> None:
    """msgspec would encode each of these as another type: one in a batch refuses the batch."""
    with pytest.raises(TypeError, match="is not"):
        encode_values([*_PLAIN_ROWS, bad])


def test_an_enum_key_equal_to_a_plain_key_of_another_value_is_refused() -> None:
    """Equal keys in two values of a batch (1 and an IntEnum member of value 1) are
    still each checked: the enum would otherwise be written as a plain int."""
    with pytest.raises(TypeError, match="is not"):
        encode_values([{1: "x"}, {_Side.LEDGER: "y"}])


def test_values_survive_the_log_and_a_snapshot(tmp_path: Path) -> None:
    values = {
        "naive": datetime(2024, 2, 29, 23, 59, 59, 1),
        "aware": datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        "date": date(1, 1, 1),
        "decimal": Decimal("-12.3400"),
        "mixed": [Decimal("1E+2"), {"d": date(2000, 1, 1)}],
    }
    store = tmp_path / "s"
    with statelog.open(store, segment_bytes=4096) as s:
        s.commit(values)
        for i in range(60):  # roll segments, so a pass has sealed log to fold
            s.commit({f"pad{i}": "x" * 100})
    compact(store)
    with statelog.open(store, readonly=True) as ro:
        assert ro.recovery.snapshot is not None  # the values came through the snapshot
        for k, v in values.items():
            assert _same(v, ro.get(k)), k
