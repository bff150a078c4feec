"""A sharded root as a standby: one standby per shard, promoted shard by shard.

``ShardedStore(COPY, follow=SOURCE)``, where ``SOURCE`` is a sharded root
directory, opens every shard of ``COPY`` as a standby of the same shard of
``SOURCE`` (:class:`~statelog.replica.standby.Standby`, each with its own copy,
lock, lag and promotion). :func:`follow_root` prepares it, in order: the
source's ``SHARDS`` is read (it must exist); a copy that has ``SHARDS``
must agree with it; each shard's standby is opened by the store; then the
copy's ``SHARDS`` is written as the source's (temp, fsync, rename, fsync of
the root), last, as a root's creation writes it, so a copy interrupted
before that is an unfinished root the next open completes.

Promotion (:meth:`ShardStandby.promote`) goes shard by shard: each shard
claims its own source and becomes its own writer
(:meth:`~statelog.store.store.StateStore.promote`), independently of the
others, so a shard whose source cannot be claimed does not hold the others
back. A sharded root follows directories only: shards shipped to a remote
share its prefix under their store ids, and are followed each on its own
(``statelog.open(COPY/shard-NNNN, follow=URL)``, one prefix per shard).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from statelog.errors import InvalidOptionError, StatelogError, StoreNotFoundError
from statelog.replica.promoted import promoted_here
from statelog.sharding.partition import (
    MANIFEST,
    ShardManifest,
    ShardMismatchError,
    read_manifest,
    shard_dir_name,
    write_manifest,
)
from statelog.storage.fileio import FileLayer
from statelog.store.standby_role import Promotion
from statelog.store.store import StateStore

__all__ = ["ShardStandby", "follow_root", "shard_follow"]

log = logging.getLogger("statelog.sharding.sharded")


def follow_root(root: Path, source: Any, files: FileLayer, lazy: bool) -> ShardManifest:
    """The manifest a standby root at ``root`` of ``source`` uses (module docstring).

    :raises InvalidOptionError: ``source`` is a URL, or ``lazy`` (every shard's
        standby opens at once).
    :raises StoreNotFoundError: ``source`` holds no sharded root.
    :raises ShardMismatchError: the copy's ``SHARDS`` disagrees with the source's.
    :raises CorruptionError, FormatVersionError, StorageError: as reading a manifest.
    """
    if isinstance(source, str) and "://" in source:
        raise InvalidOptionError(
            f"follow={source!r}: a sharded root follows a sharded root directory",
            hint="follow each shard's remote on its own: statelog.open(COPY/shard-NNNN, "
            "follow=URL), one prefix per shard",
        )
    if not isinstance(source, str | os.PathLike):
        raise InvalidOptionError(f"follow={source!r}", hint="the source's sharded root directory")
    if lazy:
        raise InvalidOptionError(
            "follow= with lazy=True", hint="a standby root opens every shard's standby at once"
        )
    src = Path(source)
    manifest = read_manifest(src, files)
    if manifest is None:
        raise StoreNotFoundError(
            f"{src} holds no sharded root (no {MANIFEST})",
            hint="follow= of a sharded root names the source's root directory",
        )
    mine = read_manifest(root, files)
    if mine is not None and mine != manifest:
        raise ShardMismatchError(f"{root}/{MANIFEST} disagrees with the one of {src}")
    return manifest


def shard_follow(source: Path, index: int, copy: Path) -> dict[str, Any]:
    """The options that open shard ``index`` (at ``copy``) of a root following ``source``.

    A shard whose promotion claimed its source is that source's writer now: it
    opens as one (no ``follow``); the others open as standbys.
    """
    src = source / shard_dir_name(index)
    if promoted_here(src, copy):
        return {"follow": None}
    return {"follow": src}


class ShardStandby:
    """Mixed into ShardedStore, which sets these attributes."""

    root: Path
    manifest: ShardManifest
    readonly: bool
    _lock: threading.RLock
    _files: FileLayer
    _follow: Path | None

    shard: Callable[[int], StateStore]
    _check_index: Callable[[int], int]

    def _finish_follow(self) -> None:
        """Write the copy's ``SHARDS`` once every shard's standby is open (the last step);
        the root is writable if a shard was promoted before."""
        if self._follow is None:
            return
        if read_manifest(self.root, self._files) is None:
            write_manifest(self.root, self.manifest, self._files)
        self.readonly = len(self.standbys) == self.manifest.shards

    @property
    def standbys(self) -> list[int]:
        """The shards that are still standbys (opened with ``follow=`` and not promoted)."""
        with self._lock:
            if self._follow is None:
                return []
            return [i for i in range(self.manifest.shards) if self.shard(i).standby]

    def promote(self, shard: int | None = None, *, force: bool = False) -> dict[int, Promotion]:
        """Promote shard ``shard``, or every shard still a standby, one shard at a time.

        Each shard's promotion is the store's
        (:meth:`~statelog.store.store.StateStore.promote`): it claims that
        shard's source and opens that shard's copy as its writer. The root
        becomes writable with its first promoted shard; a shard still a
        standby refuses commits (``ReadOnlyStoreError``).

        :returns: by shard index, where each promoted shard's reconciler resumes.
        :raises InvalidOptionError: the root is not a standby root, or a bad index.
        :raises StatelogError: a shard's own promotion error, with a note naming the
            shard; the shards before it in this call are promoted, it and the ones
            after it are standbys still.
        """
        with self._lock:
            if self._follow is None:
                raise InvalidOptionError(
                    f"sharded store {self.root} is not a standby root",
                    hint="open it with follow=SOURCE_ROOT",
                )
            todo = [self._check_index(shard)] if shard is not None else self.standbys
            out: dict[int, Promotion] = {}
            for i in todo:
                try:
                    out[i] = self.shard(i).promote(force=force)
                except StatelogError as exc:
                    exc.add_note(f"shard {i} of {self.root}: promoted so far {sorted(out)}")
                    raise
                self.readonly = False
                log.warning(
                    "root=%s event=shard_promoted shard=%d epoch=%d", self.root, i, out[i].epoch
                )
            return out
