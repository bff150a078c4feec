"""``STORE/remote.json``: what this store has shipped, and as which writer generation.

The record is local bookkeeping, never the truth about the remote (the
MANIFEST is): it lets shipping skip files already uploaded without asking
the object store, lets :func:`.lag.lag` measure what is not shipped yet,
and carries the writer generation this host holds. Losing it costs only
re-checking: a file shipped before is found in the manifest with the same
hash and adopted, never uploaded twice.

Written whole each time through ``FileLayer.create_durable``: temp file,
fsync, rename, fsync of the store directory. The writer (its claim) and the
compactor daemon (its ship) may both change the record at once: every
change is a read-modify-write under an exclusive ``flock`` of the store
directory itself (:func:`update_record`), so neither loses the other's
change nor writes ``remote.json.tmp`` while the other does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from statelog.errors import CorruptionError
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import IDENTITY, REMOTE_RECORD

__all__ = [
    "RECORD",
    "ShipRecord",
    "Shipped",
    "load_record",
    "origin_of",
    "save_record",
    "update_record",
]

RECORD = REMOTE_RECORD


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
    last_ship_ms: int = 0  # when a ship last uploaded or adopted anything (Unix ms)
    files: dict[str, Shipped] = msgspec.field(default_factory=dict)
    # The highest segment sequence in wal/ when this directory took ``generation``
    # over: segments up to it that name an older generation are the history the
    # takeover adopted, and ship under ``generation`` (docs/remote.md).
    adopted_through: int = 0
    # A restore to an earlier epoch: the remote's history after it is not this store's.
    # The takeover that makes this directory the writer drops it from the MANIFEST
    # (statelog.remote.point.cut_manifest) before anything new is shipped; 0: none.
    cut_at: int = 0


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
    except (msgspec.DecodeError, RecursionError) as exc:  # nesting too deep: not ours
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


def update_record(
    store: Path,
    change: Callable[[ShipRecord | None], ShipRecord],
    files: FileLayer | None = None,
) -> ShipRecord:
    """Read the record, apply ``change`` and save the result, holding the store's record lock.

    The lock is an exclusive ``flock`` on the store directory (no extra
    file), held only for the read, the change and the durable save, so two
    processes updating the record are serialised and neither overwrites a
    change it did not read.

    A change that changes nothing saves nothing (no fsync: an idle store's ships).

    :returns: the record saved (or left as it was).
    :raises CorruptionError: the current record does not decode.
    :raises OSError: locking, reading or saving failed; the previous record is still in place.
    """
    with _locked(store):
        cur = load_record(store, files)
        new = change(cur)
        if new != cur:
            save_record(store, new, files)
    return new


@contextlib.contextmanager
def _locked(store: Path) -> Iterator[None]:
    fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def origin_of(store: Path) -> str:
    """A token naming this store directory, the same for every process that opens it.

    Device, inode and change time of ``IDENTITY``: the writer and the daemon
    of one directory see the same file; a copy of the directory (``cp``,
    ``rsync``, a backup restored) has a new inode and change time, so it is
    never taken for the original.

    :raises OSError: ``IDENTITY`` cannot be examined.
    """
    st = os.stat(store / IDENTITY)
    return f"{st.st_dev:x}:{st.st_ino:x}:{st.st_ctime_ns:x}"
