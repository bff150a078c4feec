"""Reading a snapshot file: every check, in order, and the body decompressed once.

:func:`read_snapshot` is what :func:`statelog.storage.snapshots.verify_snapshot`
and :func:`~statelog.storage.snapshots.extract_snapshot` run. A mismatch is
a :class:`~statelog.errors.CorruptionError` whose ``reason`` starts with
the part that failed; an ``OSError`` propagates (an I/O error is not damage).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import lmdb
import msgspec
import zstandard

from statelog.errors import CorruptionError, FormatVersionError
from statelog.format.snapshot import (
    END_MAGIC,
    FLAG_DELTA,
    FOOTER_SIZE,
    HEADER_SIZE,
    IMAGE_VERSION,
    MAGIC,
    READABLE_VERSIONS,
    VERSION,
    DeltaDoc,
    MetaDoc,
    SnapshotHeader,
    decode_meta,
    parse_snapshot_name,
    peek_meta_len,
    unpack_footer,
)
from statelog.format.stream import StreamError
from statelog.storage.snapshot_body import (
    BodyTooLarge,
    ChunkConsumer,
    CountingSink,
    StreamBuild,
    StreamSink,
    body_limit,
)

__all__ = ["HINT", "SnapshotMeta", "open_read", "peek_meta", "read_snapshot"]

_CHUNK = 1 << 20
HINT = (
    "recovery skips a damaged snapshot and walks back to an older one; "
    "the file is kept as evidence (run `statelog verify` to list damaged files)"
)
_IMAGE_HINT = (
    "a format-1 snapshot holds a raw LMDB image, which only the store that wrote it "
    "maps; run a compaction pass where it was written to get a format-2 snapshot"
)


@dataclass(frozen=True)
class SnapshotMeta:
    """Everything a snapshot says about itself, besides its body.

    ``body_bytes`` is what the body decompresses to: the record stream
    (format 2) or the LMDB image (format 1). ``delta`` is the link of a
    delta snapshot to its parent (None: a full snapshot); ``sha256`` is the
    footer's digest in hex, which a child delta names as its parent's.
    """

    store_id: uuid.UUID
    epoch: int
    lsn: int
    chain: int
    offsets: dict[str, int]
    low_watermark_ms: int
    tables: dict[str, int]
    body_bytes: int
    created_ms: int
    delta: DeltaDoc | None = None
    sha256: str = ""
    commit_ms: int = 0
    """When its epoch was committed (Unix ms; 0: not recorded)."""

    @property
    def depth(self) -> int:
        """Deltas from the chain's full snapshot to this one (0: a full snapshot)."""
        return 0 if self.delta is None else self.delta.depth


_MAX_PEEKED_META = 1 << 20  # a meta is a few hundred bytes; more is not a snapshot of ours


def peek_meta(path: Path) -> MetaDoc | None:
    """The meta section of the snapshot at ``path``, read bounded and *unverified* (None:
    not readable as one): for plans and hints only (retention's cheap plan, a time to
    start from), never for a state, which :func:`read_snapshot` verifies whole."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEADER_SIZE)
            meta_len = peek_meta_len(head)
            if meta_len is None or meta_len > _MAX_PEEKED_META:
                return None
            return decode_meta(fh.read(meta_len), SnapshotHeader.peek_version(head) or 0)
    except (OSError, KeyError, ValueError, TypeError, RecursionError):  # DecodeError too
        return None


def open_read(path: Path) -> IO[bytes]:
    """The one place snapshot bytes are read from (tests substitute it to inject EIO)."""
    return open(path, "rb")


class _Section:
    """A reader of the next ``length`` bytes of ``fh`` that hashes what it returns."""

    def __init__(self, fh: IO[bytes], length: int, hasher: hashlib._Hash) -> None:
        self._fh, self.left, self.hasher = fh, length, hasher
        self.head = b""  # the first bytes read: the zstd frame header

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(self.left if n < 0 else min(n, self.left))
        self.left -= len(data)
        self.hasher.update(data)
        if len(self.head) < 18:
            self.head += data[: 18 - len(self.head)]
        return data


def _fail(path: Path, offset: int, reason: str) -> CorruptionError:
    return CorruptionError(path, offset, reason, hint=HINT)


def read_snapshot(
    path: Path,
    store_id: uuid.UUID | None,
    *,
    out: IO[bytes] | Path | None = None,
    parse: bool = True,
    body: bool = True,
    portable_only: bool = False,
    consume: ChunkConsumer | None = None,
) -> SnapshotMeta:
    """Check the snapshot at ``path``; with ``out``, also produce its LMDB image there.

    Checks, in order: magic, version, header fields, lengths against the
    file size, the file name, the store id, the footer magic, the meta, the
    declared body size against :func:`~statelog.storage.snapshot_body.body_limit`,
    then the body (decompressed, and for format 2 parsed record by record,
    unless ``parse`` is False and no ``out`` is given: then only hashed)
    and the SHA-256 of everything before the footer.

    :param out: format 2: the path to build the image at (its parent must exist; on
        any failure nothing is left there); format 1: a file the image is written to.
    :param body: False: all but the body and hash checked, the digest returned the
        footer's (a caller that read this file whole before; only with ``parse`` False,
        no ``out``, ``consume`` or ``portable_only``: else ValueError).
    :param portable_only: refuse format 1 (a bucket's snapshot, say).
    :param consume: format 2, without ``out``: sees each checked chunk, in
        order (``statelog verify`` compares a base image with it). A format-1
        body is not parsed, so it sees nothing.
    :raises CorruptionError: the part that failed starts ``reason``.
    :raises FormatVersionError: a version this code does not read, or
        format 1 with ``portable_only``.
    :raises OSError: reading or writing failed (never reported as corruption).
    """
    if not body and (parse or out is not None or consume is not None or portable_only):
        raise ValueError("body=False is only for a hash-only check of a store's own file")
    named = parse_snapshot_name(path)
    if named is None:
        raise _fail(path, 0, "name: not <epoch:016x>-<lsn:016x>.snap, so unchecked against it")
    with open_read(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(HEADER_SIZE)
        h = _check_header(path, head, size, named, store_id)
        if portable_only and h.version == IMAGE_VERSION:
            raise FormatVersionError(path, IMAGE_VERSION, VERSION, hint=_IMAGE_HINT)
        fh.seek(size - FOOTER_SIZE)
        digest, end = unpack_footer(fh.read(FOOTER_SIZE))
        if end != END_MAGIC:
            raise _fail(path, size - 8, f"footer: bad end magic {end!r}")
        fh.seek(HEADER_SIZE)
        raw_meta = fh.read(h.meta_len)
        doc = _check_meta(path, h, raw_meta)
        section = _Section(fh, h.body_len, hashlib.sha256(head + raw_meta))
        if not body:  # the caller read this file whole before
            pass
        elif h.version == IMAGE_VERSION:
            if isinstance(out, Path):
                raise TypeError("a format-1 image is extracted to an open file")
            sink = CountingSink(out, doc.body_bytes)
            _check_body(path, section, sink, digest, size, out is not None)
            _check_frame_size(path, h, doc, section.head)
            if out is not None and sink.written != doc.body_bytes:
                at = HEADER_SIZE + h.meta_len
                why = f"body: the frame yields {sink.written} bytes, it declares {doc.body_bytes}"
                raise _fail(path, at, why)
        elif isinstance(out, Path) or out is None:
            build: ChunkConsumer | None = consume
            if out is not None:
                n = len(doc.delta.changes) if doc.delta is not None else len(doc.tables)
                build = StreamBuild(
                    out, tables=n, size_hint=doc.body_bytes, delta=doc.delta is not None
                )
            _read_stream(
                path, h, doc, section, digest, size, build, parse=parse or build is not None
            )
        else:
            raise TypeError("a format-2 image is built at a path")
    return SnapshotMeta(
        h.store_id, h.epoch, h.lsn, h.chain, doc.offsets, doc.low_watermark_ms, doc.tables,
        doc.body_bytes, doc.created_ms, doc.delta, digest.hex(), doc.commit_ms,
    )  # fmt: skip


def _read_stream(
    path: Path,
    h: SnapshotHeader,
    doc: MetaDoc,
    body: _Section,
    digest: bytes,
    size: int,
    build: ChunkConsumer | None,
    *,
    parse: bool,
) -> None:
    """The body of a format-2 snapshot: parsed if ``parse``, each chunk given to ``build``."""
    if not parse:
        _check_body(path, body, CountingSink(None, doc.body_bytes), digest, size, False)
        return
    at = HEADER_SIZE + h.meta_len
    try:
        sink = StreamSink(doc.body_bytes, build, delta=doc.delta is not None)
        try:
            _check_body(path, body, sink, digest, size, True)
            sink.checker.finish()
        except StreamError as exc:
            raise _fail(path, at, f"body: {exc}") from None
        except lmdb.Error as exc:
            raise OSError(f"{path}: building its image failed: {exc}") from exc
        if sink.written != doc.body_bytes:
            raise _fail(path, at, f"body: {sink.written} bytes, the meta declares {doc.body_bytes}")
        want = doc.delta.changes if doc.delta is not None else doc.tables
        if sink.checker.counts != want:
            raise _fail(path, HEADER_SIZE, "meta: its table counts disagree with the body")
    except BaseException:
        if isinstance(build, StreamBuild):
            build.close()
            with contextlib.suppress(OSError):
                build.path.unlink()
        raise
    if isinstance(build, StreamBuild):
        build.close()


def _check_header(
    path: Path, head: bytes, size: int, named: tuple[int, int], store_id: uuid.UUID | None
) -> SnapshotHeader:
    """The header's checks: magic, version, file size, fixed fields, lengths, name, store id."""
    if len(head) >= 8 and head[:8] != MAGIC:
        raise _fail(path, 0, f"header: bad magic {head[:8]!r}, not a statelog snapshot")
    version = SnapshotHeader.peek_version(head)
    if version is not None and version not in READABLE_VERSIONS:
        raise FormatVersionError(path, version, VERSION)
    if size < HEADER_SIZE + FOOTER_SIZE:
        raise _fail(path, size, f"size: truncated, {size} bytes is less than header+footer")
    h = SnapshotHeader.unpack(head)
    flags_ok = h.flags == 0 or (h.flags == FLAG_DELTA and h.version == VERSION)
    if h.header_len != HEADER_SIZE or not flags_ok:
        why = f"header: header_len={h.header_len} flags={h.flags:#x}, want 64 and 0 or 1"
        raise _fail(path, 10, why)
    declared = HEADER_SIZE + h.meta_len + h.body_len + FOOTER_SIZE
    if declared != size:
        raise _fail(
            path,
            min(size, declared),
            f"size: header declares {declared} bytes "
            f"(meta {h.meta_len}, body {h.body_len}), the file holds {size}: "
            "truncated, or a damaged length field",
        )
    if (h.epoch, h.lsn) != named:
        raise _fail(path, 32, f"header: epoch {h.epoch} and lsn {h.lsn} disagree with the name")
    if store_id is not None and h.store_id != store_id:
        raise _fail(path, 16, f"header: snapshot of store {h.store_id}, not of {store_id}")
    return h


def _check_meta(path: Path, h: SnapshotHeader, raw_meta: bytes) -> MetaDoc:
    """The meta's checks: it decodes, names zstd, and declares a body size within limits."""
    try:
        doc = decode_meta(raw_meta, h.version)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _fail(path, HEADER_SIZE, f"meta: does not decode: {exc}") from None
    if doc.compression != "zstd":
        raise _fail(path, HEADER_SIZE, f"meta: unknown compression {doc.compression!r}")
    if (doc.delta is not None) != bool(h.flags & FLAG_DELTA):
        why = "meta: a delta link without the header's delta flag, or the flag without a link"
        raise _fail(path, HEADER_SIZE, why)
    if doc.delta is not None:
        parent = parse_snapshot_name(doc.delta.parent)
        if parent is None or parent[1] >= h.lsn:
            why = f"meta: delta parent {doc.delta.parent} does not end before LSN {h.lsn}"
            raise _fail(path, HEADER_SIZE, why)
    limit = body_limit(h.body_len)
    if doc.body_bytes > limit:
        raise CorruptionError(
            path,
            HEADER_SIZE,
            f"size: the meta declares a body of {doc.body_bytes} bytes from "
            f"{h.body_len} compressed, over the limit of {limit}",
            hint="a body may expand at most 1024 times; STATELOG_MAX_SNAPSHOT_BYTES "
            "caps it further (raise it only for a snapshot you trust)",
        )
    return doc


def _inflate(path: Path, src: _Section, sink: CountingSink, offset: int) -> None:
    """Decompress ``src`` into ``sink``; a failure or an oversized body is body damage."""
    try:
        # zstandard calls only read() and write(); the stubs ask for full file objects.
        zstandard.ZstdDecompressor().copy_stream(
            cast(IO[bytes], src), cast(IO[bytes], sink), read_size=_CHUNK, write_size=_CHUNK
        )
    except zstandard.ZstdError as exc:
        raise _fail(path, offset, f"body: the zstd frame does not decode: {exc}") from None
    except BodyTooLarge as exc:
        raise _fail(path, offset, f"body: {exc}") from None


def _check_body(
    path: Path, body: _Section, sink: CountingSink, digest: bytes, size: int, inflate: bool
) -> None:
    """Hash the body (decompressing it into ``sink`` first if ``inflate``) against ``digest``.

    On a mismatch without ``inflate``, the body is decompressed from a second
    read to tell body damage (its zstd checksum fails) from damage elsewhere.
    """
    # The header's lengths were checked against the file size: the body ends at the footer.
    body_at, foot_at = size - FOOTER_SIZE - body.left, size - FOOTER_SIZE
    if inflate:
        _inflate(path, body, sink, body_at)
    while body.read(_CHUNK):
        pass  # hash what the decompressor did not read
    if body.left:
        raise _fail(path, size - body.left, "size: the file shrank while it was read")
    if body.hasher.digest() == digest:
        return
    if not inflate:
        with open_read(path) as again:
            again.seek(body_at)
            probe = CountingSink(None, sink.limit)
            _inflate(path, _Section(again, foot_at - body_at, hashlib.sha256()), probe, body_at)
    raise _fail(
        path,
        foot_at,
        f"sha256 mismatch: footer holds {digest.hex()[:16]}..., the bytes hash to "
        f"{body.hasher.hexdigest()[:16]}...; the body still decodes in full and passes "
        "its zstd checksum, so what changed is covered by the hash alone: the header's "
        "chain, a meta value, the digest, or a frame bit zstd does not check",
    )


def _check_frame_size(path: Path, h: SnapshotHeader, doc: MetaDoc, frame_head: bytes) -> None:
    """Format 1: the frame's content size must be the meta's image size."""
    try:
        declared = zstandard.frame_content_size(frame_head)
    except zstandard.ZstdError as exc:
        raise _fail(path, HEADER_SIZE + h.meta_len, f"body: no zstd frame header: {exc}") from None
    if declared != doc.body_bytes:
        raise _fail(path, HEADER_SIZE, f"meta: image_bytes {doc.body_bytes}, body holds {declared}")
