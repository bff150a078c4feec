"""``STORE/remote.json``: what this store has shipped, and as which writer generation.

The record is local bookkeeping, never the truth about the remote (the
MANIFEST is): it lets shipping skip files already uploaded without asking
the object store, lets :func:`.lag.lag` measure what is not shipped yet,
and carries the writer generation this host holds. Losing it costs only
re-checking: a file shipped before is found in the manifest with the same
hash and adopted, never uploaded twice.

Written whole each time through ``FileLayer.create_durable``: temp file,
fsync, rename, fsync of the store directory.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from statelog.errors import CorruptionError
from statelog.fileio import FileLayer

__all__ = ["RECORD", "ShipRecord", "Shipped", "load_record", "save_record"]

RECORD = "remote.json"


class Shipped(msgspec.Struct, frozen=True):
    """One local file and the object it became."""

    key: str
    sha256: str
    size: int
    shipped_ms: int


class ShipRecord(msgspec.Struct, frozen=True):
    """The whole record; ``files`` maps ``wal/<name>`` / ``snapshots/<name>`` to objects."""

    url: str
    store_id: str
    generation: int = 0  # 0: this host holds no generation yet
    last_epoch: int = 0  # the manifest's last_epoch after our last commit
    last_ship_ms: int = 0
    files: dict[str, Shipped] = msgspec.field(default_factory=dict)


def load_record(store: Path, files: FileLayer | None = None) -> ShipRecord | None:
    """The record of ``store``, or None if it never shipped nor was restored.

    :raises CorruptionError: the file exists but does not decode (it is left in place).
    :raises OSError: reading failed.
    """
    path = store / RECORD
    try:
        raw = (files or FileLayer()).read(path)
    except FileNotFoundError:
        return None
    try:
        return msgspec.json.decode(raw, type=ShipRecord)
    except msgspec.DecodeError as exc:
        raise CorruptionError(
            path,
            0,
            f"unreadable remote record: {exc}",
            hint="delete remote.json: the next ship rebuilds it from the remote manifest",
        ) from exc


def save_record(store: Path, record: ShipRecord, files: FileLayer | None = None) -> None:
    """Replace the record durably: ``remote.json.tmp``, fsync, rename, fsync ``store``.

    :raises OSError: a step failed; the previous record is still in place.
    """
    (files or FileLayer()).create_durable(store / RECORD, msgspec.json.encode(record))
