"""Snapshot files: the base level, zstd-compressed, hashed, written atomically.

Grammar (all integers little-endian; ``docs/format.md``, "Snapshots", has
the byte-offset tables and a worked example)::

    snapshot := header meta body footer
    header   := magic "STLGSNAP"(8) version(u16)=1 header_len(u16)=64 flags(u32)=0
                store_id(16) epoch(u64) lsn(u64) chain(u32)
                meta_len(u32) body_len(u64)                        -- 64 bytes
    meta     := msgpack map {"offsets", "low_watermark_ms", "tables",
                "image_bytes", "created_ms", "compression": "zstd"}   -- meta_len bytes
    body     := one zstd frame (content size and content checksum in it)
                holding the LMDB image of :mod:`statelog.storage.image`     -- body_len bytes
    footer   := sha256(header meta body)(32) magic "STLGSEND"(8)   -- 40 bytes

File name: ``<epoch:016x>-<lsn:016x>.snap`` in ``STORE/snapshots``, so name
order is age order. ``chain`` is the crc the log continues from after
``lsn`` (the SEAL frame of the last folded segment): recovery checks that
the log links to it. Every read hashes the whole file (invariant 5); a
mismatch is a :class:`~statelog.errors.CorruptionError` naming the part
that failed, an ``OSError`` propagates (an I/O error is not damage).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import struct
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, cast

import msgspec
import zstandard

from statelog.errors import CorruptionError, FormatVersionError
from statelog.storage.fileio import FileLayer

__all__ = [
    "SnapshotMeta",
    "extract_snapshot",
    "list_snapshots",
    "parse_snapshot_name",
    "snapshot_name",
    "verify_snapshot",
    "write_snapshot",
]

MAGIC = b"STLGSNAP"
END_MAGIC = b"STLGSEND"
VERSION = 1
HEADER_SIZE = 64
FOOTER_SIZE = 40
SNAPSHOT_SUFFIX = ".snap"
# magic, version, header_len, flags, store_id, epoch, lsn, chain, meta_len, body_len
_HEADER = struct.Struct("<8sHHI16sQQIIQ")
_FOOTER = struct.Struct("<32s8s")
assert _HEADER.size == HEADER_SIZE and _FOOTER.size == FOOTER_SIZE
_CHUNK = 1 << 20
_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.snap$")
_HINT = (
    "recovery skips a damaged snapshot and walks back to an older one; "
    "the file is kept as evidence (run `statelog verify` to list damaged files)"
)
_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class _MetaDoc(msgspec.Struct):
    """The meta map. Readers ignore keys they do not know; every key here is required."""

    offsets: dict[str, int]
    low_watermark_ms: int
    tables: dict[str, _NonNegative]
    image_bytes: _NonNegative
    created_ms: int
    compression: str


_meta_decoder = msgspec.msgpack.Decoder(_MetaDoc)


@dataclass(frozen=True)
class SnapshotMeta:
    """Everything a snapshot says about itself, besides the image."""

    store_id: uuid.UUID
    epoch: int
    lsn: int
    chain: int
    offsets: dict[str, int]
    low_watermark_ms: int
    tables: dict[str, int]
    image_bytes: int
    created_ms: int


def snapshot_name(epoch: int, lsn: int) -> str:
    """File name of a snapshot: hex epoch and hex LSN, so name order is age order."""
    return f"{epoch:016x}-{lsn:016x}{SNAPSHOT_SUFFIX}"


def parse_snapshot_name(path: Path | str) -> tuple[int, int] | None:
    """``(epoch, lsn)`` from a snapshot file name, or None for any other file."""
    m = _NAME.match(Path(path).name)
    return None if m is None else (int(m.group(1), 16), int(m.group(2), 16))


def list_snapshots(snap_dir: Path) -> list[tuple[int, int, Path]]:
    """``(epoch, lsn, path)`` of every snapshot in ``snap_dir``, NEWEST first.

    Temporary (``*.tmp``) and any other files are ignored; a missing
    directory holds no snapshot.

    :raises OSError: the directory exists but cannot be listed.
    """
    try:
        entries = list(snap_dir.iterdir())
    except FileNotFoundError:
        return []
    found = [(*named, p) for p in entries if (named := parse_snapshot_name(p)) is not None]
    return sorted(found, reverse=True)


def write_snapshot(
    files: FileLayer, snap_dir: Path, meta: SnapshotMeta, image: Path, *, level: int = 3
) -> Path:
    """Write ``image`` as the snapshot ``meta`` describes; return its path.

    First the image is streamed through zstd into an unnamed scratch file
    beside it (not a durable step: the header must carry the body length).
    Durable steps, in order, each through ``files``: ``create_durable``
    writes ``<name>.tmp`` holding header and meta (temp, fsync, rename,
    fsync dir); the body and the footer are appended to it, hashed as they
    are written, and synced; ``<name>.tmp`` is renamed to ``<name>``; the
    directory is fsynced. A crash at any moment leaves no ``<name>``, or
    the whole file; at worst a stray ``*.tmp`` that ``remove_temp_files``
    deletes. Neither the image nor the body is ever held in memory.

    :raises ValueError: ``meta`` is out of range or its ``image_bytes`` is
        not the image's size.
    :raises FileExistsError: a snapshot of that name exists (never replaced:
        a damaged one is evidence).
    :raises OSError: a step failed; ``<name>.tmp`` was removed where
        possible. If only the last directory fsync failed, the complete
        file may be visible (as with ``FileLayer.create_durable``).
    """
    size = image.stat().st_size
    _check(meta, size)
    final = snap_dir / snapshot_name(meta.epoch, meta.lsn)
    if final.exists():
        raise FileExistsError(final)
    tmp = final.with_name(final.name + ".tmp")
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)
    with tempfile.TemporaryFile(dir=image.parent) as body:
        with image.open("rb") as src:
            cctx.copy_stream(src, body, size=size, read_size=_CHUNK, write_size=_CHUNK)
        head = _pack_head(meta, body.tell())
        body.seek(0)
        hasher = hashlib.sha256(head)
        try:
            files.create_durable(tmp, head)
            out = files.open_append(tmp)
            try:
                while chunk := body.read(_CHUNK):
                    hasher.update(chunk)
                    out.write([chunk])
                out.write([_FOOTER.pack(hasher.digest(), END_MAGIC)])
                out.sync()
            finally:
                out.close()
            files.rename(tmp, final)
        except BaseException:
            for stray in (tmp, tmp.with_name(tmp.name + ".tmp")):
                with contextlib.suppress(OSError):
                    files.remove(stray)
            raise
    files.fsync_dir(snap_dir)
    return final


def _check(meta: SnapshotMeta, image_size: int) -> None:
    if not (0 <= meta.epoch < 1 << 64 and 0 <= meta.lsn < 1 << 64 and 0 <= meta.chain < 1 << 32):
        raise ValueError(f"epoch, lsn or chain out of range in {meta}")
    if meta.image_bytes != image_size:
        raise ValueError(f"meta.image_bytes={meta.image_bytes}, the image has {image_size} bytes")
    if any(n < 0 for n in meta.tables.values()):
        raise ValueError(f"negative table count in {meta.tables}")


def _pack_head(meta: SnapshotMeta, body_len: int) -> bytes:
    doc = _MetaDoc(
        offsets=dict(sorted(meta.offsets.items())),
        low_watermark_ms=meta.low_watermark_ms,
        tables=dict(sorted(meta.tables.items())),
        image_bytes=meta.image_bytes,
        created_ms=meta.created_ms,
        compression="zstd",
    )
    encoded = msgspec.msgpack.encode(doc)
    fixed = _HEADER.pack(
        MAGIC, VERSION, HEADER_SIZE, 0, meta.store_id.bytes, meta.epoch, meta.lsn, meta.chain,
        len(encoded), body_len,
    )  # fmt: skip
    return fixed + encoded


def verify_snapshot(files: FileLayer, path: Path, *, store_id: uuid.UUID | None) -> SnapshotMeta:
    """Check every byte of the snapshot at ``path``; return what it says.

    Reads only (ordinary buffered reads, ``_open_read``: reading is not a
    durable step). Checks, in order: magic, version, header fields, lengths
    against the file size, the file name, the store id, the footer magic,
    the meta, then the sha256 of everything before the footer. On a hash
    mismatch the body is decompressed to tell body damage (its zstd
    checksum fails) from damage elsewhere.

    :param files: not used for reading (no durable step is taken); accepted
        so callers hand every snapshot function the same layer.
    :param store_id: the store the snapshot must belong to (None: any).
    :raises CorruptionError: ``reason`` starts with the part that failed:
        ``name:``, ``header:``, ``size:``, ``footer:``, ``meta:``, ``body:``
        or ``sha256 mismatch``.
    :raises FormatVersionError: a snapshot format this code does not read.
    :raises OSError: reading failed (never reported as corruption).
    """
    return _read(path, store_id, None)


def extract_snapshot(
    files: FileLayer,
    path: Path,
    dest: Path,
    *,
    store_id: uuid.UUID | None,
    on_write: Callable[[bytes], None] | None = None,
) -> SnapshotMeta:
    """Verify the snapshot at ``path`` and decompress its image to ``dest``.

    One pass: each body byte is hashed as it is decompressed into
    ``<dest>.tmp``, so the bytes extracted are exactly the bytes verified.
    Only when every check passed is ``<dest>.tmp`` renamed to ``dest``
    (``files.rename``); on any failure it is removed. No fsync: ``dest`` is
    a cache derived from a verified, durable snapshot, good for this
    process only; after a crash it may hold anything, so a restart
    extracts again rather than trust it.

    ``on_write`` sees every image byte as it is written (the image cache
    computes the image's CRC-32C with it).

    :raises CorruptionError: as :func:`verify_snapshot`; ``dest`` untouched.
    :raises FormatVersionError: as :func:`verify_snapshot`.
    :raises OSError: reading, writing or renaming failed.
    """
    tmp = dest.with_name(dest.name + ".tmp")
    try:
        # Plain writes, no fsync: a derived cache (see above), not a durable step.
        with open(tmp, "wb") as raw:
            out: IO[bytes] = raw if on_write is None else _Tee(raw, on_write)  # type: ignore[assignment]
            meta = _read(path, store_id, out)
        files.rename(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            files.remove(tmp)
        raise
    return meta


def _open_read(path: Path) -> IO[bytes]:
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


class _Tee:
    """Writes to ``out`` and shows each chunk to ``see``."""

    def __init__(self, out: IO[bytes], see: Callable[[bytes], None]) -> None:
        self._out, self._see = out, see

    def write(self, data: bytes) -> int:
        self._see(data)
        return self._out.write(data)


class _Sink:
    """Counts decompressed bytes; writes at most ``limit`` of them to ``out``."""

    def __init__(self, out: IO[bytes] | None, limit: int) -> None:
        self._out, self._limit, self.written = out, limit, 0

    def write(self, data: bytes) -> int:
        room = self._limit - self.written
        if self._out is not None and room > 0:
            self._out.write(data[:room])
        self.written += len(data)
        return len(data)


def _fail(path: Path, offset: int, reason: str) -> CorruptionError:
    return CorruptionError(path, offset, reason, hint=_HINT)


def _inflate(path: Path, src: _Section, sink: _Sink, offset: int) -> None:
    """Decompress ``src`` into ``sink``; a failure or a frame that stops short is body damage."""
    try:
        # zstandard calls only read() and write(); the stubs ask for full file objects.
        zstandard.ZstdDecompressor().copy_stream(
            cast(IO[bytes], src), cast(IO[bytes], sink), read_size=_CHUNK, write_size=_CHUNK
        )
        declared = zstandard.frame_content_size(src.head)
    except zstandard.ZstdError as exc:
        raise _fail(path, offset, f"body: the zstd frame does not decode: {exc}") from exc
    if declared != sink.written:
        why = f"body: the zstd frame yields {sink.written} bytes, its header declares {declared}"
        raise _fail(path, offset, why)


def _read(path: Path, store_id: uuid.UUID | None, out: IO[bytes] | None) -> SnapshotMeta:
    named = parse_snapshot_name(path)
    if named is None:
        raise _fail(path, 0, "name: not <epoch:016x>-<lsn:016x>.snap, so unchecked against it")
    with _open_read(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(HEADER_SIZE)
        if len(head) >= 8 and head[:8] != MAGIC:
            raise _fail(path, 0, f"header: bad magic {head[:8]!r}, not a statelog snapshot")
        if len(head) >= 10 and (version := struct.unpack_from("<H", head, 8)[0]) != VERSION:
            raise FormatVersionError(path, version, VERSION)
        if size < HEADER_SIZE + FOOTER_SIZE:
            raise _fail(path, size, f"size: truncated, {size} bytes is less than header+footer")
        _, _, hlen, flags, raw_id, epoch, lsn, chain, meta_len, body_len = _HEADER.unpack(head)
        if hlen != HEADER_SIZE or flags:
            raise _fail(path, 10, f"header: header_len={hlen} flags={flags:#x}, want 64 and 0")
        meta_at, body_at, foot_at = HEADER_SIZE, HEADER_SIZE + meta_len, size - FOOTER_SIZE
        if body_at + body_len != foot_at:
            raise _fail(
                path,
                min(size, body_at + body_len + FOOTER_SIZE),
                f"size: header declares {body_at + body_len + FOOTER_SIZE} bytes "
                f"(meta {meta_len}, body {body_len}), the file holds {size}: "
                "truncated, or a damaged length field",
            )
        if (epoch, lsn) != named:
            raise _fail(path, 32, f"header: epoch {epoch} and lsn {lsn} disagree with the name")
        sid = uuid.UUID(bytes=raw_id)
        if store_id is not None and sid != store_id:
            raise _fail(path, 16, f"header: snapshot of store {sid}, not of {store_id}")
        fh.seek(foot_at)
        digest, end = _FOOTER.unpack(fh.read(FOOTER_SIZE))
        if end != END_MAGIC:
            raise _fail(path, size - 8, f"footer: bad end magic {end!r}")
        fh.seek(meta_at)
        raw_meta = fh.read(meta_len)
        try:
            doc = _meta_decoder.decode(raw_meta)
        except msgspec.DecodeError as exc:
            raise _fail(path, meta_at, f"meta: does not decode: {exc}") from exc
        if doc.compression != "zstd":
            raise _fail(path, meta_at, f"meta: unknown compression {doc.compression!r}")
        body = _Section(fh, body_len, hashlib.sha256(head + raw_meta))
        sink = _Sink(out, doc.image_bytes)
        if out is not None:
            _inflate(path, body, sink, body_at)
        while body.read(_CHUNK):
            pass  # hash what the decompressor did not read
        if body.left:
            raise _fail(path, size - body.left, "size: the file shrank while it was read")
        if body.hasher.digest() != digest:
            if out is None:  # tell body damage from damage elsewhere
                with _open_read(path) as again:
                    again.seek(body_at)
                    _inflate(path, _Section(again, body_len, hashlib.sha256()), sink, body_at)
            raise _fail(
                path,
                foot_at,
                f"sha256 mismatch: footer holds {digest.hex()[:16]}..., the bytes hash to "
                f"{body.hasher.hexdigest()[:16]}...; the body still decodes in full and passes "
                "its zstd checksum, so what changed is covered by the hash alone: the header's "
                "chain, a meta value, the digest, or a frame bit zstd does not check",
            )
    try:  # the hash matched, so a mismatch below is a writer's bug, not damage on disk
        declared = zstandard.frame_content_size(body.head)
    except zstandard.ZstdError as exc:
        raise _fail(path, body_at, f"body: no zstd frame header: {exc}") from exc
    if declared != doc.image_bytes:
        raise _fail(path, meta_at, f"meta: image_bytes {doc.image_bytes}, body holds {declared}")
    return SnapshotMeta(
        sid, epoch, lsn, chain, doc.offsets, doc.low_watermark_ms, doc.tables, doc.image_bytes,
        doc.created_ms,
    )  # fmt: skip
