"""Tying a local store to its remote copy: restore when empty, take over, check ownership.

For ``statelog.open(path, remote=URL)``, in this order:

1. :func:`restore_if_empty` before the local open: a missing or empty
   directory is restored from the remote (if a store was shipped there),
   taking the store over first, so the previous owner can add nothing
   after the state restored;
2. the local open (recovery) as usual;
3. :func:`claim` after it: this host must own the store's writer
   generation. A store never shipped creates generation 1, or joins the
   generation 1 that the compactor daemon's first ship of the same
   directory created at the same moment (:func:`.manifest.create_first`);
   a restored store acquires a new generation (a takeover: the previous
   owner is fenced from then on); a store that already holds a generation
   checks it is still current and raises
   :class:`~statelog.errors.FencedError` if another host took over.

:func:`take_over` is the explicit form of the takeover for an operator. It
records in ``remote.json`` the last segment present in ``wal/``: the
segments up to it that an older generation wrote are the history the new
generation adopted, and shipping takes them (:mod:`.ship`).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec

from statelog.errors import FencedError
from statelog.log.segments import list_segments
from statelog.remote.client import RemoteClient
from statelog.remote.errors import RemoteNotFoundError
from statelog.remote.manifest import acquire as _acquire
from statelog.remote.manifest import check as _check
from statelog.remote.manifest import create_first, created_by, read_manifest
from statelog.remote.point import apply_cut
from statelog.remote.record import ShipRecord, load_record, origin_of, update_record
from statelog.remote.restore import RestoreResult, find_store, restore
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import WAL_DIR, StoreLayout

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

    Durable order: the manifest's conditional write first (from then on
    every older generation is fenced), then the record (temp, fsync, rename,
    fsync dir), which also notes the highest segment sequence in ``wal/``
    at that moment (``adopted_through``): the sealed segments up to it are
    this directory's history, which the new generation adopts and ships,
    whatever generation their headers name. Run it with the old writer of
    this directory stopped (``claim`` does, under the writer's lock). A
    crash between the two writes leaves this host without the generation
    it bumped: it takes over again, harmlessly.

    :returns: the generation now owned.
    :raises RemoteError: the manifest could not be written.
    :raises OSError: ``IDENTITY``, ``wal/`` or ``remote.json`` could not be read or written.
    """
    files = files or FileLayer()
    store = Path(store)
    sid = StoreLayout(store).read_identity(files)
    client = client or RemoteClient.from_url(url)
    gen = _acquire(client, sid, origin=origin_of(store))
    try:
        through = max((seq for seq, _, _ in list_segments(store / WAL_DIR)), default=0)
    except FileNotFoundError:
        through = 0

    def record(cur: ShipRecord | None) -> ShipRecord:
        base = cur or ShipRecord(url=url, store_id=str(sid))
        return msgspec.structs.replace(base, url=url, generation=gen, adopted_through=through)

    update_record(store, record, files)
    return gen


def claim(store: Path, url: str, *, client: RemoteClient | None = None) -> int:
    """Make sure this host owns ``store``'s writer generation; return it.

    A store holding a generation checks that it is current. A store never
    shipped from here (no ``remote.json``) creates generation 1, or joins
    it if the manifest is still the generation 1 that this same directory
    created (the daemon's first ship, racing this claim, or a record
    deleted since). A restored store (a record without a generation)
    takes the store over.

    :raises FencedError: the store holds a generation that is no longer
        current, or the remote has a manifest that this directory did not
        create (a copy of the store; ``ours`` is 0 then).
    :raises RemoteError: the object store could not be reached.
    :raises OSError: ``remote.json`` could not be written.
    """
    store = Path(store)
    client = client or RemoteClient.from_url(url)
    rec = load_record(store)
    sid = StoreLayout(store).read_identity(FileLayer())
    if rec is not None and rec.generation:
        _check(client, sid, rec.generation)
        apply_cut(store, client, sid, rec.generation)  # a takeover that died before it
        return rec.generation
    if rec is not None:
        gen = take_over(store, url, client=client)
        apply_cut(store, client, sid, gen)  # a restore to an earlier epoch
        return gen
    origin = origin_of(store)
    cur = read_manifest(client, sid)
    if cur is None:
        gen = create_first(client, sid, origin)
    elif created_by(cur.manifest, origin):
        gen = 1
    else:
        raise FencedError(
            f"{store} was never shipped from this host, but {url} holds its manifest",
            ours=0,
            current=cur.manifest.generation,
            hint="restore the store from the remote into an empty directory, or take it "
            "over explicitly if this copy is the one to keep",
        )

    def record(cur: ShipRecord | None) -> ShipRecord:
        base = cur or ShipRecord(url=url, store_id=str(sid))
        # A ship of this directory may have recorded the same generation meanwhile.
        return msgspec.structs.replace(base, url=url, generation=base.generation or gen)

    held = update_record(store, record).generation
    if held != gen:  # a takeover of this directory was recorded meanwhile: it must be current
        _check(client, sid, held)
    return held
