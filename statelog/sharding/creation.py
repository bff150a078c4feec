"""Creating a sharded root: every shard store first, then its ``SHARDS`` manifest.

Creation order: every shard store is created first (each durably, by
``statelog.open``), then ``SHARDS`` (temp file, fsync, rename, fsync of the
root). A root without ``SHARDS`` is therefore an unfinished creation whose
shard directories hold no commit, and the next creation adopts them; a root
with ``SHARDS`` never re-creates a shard it lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from statelog.errors import InvalidOptionError, NotAStoreError, StatelogError, StoreNotFoundError
from statelog.sharding.partition import MANIFEST, ShardManifest, shard_dir_name, write_manifest
from statelog.storage.fileio import FileLayer
from statelog.store.options import StoreOptions
from statelog.store.store import StateStore
from statelog.store.store import open as open_store

__all__ = ["check_store_options", "create_root"]

log = logging.getLogger("statelog.sharding.sharded")


def create_root(
    root: Path,
    manifest: ShardManifest,
    options: Mapping[str, Any],
    files: FileLayer,
    *,
    keep_open: bool,
) -> dict[int, StateStore]:
    """Create the sharded root ``manifest`` describes at ``root``; the open shards if ``keep_open``.

    Durable steps, in order: ``root`` is created; a stray ``SHARDS.tmp`` of
    an earlier attempt is removed (and the root fsynced); each shard store is
    created by ``statelog.open``; then ``SHARDS`` is written (temp, fsync,
    rename, fsync of the root). A crash before the last step leaves shard
    directories without commits, which the next creation adopts.

    :raises NotAStoreError: ``root`` holds something other than the shard
        directories of an unfinished creation; nothing was changed.
    :raises StatelogError: a shard failed to open; the shards opened so far
        are closed again and ``SHARDS`` is not written.
    :raises StorageError: an I/O error creating the root or its manifest.
    """
    n = manifest.shards
    _check_can_host(root, n)
    files.makedirs(root)
    stray = root / (MANIFEST + ".tmp")
    if stray.exists():
        files.remove(stray)
        files.fsync_dir(root)
    stores: dict[int, StateStore] = {}
    try:
        for i in range(n):
            store = open_store(root / shard_dir_name(i), **options)
            if keep_open:
                stores[i] = store
            else:
                store.close()
        write_manifest(root, manifest, files)
    except BaseException:
        _close_quietly(stores)
        raise
    log.info(
        "root=%s event=sharded_root_created shards=%d partition=%s", root, n, manifest.partition
    )
    return stores


def _close_quietly(stores: Mapping[int, StateStore]) -> None:
    """Close ``stores`` after a failed creation; the creation's own error is the one raised."""
    for store in stores.values():
        try:
            store.close()
        except StatelogError as exc:
            log.warning("store=%s event=shard_close_failed error=%r", store.path, exc.message)


def _check_can_host(root: Path, n: int) -> None:
    """Refuse a root holding anything but shard directories of an unfinished creation."""
    for p in (root, *root.parents):
        if p.exists():
            if not p.is_dir():
                raise NotAStoreError(f"{p} is not a directory")
            break
    if not root.is_dir():
        return
    allowed = {shard_dir_name(i) for i in range(n)} | {MANIFEST + ".tmp"}
    foreign = sorted(p.name for p in root.iterdir() if p.name not in allowed)
    if foreign:
        raise NotAStoreError(
            f"{root} is not a sharded root (it holds {', '.join(foreign[:5])})",
            hint="choose an empty or new directory for a new sharded root; nothing was changed",
        )
    for i in range(n):
        d = root / shard_dir_name(i)
        if d.is_dir() and _holds_commits(d):
            raise NotAStoreError(
                f"{d} holds commits but {root} has no {MANIFEST} manifest",
                hint=f"restore {MANIFEST} from a backup, or open that directory as a "
                "plain store; nothing was changed",
            )


def _holds_commits(shard: Path) -> bool:
    """Whether a shard directory left without a manifest holds any commit (read-only look)."""
    try:
        with open_store(shard, readonly=True) as ro:
            return ro.epoch > 0
    except StoreNotFoundError:
        return False  # no identity: creating the store refuses a log with records by itself
    except StatelogError:
        return True  # damaged or foreign: never adopt it


def check_store_options(options: Mapping[str, Any]) -> None:
    """Check shard store options before anything is created: the rules of :class:`StoreOptions`.

    :raises InvalidOptionError: an unknown or bad option.
    """
    if "path" in options:
        raise InvalidOptionError("path= is not a store option", hint="pass root= instead")
    StoreOptions.from_kwargs(**options)
