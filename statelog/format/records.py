"""The logical records carried by WAL frames, their msgpack codec and their schema check.

A commit record is one msgpack array (``docs/format.md``, "Commit record")::

    [1, epoch, {partition: offset}, low_watermark_ms,
        [[table, [key...], [value...], [deleted key...]], ...], commit_ms]

``commit_ms`` (the wall-clock time of the commit, Unix milliseconds, never
below the one before it in the log) is absent from records written before
statelog recorded it; they decode with ``commit_ms`` 0, "unknown".

Keys are msgpack ``str`` or ``bin`` and decode back to ``str`` or ``bytes``.
Each value is itself the msgpack encoding of the user's value
(:mod:`statelog.format.values`), stored as ``bin``: the live state keeps
values encoded, so replay, the base snapshot and reads share one
representation and a caller can never alias stored state.

Encoding is the commit path's and checks nothing: the writer validated its
input already (``statelog.store.validate``). Decoding is every reader's,
and :func:`decode_record` is the one rule all of them apply: a payload
whose frames verified but which breaks the schema (a key that is not
``str``/``bytes`` or over :data:`~statelog.format.limits.MAX_KEY_BYTES`, a
bad table name, an offset or watermark out of range, a value that is not
one complete msgpack object) raises :class:`RecordSchemaError`, which each
reader handles as it handles a checksum mismatch at that record.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from statelog.errors import StatelogError
from statelog.format.exact import plain_keys
from statelog.format.limits import MAX_KEY_BYTES, key_problem, table_name_problem
from statelog.format.values import check_values, decode_value, decode_values, encode_value

__all__ = [
    "DECODE_ERRORS",
    "CommitHead",
    "CommitRecord",
    "Key",
    "RecordSchemaError",
    "TableDelta",
    "check_record",
    "decode_record",
    "decode_record_head",
    "decode_record_values",
    "decode_value",
    "encode_record",
    "encode_value",
]


Key = str | bytes
"""A key: str and bytes keys are distinct and come back as the type given."""

_U63 = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
_EPOCH = Annotated[int, msgspec.Meta(ge=1, le=(1 << 63) - 1)]


class TableDelta(msgspec.Struct, array_like=True, frozen=True):
    """Puts and deletes of one table inside a commit."""

    name: str
    # Any, not Key: msgspec cannot decode a union of str and bytes, so
    # check_record checks the types of decoded keys.
    keys: list[Any]
    values: list[bytes]
    deletes: list[Any]


class CommitRecord(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """One atomic checkpoint: offsets, watermark and every table's delta."""

    epoch: _EPOCH
    offsets: dict[str, _U63]
    low_watermark_ms: _U63
    tables: list[TableDelta]
    commit_ms: _U63 = 0
    """When it was committed (Unix ms, non-decreasing along the log); 0: not recorded."""


class CommitHead(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """A commit record's epoch, offsets, watermark and time, its table deltas left
    encoded (:func:`decode_record_head`)."""

    epoch: _EPOCH
    offsets: dict[str, _U63]
    low_watermark_ms: _U63
    tables: msgspec.Raw
    commit_ms: _U63 = 0


class RecordSchemaError(StatelogError):
    """A payload verified on its checksums but is not a commit record statelog could write.

    Never bit rot (the checksums hold): a bug, a foreign writer or a crafted
    file. Readers treat it as corruption at that record.
    """

    hint = (
        "the record is treated as corruption: recovery stops at the last good commit; "
        "run `statelog verify STORE` to see the damage"
    )


DECODE_ERRORS = (msgspec.DecodeError, RecursionError, TypeError, ValueError, OverflowError)
"""What decoding untrusted msgpack may raise: malformed bytes, nesting too deep
(msgspec raises RecursionError, not DecodeError), or a type or value it refuses."""

_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(CommitRecord)
_head_decoder = msgspec.msgpack.Decoder(CommitHead)

encode_record = _encoder.encode
"""Encode a :class:`CommitRecord` to its payload bytes."""


def decode_record_values(
    payload: bytes | memoryview, *, keep: bool = True
) -> tuple[CommitRecord, list[list[Any]] | None]:
    """:func:`decode_record`, and every table's values decoded (None unless ``keep``): the
    schema check decodes each value anyway, so a reader that wants them keeps them.

    :raises RecordSchemaError: as :func:`decode_record`.
    """
    values: list[list[Any]] | None = [] if keep else None
    return _decode(payload, values), values


def decode_record(payload: bytes | memoryview, *, values: bool = True) -> CommitRecord:
    """Decode a payload that already passed its frame checksum, and check it against the schema.

    Checks, in order: the shape and types msgspec decodes against (the
    tag, an epoch of at least 1, offsets and the watermark in
    0..2**63-1), then :func:`check_record`. The epoch's place in the log is
    the caller's to check.

    :param values: decode each value too (the complete check). False only where
        every value of this very record was decoded before: a restore checks
        each segment it downloads, then recovers the copy it wrote.
    :raises RecordSchemaError: the bytes verified but are not a commit record
        (a bug, a foreign writer or a crafted file, never bit rot; callers
        treat it as corruption).
    """
    return _decode(payload, None, values=values)


def decode_record_head(payload: bytes | memoryview) -> CommitHead:
    """Decode a record's epoch, offsets, watermark and time, skipping over its tables.

    Only for a reader that decoded and checked this very record whole before
    (:func:`decode_record`) and keeps none of its entries: a restore's check of
    the copy it wrote follows the epochs through records it checked moments
    before, and skipping the tables makes that second pass about six times
    cheaper. The head is checked as :func:`decode_record` checks it.

    :raises RecordSchemaError: the payload is not a commit record, or its head breaks
        the schema.
    """
    try:
        return _head_decoder.decode(payload)
    except DECODE_ERRORS as exc:
        raise RecordSchemaError(f"verified frame holds no commit record: {exc}") from None


def _decode(
    payload: bytes | memoryview, out: list[list[Any]] | None, *, values: bool = True
) -> CommitRecord:
    try:
        rec = _record_decoder.decode(payload)
    except DECODE_ERRORS as exc:
        raise RecordSchemaError(f"verified frame holds no commit record: {exc}") from None
    why = check_record(rec, out, values=values)
    if why is not None:
        raise RecordSchemaError(f"verified frame breaks the commit record schema: {why}")
    return rec


def check_record(
    rec: CommitRecord, out: list[list[Any]] | None = None, *, values: bool = True
) -> str | None:
    """Why a decoded ``rec`` breaks the schema beyond what msgspec checks, or None.

    Each table: a valid name (:func:`~statelog.format.limits.table_name_problem`),
    as many values as keys, every key and deleted key exactly ``str`` or
    ``bytes`` within :data:`~statelog.format.limits.MAX_KEY_BYTES`, and every
    value one complete msgpack object, nested no deeper than a read can decode.
    Never raises.

    :param out: if given, each table's decoded values are appended to it.
    :param values: False: every value was decoded before (see :func:`decode_record`);
        each table's values are then only counted against its keys.
    """
    for i, t in enumerate(rec.tables):
        why = table_name_problem(t.name)
        if why is None and len(t.keys) != len(t.values):
            why = f"{len(t.keys)} keys but {len(t.values)} values"
        if why is None:
            why = (
                _keys_problem(t.keys)
                or _keys_problem(t.deletes)
                or (_values_problem(t.values, out) if values else None)
            )
        if why is not None:
            return f"table delta {i}: {why}"
    return None


def _keys_problem(keys: list[Any]) -> str | None:
    # One pass in C over exact types and lengths, as the commit path checks them; the
    # per-key check runs only when some key may break a limit. msgspec decodes an
    # array as an exact list.
    if type(keys) is list and plain_keys(keys, MAX_KEY_BYTES // 4):
        return None
    for k in keys:
        why = key_problem(k)
        if why is not None:
            return why
    return None


def _values_problem(values: list[bytes], out: list[list[Any]] | None = None) -> str | None:
    """Why some value does not decode, or None: each is decoded as a read decodes it.

    Decoding is the only complete check: a skip over the msgpack structure
    would pass bad UTF-8, bad timestamps and unhashable map keys, which a
    read would then trip over. The objects are dropped at once.
    """
    try:
        if out is None:
            check_values(values)
        else:
            out.append(decode_values(values))
    except DECODE_ERRORS:
        pass  # found again one at a time below, to name the value
    else:
        return None
    for i, v in enumerate(values):
        try:
            decode_value(v)
        except DECODE_ERRORS as exc:
            return f"value {i} does not decode: {exc}"
    return "a value does not decode"  # the batch failed, so one value did: not reached
