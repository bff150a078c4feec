"""The audit trail's bytes: entries of ``AUDIT.log``, the anchor ``AUDIT.head``, their hashes.

An entry is one line of canonical JSON (struct fields in declared order,
dict keys sorted) ending in its ``hash``: the hex SHA-256 of the same line
without the ``hash`` field. Entry 1's ``prev`` is :func:`genesis_hash` of
the store id; every later entry's ``prev`` is the ``hash`` of the one
before. The anchor is ``{"seq":N,"hash":"..."}`` and a newline, naming the
last entry. ``docs/format.md`` (section "Audit trail") specifies both files
to the byte; no I/O here (appending lives in :mod:`statelog.ops.audit`,
checking in :mod:`statelog.ops.audit_check`).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import PurePath
from typing import Any, Final

import msgspec

__all__ = [
    "ANCHOR_NAME",
    "ENCODER",
    "ENTRY_DECODER",
    "LINK_DECODER",
    "LOCK_NAME",
    "LOG_NAME",
    "Anchor",
    "AuditEntry",
    "Body",
    "Link",
    "genesis_hash",
    "parse_anchor",
    "seal",
]

LOG_NAME: Final = "AUDIT.log"
ANCHOR_NAME: Final = "AUDIT.head"
LOCK_NAME: Final = "AUDIT.lock"
_GENESIS_TAG: Final = b"statelog-audit-genesis\x00"
_HEX64 = re.compile(r"[0-9a-f]{64}")


class AuditEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One entry of the trail, in its canonical field order.

    :ivar seq: 1, 2, ... in append order.
    :ivar ts: UTC time of the append, RFC 3339 with microseconds and ``Z``.
    :ivar kind: what happened (an event kind, or another lower-case word).
    :ivar pid: the appending process.
    :ivar fields: the event's ``key=value`` fields, as plain JSON values.
    :ivar prev: hex SHA-256 of the previous entry (the genesis value for entry 1).
    :ivar hash: hex SHA-256 of this entry's canonical bytes without ``hash``.
    """

    # gc=False: entries hold no cycles; tracking 100k of them doubled the time to read them.

    seq: int
    ts: str
    kind: str
    pid: int
    fields: dict[str, Any]
    prev: str
    hash: str


class Body(msgspec.Struct, frozen=True):
    """An entry without its ``hash``: the bytes that are hashed."""

    seq: int
    ts: str
    kind: str
    pid: int
    fields: dict[str, Any]
    prev: str


class Link(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """An entry as verify reads it: ``fields`` left as raw bytes, which the hash covers."""

    seq: int
    ts: str
    kind: str
    pid: int
    fields: msgspec.Raw
    prev: str
    hash: str


class Anchor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The content of ``AUDIT.head``: the sequence number and hash of the last entry."""

    seq: int
    hash: str


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, PurePath):
        return str(obj)
    raise TypeError(f"type {type(obj).__name__} is not JSON-serialisable")


# order="deterministic" sorts dict keys and keeps struct fields in declared order.
ENCODER: Final = msgspec.json.Encoder(order="deterministic", enc_hook=_enc_hook)
"""The canonical encoder: entries, their fields, and the anchor (paths become strings)."""
ENTRY_DECODER: Final = msgspec.json.Decoder(AuditEntry)
"""Decodes one line (without its newline) into an :class:`AuditEntry`."""
LINK_DECODER: Final = msgspec.json.Decoder(Link)
"""Decodes one line (without its newline) into a :class:`Link`."""
_ANCHOR_DEC = msgspec.json.Decoder(Anchor)


def genesis_hash(store_id: bytes) -> str:
    """The ``prev`` of entry 1: SHA-256 of a fixed tag and the 16-byte store id, in hex.

    Tying entry 1 to the store id means a trail copied from another store
    does not verify here.
    """
    return hashlib.sha256(_GENESIS_TAG + store_id).hexdigest()


def seal(body: Body) -> tuple[AuditEntry, bytes]:
    """The entry with its hash, and its line (canonical bytes and a newline)."""
    raw = ENCODER.encode(body)
    digest = hashlib.sha256(raw).hexdigest()
    line = raw[:-1] + b',"hash":"' + digest.encode() + b'"}\n'
    entry = AuditEntry(body.seq, body.ts, body.kind, body.pid, body.fields, body.prev, digest)
    return entry, line


def parse_anchor(raw: bytes) -> Anchor:
    """The anchor in ``raw`` (the bytes of ``AUDIT.head``).

    :raises ValueError: not an anchor (also for a bad seq or hash).
    """
    try:
        anchor = _ANCHOR_DEC.decode(raw)
    except msgspec.MsgspecError as exc:
        raise ValueError(str(exc)) from exc
    if anchor.seq < 1 or not _HEX64.fullmatch(anchor.hash):
        raise ValueError(f"seq {anchor.seq} or hash {anchor.hash!r:.80} out of range")
    return anchor
