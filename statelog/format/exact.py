"""Exact-type checks of a commit's batch, and the plain batch's encoder.

A commit encodes every value it puts, and must first know that each one is of
a type that comes back as itself (:mod:`statelog.format.values`). These
functions answer for a whole batch at once. :func:`encode_plain` encodes a
batch whose every value is of an exact plain type, or an exact dict of plain
keys and values, the same bytes msgspec writes for each value; :func:`plain_keys`
says whether every key is an exact ``str`` or ``bytes`` within a length, and
:func:`tagged_keys` encodes a batch of such keys as an image stores them. A
``None`` or ``False`` answer sends the batch to the per-object path, which
decides and names any error. They run no code of the objects they read and
never raise for them.

Each has a Python reference (``*_py``) and, when the package was built with a
C compiler, the same function in C (``statelog/format/_exact.c``): checking
each object's type through Python iterators, and encoding through one msgspec
call per value, are otherwise the largest costs of a commit after the fsync.
A test holds the two to the same answers; :data:`ACCELERATED` says which ones
:func:`encode_plain`, :func:`plain_keys` and :func:`tagged_keys` are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec

__all__ = [
    "ACCELERATED",
    "PLAIN_TYPES",
    "PLAIN_TYPE_IDS",
    "encode_plain",
    "encode_plain_py",
    "plain_keys",
    "plain_keys_py",
    "tagged_keys",
    "tagged_keys_py",
]

PLAIN_TYPES = (int, str, float, bytes, bool, type(None))
"""The exact types msgspec encodes as themselves; a subclass of one is not plain."""
PLAIN_TYPE_IDS = frozenset(map(id, PLAIN_TYPES))
"""Their ids: a type is looked up by identity, so no metaclass ``__eq__`` or
``__hash__`` runs and none can pass a class off as plain. Types are read with
``type(v)``, never ``v.__class__``, which an object may say anything for."""

_KEY_TYPE_IDS = frozenset((id(str), id(bytes)))
_plain_only = PLAIN_TYPE_IDS.issuperset
_encode = msgspec.msgpack.Encoder().encode


def _type_ids(objects: Iterable[Any]) -> Iterator[int]:
    return map(id, map(type, objects))


def _plain_value(v: Any) -> bool:
    # Types, never the keys themselves, go in a set: an IntEnum member equals its int
    # and a StrEnum member its str, so a set of keys could keep the plain one only.
    if type(v) is dict:
        return _plain_only(_type_ids(v)) and _plain_only(_type_ids(v.values()))
    return id(type(v)) in PLAIN_TYPE_IDS


def encode_plain_py(values: list[Any]) -> list[bytes] | None:
    """msgspec's bytes of each value, when every value is plain or a dict of plain keys
    and values and every one encodes; else None (also for an int outside msgpack's
    range or a lone surrogate), and the per-value path decides and names the error."""
    if not all(map(_plain_value, values)):
        return None
    try:
        return list(map(_encode, values))
    except (OverflowError, UnicodeEncodeError, ValueError):  # ValueError: a str over 4 GiB
        return None


def tagged_keys_py(keys: list[Any]) -> list[bytes] | None:
    """Each key as an image stores it (``b"\\x01"`` + UTF-8 for a str, ``b"\\x00"`` +
    itself for bytes), or None when some key is not an exact str or bytes or a str
    does not encode (:func:`statelog.storage.image.encode_keys` then names the error)."""
    if not _KEY_TYPE_IDS.issuperset(_type_ids(keys)):
        return None
    try:
        return [b"\x01" + k.encode() if type(k) is str else b"\x00" + k for k in keys]
    except UnicodeEncodeError:
        return None


def plain_keys_py(keys: list[Any], max_len: int) -> bool:
    """Every key an exact str or bytes of at most ``max_len`` characters or bytes."""
    return _KEY_TYPE_IDS.issuperset(_type_ids(keys)) and (
        not keys or max(map(len, keys)) <= max_len
    )


try:
    from statelog.format import _exact as _c
except ImportError:  # built without a C compiler: the Python references answer alike
    _c = None  # type: ignore[assignment]
ACCELERATED = _c is not None
"""True when these run in C."""

encode_plain: Callable[[list[Any]], list[bytes] | None] = (
    encode_plain_py if _c is None else _c.encode_plain
)
plain_keys: Callable[[list[Any], int], bool] = plain_keys_py if _c is None else _c.plain_keys
tagged_keys: Callable[[list[Any]], list[bytes] | None] = (
    tagged_keys_py if _c is None else _c.tagged_keys
)
