"""Checks that turn a caller's commit into a record, or refuse it before any I/O.

Everything here runs before the first byte is written, so a refused commit
changes nothing on disk. Values are encoded here too: an unencodable value
is bad input like any other, and encoding once serves the log record, the
live state and (later) the base snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from statelog.errors import InvalidCommitError, InvalidOptionError
from statelog.format.exact import plain_keys
from statelog.format.limits import MAX_KEY_BYTES, MAX_TABLE_NAME_BYTES, table_name_problem
from statelog.format.records import TableDelta, encode_value
from statelog.format.values import VALUE_TYPES, encode_values
from statelog.state.live import Key

__all__ = [
    "ENCODE_ERRORS",
    "MAX_KEY_BYTES",
    "check_key",
    "check_offsets",
    "check_table_name",
    "check_wait",
    "check_watermark",
    "table_delta",
]

ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)
"""What msgspec raises for a value it cannot encode (RecursionError: cycles, deep nesting)."""


def check_key(k: Any, table: str) -> Key:
    """One key, validated and normalised to plain str or bytes.

    :raises InvalidCommitError: not str/bytes, or longer than MAX_KEY_BYTES.
    """
    return _key(k, table)


def _key(k: Any, table: str) -> Key:
    # type(k), never k.__class__ or isinstance (which asks it): an object may say anything.
    cls = type(k)
    if cls is str:
        if len(k) > MAX_KEY_BYTES // 4 and len(k.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise InvalidCommitError(
                f"key {k[:40]!r}... in table {table!r} is over {MAX_KEY_BYTES} bytes"
            )
        return k  # type: ignore[no-any-return]
    if cls is bytes:
        if len(k) > MAX_KEY_BYTES:
            raise InvalidCommitError(
                f"key {k[:40]!r}... in table {table!r} is over {MAX_KEY_BYTES} bytes"
            )
        return k  # type: ignore[no-any-return]
    if issubclass(cls, str):  # str subclasses (StrEnum, ...) are stored as plain str
        return _key(str.__str__(k), table)
    if issubclass(cls, bytes):
        return _key(bytes.__bytes__(k), table)
    raise InvalidCommitError(
        f"key {k!r} in table {table!r} is a {cls.__name__}; keys must be str or bytes",
        hint="convert the key to str or bytes; nothing was written",
    )


def _strict_keys(keys: Iterable[Any], table: str) -> list[Key]:
    out = list(keys)
    # One check of the whole list; the per-key path runs only when some key
    # needs converting, measuring or refusing.
    if not plain_keys(out, MAX_KEY_BYTES // 4):
        out = [_key(k, table) for k in out]
    return out


def check_table_name(name: Any) -> str:
    """One table name, validated (limits in bytes: ``statelog.format.limits``) and made a plain str.

    :raises InvalidCommitError: not a str, empty, holding NUL or a lone
        surrogate, or over MAX_TABLE_NAME_BYTES in UTF-8.
    """
    if type(name) is not str and issubclass(type(name), str):
        name = str.__str__(name)  # str subclasses (StrEnum, ...) are stored as plain str
    why = table_name_problem(name)
    if why is not None:
        raise InvalidCommitError(
            f"table name {name!r:.80} is invalid: {why}",
            hint=f"use a non-empty str of at most {MAX_TABLE_NAME_BYTES} bytes in UTF-8, "
            "without NUL; nothing was written",
        )
    return name  # type: ignore[no-any-return]


def table_delta(name: Any, put: Mapping[Any, Any], delete: Iterable[Any]) -> TableDelta:
    """Validate and encode one table's puts and deletes.

    :raises InvalidCommitError: bad table name, key type or length, an
        unencodable value, or a key both put and deleted.
    """
    name = check_table_name(name)
    if not isinstance(put, Mapping):
        raise InvalidCommitError(
            f"put= must be a mapping of key to value, not {type(put).__name__}"
        )
    if isinstance(delete, str | bytes):
        raise InvalidCommitError(
            "delete= must be an iterable of keys, not a single key",
            hint="wrap a single key in a tuple: delete=(key,)",
        )
    keys = _strict_keys(put.keys(), name)
    try:
        values = encode_values(list(put.values()))
    except ENCODE_ERRORS as exc:
        bad = next(k for k, v in put.items() if not _encodes(v))
        raise InvalidCommitError(
            f"value of key {bad!r} in table {name!r} cannot be stored: {exc}",
            hint=f"store only {VALUE_TYPES} (tuples come back as lists), "
            "converting anything else first; nothing was written",
        ) from exc
    try:
        deletes = _strict_keys(delete, name)
    except TypeError:
        raise InvalidCommitError(
            f"delete= must be an iterable of keys, not {type(delete).__name__}",
            hint="pass a tuple or list: delete=(key,)",
        ) from None
    if deletes and keys:
        both = set(deletes).intersection(keys)
        if both:
            raise InvalidCommitError(
                f"key {next(iter(both))!r} in table {name!r} is both put and deleted",
                hint="a commit may put or delete a key, not both",
            )
    return TableDelta(name, keys, values, deletes)


def _encodes(v: Any) -> bool:
    try:
        encode_value(v)
    except ENCODE_ERRORS:
        return False
    return True


def check_offsets(offsets: Any, current: Mapping[str, int]) -> dict[str, int]:
    """Validate offset advances against the current offsets; returns a plain dict.

    :raises InvalidCommitError: a non-str partition, a non-int or negative
        offset, or an offset lower than the one already committed.
    """
    if not isinstance(offsets, Mapping):
        raise InvalidCommitError(
            f"offsets= must be a mapping of partition to offset, not {type(offsets).__name__}"
        )
    out: dict[str, int] = {}
    for part, off in offsets.items():
        if not issubclass(type(part), str):
            raise InvalidCommitError(
                f"partition {part!r} is not a str", hint="name partitions with str"
            )
        if not _is_int(off):
            raise InvalidCommitError(f"offset of partition {part!r} is {off!r}, not an int")
        off = int.__index__(off)  # an int subclass's own comparisons never run
        if off < 0:
            raise InvalidCommitError(f"offset of partition {part!r} is negative ({off})")
        if off >= 1 << 63:
            raise InvalidCommitError(f"offset of partition {part!r} is over 2**63-1")
        before = current.get(part)
        if before is not None and off < before:
            raise InvalidCommitError(
                f"offset of partition {part!r} goes backwards: {off} < committed {before}",
                hint="offsets only advance; after a walk-back rewind the consumer to store.offsets",
            )
        out[str.__str__(part)] = off
    return out


def check_watermark(wm: Any, current: int) -> int:
    """:raises InvalidCommitError: the watermark is not an int, is negative, or goes backwards."""
    if not _is_int(wm):
        raise InvalidCommitError(f"low_watermark_ms is {wm!r}, not an int")
    wm = int.__index__(wm)
    if wm < 0 or wm >= 1 << 63:
        raise InvalidCommitError(f"low_watermark_ms {wm} is out of range 0..2**63-1")
    if wm < current:
        raise InvalidCommitError(
            f"low_watermark_ms goes backwards: {wm} < committed {current}",
            hint="the low watermark only advances; pass store.low_watermark_ms to keep it",
        )
    return wm  # type: ignore[no-any-return]


def _is_int(v: Any) -> bool:
    """An int or an int subclass other than bool, by the object's own type."""
    t = type(v)
    return t is int or (issubclass(t, int) and not issubclass(t, bool))


def check_wait(epoch: Any, timeout: Any) -> float | None:
    """``wait_durable``'s arguments: the timeout in seconds, or None for no limit.

    :raises InvalidOptionError: ``epoch`` is not an int, or ``timeout`` is
        neither None, a timedelta nor a number of seconds >= 0.
    """
    if type(epoch) is not int:
        raise InvalidOptionError(f"epoch={epoch!r}", hint="an epoch that commit() returned")
    secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if secs is None:
        return None
    if (type(secs) is not int and type(secs) is not float) or not 0 <= secs < float("inf"):
        raise InvalidOptionError(
            f"timeout={timeout!r}", hint="a timedelta or seconds >= 0, or None"
        )
    return float(secs)
