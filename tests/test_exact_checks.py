"""The commit path's batch encoder and key check: the C build and the Python reference agree.

A batch the encoder calls plain is encoded as it is, so an encoder that takes a
subclass, a set or a bytearray for plain would store a value that comes back
as another type, and one whose bytes differ from msgspec's would write records
no other reader expects. Each row is a batch and whether both implementations
encode it (to msgspec's bytes of each value); a table of every msgpack header
size follows; Hypothesis then draws batches mixing plain and odd objects and
compares the two.
"""

from __future__ import annotations

import enum
import subprocess
import sys
import uuid
from collections import OrderedDict
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import statelog
from statelog.format import exact, values
from statelog.format.values import encode_value, encode_values
from statelog.storage.image import encode_key, encode_keys


class _Side(enum.IntEnum):
    LEDGER = 1


class _Tag(enum.StrEnum):
    A = "a"


class _Str(str):
    pass


class _Float(float):
    pass


class _Bytes(bytes):
    pass


class _Dict(dict[Any, Any]):
    pass


class _List(list[Any]):
    pass


class _AnyEqual(type):
    """A metaclass whose classes hash and compare equal to int: a check that looks a
    type up by equality (``type(v) in {int, ...}``) takes them for int."""

    def __hash__(cls) -> int:
        return hash(int)

    def __eq__(cls, other: object) -> bool:
        return True


class _SetLikeInt(set[Any], metaclass=_AnyEqual):
    pass


class _Disguised(set[Any]):
    """A set that says it is an int when asked for ``__class__``."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return int


_ROW = {"id": 7, "side": "ledger", "amt": 1.5, "raw": b"x", "ok": None, "flag": True}

# (batch, encoded as it is?)
BATCHES: list[Any] = [
    pytest.param([], True, id="empty"),
    pytest.param([1, "a", 1.5, b"b", True, None, 2**64 - 1, -(2**63)], True, id="plain-values"),
    pytest.param([dict(_ROW) for _ in range(5)], True, id="dicts-of-plain"),
    pytest.param([{}, {}], True, id="empty-dicts"),
    pytest.param([{1: "x", b"k": 2.0, None: None, 1.5: b"", False: 0}], True, id="plain-keys"),
    pytest.param([1, {"a": 1}], True, id="a-plain-value-then-a-dict"),
    pytest.param([{"a": 1}, 1], True, id="a-dict-then-a-plain-value"),
    pytest.param([_Side.LEDGER], False, id="int-enum-value"),
    pytest.param([_Tag.A], False, id="str-enum-value"),
    pytest.param([_Str("x")], False, id="str-subclass-value"),
    pytest.param([_Float(1.0)], False, id="float-subclass-value"),
    pytest.param([_Bytes(b"x")], False, id="bytes-subclass-value"),
    pytest.param([_SetLikeInt({1})], False, id="type-equal-to-int"),
    pytest.param([_Disguised({1})], False, id="class-attribute-says-int"),
    pytest.param([{"a": _SetLikeInt({1})}], False, id="type-equal-to-int-in-dict"),
    pytest.param([{"a": _Disguised({1})}], False, id="class-attribute-says-int-in-dict"),
    pytest.param([bytearray(b"x")], False, id="bytearray-value"),
    pytest.param([memoryview(b"x")], False, id="memoryview-value"),
    pytest.param([(1, 2)], False, id="tuple-value"),
    pytest.param([[1]], False, id="list-value"),
    pytest.param([{"a": 1}, _Dict(a=1)], False, id="dict-subclass"),
    pytest.param([OrderedDict(a=1)], False, id="ordered-dict"),
    pytest.param([{"a": {"b": 1}}], False, id="nested-dict"),
    pytest.param([{"a": [1]}], False, id="list-in-dict"),
    pytest.param([{"a": {1}}], False, id="set-in-dict"),
    pytest.param([{"a": date(2024, 1, 2)}], False, id="date-in-dict"),
    pytest.param([{"a": Decimal(1)}], False, id="decimal-in-dict"),
    pytest.param([{"a": uuid.UUID(int=1)}], False, id="uuid-in-dict"),
    pytest.param([{1: "x"}, {_Side.LEDGER: "y"}], False, id="enum-key-equal-to-a-plain-key"),
    pytest.param([{"a": 1}, {_Tag.A: 1}], False, id="str-enum-key-equal-to-a-plain-key"),
    pytest.param([{(1, 2): 1}], False, id="tuple-key"),
    pytest.param([{_Bytes(b"k"): 1}], False, id="bytes-subclass-key"),
    pytest.param([dict(_ROW) for _ in range(99)] + [{"x": _Side.LEDGER}], False, id="last-of-100"),
]

IMPLEMENTATIONS = [
    pytest.param(exact.encode_plain_py, id="python"),
    pytest.param(exact.encode_plain, id="built"),
]
_msgspec = msgspec.msgpack.Encoder().encode


def test_the_c_checks_are_built() -> None:
    """`make` builds them on a machine with a C compiler; a missing build would
    leave every commit on the slower Python path without a word."""
    assert exact.ACCELERATED, "statelog/format/_exact.c was not built: reinstall with a compiler"


@pytest.mark.parametrize("encode", IMPLEMENTATIONS)
@pytest.mark.parametrize("batch,plain", BATCHES)
def test_a_batch_is_encoded_as_it_is_only_when_every_object_is_of_an_exact_plain_type(
    encode: Any, batch: list[Any], plain: bool
) -> None:
    encoded = encode(batch)
    assert (encoded is not None) is plain
    if encoded is not None:
        assert encoded == [_msgspec(v) for v in batch]


def _sized(n: int) -> list[int]:
    return [n - 1, n, n + 1]


# Every header size msgpack has, at and around each limit; None: not encodable here.
HEADERS: list[Any] = [
    pytest.param([*range(-40, 140), *_sized(2**8), *_sized(2**16), *_sized(2**32)], id="ints"),
    pytest.param([-129, -128, -(2**15) - 1, -(2**15), -(2**31) - 1, -(2**31)], id="negative-ints"),
    pytest.param([*_sized(2**30), *_sized(2**60), -(2**30), -(2**60) - 1], id="int-digits"),
    pytest.param([2**63 - 1, 2**63, 2**64 - 1, -(2**63)], id="64-bit-ints"),
    pytest.param(["x" * n for n in (0, 31, 32, 255, 256, 65535, 65536)], id="str-lengths"),
    pytest.param(["é", "\U0001f600" * 8, "é" * 16, "ß" * 200], id="non-ascii-str"),
    pytest.param([b"x" * n for n in (0, 255, 256, 65535, 65536)], id="bytes-lengths"),
    pytest.param([0.0, -0.0, float("inf"), -float("inf"), 1e-310, 2.5], id="floats"),
    pytest.param([{i: i for i in range(n)} for n in (0, 15, 16, 65535, 65536)], id="dict-sizes"),
    pytest.param([{"a": "é" * 40, b"b": 2**64 - 1, None: -(2**63)}], id="dict-of-each"),
]


@pytest.mark.parametrize("encode", IMPLEMENTATIONS)
@pytest.mark.parametrize("batch", HEADERS)
def test_the_encoder_writes_msgspecs_bytes_for_every_header_size(
    encode: Any, batch: list[Any]
) -> None:
    assert encode(batch) == [_msgspec(v) for v in batch]


@pytest.mark.parametrize("encode", IMPLEMENTATIONS)
@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(2**64, id="int-over-2**64-1"),
        pytest.param(-(2**63) - 1, id="int-under--2**63"),
        pytest.param(10**30, id="int-of-many-digits"),
        pytest.param("a\ud800", id="lone-surrogate"),
        pytest.param({"a": 2**64}, id="int-over-in-dict"),
        pytest.param({"\udfff": 1}, id="lone-surrogate-key"),
    ],
)
def test_a_value_that_does_not_encode_sends_the_whole_batch_back(encode: Any, bad: Any) -> None:
    """None, never an exception and never a partial list: the per-value path names
    the error (``encode_values`` raises it, tested below)."""
    assert encode([{"ok": 1}, "fine", bad]) is None
    with pytest.raises((OverflowError, UnicodeEncodeError)):
        encode_values([bad])


KEYS: list[Any] = [
    pytest.param([], 4, True, id="empty"),
    pytest.param(["abcd", b"abcd", ""], 4, True, id="at-the-limit"),
    pytest.param(["abcde"], 4, False, id="str-over-the-limit"),
    pytest.param([b"abcde"], 4, False, id="bytes-over-the-limit"),
    pytest.param(["\U0001f600" * 4], 4, True, id="characters-not-bytes"),
    pytest.param([_Str("a")], 4, False, id="str-subclass"),
    pytest.param([_Bytes(b"a")], 4, False, id="bytes-subclass"),
    pytest.param([_Tag.A], 4, False, id="str-enum"),
    pytest.param([bytearray(b"a")], 4, False, id="bytearray"),
    pytest.param(["a", 1], 4, False, id="int"),
    pytest.param(["a", None], 4, False, id="none"),
]


@pytest.mark.parametrize("check", [exact.plain_keys_py, exact.plain_keys])
@pytest.mark.parametrize("keys,max_len,plain", KEYS)
def test_keys_are_plain_only_when_exact_str_or_bytes_within_the_length(
    check: Any, keys: list[Any], max_len: int, plain: bool
) -> None:
    assert check(keys, max_len) is plain


TAGGED: list[Any] = [
    pytest.param([], [], id="empty"),
    pytest.param(["", b""], [b"\x01", b"\x00"], id="empty-keys"),
    pytest.param(["abc", b"abc"], [b"\x01abc", b"\x00abc"], id="ascii-and-bytes"),
    pytest.param(["\xe9", "\U0001f600"], [b"\x01\xc3\xa9", b"\x01\xf0\x9f\x98\x80"], id="utf-8"),
    pytest.param([b"\x00\xff" * 300], [b"\x00" + b"\x00\xff" * 300], id="long-bytes"),
    pytest.param(["a", "\udc80"], None, id="lone-surrogate"),
    pytest.param(["a", _Str("b")], None, id="str-subclass"),
    pytest.param([b"a", _Bytes(b"b")], None, id="bytes-subclass"),
    pytest.param([_Tag.A], None, id="str-enum"),
    pytest.param([bytearray(b"a")], None, id="bytearray"),
    pytest.param(["a", 1], None, id="int"),
]


@pytest.mark.parametrize("encode", [exact.tagged_keys_py, exact.tagged_keys])
@pytest.mark.parametrize("keys,tagged", TAGGED)
def test_keys_are_tagged_as_an_image_stores_them(
    encode: Any, keys: list[Any], tagged: list[bytes] | None
) -> None:
    assert encode(keys) == tagged
    if tagged is not None:
        assert tagged == [encode_key(k) for k in keys]


@pytest.mark.parametrize(
    "keys,error",
    [(["a", "\udc80"], UnicodeEncodeError), (["a", 1], TypeError), ([None], TypeError)],
    ids=["lone-surrogate", "int", "none"],
)
def test_a_key_no_image_stores_is_named_by_the_per_key_path(keys: list[Any], error: type) -> None:
    with pytest.raises(error):
        encode_keys(keys)


@pytest.mark.skipif(not exact.ACCELERATED, reason="the C checks were not built")
@pytest.mark.parametrize("not_a_list", [(1, 2), _List(["a"])], ids=["tuple", "list-subclass"])
def test_the_built_checks_take_only_a_list(not_a_list: Any) -> None:
    """A list subclass could answer for its items other than its storage holds."""
    with pytest.raises(TypeError):
        exact.encode_plain(not_a_list)
    with pytest.raises(TypeError):
        exact.plain_keys(not_a_list, 4)
    with pytest.raises(TypeError):
        exact.tagged_keys(not_a_list)


_odd = st.sampled_from(
    [
        _Side.LEDGER,
        _Tag.A,
        _Str("s"),
        _Float(2.0),
        _Bytes(b"b"),
        _SetLikeInt({3}),
        _Disguised({4}),
        bytearray(b"b"),
        (1,),
        [1],
        {2},
        date(2000, 1, 1),
    ]
)
# Lone surrogates, which no UTF-8 encoder takes, and their neighbours, which it does.
_near_surrogates = st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010, exclude_categories=())
_plain = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**65),  # beyond msgpack's range on both sides too
    st.floats(),
    st.text(max_size=4),
    st.text(_near_surrogates, max_size=3),
    st.binary(max_size=4),
)
_key = st.one_of(_plain, st.sampled_from([_Side.LEDGER, _Tag.A, _Str("k"), _Bytes(b"k"), (1, 2)]))
_dicts = st.dictionaries(_key.filter(lambda k: k == k), st.one_of(_plain, _odd), max_size=4)
_batches = st.one_of(
    st.lists(st.one_of(_plain, _odd), max_size=8),
    st.lists(_dicts, max_size=8),
    st.lists(st.one_of(_plain, _dicts), max_size=8),
)


@settings(max_examples=500, deadline=None)
@given(_batches)
def test_the_built_encoder_answers_as_the_python_one(batch: list[Any]) -> None:
    assert exact.encode_plain(batch) == exact.encode_plain_py(batch)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=6), st.binary(max_size=6), _key), max_size=8))
def test_the_built_key_check_answers_as_the_python_one(keys: list[Any]) -> None:
    assert exact.plain_keys(keys, 4) is exact.plain_keys_py(keys, 4)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=6), st.text(_near_surrogates, max_size=3),
                          st.binary(max_size=6), _key), max_size=8))  # fmt: skip
def test_the_built_key_encoder_answers_as_the_python_one(keys: list[Any]) -> None:
    assert exact.tagged_keys(keys) == exact.tagged_keys_py(keys)


@pytest.mark.parametrize("batch,plain", BATCHES)
def test_a_commit_encodes_alike_with_either_encoder(
    batch: list[Any], plain: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes or the error of a batch do not depend on which encoder ran."""

    def outcome() -> Any:
        try:
            return encode_values(batch)
        except (TypeError, OverflowError) as exc:
            return type(exc)

    built = outcome()
    monkeypatch.setattr(values, "encode_plain", exact.encode_plain_py)
    assert outcome() == built
    if not isinstance(built, type):
        assert built == [encode_value(v) for v in batch]


def test_without_the_build_a_store_commits_on_the_python_checks(tmp_path: Path) -> None:
    """A machine without a compiler installs statelog all the same: the import of the
    C module fails, the Python checks answer, and a commit and its refusals work."""
    script = """
import sys
sys.modules["statelog.format._exact"] = None  # as if it was never built
import enum, statelog
from statelog.format import exact
assert not exact.ACCELERATED and exact.encode_plain is exact.encode_plain_py
class Side(enum.IntEnum):
    A = 1
with statelog.open(sys.argv[1]) as s:
    s.commit({"k": {"id": 1, "side": "a"}})
    try:
        s.commit({"j": {"side": Side.A}})
    except statelog.InvalidCommitError:
        pass
    else:
        raise SystemExit("an IntEnum value was stored")
    assert s.get("k") == {"id": 1, "side": "a"} and s.get("j") is None and s.epoch == 1
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "s")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


class _DisguisedKey(frozenset[Any]):
    """A frozenset (hashable, so it can be a key) that says it is a str."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return str


class _DisguisedInt(frozenset[Any]):
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return int


@pytest.mark.parametrize(
    "commit",
    [
        pytest.param({"put": {"k": _Disguised({1})}}, id="value-says-int"),
        pytest.param({"put": {"k": _SetLikeInt({1})}}, id="value-type-equal-to-int"),
        pytest.param({"put": {"k": {"f": _Disguised({1})}}}, id="field-says-int"),
        pytest.param({"put": {"k": {_DisguisedKey({1}): 1}}}, id="field-key-says-str"),
        pytest.param({"put": {_DisguisedKey({1}): 1}}, id="key-says-str"),
        pytest.param({"delete": [_DisguisedKey({1})]}, id="deleted-key-says-str"),
        pytest.param({"offsets": {"p0": _DisguisedInt({1})}}, id="offset-says-int"),
        pytest.param({"low_watermark_ms": _DisguisedInt({1})}, id="watermark-says-int"),
        pytest.param({"put": {"k": 1}, "table": _DisguisedKey({1})}, id="table-says-str"),
    ],
)
def test_an_object_that_lies_about_its_type_is_refused_and_nothing_written(
    tmp_path: Path, commit: dict[str, Any]
) -> None:
    """Types are read from the object itself, never from ``__class__`` or by equality:
    a set stored as an int, or a frozenset as a key, would come back as something else,
    or leave a record that recovery must refuse."""
    with statelog.open(tmp_path / "s") as s:
        s.commit({"before": 1}, offsets={"p0": 5}, low_watermark_ms=10)
        with pytest.raises(statelog.InvalidCommitError):
            s.commit(**commit)
        assert (s.epoch, s.offsets, s.low_watermark_ms) == (1, {"p0": 5}, 10)
    with statelog.open(tmp_path / "s", readonly=True) as ro:
        assert ro.epoch == 1 and ro.get("before") == 1


@pytest.mark.skipif(not exact.ACCELERATED, reason="the C checks were not built")
@pytest.mark.parametrize(
    "call,expected",
    [
        ("encode_plain", "[msgspec.msgpack.encode(v) for v in batch]"),
        ("tagged_keys", "[b'\\x01' + v.encode() for v in batch]"),
    ],
)
def test_a_finalizer_that_empties_the_batch_during_the_call_crashes_nothing(
    call: str, expected: str
) -> None:
    """Allocating the result may run a collection, whose finalizers may change the
    batch; an encoder that went on with the size it read before would read freed
    memory. The answer is then None (the per-value path reads the batch anew) or, where
    no collection ran, the answer for the batch as it was."""
    script = f"""
import gc, sys, msgspec
from statelog.format import _exact
batch = [str(i) * 50 for i in range(2000)]
before = {expected}"""
    script += """
class Clears:
    def __del__(self):
        batch.clear()
gc.disable()
c = Clears(); c.me = c; del c
keep = [[] for _ in range(200)]  # no free list left: the result list comes from the collector
gc.set_threshold(1)
gc.enable()
out = getattr(_exact, sys.argv[1])(batch)
assert out is None or out == before, out
print("cleared" if not batch else "kept")
"""
    done = subprocess.run([sys.executable, "-c", script, call], capture_output=True, text=True)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.strip() == "cleared"  # the collection ran during the call
