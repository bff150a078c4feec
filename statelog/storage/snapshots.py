"""Snapshot files: the base level, zstd-compressed, hashed, written atomically.

The byte layout (header, meta, body, footer) is :mod:`statelog.format.snapshot`;
this module does the file I/O: it writes a snapshot durably, verifies one,
and extracts its LMDB image.

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
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import msgspec
import zstandard

from statelog.errors import CorruptionError, FormatVersionError
from statelog.format.snapshot import (
    END_MAGIC,
    FOOTER_SIZE,
    HEADER_SIZE,
    MAGIC,
    VERSION,
    MetaDoc,
    SnapshotHeader,
    decode_meta,
    encode_meta,
    pack_footer,
    parse_snapshot_name,
    snapshot_name,
    unpack_footer,
)
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

_CHUNK = 1 << 20
_HINT = (
    "recovery skips a damaged snapshot and walks back to an older one; "
    "the file is kept as evidence (run `statelog verify` to list damaged files)"
)


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
                out.write([pack_footer(hasher.digest())])
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
    encoded = encode_meta(
        meta.offsets, meta.low_watermark_ms, meta.tables, meta.image_bytes, meta.created_ms
    )
    fixed = SnapshotHeader(
        meta.store_id, meta.epoch, meta.lsn, meta.chain, len(encoded), body_len
    ).pack()
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
    """Every check of :func:`verify_snapshot`, in its order; the image goes to ``out`` if given."""
    named = parse_snapshot_name(path)
    if named is None:
        raise _fail(path, 0, "name: not <epoch:016x>-<lsn:016x>.snap, so unchecked against it")
    with _open_read(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(HEADER_SIZE)
        h = _check_header(path, head, size, named, store_id)
        fh.seek(size - FOOTER_SIZE)
        digest, end = unpack_footer(fh.read(FOOTER_SIZE))
        if end != END_MAGIC:
            raise _fail(path, size - 8, f"footer: bad end magic {end!r}")
        fh.seek(HEADER_SIZE)
        raw_meta = fh.read(h.meta_len)
        try:
            doc = decode_meta(raw_meta)
        except msgspec.DecodeError as exc:
            raise _fail(path, HEADER_SIZE, f"meta: does not decode: {exc}") from exc
        if doc.compression != "zstd":
            raise _fail(path, HEADER_SIZE, f"meta: unknown compression {doc.compression!r}")
        body = _Section(fh, h.body_len, hashlib.sha256(head + raw_meta))
        _check_body(path, body, _Sink(out, doc.image_bytes), digest, size, inflate=out is not None)
    return _meta_of(path, h, doc, body.head)


def _check_header(
    path: Path, head: bytes, size: int, named: tuple[int, int], store_id: uuid.UUID | None
) -> SnapshotHeader:
    """The header's checks: magic, version, file size, fixed fields, lengths, name, store id."""
    if len(head) >= 8 and head[:8] != MAGIC:
        raise _fail(path, 0, f"header: bad magic {head[:8]!r}, not a statelog snapshot")
    version = SnapshotHeader.peek_version(head)
    if version is not None and version != VERSION:
        raise FormatVersionError(path, version, VERSION)
    if size < HEADER_SIZE + FOOTER_SIZE:
        raise _fail(path, size, f"size: truncated, {size} bytes is less than header+footer")
    h = SnapshotHeader.unpack(head)
    if h.header_len != HEADER_SIZE or h.flags:
        why = f"header: header_len={h.header_len} flags={h.flags:#x}, want 64 and 0"
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


def _check_body(
    path: Path, body: _Section, sink: _Sink, digest: bytes, size: int, *, inflate: bool
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
        with _open_read(path) as again:
            again.seek(body_at)
            _inflate(path, _Section(again, foot_at - body_at, hashlib.sha256()), sink, body_at)
    raise _fail(
        path,
        foot_at,
        f"sha256 mismatch: footer holds {digest.hex()[:16]}..., the bytes hash to "
        f"{body.hasher.hexdigest()[:16]}...; the body still decodes in full and passes "
        "its zstd checksum, so what changed is covered by the hash alone: the header's "
        "chain, a meta value, the digest, or a frame bit zstd does not check",
    )


def _meta_of(path: Path, h: SnapshotHeader, doc: MetaDoc, frame_head: bytes) -> SnapshotMeta:
    """What a snapshot whose hash matched says; a length mismatch here is a writer's bug."""
    try:
        declared = zstandard.frame_content_size(frame_head)
    except zstandard.ZstdError as exc:
        raise _fail(path, HEADER_SIZE + h.meta_len, f"body: no zstd frame header: {exc}") from exc
    if declared != doc.image_bytes:
        raise _fail(
            path, HEADER_SIZE, f"meta: image_bytes {doc.image_bytes}, body holds {declared}"
        )
    return SnapshotMeta(
        h.store_id, h.epoch, h.lsn, h.chain, doc.offsets, doc.low_watermark_ms, doc.tables,
        doc.image_bytes, doc.created_ms,
    )  # fmt: skip
