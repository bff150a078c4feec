"""Byte layout of snapshot files (format versions 2 and 1).

Constants and pure functions only: no file I/O. :mod:`statelog.storage.snapshots`
writes and verifies snapshot files with them; :mod:`statelog.ops.metrics`
peeks at a header's meta to tell a snapshot's age. ``docs/format.md``,
"Snapshots", has the byte-offset tables and a worked example.

Grammar (all integers little-endian)::

    snapshot := header meta body footer
    header   := magic "STLGSNAP"(8) version(u16)=2 header_len(u16)=64 flags(u32)
                store_id(16) epoch(u64) lsn(u64) chain(u32)
                meta_len(u32) body_len(u64)                        -- 64 bytes
    meta     := msgpack map {"offsets", "low_watermark_ms", "tables",
                "body_bytes", "created_ms", "compression": "zstd",
                ["delta": {...} when flags = 1]}                     -- meta_len bytes
    body     := one zstd frame (content checksum in it) holding the record
                stream of :mod:`statelog.format.stream`                -- body_len bytes
    footer   := sha256(header meta body)(32) magic "STLGSEND"(8)   -- 40 bytes

Version 1, still read from a store's own directory, differs in two places:
its meta says ``image_bytes`` where version 2 says ``body_bytes``, and its
body is an LMDB image (frame content size set). A version-1 body is a raw
LMDB file, which only the host that wrote it may map; version 2 is parsed
and checked record by record, so it may come from anywhere.

``flags`` is 0 for a full snapshot and :data:`FLAG_DELTA` for a delta
snapshot, whose body holds only the keys its tail changed (deletes
included) and whose meta links it to its parent (:class:`DeltaDoc`).

File name: ``<epoch:016x>-<lsn:016x>.snap``, so name order is age order.
"""

from __future__ import annotations

import re
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec

__all__ = [
    "END_MAGIC",
    "FLAG_DELTA",
    "FOOTER_SIZE",
    "HEADER_SIZE",
    "IMAGE_VERSION",
    "MAGIC",
    "READABLE_VERSIONS",
    "SNAPSHOT_SUFFIX",
    "VERSION",
    "DeltaDoc",
    "ImageMetaDoc",
    "MetaDoc",
    "SnapshotHeader",
    "decode_meta",
    "encode_meta",
    "pack_footer",
    "parse_snapshot_name",
    "peek_created_ms",
    "peek_delta",
    "peek_meta_len",
    "snapshot_name",
    "unpack_footer",
]

MAGIC = b"STLGSNAP"
END_MAGIC = b"STLGSEND"
VERSION = 2
IMAGE_VERSION = 1
READABLE_VERSIONS = (IMAGE_VERSION, VERSION)
HEADER_SIZE = 64
FOOTER_SIZE = 40
SNAPSHOT_SUFFIX = ".snap"
FLAG_DELTA = 1
"""Header flag of a delta snapshot (format 2 only): its meta holds ``delta``."""

# magic, version, header_len, flags, store_id, epoch, lsn, chain, meta_len, body_len
_HEADER = struct.Struct("<8sHHI16sQQIIQ")
_VERSION = struct.Struct("<H")  # bytes 8..10, readable before the rest of the header
_FOOTER = struct.Struct("<32s8s")
assert _HEADER.size == HEADER_SIZE and _FOOTER.size == FOOTER_SIZE
_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.snap$")
_NonNegative = Annotated[int, msgspec.Meta(ge=0)]
_U63 = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
"""An offset or a watermark: the range a commit record holds them in."""
_Positive = Annotated[int, msgspec.Meta(ge=1)]
_SnapName = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{16}-[0-9a-f]{16}\.snap$")]
_Sha256Hex = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    """The 64-byte header that opens every snapshot file.

    ``chain`` is the crc the log continues from after ``lsn``; ``meta_len``
    and ``body_len`` are the lengths of the two sections that follow.
    """

    store_id: uuid.UUID
    epoch: int
    lsn: int
    chain: int
    meta_len: int
    body_len: int
    version: int = VERSION
    header_len: int = HEADER_SIZE
    flags: int = 0

    def pack(self) -> bytes:
        """The header's 64 bytes.

        :raises struct.error: a field does not fit its width.
        """
        return _HEADER.pack(
            MAGIC, self.version, self.header_len, self.flags, self.store_id.bytes,
            self.epoch, self.lsn, self.chain, self.meta_len, self.body_len,
        )  # fmt: skip

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> SnapshotHeader:
        """Parse 64 header bytes whose magic the caller has already checked.

        :raises struct.error: ``data`` is shorter than 64 bytes.
        """
        _, version, hlen, flags, raw_id, epoch, lsn, chain, meta_len, body_len = (
            _HEADER.unpack_from(data)
        )
        sid = uuid.UUID(bytes=bytes(raw_id))
        return cls(sid, epoch, lsn, chain, meta_len, body_len, version, hlen, flags)

    @staticmethod
    def peek_version(data: bytes | memoryview) -> int | None:
        """The version field if ``data`` starts with the magic, else None."""
        if len(data) < 10 or bytes(data[:8]) != MAGIC:
            return None
        return int(_VERSION.unpack_from(data, 8)[0])


class DeltaDoc(msgspec.Struct, frozen=True):
    """The ``delta`` map of a delta snapshot's meta: its link to its parent.

    ``parent`` is the parent snapshot's file name and ``parent_sha256`` its
    footer digest (hex); ``depth`` counts the deltas from the chain's full
    snapshot to this one (1: its parent is full). ``chain_bytes`` is the sum
    of ``body_bytes`` over the chain's deltas, this one included, and
    ``full_bytes`` the ``body_bytes`` of its full snapshot: the compactor's
    merge rule reads them without opening the chain. ``changes`` counts the
    records (puts and deletes) per table in the body.
    """

    parent: _SnapName
    parent_sha256: _Sha256Hex
    depth: _Positive
    chain_bytes: _NonNegative
    full_bytes: _NonNegative
    changes: dict[str, _NonNegative]


class MetaDoc(msgspec.Struct, omit_defaults=True):
    """The meta map of version 2. Readers ignore keys they do not know; every key here
    is required but ``delta``, which only a delta snapshot holds (and its header
    flags). ``body_bytes`` is what the body decompresses to; ``tables`` is the
    keys per table of the state the snapshot restores (for a delta: parent and
    delta together)."""

    offsets: dict[str, _U63]
    low_watermark_ms: _U63
    tables: dict[str, _NonNegative]
    body_bytes: _NonNegative
    created_ms: int
    compression: str
    delta: DeltaDoc | None = None
    commit_ms: _NonNegative = 0
    """When the snapshot's epoch was committed (Unix ms); absent (0) when unknown."""


class ImageMetaDoc(msgspec.Struct):
    """The meta map of version 1: ``image_bytes`` is the LMDB image's size."""

    offsets: dict[str, _U63]
    low_watermark_ms: _U63
    tables: dict[str, _NonNegative]
    image_bytes: _NonNegative
    created_ms: int
    compression: str


_meta_decoder = msgspec.msgpack.Decoder(MetaDoc)
_image_meta_decoder = msgspec.msgpack.Decoder(ImageMetaDoc)


def encode_meta(
    offsets: dict[str, int],
    low_watermark_ms: int,
    tables: dict[str, int],
    body_bytes: int,
    created_ms: int,
    *,
    version: int = VERSION,
    delta: DeltaDoc | None = None,
    commit_ms: int = 0,
) -> bytes:
    """The msgpack meta section, maps in key order so equal metas encode to equal bytes.

    :raises ValueError: ``delta`` for a version-1 meta.
    """
    args = (
        dict(sorted(offsets.items())), low_watermark_ms, dict(sorted(tables.items())),
        body_bytes, created_ms, "zstd",
    )  # fmt: skip
    if version != VERSION:
        if delta is not None:
            raise ValueError("format 1 has no delta snapshots")
        return msgspec.msgpack.encode(ImageMetaDoc(*args))
    if delta is not None:
        delta = msgspec.structs.replace(delta, changes=dict(sorted(delta.changes.items())))
    return msgspec.msgpack.encode(MetaDoc(*args, delta=delta, commit_ms=commit_ms))


def decode_meta(raw: bytes, version: int = VERSION) -> MetaDoc:
    """Parse a meta section of ``version``, checking every required key and its type.

    A version-1 meta comes back as a :class:`MetaDoc` whose ``body_bytes``
    is its ``image_bytes``.

    :raises msgspec.DecodeError: not a meta map of that format.
    :raises KeyError: ``version`` is not one of :data:`READABLE_VERSIONS`.
    """
    if version == VERSION:
        return _meta_decoder.decode(raw)
    if version != IMAGE_VERSION:
        raise KeyError(version)
    doc = _image_meta_decoder.decode(raw)
    return MetaDoc(
        doc.offsets, doc.low_watermark_ms, doc.tables, doc.image_bytes, doc.created_ms,
        doc.compression,
    )  # fmt: skip


def peek_meta_len(head: bytes) -> int | None:
    """``meta_len`` if ``head`` is a whole snapshot header (by its magic), else None."""
    if len(head) < HEADER_SIZE or head[:8] != MAGIC:
        return None
    return SnapshotHeader.unpack(head).meta_len


def peek_delta(raw_meta: bytes) -> DeltaDoc | None:
    """The ``delta`` link from meta bytes read unverified (None: a full snapshot's meta).

    For readers that only describe a snapshot (``statelog inspect``, the
    metrics' chain length); resolving a chain goes through the verified read.

    :raises msgspec.DecodeError: not a version-2 meta map.
    """
    return _meta_decoder.decode(raw_meta).delta


def peek_created_ms(raw_meta: bytes) -> int | None:
    """``created_ms`` from meta bytes read unverified, or None.

    For readers that must stay cheap and tell only a snapshot's age: None
    when the meta does not decode or holds no positive ``created_ms``
    (damage is for verification to report, not this).
    """
    try:
        meta = msgspec.msgpack.decode(raw_meta)
    except msgspec.DecodeError:
        return None
    created = meta.get("created_ms") if isinstance(meta, dict) else None
    if isinstance(created, int) and not isinstance(created, bool) and created > 0:
        return created
    return None


def pack_footer(digest: bytes) -> bytes:
    """The 40-byte footer: the sha256 of everything before it, then the end magic."""
    return _FOOTER.pack(digest, END_MAGIC)


def unpack_footer(data: bytes) -> tuple[bytes, bytes]:
    """``(digest, end magic)`` from the footer's 40 bytes; the caller checks the magic.

    :raises struct.error: ``data`` is not 40 bytes long.
    """
    digest, end = _FOOTER.unpack(data)
    return bytes(digest), bytes(end)


def snapshot_name(epoch: int, lsn: int) -> str:
    """File name of a snapshot: hex epoch and hex LSN, so name order is age order."""
    return f"{epoch:016x}-{lsn:016x}{SNAPSHOT_SUFFIX}"


def parse_snapshot_name(path: Path | str) -> tuple[int, int] | None:
    """``(epoch, lsn)`` from a snapshot file name, or None for any other file."""
    m = _NAME.match(Path(path).name)
    return None if m is None else (int(m.group(1), 16), int(m.group(2), 16))
