"""Mirroring a store directory: the standby's local copy of what its source publishes.

:func:`mirror` brings the copy up to date with one look at the source, in this order:

1. ``IDENTITY``: a new copy gets the source's (directories first, the identity
   last, as a store is created); an existing copy must carry the same store id.
2. Under a pin on every file it lists in the source (so the source's retention
   keeps them while they are read), each snapshot the copy lacks is copied
   (temp file, fsync, rename, fsync of ``snapshots/``); each sealed segment the
   copy lacks or holds only part of is copied whole the same way; the unsealed
   end of the source's log is copied up to the end of its last record that
   verifies (the segment's header, its frames and their chain), appended to
   the copy and synced. Unverified bytes are never copied.
3. What the source's retention deleted is deleted from the copy: segments
   older than the source's oldest, snapshots older than its oldest (pins of the
   copy honoured under its retention guard).

The copy is therefore always a store that a writer could open: every file
whole or a verified prefix, like the store of a writer killed at that moment.
Reading and applying it is the standby's business
(:mod:`statelog.replica.standby`); nothing here decodes a record or a snapshot.
The source is only read (and pinned). Its files are checked where they name
something (segment and snapshot names are parsed, sizes come from the files);
their contents are verified by whoever reads the copy, as any read is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from statelog.errors import NotAStoreError, StorageError
from statelog.format.wal import HEADER_SIZE, parse_segment_name
from statelog.log.reader import StopKind, peek_seal, scan_from, scan_segment
from statelog.log.segments import list_segments
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.pins import (
    ALL,
    PIN_DIR,
    Note,
    log_notes,
    pin,
    pinned_names,
    retention_guard,
)
from statelog.storage.snapshots import list_snapshots

__all__ = ["MirrorResult", "Tails", "mirror", "prune"]

_COPY_CHUNK = 1 << 20


@dataclass
class MirrorResult:
    """What one look at the source did to the copy."""

    snapshots: list[str] = field(default_factory=list)
    """Snapshot files copied."""
    segments: list[str] = field(default_factory=list)
    """Segment files copied whole or extended."""
    deleted: list[str] = field(default_factory=list)
    """Files removed from the copy because the source no longer holds them."""
    rewound: list[str] = field(default_factory=list)
    """Segments whose copy was not a prefix of the source's (the source cut its tail
    after a crash): replaced by the source's verified prefix."""
    copied_bytes: int = 0
    gained: list[tuple[str, bytes, int]] = field(default_factory=list)
    """Records appended to the copy's live segment by this look, verified: (segment name,
    payload, size in the log), in log order; a standby applies them without reading the
    segment again."""
    source_epoch: int = 0
    """The last epoch the source's log holds, as far as its records verify."""


Tails = dict[str, tuple[int, int, int, int]]
"""Per unsealed segment of the copy: where its verified copy ends (a record boundary),
the chain value there, the records before it, and the source file's modification time
when it was read, so the next look reads and verifies only what follows (and compares
the whole segment again if the source was written without growing past that end)."""


def mirror(
    source: Path, dest: Path, files: FileLayer | None = None, tails: Tails | None = None
) -> MirrorResult:
    """Bring the copy at ``dest`` up to date with ``source`` (module docstring).

    :param tails: kept by the caller from one look to the next: a look then reads
        only the bytes of the source's live segment after what it copied before.

    :raises StoreNotFoundError: ``source`` holds no store.
    :raises NotAStoreError: ``dest`` holds another store, or a file.
    :raises CorruptionError: an identity file is unreadable.
    :raises StorageError: an I/O error (nothing partial is visible in the copy).
    """
    files = files or FileLayer()
    src, dst = StoreLayout(source), StoreLayout(dest)
    store_id = src.read_identity(files)
    try:
        _identity(src, dst, files, store_id)
        result = MirrorResult()
        snaps = list_snapshots(src.snapshots)
        segs = list_segments(src.wal)
        names = [f"snapshots/{p.name}" for *_n, p in snaps]
        names += [f"wal/{p.name}" for *_n, p in segs]
        with contextlib.ExitStack() as stack:
            if (source / PIN_DIR).is_dir():
                held = stack.enter_context(pin(source, names, purpose="standby"))
                gone = held.missing
            else:
                gone = frozenset(n for n in names if not (source / n).exists())
            for *_n, p in reversed(snaps):
                if f"snapshots/{p.name}" not in gone:
                    _copy_snapshot(p, dst.snapshots / p.name, files, result)
            present = [s for s in segs if f"wal/{s[2].name}" not in gone]
            tails = {} if tails is None else tails
            for i, (_seq, first, p) in enumerate(present):
                last = i == len(present) - 1
                _copy_segment(p, dst.wal / p.name, files, result, is_last=last, tails=tails)
                result.source_epoch = max(result.source_epoch, first - 1)
            prune(
                dest, present[0][0] if present else None, {p.name for *_n, p in snaps},
                snaps[-1][1] if snaps else None, files, result,
            )  # fmt: skip
    except OSError as exc:
        raise StorageError(f"mirroring {source} to {dest} failed: {exc}", errno=exc.errno) from exc
    return result


def _identity(src: StoreLayout, dst: StoreLayout, files: FileLayer, store_id: object) -> None:
    if dst.identity.exists():
        if dst.read_identity(files) != store_id:
            raise NotAStoreError(
                f"{dst.root} holds another store than {src.root}",
                hint="give the standby an empty directory of its own",
            )
        return
    dst.check_can_host()
    for d in (dst.wal, dst.snapshots):
        files.makedirs(d)
    files.create_durable(dst.identity, files.read(src.identity))


def _copy_whole(source: Path, dest: Path, files: FileLayer) -> int:
    """Copy ``source`` to ``dest``: temp file, fsync, rename, fsync of the directory."""
    tmp = dest.with_name(dest.name + ".tmp")
    with open(source, "rb") as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout, _COPY_CHUNK)
        fout.flush()
        os.fsync(fout.fileno())
        size = fout.tell()
    files.rename(tmp, dest)
    files.fsync_dir(dest.parent)
    return size


def _copy_snapshot(source: Path, dest: Path, files: FileLayer, result: MirrorResult) -> None:
    if dest.exists():
        return
    result.copied_bytes += _copy_whole(source, dest, files)
    result.snapshots.append(f"snapshots/{dest.name}")


def _copy_segment(
    source: Path,
    dest: Path,
    files: FileLayer,
    result: MirrorResult,
    *,
    is_last: bool,
    tails: Tails,
) -> None:
    """Copy a sealed segment whole, or extend the copy of an unsealed one by what verifies."""
    st = source.stat()
    size = st.st_size
    have = dest.stat().st_size if dest.exists() else 0
    seal = peek_seal(source, size)
    if seal is not None:
        known = tails.pop(dest.name, None)
        result.source_epoch = max(result.source_epoch, seal[0])
        if have == size and peek_seal(dest, have) == seal:
            return  # the same SEAL: its crc chains every frame before it
        if known is None or known[0] != have or not _seal_copy(source, dest, files, known):
            if have:  # the copy held a prefix that the sealed segment does not continue
                result.rewound.append(f"wal/{dest.name}")
            _copy_whole(source, dest, files)
        result.copied_bytes += size - have
        result.segments.append(f"wal/{dest.name}")
        return
    known = tails.get(dest.name)
    if (
        known is not None
        and known[0] == have
        and size >= have
        and _extend(
            source, dest, files, result, (*known[:3], st.st_mtime_ns), is_last=is_last, tails=tails
        )
    ):
        return
    data = files.read(source)
    scan = scan_segment(source, data, store_id=None, prev_crc=None, is_last=is_last)
    end = scan.records[-1].end if scan.records else HEADER_SIZE
    if scan.header is None or (scan.stop.kind is StopKind.CORRUPT and scan.stop.offset == 0):
        return  # nothing that verifies yet: whoever reads the copy reports damage
    result.source_epoch = max(result.source_epoch, scan.header.first_lsn - 1 + len(scan.records))
    chain = scan.records[-1].crc if scan.records else scan.header.prev_crc
    tails[dest.name] = (end, chain, len(scan.records), st.st_mtime_ns)
    if end == have and have and files.read(dest) == data[:end]:
        return
    # The copy holds only records that verified in the source; if the source's verified
    # prefix is now shorter, or differs, the source lost its tail (power loss took writes
    # it had not synced) and wrote others: the copy takes the source's log whole.
    if have and (have > end or files.read(dest)[:have] != data[:have]):
        files.create_durable(dest, data[:end])
        result.rewound.append(f"wal/{dest.name}")
        result.copied_bytes += end
    elif have:
        _append(files, dest, memoryview(data)[have:end])
        result.copied_bytes += end - have
    else:
        files.create_durable(dest, data[:end])
        result.copied_bytes += end
    result.segments.append(f"wal/{dest.name}")


def _read_after(source: Path, offset: int) -> bytes:
    """The bytes of ``source`` from ``offset`` to its end, as it is now."""
    with open(source, "rb") as fh:
        fh.seek(offset)
        return fh.read()


def _append(files: FileLayer, dest: Path, chunk: bytes | memoryview) -> None:
    """Append ``chunk`` to the copy ``dest`` and sync it."""
    out = files.open_append(dest)
    try:
        out.write([chunk])
        out.sync()
    finally:
        out.close()


def _seal_copy(
    source: Path, dest: Path, files: FileLayer, known: tuple[int, int, int, int]
) -> bool:
    """Complete the copy of a segment sealed since the last look with what follows its end.

    False (nothing done) unless those bytes verify whole, from the copy's chain
    to the SEAL and the end of the file: the segment is then copied whole.
    """
    have, chain, _records, _mtime = known
    data = _read_after(source, have)
    scan = scan_from(source, data, chain=chain, is_last=False)
    if scan.stop.kind is not StopKind.CLEAN or scan.sealed_lsn is None:
        return False
    _append(files, dest, data)
    return True


def _extend(
    source: Path,
    dest: Path,
    files: FileLayer,
    result: MirrorResult,
    known: tuple[int, int, int, int],
    *,
    is_last: bool,
    tails: Tails,
) -> bool:
    """Append to the copy what verifies after its end, reading only that part of the source.

    ``known`` ends with the source's modification time now. False (nothing done) when
    the first frame there does not continue the copy's chain, or when nothing follows
    but the source was written since the last look: either way the source cut its tail
    since (and may have written other records up to the same length), and the whole
    segment is compared instead.
    """
    have, chain, before, mtime = known
    data = _read_after(source, have)
    scan = scan_from(source, data, chain=chain, is_last=is_last)
    if not scan.records and (
        (scan.stop.kind is StopKind.CORRUPT and scan.stop.offset == 0)
        or mtime != tails[dest.name][3]
    ):
        return False
    records = before + len(scan.records)
    named = parse_segment_name(dest.name)
    assert named is not None  # the copy's segments were listed by name
    result.source_epoch = max(result.source_epoch, named[1] - 1 + records)
    if not scan.records:
        return True
    end = scan.records[-1].end
    _append(files, dest, memoryview(data)[:end])
    tails[dest.name] = (have + end, scan.records[-1].crc, records, mtime)
    result.gained += [(dest.name, bytes(r.payload), r.end - r.offset) for r in scan.records]
    result.copied_bytes += end
    result.segments.append(f"wal/{dest.name}")
    return True


def prune(
    dest: Path,
    oldest_sequence: int | None,
    snapshots: Collection[str],
    oldest_lsn: int | None,
    files: FileLayer,
    result: MirrorResult,
) -> None:
    """Delete what the source's retention deleted: files older than its oldest.

    Segments below ``oldest_sequence`` (the source's oldest) go, oldest first,
    stopping at the first one pinned in the copy, so the copy's log stays one
    unbroken run, as retention leaves a store's; so do snapshots older than
    ``oldest_lsn`` (the source's oldest) whose names are not in ``snapshots``
    (the source's). None: the source holds no such file, nothing of that kind goes.
    """
    layout = StoreLayout(dest)
    old_segs: list[Path] = []
    old_snaps: list[Path] = []
    if oldest_sequence is not None:
        old_segs = [p for seq, _f, p in list_segments(layout.wal) if seq < oldest_sequence]
    if oldest_lsn is not None:
        old_snaps = [
            p
            for _e, lsn, p in list_snapshots(layout.snapshots)
            if lsn < oldest_lsn and p.name not in snapshots
        ]
    if not old_segs and not old_snaps:
        return
    notes: list[Note] = []
    with retention_guard(dest):
        pinned = pinned_names(dest, notes=notes)
        if ALL not in pinned:
            for p in old_snaps:
                if f"snapshots/{p.name}" not in pinned:
                    files.remove(p)
                    result.deleted.append(f"snapshots/{p.name}")
            for p in old_segs:
                if f"wal/{p.name}" in pinned:
                    break
                files.remove(p)
                result.deleted.append(f"wal/{p.name}")
    log_notes(notes)
    if result.deleted:
        files.fsync_dir(layout.snapshots)
        files.fsync_dir(layout.wal)
