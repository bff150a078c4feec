"""StateStore: the public face of statelog.

A commit is one record in the write-ahead log: encode, frame, append,
fsync (by the durability policy), apply to the in-memory overlay, return
the new epoch. Reads never touch the log. Opening a store runs recovery
(:mod:`statelog.recovery.replay`), then appends to the verified last segment, or
starts a new one after a clean close or after corruption.

With ``remote=URL`` (``docs/remote.md``) a missing or empty directory is
restored first (a takeover), and after recovery the writer claims its
generation: stamped in each segment header, re-checked at each roll and
every ``remote_check``.

The writer's open sequence is :mod:`statelog.store.writer_open`; ``flush``,
``wait_durable`` and ``durable_epoch`` are :mod:`statelog.store.durability`; the
reads are :mod:`statelog.store.reads`. The commit path and ``close`` are here.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import types
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statelog.errors import (
    InvalidCommitError,
    InvalidOptionError,
    ReadOnlyStoreError,
    StatelogError,
    StorageError,
    StoreClosedError,
)
from statelog.format.records import CommitRecord, TableDelta, encode_record
from statelog.log.group_commit import GroupCommitter
from statelog.log.writer import FenceWatch, WalWriter
from statelog.ops import metrics
from statelog.recovery.ladder import recover_store
from statelog.state.live import Key, LiveState
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.lock import StoreLock
from statelog.store.base_watcher import BaseWatcher
from statelog.store.durability import Durability, StoreDurability
from statelog.store.inproc import (
    CompactorMode,
    InProcessCompactor,
    check_compactor_options,
    start_compactor,
)
from statelog.store.reads import StoreReads
from statelog.store.transaction import Transaction
from statelog.store.validate import (
    ENCODE_ERRORS,
    check_offsets,
    check_options,
    check_remote_options,
    check_watermark,
    table_delta,
)
from statelog.store.writer_open import WriterOpen

if TYPE_CHECKING:
    from statelog.remote import RestoreResult

__all__ = ["Durability", "StateStore", "open"]

log = logging.getLogger("statelog.store.store")

Puts = Mapping[str, Any] | Mapping[bytes, Any] | Mapping[Key, Any]
"""What ``put=`` accepts: a mapping from str keys, bytes keys, or both (Mapping is invariant)."""
_EMPTY: Mapping[Any, Any] = types.MappingProxyType({})
_MiB = 1 << 20


class StateStore(StoreReads, StoreDurability, WriterOpen):
    """A changelog-backed state store. Create with :func:`statelog.open`.

    One writer per store (an exclusive lock); any number of read-only opens.
    Commits are serialised; reads may come from any thread and see whole
    commits only.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        durability: Durability = "commit",
        group_delay: timedelta = timedelta(milliseconds=2),
        segment_bytes: int = 64 * _MiB,
        fragment_bytes: int | None = None,
        max_record_bytes: int = 64 * _MiB,
        readonly: bool = False,
        strict: bool = False,
        base_refresh: timedelta = timedelta(seconds=1),
        compactor: CompactorMode = "none",
        compactor_interval: timedelta = timedelta(seconds=30),
        min_tail_bytes: int = 64 * _MiB,
        retain: int = 3,
        remote: str | None = None,
        remote_check: timedelta = timedelta(seconds=5),
        file_layer: FileLayer | None = None,
    ) -> None:
        """Open the store at ``path``, creating it (writer) or failing (read-only) if absent.

        :param durability: ``"commit"`` fsyncs before ``commit`` returns;
            ``"group"`` fsyncs in the background within ``group_delay``
            (see :meth:`wait_durable`); ``"none"`` never syncs until close and
            loses recent commits on power loss: for tests and benchmarks only.
        :param segment_bytes: roll to a new segment past this size.
        :param fragment_bytes: split records larger than this into fragments
            (default: 1 MiB, or ``segment_bytes`` if smaller).
        :param max_record_bytes: refuse commits whose record is larger.
        :param readonly: read the last durable state without taking the lock.
        :param strict: raise :class:`CorruptionError` on damage before the log's tail
            instead of recovering to the last good commit.
        :param base_refresh: how often the writer looks for a new snapshot to
            use as its base level (swapped in off the commit path).
        :param compactor: ``"none"`` (default: run the ``statelog-compactor``
            daemon), or start one with the writer: ``"process"`` (a child
            process) or ``"thread"``; it folds sealed segments every
            ``compactor_interval`` once ``min_tail_bytes`` accumulated, and
            keeps ``retain`` snapshots.
        :param remote: ``s3://bucket/prefix`` of the store's remote copy
            (writer only, with ``compactor="none"``; docs/remote.md). A
            missing or empty ``path`` is restored from it first (a takeover);
            after recovery the writer claims its generation
            (:attr:`generation`). Shipping is the daemon's job.
        :param remote_check: with ``remote``, how often a background thread
            re-checks that this writer's generation still owns the store
            (it is also checked before every roll to a new segment).
        :raises StoreLockedError: another writer has the store open.
        :raises FencedError: ``remote``: another host owns the store.
        :raises RemoteError: ``remote``: the restore or the claim failed
            (a restore that failed leaves ``path`` as it was).
        :raises CorruptionError: ``strict`` and the log is damaged.
        :raises FormatVersionError: files of a newer format.
        :raises StorageError: an I/O error while reading or creating files.
        """
        if fragment_bytes is None:
            fragment_bytes = min(_MiB, segment_bytes) if isinstance(segment_bytes, int) else _MiB
        check_options(durability, group_delay, segment_bytes, fragment_bytes, max_record_bytes)
        for name, flag in (("readonly", readonly), ("strict", strict)):
            if not isinstance(flag, bool):
                raise InvalidOptionError(f"{name}={flag!r}", hint="pass True or False")
        check_compactor_options(compactor, compactor_interval, min_tail_bytes, retain)
        if not isinstance(base_refresh, timedelta) or base_refresh <= timedelta(0):
            raise InvalidOptionError(f"base_refresh={base_refresh!r}", hint="a positive timedelta")
        check_remote_options(remote, remote_check, readonly, compactor)
        metrics.install()  # before recovery, so the recovery's events are counted
        self.path = Path(path)
        self.readonly = readonly
        self._durability = durability
        self._max_record = max_record_bytes
        self._files = file_layer or FileLayer()
        self._layout = StoreLayout(self.path)
        self._state = LiveState()
        self._lock = threading.Lock()  # serialises commits and close
        self._view = threading.Lock()  # makes each applied commit visible whole
        self._closed = False
        self._wal: WalWriter | None = None
        self._writer_lock: StoreLock | None = None
        self._group: GroupCommitter | None = None
        self._watcher: BaseWatcher | None = None
        self._compactor: InProcessCompactor | None = None
        self._ro_images: Path | None = None
        self._boundaries: dict[int, int] = {}
        self._remote = remote
        self._fence: FenceWatch | None = None
        self.generation = 0
        """The remote writer generation this writer holds (0: no ``remote``)."""
        self.restored: RestoreResult | None = None
        """What the restore of ``remote=`` did, if this open restored ``path``; else None."""
        if readonly:
            self.store_id = self._layout.read_identity(self._files)
            # Changes nothing in the store: a snapshot image goes to a private
            # temp dir; truncated_bytes counts the unfinished tail it ignored.
            self._ro_images = Path(tempfile.mkdtemp(prefix="statelog-ro-"))
            try:
                self.recovery, _ = recover_store(
                    self._files,
                    self._layout,
                    self.store_id,
                    self._state,
                    image_dir=self._ro_images,
                    repair=False,
                    strict=strict,
                )
            except BaseException:
                self._state.base.close()
                self._drop_images()
                raise
            self._synced_epoch = self._state.epoch
            return
        self._open_writer(
            strict, segment_bytes, fragment_bytes, group_delay, base_refresh, remote_check
        )
        try:
            self._compactor = start_compactor(
                compactor, self.path, compactor_interval, min_tail_bytes, retain
            )
        except BaseException:
            self.close()
            raise

    @staticmethod
    def open(path: str | Path, **options: Any) -> StateStore:
        """Alias of :func:`statelog.open`."""
        return open(path, **options)

    # -- context manager -------------------------------------------------
    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------
    def commit(
        self,
        *,
        offsets: Mapping[str, int],
        low_watermark_ms: int,
        put: Puts = _EMPTY,
        delete: Iterable[Key] = (),
        table: str = "default",
    ) -> int:
        """Commit one atomic checkpoint: offset advances, the watermark and one table's delta.

        ``offsets`` updates the named partitions (others keep their offset).
        Durable on return with ``durability="commit"``.

        :returns: the new epoch, the previous epoch + 1.
        :raises InvalidCommitError: bad input; nothing was written.
        :raises StorageError: the write or sync failed; the commit is not
            visible and will not be replayed.
        """
        started = time.perf_counter()
        with self._lock:
            self._check_writable()
            state = self._state
            offs = check_offsets(offsets, state.offsets)
            wm = check_watermark(low_watermark_ms, state.low_watermark_ms)
            return self._append(offs, wm, [table_delta(table, put, delete)], started)

    def transaction(self) -> Transaction:
        """A multi-table commit: ``with store.transaction() as tx: tx.put(...)``.

        Commits on a clean exit of the ``with`` block, discards on an exception.
        """
        self._check_writable()
        return Transaction(self)

    def _commit_transaction(
        self, offsets: Mapping[str, int], low_watermark_ms: int | None, deltas: list[TableDelta]
    ) -> int:
        started = time.perf_counter()
        with self._lock:
            self._check_writable()
            state = self._state
            offs = check_offsets(offsets, state.offsets)
            wm = state.low_watermark_ms if low_watermark_ms is None else low_watermark_ms
            return self._append(offs, check_watermark(wm, state.low_watermark_ms), deltas, started)

    def _append(
        self, offsets: dict[str, int], wm: int, deltas: list[TableDelta], started: float
    ) -> int:
        """The hot path: encode, frame, append, fsync by policy, apply. Caller holds ``_lock``.

        ``started`` is the ``perf_counter`` of the commit call: the latency
        observed covers validation and waiting for the lock too.
        """
        group = self._group
        if group is not None and group.failure is not None:
            raise group.failure
        epoch = self._state.epoch + 1
        try:
            payload = encode_record(CommitRecord(epoch, offsets, wm, deltas))
        except ENCODE_ERRORS as exc:  # e.g. a lone surrogate in a name
            raise InvalidCommitError(f"the commit cannot be encoded: {exc}") from exc
        if len(payload) > self._max_record:
            raise InvalidCommitError(
                f"commit record is {len(payload)} bytes, over max_record_bytes={self._max_record}",
                hint="split the commit into smaller ones or raise max_record_bytes",
            )
        assert self._wal is not None
        sync = self._durability == "commit"
        self._wal.append(payload, sync=sync)
        if sync:
            self._synced_epoch = epoch
        with self._view:
            state = self._state
            if self._wal.sequence != state.generations[-1].segment:
                state.begin_generation(self._wal.sequence)
            state.apply(epoch, offsets, wm, ((d.name, d.keys, d.values, d.deletes) for d in deltas))
        if group is not None:
            group.written_up_to(epoch)
        m = self._metrics
        m.commits.inc()
        m.commit_seconds.observe(time.perf_counter() - started)
        return epoch

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        if self.readonly:
            raise ReadOnlyStoreError(f"store {self.path} was opened read-only")

    # -- closing ---------------------------------------------------------
    def close(self) -> None:
        """Flush, seal the active segment, release the lock. Idempotent.

        :raises StorageError: sealing failed; the lock is released anyway and
            the next open recovers the unsealed segment.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True  # from here on, commits are refused
        if not self.readonly:
            metrics.unwatch(self.path)
        # The flusher takes _lock to find the file it syncs: stop it unlocked.
        if self._group is not None:
            self._group.stop()
        if self._compactor is not None:
            self._compactor.stop()
        if self._watcher is not None:
            self._watcher.stop()
        if self._fence is not None:
            self._fence.stop()
        with self._view:
            self._state.base.close()
        self._drop_images()
        with self._lock:
            try:
                if self._wal is not None:
                    # After a failed sync a seal could vouch for records the
                    # kernel dropped: leave the segment to recovery instead.
                    if self._wal.poisoned or (self._group and self._group.failure):
                        self._wal.close()
                    else:
                        self._wal.seal()
                        self._synced_epoch = self._state.epoch
            finally:
                if self._writer_lock is not None:
                    self._writer_lock.release()

    def _drop_images(self) -> None:
        if self._ro_images is not None:
            shutil.rmtree(self._ro_images, ignore_errors=True)
            self._ro_images = None

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        mode = "readonly" if self.readonly else self._durability
        return (
            f"<StateStore {self.path} epoch={self.epoch} {mode}{' closed' if self._closed else ''}>"
        )


def open(path: str | Path, **options: Any) -> StateStore:
    """Create or recover the store at ``path``; see :class:`StateStore` for ``options``.

    Use as a context manager: ``with statelog.open(path) as store: ...``.
    """
    try:
        return StateStore(path, **options)
    except TypeError as exc:
        if "unexpected keyword argument" in str(exc):
            raise InvalidOptionError(str(exc)) from None
        raise
    except StatelogError:
        raise
    except OSError as exc:  # permissions, a read-only file system, ...
        raise StorageError(
            f"opening {path} failed: {exc}",
            errno=exc.errno,
            hint="check that the path is a writable directory; nothing was changed",
        ) from exc
