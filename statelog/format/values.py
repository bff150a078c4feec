"""The codec of stored values: which Python values statelog keeps, and how they round-trip.

A value is stored as one msgpack object (``docs/format.md``, "Values").
Every value of these types comes back equal and of the same type:

=====================  ==============================================
``None``, ``bool``     msgpack nil, true, false
``int``                msgpack int (-2**63 .. 2**64-1)
``float``              msgpack float 64
``str``, ``bytes``     msgpack str (UTF-8), bin
``list``               msgpack array
``tuple``              msgpack array: comes back as a ``list``
``dict``               msgpack map; keys ``None``, bool, int, float, str or bytes
``datetime``           ext 1: ``isoformat()`` as UTF-8, naive or aware
``date``               ext 2: ``isoformat()`` as UTF-8
``Decimal``            ext 3: ``str()`` as UTF-8 (precision and sign kept)
=====================  ==============================================

An aware ``datetime`` comes back with a fixed UTC offset
(:class:`datetime.timezone`) equal to its own at that instant: the same
wall time, offset and instant, but not the same ``ZoneInfo`` object. Anything
else (sets, subclasses such as enums or a pandas ``Timestamp``, dataclasses,
``time``, ``timedelta``, UUIDs) is refused at commit: msgpack would keep it
only as a string or a list, and a reader would get another type back.

Values written before the extensions existed decode as they did: an aware
``datetime`` stored as the msgpack timestamp extension (-1) comes back in UTC.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from itertools import islice
from typing import Any

import msgspec

from statelog.format.exact import PLAIN_TYPE_IDS, encode_plain

__all__ = [
    "CHECKED_IN_C",
    "EXT_DATE",
    "EXT_DATETIME",
    "EXT_DECIMAL",
    "VALUE_TYPES",
    "check_values",
    "decodable_prefix",
    "decode_value",
    "decode_values",
    "encode_value",
    "encode_values",
]

EXT_DATETIME = 1
EXT_DATE = 2
EXT_DECIMAL = 3

VALUE_TYPES = "None, bool, int, float, str, bytes, list, tuple, dict, datetime, date, Decimal"
"""The stored value types, as the commit's error message names them."""

_MAX_EXT_TEXT = 64  # the longest isoformat() of a datetime is 32 characters


def _convert(v: Any) -> Any:
    """``v`` with datetimes, dates and Decimals as extensions; a TypeError names what cannot be."""
    c = type(v)  # never v.__class__, which an object may say anything for
    if id(c) in PLAIN_TYPE_IDS:
        return v
    if c is dict:
        return {_key(k): _convert(x) for k, x in v.items()}
    if c is list or c is tuple:
        return [_convert(x) for x in v]
    if c is datetime:
        return msgspec.msgpack.Ext(EXT_DATETIME, v.isoformat().encode())
    if c is date:
        return msgspec.msgpack.Ext(EXT_DATE, v.isoformat().encode())
    if c is Decimal:
        return msgspec.msgpack.Ext(EXT_DECIMAL, str(v).encode())
    raise TypeError(f"a {c.__module__}.{c.__qualname__} is not a stored value type")


def _key(k: Any) -> Any:
    c = type(k)
    if id(c) in PLAIN_TYPE_IDS:
        return k
    raise TypeError(f"a map key of type {c.__module__}.{c.__qualname__} is not stored")


_encode = msgspec.msgpack.Encoder().encode


def encode_value(v: Any) -> bytes:
    """Encode one user value to its stored msgpack bytes.

    :raises TypeError: a type outside the stored set (the message names it).
    :raises OverflowError: an int outside msgpack's range.
    :raises RecursionError: nesting too deep, or a cycle.
    """
    if id(type(v)) in PLAIN_TYPE_IDS:
        return _encode(v)
    return _encode(_convert(v))


def encode_values(values: Sequence[Any]) -> list[bytes]:
    """:func:`encode_value` of each of ``values``, the same bytes, the same errors.

    A commit encodes every value it puts, so this is on the commit path. A
    batch whose every value is of a plain type or a dict of plain keys and
    values is encoded in one call (:func:`statelog.format.exact.encode_plain`,
    msgspec's bytes); any other batch, or one that fails to encode there,
    takes :func:`encode_value` per value, which names the error.

    :raises TypeError, OverflowError, RecursionError: as :func:`encode_value`,
        for the first value that fails.
    """
    batch = values if type(values) is list else list(values)
    encoded = encode_plain(batch)
    if encoded is not None:
        return encoded
    return list(map(encode_value, batch))


def _ext_hook(code: int, data: memoryview) -> Any:
    """Decode one extension; bytes that do not parse raise ValueError, as bad msgpack does."""
    if code == EXT_DECIMAL:
        try:
            return Decimal(bytes(data).decode("ascii"))
        except (UnicodeDecodeError, InvalidOperation):
            raise ValueError("extension 3 holds no decimal") from None
    if code not in (EXT_DATETIME, EXT_DATE) or len(data) > _MAX_EXT_TEXT:
        raise ValueError(f"extension {code} of {len(data)} bytes is not a stored value type")
    text = bytes(data).decode("ascii", "replace")
    parse = datetime.fromisoformat if code == EXT_DATETIME else date.fromisoformat
    return parse(text)  # ValueError when it does not parse


_decode = msgspec.msgpack.Decoder(ext_hook=_ext_hook).decode


def decode_value(data: bytes | memoryview) -> Any:
    """Decode one stored value back to Python objects (a fresh copy each call).

    :raises msgspec.DecodeError: ``data`` is not one valid msgpack object.
    :raises ValueError: an extension that does not parse, or of an unknown code.
    :raises RecursionError: nesting too deep. Bytes from a record or snapshot
        that passed its checks never raise.
    """
    return _decode(data)


def decode_values(values: Iterable[bytes | memoryview]) -> list[Any]:
    """:func:`decode_value` of each of ``values``, without a Python-level loop: every
    replay and restore checks each value of each record this way.

    :raises msgspec.DecodeError: as :func:`decode_value`, for the first value that fails;
        likewise ``ValueError``, ``RecursionError``, ``TypeError`` and ``OverflowError``
        (the kinds :data:`statelog.format.records.DECODE_ERRORS` catches).
    """
    return list(map(_decode, values))


_drop = deque[Any](maxlen=0).extend  # consumes an iterator, keeping nothing


def _none_proven(values: list[Any]) -> int:
    return 0


try:
    from statelog.format import _msgcheck as _c
except ImportError:  # built without a C compiler: every value is decoded to check it
    _c = None  # type: ignore[assignment]
CHECKED_IN_C = _c is not None
"""True when :func:`decodable_prefix` reads values in C; else it proves none."""

decodable_prefix: Callable[[list[Any]], int] = _none_proven if _c is None else _c.decodable_prefix
"""How many leading items of a list of encoded values are proven, in C and without
making any object, to be one msgpack object each of a part of msgpack that
:func:`decode_value` always decodes: nil, booleans, ints, floats, ASCII strings,
binaries, and arrays and maps of them nested at most 32 deep (and within the
recursion limit, as msgspec's decoder counts it), with scalar map keys, not both
str and bytes in one map. The item after them is not proven, which is no verdict:
:func:`decode_value` decides. Items must be ``bytes`` or C-contiguous, unreleased
``memoryview``; 0 without the C module."""


def check_values(values: Iterable[bytes | memoryview]) -> None:
    """Check that each of ``values`` decodes as a read decodes it, keeping nothing: the
    check of every value of every record that a replay, a fold or a restore makes.

    A list's leading values that :func:`decodable_prefix` proves are not decoded;
    the rest are decoded and each object dropped at once, which reuses the same
    memory for the next where a list of them all would touch fresh memory.

    :raises msgspec.DecodeError: as :func:`decode_values`, for the first value that
        fails; likewise its other exceptions.
    """
    if type(values) is list:
        done = decodable_prefix(values)
        if done == len(values):
            return
        values = islice(values, done, None)
    _drop(map(_decode, values))
