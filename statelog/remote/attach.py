"""Tying a local store to its remote copy: restore when empty, take over, check ownership.

For ``statelog.open(path, remote=URL)``, in this order:

1. :func:`restore_if_empty` before the local open: a missing or empty
   directory is restored from the remote (if a store was shipped there),
   taking the store over first, so the previous owner can add nothing
   after the state restored;
2. the local open (recovery) as usual;
3. :func:`claim` after it: this host must own the store's writer
   generation. A store it restored, or one never shipped, acquires a new
   generation (a takeover: the previous owner is fenced from then on); a
   store that already holds a generation checks it is still current and
   raises :class:`~statelog.errors.FencedError` if another host took over.

:func:`take_over` is the explicit form of the takeover for an operator.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec

from statelog.errors import FencedError
from statelog.fileio import FileLayer
from statelog.layout import StoreLayout

from .client import RemoteClient
from .errors import RemoteNotFoundError
from .manifest import acquire as _acquire
from .manifest import check as _check
from .manifest import read_manifest
from .record import ShipRecord, load_record, save_record
from .restore import RestoreResult, find_store, restore

__all__ = ["acquire", "check", "claim", "restore_if_empty", "take_over"]


def acquire(url: str, store_id: uuid.UUID, *, client: RemoteClient | None = None) -> int:
    """Take store ``store_id`` at ``url`` over: bump (or create) its writer generation.

    :returns: the new generation; every older one is fenced from now on.
    :raises RemoteError: the manifest could not be written.
    """
    return _acquire(client or RemoteClient.from_url(url), store_id)


def check(
    url: str, store_id: uuid.UUID, generation: int, *, client: RemoteClient | None = None
) -> None:
    """Return if ``generation`` still owns store ``store_id`` at ``url``.

    :raises FencedError: another generation owns it.
    :raises RemoteNotFoundError: the store has no manifest.
    """
    _check(client or RemoteClient.from_url(url), store_id, generation)


def restore_if_empty(
    path: Path,
    url: str,
    *,
    store_id: uuid.UUID | None = None,
    client: RemoteClient | None = None,
) -> RestoreResult | None:
    """Restore into ``path`` if it is missing or empty and ``url`` holds a store; else None.

    The restore takes the store over (a new generation, recorded in
    ``remote.json``) before it reads the manifest.

    :raises RemoteError: as :func:`.restore.restore` (``path`` is then still empty).
    """
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        return None
    client = client or RemoteClient.from_url(url)
    try:
        sid = store_id or find_store(client)
    except RemoteNotFoundError:
        return None  # nothing shipped yet: the local open creates a new store
    if read_manifest(client, sid) is None:
        return None
    return restore(url, path, store_id=sid, client=client, take_over=True)


def take_over(
    store: Path, url: str, *, client: RemoteClient | None = None, files: FileLayer | None = None
) -> int:
    """Acquire a new writer generation for ``store`` and record it in ``remote.json``.

    Durable order: the manifest's conditional write first, then the record
    (temp, fsync, rename, fsync dir). A crash between them leaves this host
    without the generation it bumped: it takes over again, harmlessly.

    :returns: the generation now owned.
    :raises RemoteError: the manifest could not be written.
    """
    files = files or FileLayer()
    store = Path(store)
    sid = StoreLayout(store).read_identity(files)
    client = client or RemoteClient.from_url(url)
    gen = _acquire(client, sid)
    rec = load_record(store, files) or ShipRecord(url=url, store_id=str(sid))
    save_record(store, msgspec.structs.replace(rec, url=url, generation=gen), files)
    return gen


def claim(store: Path, url: str, *, client: RemoteClient | None = None) -> int:
    """Make sure this host owns ``store``'s writer generation; return it.

    :raises FencedError: the store holds a generation that is no longer
        current, or the remote has a manifest for a copy this host never
        restored nor shipped (``ours`` is 0 then).
    :raises RemoteError: the object store could not be reached.
    """
    store = Path(store)
    client = client or RemoteClient.from_url(url)
    rec = load_record(store)
    if rec is not None and rec.generation:
        _check(client, StoreLayout(store).read_identity(FileLayer()), rec.generation)
        return rec.generation
    if rec is None:
        cur = read_manifest(client, StoreLayout(store).read_identity(FileLayer()))
        if cur is not None:
            raise FencedError(
                f"{store} was never shipped from this host, but {url} holds its manifest",
                ours=0,
                current=cur.manifest.generation,
                hint="restore the store from the remote into an empty directory, or take it "
                "over explicitly if this copy is the one to keep",
            )
    return take_over(store, url, client=client)
