"""Reusing an extracted base image across restarts, instead of decompressing its snapshot again.

Extracting a snapshot verifies every byte of it (SHA-256) while it
decompresses the LMDB image into ``base/``, which is most of a restart. So
each extraction also writes a **stamp** beside the image, ``<image>.ok``
(layout in ``docs/format.md``): the snapshot's name, size and footer hash,
the image's size and CRC-32C, the snapshot's meta, and the stamp's CRC-32C.

A later writer open that chooses the same snapshot looks for an image with
a stamp that matches the snapshot file as it is now (same name, size and
footer hash). Then one of two checks decides:

- **Settled** (the restart's cost does not grow with the state): the stamp
  also records, under ``settled``, the inode, size and mtime of the image
  and of the snapshot as they were once the image was fsynced and both
  files had been checked whole. If both files still have exactly those,
  neither has been written since it was checked (images are opened
  read-only, snapshots are never rewritten), and the image is mapped
  without reading either file. This is the threat model's trust in this
  host's own files; media corruption underneath an unchanged inode is
  found by ``statelog verify``, which compares every image with its
  snapshot, not by the open.
- **Whole** (no settled record, or a file changed): the snapshot's SHA-256
  must equal its footer's, so a snapshot damaged since is refused by the
  ladder exactly as an extraction would refuse it, and the image must
  still have the stamped CRC-32C, read in full. A writer open that passes
  this check then settles the stamp (image fsynced, then the stamp
  rewritten with both identities), so the next restart is a settled one.

Anything else (no stamp, a torn or edited stamp, an image changed by a
crash or by bit rot, a snapshot that no longer hashes to its footer) falls
back to extracting and verifying the snapshot, which also names the damage.

Durable steps: an extraction's stamp is written without fsync and without
a settled record: a crash can leave either file half-written, and the
checksums turn that into a fallback, never into a wrong base. A settled
record is written only after the image's fsync, so no crash can leave a
settled stamp beside an image whose bytes were not on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import uuid
from collections.abc import Collection, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import crc32c

from statelog.format.snapshot import FOOTER_SIZE
from statelog.storage.fileio import FileLayer
from statelog.storage.image_stamp import (
    STAMP_SUFFIX,
    file_identity,
    footer_hash,
    load_stamp,
    settled_matches,
    stamp_doc,
    stamp_of,
)
from statelog.storage.snapshots import SnapshotMeta, extract_snapshot
from statelog.storage.whole_checks import HASHED, check_once

__all__ = [
    "PUBLISHED_TAG",
    "copy_reusable",
    "extract_stamped",
    "image_crc",
    "image_path",
    "publish_image",
    "published",
    "reusable_image",
    "seal_image",
]

log = logging.getLogger("statelog.storage.image_cache")

PUBLISHED_TAG = "c"
"""First letter of the token of an image the compactor published (see :func:`publish_image`)."""
_CHUNK = 8 << 20


def image_path(image_dir: Path, snapshot: Path, *, tag: str = "") -> Path:
    """A fresh name for an image of ``snapshot``'s state: ``<name>.<tag><token>.mdb``.

    Never the name of an existing image, so an extraction never renames
    over an image left by an earlier process (whose unlink would then be
    paid on the open path, and which a process still mapping it may read).
    """
    return image_dir / f"{snapshot.name.removesuffix('.snap')}.{tag}{secrets.token_hex(4)}.mdb"


def _stamp(
    files: FileLayer,
    image: Path,
    snapshot: Path,
    meta: SnapshotMeta,
    *,
    settle: bool = False,
    crc: int | None = None,
) -> None:
    """Write ``image``'s stamp (``<stamp>.tmp``, then renamed); a failure is logged only.

    ``settle``: fsync the image first, then record both files' identities
    (see the module docstring); only for an image and snapshot just checked
    whole or written by this process. ``crc``: the image's, if just checked.
    """
    try:
        settled = None
        if settle:
            files.fsync_file(image)
            settled = {"image": file_identity(image), "snapshot": file_identity(snapshot)}
        crc = image_crc(image) if crc is None else crc
        doc = stamp_doc(snapshot, image.stat().st_size, crc, meta, settled)
        tmp = image.with_name(image.name + STAMP_SUFFIX + ".tmp")
        tmp.write_bytes(doc)
        files.rename(tmp, stamp_of(image))
    except OSError as exc:
        log.warning("image=%s event=stamp_not_written error=%r", image.name, exc)


def seal_image(files: FileLayer, image: Path) -> int:
    """Fsync the compactor's finished ``image`` and return its CRC-32C, for :func:`publish_image`.

    Called before the snapshot the image belongs to is renamed into place:
    at 10M keys the fsync and the read of a full image take seconds, and
    done after the rename they would leave a snapshot with no published
    image for long enough that the writer builds the image itself.

    :raises OSError: the fsync or the read failed.
    """
    files.fsync_file(image)
    return image_crc(image)


def publish_image(
    files: FileLayer,
    image: Path,
    image_dir: Path,
    snapshot: Path,
    meta: SnapshotMeta,
    *,
    keep: Collection[str] = (),
    crc: int | None = None,
) -> Path | None:
    """Move the compactor's finished ``image`` of ``snapshot`` into ``image_dir``, stamped.

    For the writer's base watcher and its next open, and read-only opens
    (which copy it), instead of building the image from the snapshot
    again; also the next compaction pass's starting point. Order: the image is
    renamed into place, then its stamp written; then the images this
    function published for older snapshots are removed, except those of
    the snapshots named in ``keep`` (the chain ``snapshot`` extends), and a
    process still mapping one keeps its pages until it unmaps. The stamp is
    settled (the image fsynced before it is written), since this process
    wrote both files; the rename is not a durable step: a crash leaves at
    worst an unstamped image, which the writer's next open removes. ``crc``:
    the image's from :func:`seal_image`, which makes all of this a rename
    and a small write. Returns the image's new path, or None.
    """
    dest = image_path(image_dir, snapshot, tag=PUBLISHED_TAG)
    try:
        files.makedirs(image_dir)
        os.rename(image, dest)  # across directories, and not a durable step: not the layer's
    except OSError as exc:  # another file system, say: the writer builds its own
        log.info("image=%s event=image_not_published error=%r", image.name, exc)
        return None
    _stamp(files, dest, snapshot, meta, settle=True, crc=crc)
    stem = snapshot.name.removesuffix(".snap")
    for old in image_dir.glob(f"*.{PUBLISHED_TAG}*.mdb"):
        old_stem = old.name.split(".", 1)[0]
        if old_stem < stem and f"{old_stem}.snap" not in keep:
            for p in (old, stamp_of(old)):
                with contextlib.suppress(OSError):
                    files.remove(p)
    return dest


def published(image_dir: Path, snapshot: Path) -> bool:
    """Whether ``image_dir`` holds a stamped image the compactor published for ``snapshot``."""
    stem = snapshot.name.removesuffix(".snap")
    return any(image_dir.glob(f"{stem}.{PUBLISHED_TAG}*.mdb{STAMP_SUFFIX}"))


def extract_stamped(
    files: FileLayer,
    snapshot: Path,
    dest: Path,
    *,
    store_id: uuid.UUID,
    portable_only: bool = False,
) -> SnapshotMeta:
    """:func:`~statelog.storage.snapshots.extract_snapshot` to ``dest``, then write its stamp.

    Order: the image is extracted (verified) and renamed into place; then
    the stamp is written to ``<stamp>.tmp`` and renamed. A failed stamp is
    logged and costs only the reuse.

    :raises CorruptionError: the snapshot did not verify (no image, no stamp).
    :raises FormatVersionError: as :func:`~statelog.storage.snapshots.extract_snapshot`.
    :raises OSError: reading or writing the image failed.
    """
    meta = extract_snapshot(files, snapshot, dest, store_id=store_id, portable_only=portable_only)
    _stamp(files, dest, snapshot, meta)
    return meta


def reusable_image(
    image_dir: Path, snapshot: Path, *, store_id: uuid.UUID, files: FileLayer | None = None
) -> tuple[Path, SnapshotMeta] | None:
    """An image in ``image_dir`` of ``snapshot`` as it is now, intact; else None.

    A settled stamp whose files are unchanged is trusted without reading
    them; otherwise each candidate image is read whole to check its CRC-32C
    (from the page cache after a restart, typically: several GiB/s) and,
    with ``files`` (a writer's open, which owns ``image_dir``), its stamp is
    then settled so the next restart does not read it again.
    """
    for image, doc, meta, settled in _candidates(image_dir, snapshot, store_id):
        if settled:
            return image, meta
        try:
            crc = doc["crc"]
            intact = image.stat().st_size == doc["image_bytes"] and check_once(
                image, ("crc32c", crc), partial(_crc_is, image, crc)
            )
        except OSError:
            intact = False
        if intact:
            if files is not None:
                _stamp(files, image, snapshot, meta, settle=True, crc=doc["crc"])
            return image, meta
        log.warning(
            "image=%s event=stale_image reason='crc or size differs from its stamp'", image.name
        )
    return None


def copy_reusable(
    image_dir: Path, snapshot: Path, dest_dir: Path, *, store_id: uuid.UUID
) -> tuple[Path, SnapshotMeta] | None:
    """A private copy, in ``dest_dir``, of an intact image of ``snapshot`` in ``image_dir``.

    For a read-only open, which must not map the writer's files but may
    copy them: the copy's own CRC-32C is checked against the stamp, so an
    image removed or replaced while it was copied is never used. None if
    no candidate survives (the caller extracts the snapshot instead).
    """
    for image, doc, meta, _settled in _candidates(image_dir, snapshot, store_id):
        dest = image_path(dest_dir, snapshot)
        try:
            shutil.copyfile(image, dest)
            if dest.stat().st_size == doc["image_bytes"] and image_crc(dest) == doc["crc"]:
                return dest, meta
        except OSError:
            pass  # removed by its writer meanwhile: try the next, or extract
        with contextlib.suppress(OSError):
            dest.unlink()
    return None


def _candidates(
    image_dir: Path, snapshot: Path, store_id: uuid.UUID
) -> Iterator[tuple[Path, dict[str, Any], SnapshotMeta, bool]]:
    """Images in ``image_dir`` whose stamp names ``snapshot`` as it is now, of this store,
    each with whether its settled stamp still matches both files.

    Stops, yielding nothing more, if ``snapshot`` no longer hashes to its
    footer (damaged since: the extraction names the damage); the hash is
    skipped for a candidate whose settled stamp still matches both files.
    """
    stem = snapshot.name.removesuffix(".snap")
    try:
        stamps = sorted(image_dir.glob(f"{stem}.*.mdb{STAMP_SUFFIX}"))
        size, footer = snapshot.stat().st_size, footer_hash(snapshot)
    except OSError:
        return
    hashed = False
    for stamp in stamps:
        got = load_stamp(stamp)
        if got is None:
            continue
        doc, meta = got
        named = (doc["snapshot"], doc["snapshot_bytes"], doc["footer"])
        if named != (snapshot.name, size, footer) or meta.store_id != store_id:
            continue
        image = stamp.with_name(stamp.name.removesuffix(STAMP_SUFFIX))
        settled = settled_matches(doc, image, snapshot)
        if not hashed and not settled:
            if not check_once(
                snapshot, (HASHED, footer), lambda: _hashes_to_footer(snapshot, size, footer)
            ):
                return
            hashed = True
        yield image, doc, meta, settled


def _hashes_to_footer(snapshot: Path, size: int, footer: str) -> bool:
    """Whether the SHA-256 of ``snapshot`` before its footer is the footer's digest."""
    h = hashlib.sha256()
    left = size - FOOTER_SIZE
    with open(snapshot, "rb", buffering=0) as fh:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while left > 0:
            n = fh.readinto(view[: min(left, _CHUNK)])
            if not n:
                return False
            h.update(view[:n])
            left -= n
    return h.hexdigest() == footer[:64]


def _crc_is(image: Path, crc: int) -> bool:
    return image_crc(image) == crc


def image_crc(image: Path) -> int:
    """The CRC-32C of the whole file at ``image``, read in 8 MiB chunks."""
    crc = 0
    with open(image, "rb", buffering=0) as fh:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            crc = crc32c.crc32c(view[:n], crc)
    return crc
