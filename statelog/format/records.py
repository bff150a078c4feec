"""The logical records carried by WAL frames, and their msgpack codec.

A commit record is one msgpack array (``docs/format.md``, "Commit record")::

    [1, epoch, {partition: offset}, low_watermark_ms,
        [[table, [key...], [value...], [deleted key...]], ...]]

Keys are msgpack ``str`` or ``bin`` and decode back to ``str`` or ``bytes``.
Each value is itself the msgpack encoding of the user's value, stored as
``bin``: the live state keeps values encoded, so replay, the base snapshot
and reads share one representation and a caller can never alias stored state.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "CommitRecord",
    "Key",
    "TableDelta",
    "decode_record",
    "decode_value",
    "encode_record",
    "encode_value",
]


Key = str | bytes
"""A key: str and bytes keys are distinct and come back as the type given."""


class TableDelta(msgspec.Struct, array_like=True, frozen=True):
    """Puts and deletes of one table inside a commit."""

    name: str
    keys: list[Any]
    values: list[bytes]
    deletes: list[Any]


class CommitRecord(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """One atomic checkpoint: offsets, watermark and every table's delta."""

    epoch: int
    offsets: dict[str, int]
    low_watermark_ms: int
    tables: list[TableDelta]


_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(CommitRecord)
_value_decoder = msgspec.msgpack.Decoder()

encode_value = _encoder.encode
"""Encode one user value to msgpack bytes (raises TypeError/ValueError/OverflowError)."""

encode_record = _encoder.encode
"""Encode a :class:`CommitRecord` to its payload bytes."""


def decode_record(payload: bytes | memoryview) -> CommitRecord:
    """Decode a payload that already passed its frame checksum.

    :raises msgspec.DecodeError: the bytes verified but are not a commit record
        (a bug or a foreign writer, never bit-rot; callers treat it as corruption).
    """
    return _record_decoder.decode(payload)


def decode_value(data: bytes) -> Any:
    """Decode one stored value back to Python objects (a fresh copy each call)."""
    return _value_decoder.decode(data)
