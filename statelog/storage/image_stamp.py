"""The stamp beside a base image: its layout, written and parsed.

A stamp (``<image>.ok``) records what an image was built from and how to
tell it is still intact; :mod:`statelog.storage.image_cache` decides what
to trust. Layout and example: ``docs/format.md`` (the base image).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import crc32c
import msgspec

from statelog.format.snapshot import FOOTER_SIZE, DeltaDoc
from statelog.storage.layout import parse_json_doc
from statelog.storage.snapshots import SnapshotMeta

__all__ = [
    "STAMP_SUFFIX",
    "file_identity",
    "footer_hash",
    "load_stamp",
    "settled_matches",
    "stamp_doc",
    "stamp_of",
]

STAMP_SUFFIX = ".ok"


def stamp_of(image: Path) -> Path:
    """The stamp file of ``image``."""
    return image.with_name(image.name + STAMP_SUFFIX)


def file_identity(path: Path) -> dict[str, int]:
    """What a settled stamp records of a file: inode, size, mtime (ns).

    :raises OSError: ``path`` cannot be stat'ed.
    """
    st = path.stat()
    return {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def settled_matches(doc: dict[str, Any], image: Path, snapshot: Path) -> bool:
    """Whether both files are exactly as they were when ``doc``'s stamp was settled."""
    settled = doc.get("settled")
    if not isinstance(settled, dict):
        return False
    try:
        now = {"image": file_identity(image), "snapshot": file_identity(snapshot)}
    except OSError:
        return False
    return bool(settled == now)


def stamp_doc(
    snapshot: Path,
    image_bytes: int,
    crc: int,
    meta: SnapshotMeta,
    settled: dict[str, dict[str, int]] | None,
) -> bytes:
    """The stamp's bytes: one JSON line ``{"body": <JSON text>, "crc": <CRC-32C of it>}``."""
    body: dict[str, Any] = {
        "snapshot": snapshot.name,
        "snapshot_bytes": snapshot.stat().st_size,
        "footer": footer_hash(snapshot),
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
    if settled is not None:
        body["settled"] = settled
    raw = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"body": raw, "crc": crc32c.crc32c(raw.encode())}).encode() + b"\n"


def load_stamp(stamp: Path) -> tuple[dict[str, Any], SnapshotMeta] | None:
    """The stamp's body and the meta it records; None if torn, edited or foreign."""
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


def footer_hash(snapshot: Path) -> str:
    """The hex of ``snapshot``'s footer (its last bytes), read without checking it.

    :raises OSError: reading failed.
    """
    with open(snapshot, "rb") as fh:
        fh.seek(-FOOTER_SIZE, 2)
        return fh.read(FOOTER_SIZE).hex()
