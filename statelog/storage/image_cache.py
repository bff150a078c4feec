"""Reusing an extracted base image across restarts, instead of decompressing its snapshot again.

Extracting a snapshot verifies every byte of it (SHA-256) while it
decompresses the LMDB image into ``base/``; at 1M keys that is most of a
restart. So each extraction also writes a **stamp** beside the image,
``<image>.ok``: one JSON line holding the snapshot's name, size and footer
hash, the image's size and CRC-32C (computed once it is in place), the
snapshot's meta (epoch, LSN, chain, offsets, watermark, tables), and a
CRC-32C of the stamp itself.

A later writer open that chooses the same snapshot looks for an image with
a stamp that matches the snapshot file as it is now (same name, size and
footer hash). It still verifies the snapshot on this read: the SHA-256 of
everything before the footer must equal the footer's, so a snapshot
damaged since is refused by the ladder exactly as an extraction would
refuse it. Then the image must still have the stamped CRC-32C, read in
full. If all of that holds, the image is mapped with the stamped meta,
and the snapshot is hashed but not decompressed or written out again,
which is most of a restart's cost. Anything else (no stamp, a torn or
edited stamp, an image changed by a crash or by bit rot, a snapshot that
no longer hashes to its footer) falls back to extracting and verifying
the snapshot, which also names the damage.

Neither file is fsynced: a crash can leave either half-written, and the two
checksums turn that into a fallback, never into a wrong base.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import uuid
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import crc32c
import msgspec

from statelog.format.snapshot import FOOTER_SIZE, DeltaDoc
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import parse_json_doc
from statelog.storage.snapshots import SnapshotMeta, extract_snapshot

__all__ = [
    "PUBLISHED_TAG",
    "STAMP_SUFFIX",
    "copy_reusable",
    "extract_stamped",
    "image_crc",
    "image_path",
    "publish_image",
    "published",
    "reusable_image",
    "stamp_of",
]

log = logging.getLogger("statelog.storage.image_cache")

STAMP_SUFFIX = ".ok"
PUBLISHED_TAG = "c"
"""First letter of the token of an image the compactor published (see :func:`publish_image`)."""
_CHUNK = 8 << 20

# Files this process has already checked whole (an image's CRC-32C, a
# snapshot's SHA-256), by path, size, mtime and inode: a writer swapping in
# each delta of a chain reopens the chain's full image every time, and
# must not read gigabytes to recheck what it checked a minute ago. A file
# changed since (new size, mtime or inode) is checked again.
_checked: set[tuple[str, int, int, int, object]] = set()


def _identity(path: Path, what: object) -> tuple[str, int, int, int, object]:
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns, st.st_ino, what)


def _check_once(path: Path, what: object, check: Any) -> bool:
    """``check()``, or True without calling it if ``path`` passed it unchanged before."""
    key = _identity(path, what)
    if key in _checked:
        return True
    ok = bool(check())
    if ok:
        _checked.add(key)
    return ok


def stamp_of(image: Path) -> Path:
    """The stamp file of ``image``."""
    return image.with_name(image.name + STAMP_SUFFIX)


def image_path(image_dir: Path, snapshot: Path, *, tag: str = "") -> Path:
    """A fresh name for an image of ``snapshot``'s state: ``<name>.<tag><token>.mdb``.

    Never the name of an existing image, so an extraction never renames
    over an image left by an earlier process (whose unlink would then be
    paid on the open path, and which a process still mapping it may read).
    """
    return image_dir / f"{snapshot.name.removesuffix('.snap')}.{tag}{secrets.token_hex(4)}.mdb"


def _stamp(files: FileLayer, image: Path, snapshot: Path, meta: SnapshotMeta) -> None:
    """Write ``image``'s stamp (``<stamp>.tmp``, then renamed); a failure is logged only."""
    try:
        doc = _doc(snapshot, image.stat().st_size, image_crc(image), meta)
        tmp = image.with_name(image.name + STAMP_SUFFIX + ".tmp")
        tmp.write_bytes(doc)
        files.rename(tmp, stamp_of(image))
    except OSError as exc:
        log.warning("image=%s event=stamp_not_written error=%r", image.name, exc)


def publish_image(
    files: FileLayer,
    image: Path,
    image_dir: Path,
    snapshot: Path,
    meta: SnapshotMeta,
    *,
    keep: Collection[str] = (),
) -> Path | None:
    """Move the compactor's finished ``image`` of ``snapshot`` into ``image_dir``, stamped.

    For the writer's base watcher and its next open, and read-only opens
    (which copy it), instead of building the image from the snapshot
    again; also the next compaction pass's starting point. Order: the image is
    renamed into place, then its stamp written; then the images this
    function published for older snapshots are removed, except those of
    the snapshots named in ``keep`` (the chain ``snapshot`` extends), and a
    process still mapping one keeps its pages until it unmaps. Nothing here is a
    durable step: a crash leaves at worst an unstamped image, which the
    writer's next open removes. Returns the image's new path, or None.
    """
    dest = image_path(image_dir, snapshot, tag=PUBLISHED_TAG)
    try:
        files.makedirs(image_dir)
        os.rename(image, dest)  # across directories, and not a durable step: not the layer's
    except OSError as exc:  # another file system, say: the writer builds its own
        log.info("image=%s event=image_not_published error=%r", image.name, exc)
        return None
    _stamp(files, dest, snapshot, meta)
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
    image_dir: Path, snapshot: Path, *, store_id: uuid.UUID
) -> tuple[Path, SnapshotMeta] | None:
    """An image in ``image_dir`` of ``snapshot`` as it is now, intact; else None.

    Reads each candidate image whole to check its CRC-32C (from the page
    cache after a restart, typically: several GiB/s).
    """
    for image, doc, meta in _candidates(image_dir, snapshot, store_id):
        try:
            intact = image.stat().st_size == doc["image_bytes"] and _check_once(
                image, doc["crc"], lambda image=image, doc=doc: image_crc(image) == doc["crc"]
            )
        except OSError:
            intact = False
        if intact:
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
    for image, doc, meta in _candidates(image_dir, snapshot, store_id):
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
) -> Iterator[tuple[Path, dict[str, Any], SnapshotMeta]]:
    """Images in ``image_dir`` whose stamp names ``snapshot`` as it is now, of this store.

    Stops, yielding nothing more, if ``snapshot`` no longer hashes to its
    footer (damaged since: the extraction names the damage).
    """
    stem = snapshot.name.removesuffix(".snap")
    try:
        stamps = sorted(image_dir.glob(f"{stem}.*.mdb{STAMP_SUFFIX}"))
        size, footer = snapshot.stat().st_size, _footer_hash(snapshot)
    except OSError:
        return
    hashed = False
    for stamp in stamps:
        got = _load(stamp)
        if got is None:
            continue
        doc, meta = got
        named = (doc["snapshot"], doc["snapshot_bytes"], doc["footer"])
        if named != (snapshot.name, size, footer) or meta.store_id != store_id:
            continue
        if not hashed:
            if not _check_once(snapshot, footer, lambda: _hashes_to_footer(snapshot, size, footer)):
                return
            hashed = True
        yield stamp.with_name(stamp.name.removesuffix(STAMP_SUFFIX)), doc, meta


def _doc(snapshot: Path, image_bytes: int, crc: int, meta: SnapshotMeta) -> bytes:
    body: dict[str, Any] = {
        "snapshot": snapshot.name,
        "snapshot_bytes": snapshot.stat().st_size,
        "footer": _footer_hash(snapshot),
        "image_bytes": image_bytes,
        "crc": crc,
        "meta": {
            "store_id": str(meta.store_id),
            "epoch": meta.epoch,
            "lsn": meta.lsn,
            "chain": meta.chain,
            "offsets": meta.offsets,
            "low_watermark_ms": meta.low_watermark_ms,
            "tables": meta.tables,
            "body_bytes": meta.body_bytes,
            "created_ms": meta.created_ms,
            "commit_ms": meta.commit_ms,
            "delta": msgspec.to_builtins(meta.delta),
        },
    }
    raw = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"body": raw, "crc": crc32c.crc32c(raw.encode())}).encode() + b"\n"


def _load(stamp: Path) -> tuple[dict[str, Any], SnapshotMeta] | None:
    try:
        outer = parse_json_doc(stamp.read_bytes())
        raw = outer["body"]
        if crc32c.crc32c(raw.encode()) != outer["crc"]:
            return None
        doc = parse_json_doc(raw.encode())
        m = doc["meta"]
        meta = SnapshotMeta(
            uuid.UUID(m["store_id"]), m["epoch"], m["lsn"], m["chain"], dict(m["offsets"]),
            m["low_watermark_ms"], dict(m["tables"]), m["body_bytes"], m["created_ms"],
            msgspec.convert(m.get("delta"), DeltaDoc | None), str(doc["footer"])[:64],
            int(m.get("commit_ms", 0)),
        )  # fmt: skip
        return doc, meta
    except (OSError, ValueError, KeyError, TypeError, AttributeError, msgspec.ValidationError):
        return None  # torn, edited or foreign: extract again


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


def _footer_hash(snapshot: Path) -> str:
    with open(snapshot, "rb") as fh:
        fh.seek(-FOOTER_SIZE, 2)
        return fh.read(FOOTER_SIZE).hex()


def image_crc(image: Path) -> int:
    """The CRC-32C of the whole file at ``image``, read in 8 MiB chunks."""
    crc = 0
    with open(image, "rb", buffering=0) as fh:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            crc = crc32c.crc32c(view[:n], crc)
    return crc
