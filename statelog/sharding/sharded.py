"""ShardedStore: one ordinary statelog store per shard under a root.

Layout::

    ROOT/
      SHARDS          the manifest: shard count and partitioning (statelog.sharding.partition)
      shard-0000/     an ordinary store (IDENTITY, wal/, snapshots/, ...)
      shard-0001/
      ...

Each shard is a complete store with its own lock, log, snapshots and
recovery, so a damaged shard is recovered (or refused) on its own and its
repair touches only files under its own directory. Nothing spans shards: a
:meth:`ShardedStore.commit` whose keys fall in several shards is one
atomic commit *per shard*, not one across shards. The atomic unit a
reconciler should build on is one shard (:meth:`ShardedStore.commit_shard`
or ``shard(i).transaction()``), with each source partition assigned to one
shard and its offsets kept there.

Creating a root (:mod:`statelog.sharding.creation`) writes every shard store
first and the ``SHARDS`` manifest last, so a root without ``SHARDS`` is an
unfinished creation the next one adopts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from statelog.errors import (
    InvalidOptionError,
    ReadOnlyStoreError,
    StatelogError,
    StoreClosedError,
    StoreNotFoundError,
)
from statelog.recovery.report import RecoveryReport
from statelog.sharding.access import ShardAccess, ShardCommitError
from statelog.sharding.creation import check_store_options, create_root
from statelog.sharding.partition import (
    MANIFEST,
    Key,
    Partition,
    ShardManifest,
    ShardMismatchError,
    expand_stores,
    read_manifest,
    shard_dir_name,
)
from statelog.sharding.standby import ShardStandby, follow_root, shard_follow
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import IDENTITY
from statelog.store.options import check_store_path
from statelog.store.store import StateStore
from statelog.store.store import open as open_store

__all__ = ["OnFailure", "ShardCommitError", "ShardOpenError", "ShardedStore", "expand_stores"]

log = logging.getLogger("statelog.sharding.sharded")

OnFailure = Literal["raise", "report"]


class ShardOpenError(StatelogError):
    """One shard failed to open or recover; ``cause`` is the shard's own error."""

    def __init__(self, root: Path, shard: int, path: Path, cause: StatelogError) -> None:
        super().__init__(
            f"shard {shard} of {root} ({path.name}) is unavailable: {cause.message}",
            hint=f"{cause.hint}; only this shard is affected: open the root with "
            "on_failure='report' to use the others while it is repaired",
        )
        self.root = root
        self.shard = shard
        self.path = path
        self.cause = cause


def _check_open_flags(lazy: object, on_failure: object) -> None:
    """:raises InvalidOptionError: ``lazy`` not a bool, or ``on_failure`` not raise or report."""
    if not isinstance(lazy, bool):
        raise InvalidOptionError(f"lazy={lazy!r}", hint="pass True or False")
    if on_failure not in ("raise", "report"):
        raise InvalidOptionError(f"on_failure={on_failure!r}", hint="use 'raise' or 'report'")


class ShardedStore(ShardAccess, ShardStandby):
    """``shards`` ordinary stores under ``root``, keys routed by hash or by key range.

    Reads route to one shard (``get``) or merge every shard (``items``,
    ``count``, ``offsets``, ``low_watermark_ms``). Commits are atomic per
    shard only. Thread-safe: commits through this object are serialised.
    """

    def __init__(
        self,
        root: str | Path,
        shards: int | None = None,
        *,
        partition: Partition | None = None,
        boundaries: Sequence[Key] | None = None,
        lazy: bool = False,
        on_failure: OnFailure = "raise",
        **store_options: Any,
    ) -> None:
        """Create the sharded root at ``root``, or reopen it.

        Creating needs ``shards``; ``partition`` defaults to ``"hash"``, and
        ``"range"`` needs ``shards - 1`` sorted ``boundaries`` (shard ``i``
        holds ``boundaries[i-1] <= key < boundaries[i]``). Reopening needs no
        parameter: the ``SHARDS`` manifest supplies them; any given must match it.

        :param lazy: open no shard now; each opens on first use (or :meth:`open_shard`).
        :param on_failure: ``"raise"`` (default): a shard that fails to open or
            recover raises :class:`ShardOpenError` naming it, after the shards
            already opened are closed again. ``"report"``: it is left closed and
            listed in :attr:`failures`; the other shards open normally.
        :param store_options: passed to ``statelog.open`` for every shard
            (``durability``, ``strict``, ``readonly``, ...); ``follow=SOURCE_ROOT``: each
            shard a standby of that root's same shard (:mod:`statelog.sharding.standby`).
        :raises InvalidOptionError: bad parameters or options, or a ``root`` that
            cannot name a directory; nothing was changed.
        :raises ShardMismatchError: parameters other than the manifest's; nothing was changed.
        :raises NotAStoreError: ``root`` holds something that is not a sharded root.
        :raises StoreNotFoundError: ``readonly=True`` and no sharded root at ``root``.
        :raises ShardOpenError: a shard failed to open (``on_failure="raise"``).
        :raises CorruptionError: the manifest is damaged.
        :raises StorageError: an I/O error creating the root or its manifest.
        """
        _check_open_flags(lazy, on_failure)
        check_store_options(store_options)
        self.root = check_store_path(root)
        self._options = dict(store_options)
        self._follow = self._options.pop("follow", None)
        self.readonly: bool = store_options.get("readonly", False) or self._follow is not None
        self._files: FileLayer = store_options.get("file_layer") or FileLayer()
        self._lock = threading.RLock()
        self._tables_seen: set[str] = set()  # tables some shard was seen to have
        self._stores: dict[int, StateStore] = {}
        self._failures: dict[int, StatelogError] = {}
        self._closed = False
        manifest = read_manifest(self.root, self._files)
        if self._follow is not None:
            manifest = follow_root(self.root, self._follow, self._files, lazy)
            self._follow = Path(self._follow)
        if manifest is None:
            if self.readonly:
                raise StoreNotFoundError(f"{self.root} holds no sharded store (no {MANIFEST})")
            if shards is None:
                raise InvalidOptionError(
                    f"{self.root} has no {MANIFEST} manifest and shards= was not given",
                    hint="pass shards= (and partition=) to create a sharded root; nothing "
                    "was changed",
                )
            self.manifest = ShardManifest.build(shards, partition or "hash", boundaries)
            self._stores = create_root(
                self.root, self.manifest, self._options, self._files, keep_open=not lazy
            )
        else:
            bad = manifest.mismatches(shards, partition, boundaries)
            if bad:
                raise ShardMismatchError(f"{self.root}/{MANIFEST} disagrees: {', '.join(bad)}")
            self.manifest = manifest
        if not lazy:
            for i in range(self.manifest.shards):
                try:
                    self.open_shard(i)
                except ShardOpenError:
                    if on_failure == "raise":
                        self.close()
                        raise
            self._finish_follow()

    @classmethod
    def open(cls, root: str | Path, shards: int | None = None, **options: Any) -> ShardedStore:
        """Create or reopen a sharded root; the same arguments as the constructor."""
        return cls(root, shards, **options)

    def __enter__(self) -> ShardedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- shards ----------------------------------------------------------
    def shard_path(self, index: int) -> Path:
        """The directory of shard ``index``."""
        return self.root / shard_dir_name(index)

    def open_shard(self, index: int, **overrides: Any) -> StateStore:
        """Open (recover) shard ``index`` alone, or return it if it is open.

        Touches only files under that shard's directory. ``overrides``
        replace store options for this open, e.g. ``strict=False`` to let a
        shard refused under ``strict=True`` recover to its last good commit.
        A shard that failed before is tried again.

        :raises ShardOpenError: the shard failed to open; it is listed in :attr:`failures`.
        :raises InvalidOptionError: a bad index or override, or overrides for an open shard.
        """
        with self._lock:
            self._check_open()
            idx = self._check_index(index)
            store = self._stores.get(idx)
            if store is not None:
                if overrides:
                    raise InvalidOptionError(
                        f"shard {idx} is already open", hint="call close_shard() first"
                    )
                return store
            options = {**self._options, **overrides}
            if overrides:
                check_store_options(options)
            path = self.shard_path(idx)
            if self._follow is not None:
                options.update(shard_follow(self._follow, idx, path))
            try:
                standby = self._follow is not None  # a standby creates its copy
                if not (path / IDENTITY).is_file() and not options.get("readonly") and not standby:
                    raise StoreNotFoundError(
                        f"{path} holds no statelog store",
                        hint="the shard's directory or IDENTITY is gone: restore it from a "
                        "backup; a sharded root never re-creates a shard silently",
                    )
                store = open_store(path, **options)
            except StatelogError as exc:
                self._failures[idx] = exc
                log.error(
                    "root=%s event=shard_failed shard=%d error=%s reason=%r",
                    self.root,
                    idx,
                    type(exc).__name__,
                    exc.message,
                )
                raise ShardOpenError(self.root, idx, path, exc) from exc
            self._failures.pop(idx, None)
            self._stores[idx] = store
            r = store.recovery
            log.info(
                "root=%s event=shard_opened shard=%d epoch=%d outcome=%s replayed=%d",
                self.root,
                idx,
                r.epoch,
                r.outcome,
                r.replayed,
            )
            return store

    def close_shard(self, index: int) -> None:
        """Close shard ``index`` (if open) so that it can be reopened on its own.

        :raises StorageError: sealing its log failed (its lock is released anyway).
        """
        with self._lock:
            store = self._stores.pop(self._check_index(index), None)
        if store is not None:
            store.close()

    def shard(self, index: int) -> StateStore:
        """Shard ``index``'s store, opened on first use.

        :raises ShardOpenError: the shard failed to open (now or earlier: use
            :meth:`open_shard` to try again).
        """
        with self._lock:
            idx = self._check_index(index)
            failure = self._failures.get(idx)
            if failure is not None and idx not in self._stores:
                raise ShardOpenError(self.root, idx, self.shard_path(idx), failure)
            return self.open_shard(idx)

    @property
    def shards(self) -> int:
        """The number of shards (fixed by the manifest)."""
        return self.manifest.shards

    @property
    def failures(self) -> dict[int, StatelogError]:
        """Shards that failed to open, with their own errors (``on_failure="report"``)."""
        with self._lock:
            return dict(self._failures)

    @property
    def recovery(self) -> dict[int, RecoveryReport]:
        """The recovery report of every open shard, by shard index."""
        with self._lock:
            return {i: s.recovery for i, s in sorted(self._stores.items())}

    # -- closing ---------------------------------------------------------
    def close(self) -> None:
        """Close every open shard (each seals its log and releases its lock). Idempotent.

        :raises StorageError: a shard failed to seal; every other shard is closed anyway.
        """
        with self._lock:
            self._closed = True
            self._close_all()

    def _close_all(self) -> None:
        first: BaseException | None = None
        stores, self._stores = self._stores, {}
        for store in stores.values():
            try:
                store.close()
            except StatelogError as exc:
                first = first or exc
        if first is not None:
            raise first

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"sharded store {self.root} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyStoreError(f"sharded store {self.root} was opened read-only")

    def __repr__(self) -> str:
        m = self.manifest
        state = " closed" if self._closed else ""
        return f"<ShardedStore {self.root} shards={m.shards} {m.partition}{state}>"
