"""Snapshot files: the base level, zstd-compressed, hashed, written atomically.

The byte layout (header, meta, body, footer) is :mod:`statelog.format.snapshot`,
the body's record stream :mod:`statelog.format.stream`; this module does the
file I/O: it writes a snapshot durably, verifies one, and builds the LMDB
image of its base level from it (:mod:`statelog.storage.snapshot_body`).

File name: ``<epoch:016x>-<lsn:016x>.snap`` in ``STORE/snapshots``, so name
order is age order. ``chain`` is the crc the log continues from after
``lsn`` (the SEAL frame of the last folded segment): recovery checks that
the log links to it. Every read hashes the whole file (invariant 5); a
mismatch is a :class:`~statelog.errors.CorruptionError` naming the part
that failed, an ``OSError`` propagates (an I/O error is not damage).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

import msgspec
import zstandard

from statelog.format.snapshot import (
    FLAG_DELTA,
    HEADER_SIZE,
    IMAGE_VERSION,
    VERSION,
    SnapshotHeader,
    encode_meta,
    pack_footer,
    parse_snapshot_name,
    snapshot_name,
)
from statelog.storage.fileio import Buffer, FileLayer
from statelog.storage.listing import regular_files
from statelog.storage.snapshot_body import stream_image
from statelog.storage.snapshot_read import SnapshotMeta, open_read, read_snapshot

__all__ = [
    "SnapshotMeta",
    "StreamWriter",
    "extract_snapshot",
    "list_snapshots",
    "parse_snapshot_name",
    "snapshot_name",
    "verify_snapshot",
    "write_delta_snapshot",
    "write_snapshot",
]

StreamWriter = Callable[[Callable[[bytes], object]], tuple[int, dict[str, int]]]
"""Writes a record stream through the callable it is given; returns its size and counts."""

_CHUNK = 1 << 20


def list_snapshots(snap_dir: Path) -> list[tuple[int, int, Path]]:
    """``(epoch, lsn, path)`` of every snapshot in ``snap_dir``, NEWEST first.

    Temporary (``*.tmp``) and any other files are ignored, and so is anything
    named like a snapshot that is not a regular file (logged once:
    :func:`~statelog.storage.listing.regular_files`); a missing directory holds
    no snapshot.

    :raises OSError: the directory exists but cannot be listed.
    """
    try:
        entries = regular_files(snap_dir, parse_snapshot_name)
    except FileNotFoundError:
        return []
    found = [(*named, p) for p in entries if (named := parse_snapshot_name(p)) is not None]
    return sorted(found, reverse=True)


def write_snapshot(
    files: FileLayer,
    snap_dir: Path,
    meta: SnapshotMeta,
    image: Path,
    *,
    level: int = 3,
    version: int = VERSION,
    stream: StreamWriter | None = None,
) -> tuple[Path, SnapshotMeta]:
    """Write the state of the finished LMDB ``image`` as the snapshot ``meta`` describes.

    The body is the record stream of ``image`` (format 2), or, with
    ``version=1``, the image itself (kept so that tests can make the
    snapshots older stores hold). With ``stream``, that writes the record
    stream instead of it being read from ``image`` (a full merge streams the
    entries it appends to the image it builds meanwhile:
    :class:`~statelog.storage.snapshot_body.StreamTee`), and ``created_ms``
    is taken once it has finished. ``meta.body_bytes`` is replaced by the
    body's size, and for format 2 ``meta.tables`` by the keys the stream
    holds per table (format 1 keeps the caller's counts); the meta written
    is returned.

    First the body is streamed through zstd into an unnamed scratch file
    beside ``image`` (not a durable step: the header must carry the body
    length). Durable steps, in order, each through ``files``:
    ``create_durable`` writes ``<name>.tmp`` holding header and meta (temp,
    fsync, rename, fsync dir); the body and the footer are appended to it,
    hashed as they are written, and synced; ``<name>.tmp`` is renamed to
    ``<name>``; the directory is fsynced. A crash at any moment leaves no
    ``<name>``, or the whole file; at worst a stray ``*.tmp`` that
    ``remove_temp_files`` deletes. Neither the image nor the body is ever
    held in memory.

    :raises ValueError: ``meta`` is out of range.
    :raises FileExistsError: a snapshot of that name exists (never replaced:
        a damaged one is evidence).
    :raises OSError: a step failed; ``<name>.tmp`` was removed where
        possible. If only the last directory fsync failed, the complete
        file may be visible (as with ``FileLayer.create_durable``).
    """
    return _write(
        files, snap_dir, meta, image.parent,
        lambda body: _compress(image, body, meta, level, version, stream), version,
    )  # fmt: skip


def write_delta_snapshot(
    files: FileLayer,
    snap_dir: Path,
    meta: SnapshotMeta,
    stream: StreamWriter,
    *,
    scratch: Path,
    level: int = 3,
) -> tuple[Path, SnapshotMeta]:
    """Write the delta snapshot ``meta`` describes (``meta.delta`` set), its body from ``stream``.

    ``stream`` writes the delta's record stream
    (:func:`~statelog.storage.snapshot_body.stream_delta`); ``meta.tables``
    is the state's keys per table after the delta, which the caller knows;
    ``body_bytes``, ``delta.changes`` and ``delta.chain_bytes`` (the parent's
    chain bytes, as given, plus this body) are filled in here. The durable
    steps are :func:`write_snapshot`'s; the compressed body goes to an
    unnamed scratch file in ``scratch`` first.

    :raises ValueError: ``meta`` is out of range or has no ``delta``.
    :raises FileExistsError: a snapshot of that name exists.
    :raises OSError: as :func:`write_snapshot`.
    """
    if meta.delta is None:
        raise ValueError("a delta snapshot needs meta.delta")
    delta = meta.delta

    def produce(body: IO[bytes]) -> SnapshotMeta:
        size, changes = _zstd_frame(body, level, stream)
        link = msgspec.structs.replace(delta, changes=changes, chain_bytes=delta.chain_bytes + size)
        return dataclasses.replace(meta, body_bytes=size, delta=link)

    return _write(files, snap_dir, meta, scratch, produce, VERSION)


def _write(
    files: FileLayer,
    snap_dir: Path,
    meta: SnapshotMeta,
    scratch: Path,
    produce: Callable[[IO[bytes]], SnapshotMeta],
    version: int,
) -> tuple[Path, SnapshotMeta]:
    _check(meta)
    final = snap_dir / snapshot_name(meta.epoch, meta.lsn)
    if final.exists():
        raise FileExistsError(final)
    tmp = final.with_name(final.name + ".tmp")
    # Unbuffered: closing it after a failure has nothing to flush, which on a full
    # disk would fail again and hide the first error.
    with tempfile.TemporaryFile(dir=scratch, buffering=0) as body:
        meta = produce(body)
        head = _pack_head(meta, body.tell(), version)
        body.seek(0)
        try:
            digest = _append_durably(files, tmp, head, body)
            files.rename(tmp, final)
        except BaseException:
            for stray in (tmp, tmp.with_name(tmp.name + ".tmp")):
                with contextlib.suppress(OSError):
                    files.remove(stray)
            raise
    files.fsync_dir(snap_dir)
    return final, dataclasses.replace(meta, sha256=digest.hex())


def _compress(
    image: Path,
    body: IO[bytes],
    meta: SnapshotMeta,
    level: int,
    version: int,
    stream: StreamWriter | None = None,
) -> SnapshotMeta:
    """Write the zstd frame of ``image``'s body to ``body``; the meta with the body's sizes."""
    if version == IMAGE_VERSION:
        size = image.stat().st_size
        cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)
        with image.open("rb") as src:
            cctx.copy_stream(src, _whole(body), size=size, read_size=_CHUNK,
                             write_size=_CHUNK)  # fmt: skip
        return _with(meta, size, meta.tables)
    size, counts = _zstd_frame(body, level, stream or functools.partial(stream_image, image))
    if stream is not None:  # the stream built the image meanwhile: made now, not before
        meta = dataclasses.replace(meta, created_ms=int(time.time() * 1000))
    return _with(meta, size, counts)


class _WholeWrites:
    """Writes each buffer whole to the unbuffered ``raw`` file: zstd ignores the count a
    ``write`` returns, and a raw file's write may take only part (a disk filling up)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw

    def write(self, data: Buffer) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            n = self._raw.write(view)
            if not n:
                raise OSError(errno.ENOSPC, "the scratch file took no bytes")
            view = view[n:]
        return total

    def flush(self) -> None:
        self._raw.flush()


def _whole(raw: IO[bytes]) -> IO[bytes]:
    return cast(IO[bytes], _WholeWrites(raw))  # zstd calls only write and flush


def _zstd_frame(body: IO[bytes], level: int, stream: StreamWriter) -> tuple[int, dict[str, int]]:
    """Write one zstd frame (with its checksum) of what ``stream`` writes to ``body``;
    returns what ``stream`` returns.

    An error of ``stream`` is raised as it is: the compressor is not closed after it,
    since closing flushes what it holds, which on a full disk fails too and would be
    reported instead.
    """
    cctx = zstandard.ZstdCompressor(level=level, write_checksum=True)
    writer = cctx.stream_writer(_whole(body), closefd=False, write_size=_CHUNK)
    made = stream(writer.write)  # on an error the writer is left unflushed: the body is void
    writer.close()  # type: ignore[no-untyped-call]
    return made


def _with(meta: SnapshotMeta, body_bytes: int, tables: dict[str, int]) -> SnapshotMeta:
    return dataclasses.replace(meta, tables=dict(tables), body_bytes=body_bytes, delta=None)


def _append_durably(files: FileLayer, tmp: Path, head: bytes, body: IO[bytes]) -> bytes:
    """``create_durable(tmp, head)``, then the body and the footer appended and synced;
    returns the footer's digest."""
    hasher = hashlib.sha256(head)
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
    return hasher.digest()


def _check(meta: SnapshotMeta) -> None:
    if not (0 <= meta.epoch < 1 << 64 and 0 <= meta.lsn < 1 << 64 and 0 <= meta.chain < 1 << 32):
        raise ValueError(f"epoch, lsn or chain out of range in {meta}")


def _pack_head(meta: SnapshotMeta, body_len: int, version: int) -> bytes:
    encoded = encode_meta(
        meta.offsets, meta.low_watermark_ms, meta.tables, meta.body_bytes, meta.created_ms,
        version=version, delta=meta.delta, commit_ms=meta.commit_ms,
    )  # fmt: skip
    flags = FLAG_DELTA if meta.delta is not None else 0
    fixed = SnapshotHeader(
        meta.store_id,
        meta.epoch,
        meta.lsn,
        meta.chain,
        len(encoded),
        body_len,
        version,
        flags=flags,
    ).pack()
    return fixed + encoded


def verify_snapshot(
    files: FileLayer,
    path: Path,
    *,
    store_id: uuid.UUID | None,
    parse: bool = True,
    body: bool = True,
    portable_only: bool = False,
) -> SnapshotMeta:
    """Check every byte of the snapshot at ``path`` (all but its body with ``body``
    False); return what it says.

    Reads only (:func:`~statelog.storage.snapshot_read.open_read`: reading is
    not a durable step). Checks, in order: magic, version, header fields,
    lengths against the file size, the file name, the store id, the footer
    magic, the meta and its declared body size, then the body: a format-2
    body is decompressed and parsed record by record (every key typed and
    within limits, every table name valid, the counts the meta gives),
    unless ``parse`` is False; a format-1 body, and any body when ``parse``
    is False, is hashed only. Last the SHA-256 of everything before the
    footer.

    :param files: not used for reading (no durable step is taken); accepted
        so callers hand every snapshot function the same layer.
    :param store_id: the store the snapshot must belong to (None: any).
    :param parse: False: the hash alone (for a store's own files, when
        only their integrity is in question).
    :param body: False, with ``parse`` False: neither the body nor the hash is
        read, every other check is made, and the ``sha256`` returned is only what
        the footer claims (for a caller that read this file whole before,
        :mod:`statelog.storage.whole_checks`).
    :param portable_only: refuse a format-1 snapshot (whose body is a raw
        LMDB image): for snapshots from elsewhere, such as a bucket.
    :raises ValueError: ``body`` False with ``parse`` or ``portable_only``.
    :raises CorruptionError: ``reason`` starts with the part that failed:
        ``name:``, ``header:``, ``size:``, ``footer:``, ``meta:``, ``body:``
        or ``sha256 mismatch``.
    :raises FormatVersionError: a snapshot format this code does not read,
        or format 1 with ``portable_only``.
    :raises OSError: reading failed (never reported as corruption).
    """
    return read_snapshot(path, store_id, parse=parse, body=body, portable_only=portable_only)


def extract_snapshot(
    files: FileLayer,
    path: Path,
    dest: Path,
    *,
    store_id: uuid.UUID | None,
    portable_only: bool = False,
) -> SnapshotMeta:
    """Verify the snapshot at ``path`` and produce the LMDB image of its state at ``dest``.

    One pass: each body byte is hashed as it is decompressed, and for
    format 2 parsed and appended to a new image built at ``<dest>.tmp``
    with LMDB's own API (format 1: the image is written out as it is), so
    the state produced is exactly the bytes verified. Only when every check
    passed is ``<dest>.tmp`` renamed to ``dest`` (``files.rename``); on any
    failure it is removed. No fsync: ``dest`` is a cache derived from a
    verified, durable snapshot, good for this process only; after a crash
    it may hold anything, so a restart extracts again rather than trust it.

    :param portable_only: as for :func:`verify_snapshot`.
    :raises CorruptionError: as :func:`verify_snapshot`; ``dest`` untouched.
    :raises FormatVersionError: as :func:`verify_snapshot`.
    :raises OSError: reading, writing, building or renaming failed.
    """
    tmp = dest.with_name(dest.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a crash: scratch, never evidence
    try:
        meta = _extract_to(path, tmp, store_id, portable_only)
        files.rename(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            files.remove(tmp)
        raise
    return meta


def _extract_to(
    path: Path, tmp: Path, store_id: uuid.UUID | None, portable_only: bool
) -> SnapshotMeta:
    with open_read(path) as fh:
        version = SnapshotHeader.peek_version(fh.read(HEADER_SIZE))
    if version != IMAGE_VERSION or portable_only:
        return read_snapshot(path, store_id, out=tmp, portable_only=portable_only)
    # Plain writes, no fsync: a derived cache (see above), not a durable step.
    with open(tmp, "wb") as raw:
        return read_snapshot(path, store_id, out=raw)
