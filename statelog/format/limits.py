"""The limits every key and table name obeys, in bytes, wherever it comes from.

One set of limits, checked twice: when a caller commits (bad input, refused
before any I/O) and when a record, a snapshot or a remote object is decoded
(corruption: the bytes verified but cannot be statelog's). The numbers come
from the base level: LMDB refuses keys, and named databases, longer than
511 bytes. A stored key carries one tag byte in front of its bytes
(:func:`statelog.storage.image.encode_key`); a table name is stored as the
name of an LMDB database, and statelog's own tables put a prefix of at most
:data:`RESERVED_PREFIX_BYTES` in front of a name a caller chose (the sinks'
``__sink__:<name>``), so the limits leave room for both.

Pure functions, no I/O: each ``*_problem`` returns why a value breaks a
limit, or None when it keeps them, and never raises.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LMDB_MAX_KEY_BYTES",
    "MAX_KEY_BYTES",
    "MAX_TABLE_NAME_BYTES",
    "RESERVED_PREFIX_BYTES",
    "key_problem",
    "table_name_problem",
]

LMDB_MAX_KEY_BYTES = 511
"""LMDB's default ``mdb_env_get_maxkeysize``: keys and database names."""

MAX_KEY_BYTES = 500
"""Longest key, in bytes (UTF-8 for a ``str`` key): with its tag byte, under LMDB's limit."""

RESERVED_PREFIX_BYTES = 16
"""Room kept for the prefix of statelog's own tables (``__sink__:``, 9 bytes)."""

MAX_TABLE_NAME_BYTES = 255
"""Longest table name, in UTF-8 bytes; with a reserved prefix, under LMDB's limit."""

assert MAX_KEY_BYTES + 1 <= LMDB_MAX_KEY_BYTES
assert RESERVED_PREFIX_BYTES + MAX_TABLE_NAME_BYTES <= LMDB_MAX_KEY_BYTES


def _utf8_len(s: str) -> int | None:
    """The UTF-8 length of ``s``; None if it holds a lone surrogate (not UTF-8 at all)."""
    if s.isascii():
        return len(s)
    try:
        return len(s.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def key_problem(key: Any) -> str | None:
    """Why ``key`` cannot be a stored key, or None: exactly ``str`` or ``bytes``, within limits."""
    cls = type(key)
    if cls is bytes:
        size = len(key)
    elif cls is str:
        utf8 = _utf8_len(key)
        if utf8 is None:
            return "the key is not valid UTF-8 (a lone surrogate)"
        size = utf8
    else:
        return f"a key must be str or bytes, not {cls.__name__}"
    if size > MAX_KEY_BYTES:
        return f"the key is {size} bytes, over {MAX_KEY_BYTES}"
    return None


def table_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a table, or None: a non-empty ``str`` without NUL, within limits."""
    if type(name) is not str:
        return f"a table name must be a str, not {type(name).__name__}"
    if not name:
        return "the table name is empty"
    if "\x00" in name:
        return "the table name holds a NUL character"
    size = _utf8_len(name)
    if size is None:
        return "the table name is not valid UTF-8 (a lone surrogate)"
    if size > MAX_TABLE_NAME_BYTES:
        return f"the table name is {size} bytes in UTF-8, over {MAX_TABLE_NAME_BYTES}"
    return None
