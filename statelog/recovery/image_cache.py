"""Reusing an extracted base image across restarts, instead of decompressing its snapshot again.

Extracting a snapshot verifies every byte of it (SHA-256) while it
decompresses the LMDB image into ``base/``; at 1M keys that is most of a
restart. So each extraction also writes a **stamp** beside the image,
``<image>.ok``: one JSON line holding the snapshot's name, size and footer
hash, the image's size and CRC-32C (computed while it was written), the
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

import hashlib
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import crc32c

from statelog.format.snapshot import FOOTER_SIZE
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import parse_json_doc
from statelog.storage.snapshots import SnapshotMeta, extract_snapshot

__all__ = ["STAMP_SUFFIX", "extract_stamped", "reusable_image", "stamp_of"]

log = logging.getLogger("statelog.recovery.replay")

STAMP_SUFFIX = ".ok"
_CHUNK = 8 << 20


def stamp_of(image: Path) -> Path:
    """The stamp file of ``image``."""
    return image.with_name(image.name + STAMP_SUFFIX)


def extract_stamped(
    files: FileLayer, snapshot: Path, dest: Path, *, store_id: uuid.UUID
) -> SnapshotMeta:
    """:func:`~statelog.storage.snapshots.extract_snapshot` to ``dest``, then write its stamp.

    Order: the image is extracted (verified) and renamed into place; then
    the stamp is written to ``<stamp>.tmp`` and renamed. A failed stamp is
    logged and costs only the reuse.

    :raises CorruptionError: the snapshot did not verify (no image, no stamp).
    :raises FormatVersionError: as :func:`~statelog.storage.snapshots.extract_snapshot`.
    :raises OSError: reading or writing the image failed.
    """
    crc = [0]

    def update(data: bytes) -> None:
        crc[0] = crc32c.crc32c(data, crc[0])

    meta = extract_snapshot(files, snapshot, dest, store_id=store_id, on_write=update)
    try:
        doc = _doc(snapshot, dest.stat().st_size, crc[0], meta)
        tmp = dest.with_name(dest.name + STAMP_SUFFIX + ".tmp")
        tmp.write_bytes(doc)
        files.rename(tmp, stamp_of(dest))
    except OSError as exc:
        log.warning("image=%s event=stamp_not_written error=%r", dest.name, exc)
    return meta


def reusable_image(
    image_dir: Path, snapshot: Path, *, store_id: uuid.UUID
) -> tuple[Path, SnapshotMeta] | None:
    """An image in ``image_dir`` extracted from ``snapshot`` as it is now, intact; else None.

    Reads each candidate image whole to check its CRC-32C (from the page
    cache after a restart, typically: several GiB/s).
    """
    stem = snapshot.name.removesuffix(".snap")
    try:
        candidates = sorted(image_dir.glob(f"{stem}.*.mdb{STAMP_SUFFIX}"))
        size, footer = snapshot.stat().st_size, _footer_hash(snapshot)
    except OSError:
        return None
    for stamp in candidates:
        image = stamp.with_name(stamp.name.removesuffix(STAMP_SUFFIX))
        got = _load(stamp)
        if got is None:
            continue
        doc, meta = got
        same = (doc["snapshot"], doc["snapshot_bytes"], doc["footer"]) == (
            snapshot.name,
            size,
            footer,
        )
        if not same or meta.store_id != store_id:
            continue
        if not _hashes_to_footer(snapshot, size, footer):
            return None  # damaged since: the extraction names the damage
        try:
            intact = image.stat().st_size == doc["image_bytes"] and _crc(image) == doc["crc"]
        except OSError:
            intact = False
        if intact:
            return image, meta
        log.warning(
            "image=%s event=stale_image reason='crc or size differs from its stamp'", image.name
        )
    return None


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
            "image_bytes": meta.image_bytes,
            "created_ms": meta.created_ms,
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
            m["low_watermark_ms"], dict(m["tables"]), m["image_bytes"], m["created_ms"],
        )  # fmt: skip
        return doc, meta
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
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


def _crc(image: Path) -> int:
    crc = 0
    with open(image, "rb", buffering=0) as fh:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            crc = crc32c.crc32c(view[:n], crc)
    return crc
