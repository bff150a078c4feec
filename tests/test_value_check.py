"""The read's value check in C: what it proves, msgspec decodes.

Every replay, fold, restore and snapshot check runs :func:`check_values` over each
value it reads. Values that :func:`decodable_prefix` proves are not decoded, so
a proof of a value that msgspec would refuse would let a record or a snapshot
that a read cannot decode pass as clean. The tables name the bytes it must
leave to msgspec and the values it must prove (else the fast path is dead);
Hypothesis then draws encoded values, mutates them, and draws raw bytes, and
holds every proof to a decode.
"""

from __future__ import annotations

import inspect
import mmap
import subprocess
import sys
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statelog.format import values
from statelog.format.records import DECODE_ERRORS
from statelog.format.values import check_values, decodable_prefix, decode_value, encode_value

_raw = msgspec.msgpack.encode


def _decodes(data: bytes | memoryview) -> bool:
    try:
        decode_value(data)
    except DECODE_ERRORS:
        return False
    return True


def _proven(data: bytes) -> bool:
    return decodable_prefix([data]) == 1


def test_this_build_checks_in_c() -> None:
    assert values.CHECKED_IN_C, "statelog/format/_msgcheck.c was not built: reinstall"


def _nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\x01"  # depth one-item arrays around an int


# (why, bytes): msgspec decodes each, but their rules are msgspec's to apply.
LEFT_TO_MSGSPEC: list[tuple[str, bytes]] = [
    ("a non-ASCII str", _raw("é")),
    ("a datetime extension", encode_value(datetime(2026, 1, 2, tzinfo=UTC))),
    ("a date extension", encode_value(date(2026, 1, 2))),
    ("a Decimal extension", encode_value(Decimal("1.5"))),
    ("a msgpack timestamp", _raw(datetime(2026, 1, 2, tzinfo=UTC))),
    ("an array as a map key", b"\x81\x91\x01\x02"),
    ("33 levels of nesting", _nested(33)),
    ("str and bytes keys in one map", b"\x82\xa1a\x01\xc4\x01b\x02"),
]

# (why, bytes): msgspec refuses each.
REFUSED: list[tuple[str, bytes]] = [
    ("nothing", b""),
    ("the never-used tag 0xc1", b"\xc1"),
    ("a byte after the object", b"\x01\x02"),
    ("a truncated uint32", b"\xce\x00\x01"),
    ("a truncated str 8", b"\xd9\x05abc"),
    ("a truncated bin 32", b"\xc6\x00\x00\x00\x09ab"),
    ("an array missing an item", b"\x92\x01"),
    ("a map missing its last value", b"\x82\xa1a\x01\xa1b"),
    ("an array 32 claiming 2**32-1 items", b"\xdd\xff\xff\xff\xff\x01"),
    ("a map 32 claiming 2**32-1 pairs", b"\xdf\xff\xff\xff\xff\x01\x01"),
    ("invalid UTF-8", b"\xa2\xff\xfe"),
    ("a lone surrogate in UTF-8", b"\xa3\xed\xa0\x80"),
    ("an unknown extension", b"\xd4\x07\x00"),
    ("a map as a map key", b"\x81\x80\x01"),
    ("a truncated float 64", b"\xcb\x00\x00"),
]

# Values the proof must cover: what the reconciler workload and most stores hold.
PROVEN: list[tuple[str, Any]] = [
    ("nil, booleans", [None, True, False]),
    ("every int width", [0, 127, 128, 255, 65_535, 2**32, 2**64 - 1, -1, -33, -(2**63)]),
    ("a float", 1.5),
    ("ASCII strings of every length form", ["", "a" * 31, "b" * 32, "c" * 300, "d" * 70_000]),
    ("bytes of every length form", [b"", b"x" * 300, b"y" * 70_000]),
    ("a dict of scalar keys", {"a": 1, 2: "b", None: 1.5, True: [], 0.5: {}}),
    ("a long array", list(range(20_000))),
    ("a large map", {str(i): i for i in range(20_000)}),
    ("32 levels of nesting", msgspec.Raw(_nested(32))),
    ("an empty array 33 levels deep", msgspec.Raw(b"\x91" * 32 + b"\x90")),
    ("maps of str keys and of bytes keys apart", [{"a": 1}, {b"a": 1}]),
    ("a workload buffer record", {"txn_id": 1, "amount_cents": 250, "currency": "EUR"}),
]


@pytest.mark.parametrize(("why", "data"), LEFT_TO_MSGSPEC, ids=[w for w, _ in LEFT_TO_MSGSPEC])
def test_what_is_outside_the_plain_part_is_left_to_msgspec(why: str, data: bytes) -> None:
    assert _decodes(data), why
    assert not _proven(data), why
    check_values([data])


@pytest.mark.parametrize(("why", "data"), REFUSED, ids=[w for w, _ in REFUSED])
def test_bytes_msgspec_refuses_are_never_proven(why: str, data: bytes) -> None:
    assert not _decodes(data), why
    assert not _proven(data), why
    with pytest.raises(DECODE_ERRORS):
        check_values([_raw(1), data, _raw(2)])


@pytest.mark.parametrize(("why", "value"), PROVEN, ids=[w for w, _ in PROVEN])
def test_plain_values_are_proven_without_decoding(why: str, value: Any) -> None:
    data = _raw(value)
    assert _proven(data), why
    assert decodable_prefix([data, memoryview(b"\x00" + data)[1:]]) == 2, why


def test_the_prefix_stops_at_the_first_value_it_cannot_prove() -> None:
    good, odd = _raw({"a": 1}), _raw("é")
    assert decodable_prefix([good, good, odd, good]) == 2
    assert decodable_prefix([good, bytearray(good), good]) == 1  # only bytes and memoryview
    assert decodable_prefix([good, memoryview(good * 2)[::2]]) == 1  # not contiguous
    assert decodable_prefix([]) == 0
    with pytest.raises(TypeError):
        decodable_prefix((good,))  # type: ignore[arg-type]


def test_a_bad_value_after_proven_ones_is_still_refused() -> None:
    """check_values decodes from the first value not proven on: a fault that stopped
    after the proven prefix, or skipped the rest, would pass this record."""
    batch = [_raw(i) for i in range(1000)] + [_raw("é"), b"\xa2\xff\xfe", _raw(1)]
    with pytest.raises(msgspec.DecodeError):
        check_values(batch)
    check_values(batch[:1001])


def test_a_released_view_is_never_proven() -> None:
    """A released memoryview keeps its old pointer: read through it, the proof would
    pass a value msgspec refuses, and read freed (or unmapped) memory."""
    held = memoryview(bytes(_raw({"a": 1})))
    held.release()
    mapped = mmap.mmap(-1, 4096)
    mapped[0] = 1
    view = memoryview(mapped)[:1]
    view.release()
    mapped.close()
    for released in (held, view):
        assert decodable_prefix([released]) == 0
        with pytest.raises(ValueError, match="released"):
            check_values([released])


def test_the_proof_counts_against_the_recursion_limit_as_msgspec_does() -> None:
    """Nesting that a read decodes at the default limit may not decode near the limit:
    then it is not proven, whatever the interpreter counts the limit against."""
    data = _nested(30)
    assert _proven(data)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 15)
    try:
        proven, decodes = _proven(data), _decodes(data)
    finally:
        sys.setrecursionlimit(old)
    assert decodes or not proven


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=40)
)
_keys = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5) | st.binary(max_size=5)
_objects = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=25,
)
_plain_keys = (
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text("abc")
)
_ascii_objects = st.recursive(
    _scalars.filter(lambda v: not isinstance(v, str) or v.isascii()),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_plain_keys, inner, max_size=5),
    max_leaves=25,
)
_odd = st.sampled_from([data for _, data in LEFT_TO_MSGSPEC + REFUSED])


@settings(max_examples=400, deadline=None)
@given(_ascii_objects)
def test_every_plain_object_is_proven(value: Any) -> None:
    assert _proven(_raw(value))


@settings(max_examples=600, deadline=None)
@given(
    st.lists(_objects.map(_raw) | _odd, min_size=1, max_size=4).map(b"".join),
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4),
    st.integers(0, 400),
)
def test_a_proof_always_means_msgspec_decodes(base: bytes, flips: list, cut: int) -> None:
    """Joined values (so the trailing bytes rule is exercised), flipped bytes, and a
    truncation: whatever results, a proven value is one msgspec decodes."""
    data = bytearray(base)
    for at, byte in flips:
        if data:
            data[at % len(data)] = byte
    for candidate in (bytes(data), bytes(data[: cut % (len(data) + 1)])):
        if _proven(candidate):
            assert _decodes(candidate), candidate


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=64))
def test_a_proof_of_raw_bytes_means_msgspec_decodes(data: bytes) -> None:
    if _proven(data):
        assert _decodes(data), data


def test_without_the_build_every_value_is_decoded_to_check_it() -> None:
    script = """
import sys
sys.modules["statelog.format._msgcheck"] = None  # as if it was never built
import msgspec
from statelog.format import values
assert not values.CHECKED_IN_C and values.decodable_prefix([b"\\x01"]) == 0
values.check_values([b"\\x01", b"\\x81\\xa1a\\x02"])
try:
    values.check_values([b"\\x01", b"\\xc1"])
except msgspec.DecodeError:
    pass
else:
    raise SystemExit("a bad value passed")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
