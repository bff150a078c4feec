"""Exact-type checks of a commit's batch: which batches msgspec may encode as they are.

A commit encodes every value it puts, and must first know that each one is of
a type that comes back as itself (:mod:`statelog.format.values`). These checks
answer for a whole batch at once: ``True`` only when every object is of an
exact plain type; ``False`` sends the batch to the per-object path, which
decides and names any error. They run no code of the objects they read and
never raise for them.

Each check has a Python reference (``*_py``) and, when the package was built
with a C compiler, the same check in C (``statelog/format/_exact.c``): checking
each object's type through Python iterators is otherwise the largest single
cost of a commit. A test holds the two to the same answers; :data:`ACCELERATED`
says which one :func:`plain_batch` and :func:`plain_keys` are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import Any

__all__ = [
    "ACCELERATED",
    "PLAIN_TYPES",
    "PLAIN_TYPE_IDS",
    "plain_batch",
    "plain_batch_py",
    "plain_keys",
    "plain_keys_py",
]

PLAIN_TYPES = (int, str, float, bytes, bool, type(None))
"""The exact types msgspec encodes as themselves; a subclass of one is not plain."""
PLAIN_TYPE_IDS = frozenset(map(id, PLAIN_TYPES))
"""Their ids: a type is looked up by identity, so no metaclass ``__eq__`` or
``__hash__`` runs and none can pass a class off as plain. Types are read with
``type(v)``, never ``v.__class__``, which an object may say anything for."""

_KEY_TYPE_IDS = frozenset((id(str), id(bytes)))
_DICT_ID = frozenset((id(dict),))
_plain_only = PLAIN_TYPE_IDS.issuperset
_flatten = chain.from_iterable


def _type_ids(objects: Iterable[Any]) -> Iterator[int]:
    return map(id, map(type, objects))


def plain_batch_py(values: list[Any]) -> bool:
    """Every value plain, or every value a dict of plain keys and plain values."""
    if _plain_only(_type_ids(values)):
        return True
    if not _DICT_ID.issuperset(_type_ids(values)):
        return False
    # Types, never the keys themselves, go in a set: an IntEnum member equals its int
    # and a StrEnum member its str, so a set of keys could keep the plain one only.
    keys = _flatten(values)  # a dict iterates its keys
    return _plain_only(_type_ids(keys)) and _plain_only(
        _type_ids(_flatten(map(dict.values, values)))
    )


def plain_keys_py(keys: list[Any], max_len: int) -> bool:
    """Every key an exact str or bytes of at most ``max_len`` characters or bytes."""
    return _KEY_TYPE_IDS.issuperset(_type_ids(keys)) and (
        not keys or max(map(len, keys)) <= max_len
    )


try:
    from statelog.format import _exact as _c
except ImportError:  # built without a C compiler: the Python checks answer alike
    _c = None  # type: ignore[assignment]
ACCELERATED = _c is not None
"""True when the checks run in C."""

plain_batch: Callable[[list[Any]], bool] = plain_batch_py if _c is None else _c.plain_batch
plain_keys: Callable[[list[Any], int], bool] = plain_keys_py if _c is None else _c.plain_keys
