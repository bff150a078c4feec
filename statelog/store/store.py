"""StateStore: the public face of statelog.

A commit is one record in the write-ahead log: encode, frame, append,
fsync (by the durability policy), apply to the in-memory overlay, return
the new epoch. Reads never touch the log: they go to the newest overlay
generation first, then older ones, then the memory-mapped base
(:mod:`statelog.state.live`), each under the view lock, so a read sees whole
commits only and a base swap happens entirely before or after it.

A store is made of parts, each owning what it uses:

* its settings, one checked :class:`~statelog.store.options.StoreOptions`;
* its :class:`~statelog.state.live.LiveState` and the two locks here: the
  commit lock (commits, the writer's syncs and close) and the view lock
  (each applied commit and each base swap becomes visible whole);
* a writing store's :class:`~statelog.store.writer.StoreWriter` (the log, the
  writer lock, the threads beside them, durability), built by
  :func:`~statelog.store.writer_open.open_writer`;
* a read-only store's :class:`~statelog.recovery.readonly.ReadOnlyRecovery`.

With ``remote=URL`` (``docs/remote.md``) a missing or empty directory is
restored first (a takeover), and after recovery the writer claims its
generation: stamped in each segment header, re-checked at each roll and
every ``remote_check``.
"""

from __future__ import annotations

import logging
import threading
import time
import types
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statelog.errors import (
    EpochNotCommittedError,
    InvalidCommitError,
    ReadOnlyStoreError,
    StatelogError,
    StorageError,
    StoreClosedError,
)
from statelog.format.records import CommitRecord, TableDelta, encode_record
from statelog.ops import metrics
from statelog.recovery.readonly import ReadOnlyRecovery, recover_readonly
from statelog.recovery.report import RecoveryReport
from statelog.recovery.timeline import recover_at
from statelog.replica.standby import Standby
from statelog.state.live import Key, LiveState
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.lock import StoreLock
from statelog.store.inproc import start_compactor
from statelog.store.options import Durability, StoreOptions, check_store_path, resolve_options
from statelog.store.reads import StoreReads
from statelog.store.standby_role import StandbyRole
from statelog.store.transaction import Transaction
from statelog.store.validate import (
    ENCODE_ERRORS,
    check_offsets,
    check_wait,
    check_watermark,
    table_delta,
)
from statelog.store.writer import StoreWriter
from statelog.store.writer_open import open_writer

if TYPE_CHECKING:
    from statelog.remote import RestoreResult

__all__ = ["Durability", "StateStore", "StoreOptions", "open"]

log = logging.getLogger("statelog.store.store")

Puts = Mapping[str, Any] | Mapping[bytes, Any] | Mapping[Key, Any]
"""What ``put=`` accepts: a mapping from str keys, bytes keys, or both (Mapping is invariant)."""
_EMPTY: Mapping[Any, Any] = types.MappingProxyType({})


class StateStore(StoreReads, StandbyRole):
    """A changelog-backed state store. Create with :func:`statelog.open`.

    One writer per store (an exclusive lock); any number of read-only opens.
    Commits are serialised; reads may come from any thread and see whole
    commits only.
    """

    def __init__(
        self, path: str | Path, *, options: StoreOptions | None = None, **kwargs: Any
    ) -> None:
        """Open the store at ``path``, creating it (writer) or failing (read-only) if absent.

        The options are a :class:`StoreOptions` passed as ``options=``, or its
        fields as keywords (``durability="group"``); the defaults and the
        meaning of each are documented there. In short: ``durability``
        (``"commit"``, ``"group"`` with ``group_delay``, ``"none"``), the
        log's ``segment_bytes``, ``fragment_bytes`` and ``max_record_bytes``,
        ``readonly``, ``strict``, the writer's ``base_refresh``, an in-process
        ``compactor`` (``compactor_interval``, ``min_tail_bytes``, ``retain``,
        ``max_chain``, ``full_ratio``),
        ``remote`` with ``remote_check``, and a ``file_layer``.

        Read-only: recovers without the lock and without changing the store
        (:func:`~statelog.recovery.readonly.recover_readonly`). Writer: runs
        the open sequence of :mod:`statelog.store.writer_open`, then starts the
        in-process compactor, if any (closing the store again if that fails).

        :raises InvalidOptionError: an unknown or bad option, or both
            ``options=`` and keywords, or a ``path`` that cannot name a
            directory (not a str or ``os.PathLike`` of str, empty, or with a
            NUL byte); nothing was touched.
        :raises RemoteConfigError: ``remote`` is not a usable URL or environment.
        :raises StoreNotFoundError: read-only, and ``path`` holds no store.
        :raises StoreLockedError: another writer has the store open.
        :raises FencedError: ``remote``: another host owns the store.
        :raises RemoteError: ``remote``: the restore or the claim failed
            (a restore that failed leaves ``path`` as it was).
        :raises CorruptionError: ``strict`` and the log is damaged.
        :raises FormatVersionError: files of a newer format.
        :raises StorageError: an I/O error while reading or creating files.
        """
        self.path = check_store_path(path)
        opts = resolve_options(options, kwargs)
        metrics.install()  # before recovery, so the recovery's events are counted
        self.readonly = opts.readonly
        self._options = opts
        self._known_tables = {"default", *opts.tables}
        self._lock = threading.Lock()  # serialises commits and close
        self._view = threading.Lock()  # makes each applied commit visible whole
        self._closed = False
        self._writer: StoreWriter | None = None
        self._ro: ReadOnlyRecovery | None = None
        self._standby: Standby | None = None
        self._standby_lock: StoreLock | None = None
        self.generation = 0
        """The remote writer generation this writer holds (0: no ``remote``)."""
        self.restored: RestoreResult | None = None
        """What the restore of ``remote=`` did, if this open restored ``path``; else None."""
        files = opts.file_layer or FileLayer()
        if opts.follow is not None:
            self._standby = standby = self._open_standby(opts, files)
            self._state = standby.state
            self.store_id, self.recovery, self.readonly = standby.store_id, standby.report, True
            return
        if opts.readonly:
            self._ro = ro = _recover_readonly(self.path, files, opts)
            self._state: LiveState = ro.state
            self.store_id = ro.store_id
            self.recovery: RecoveryReport = ro.report
            return
        self._state = LiveState()
        opened = open_writer(
            StoreLayout(self.path), files, self._state, self._view, self._lock, opts
        )
        self._writer = writer = opened.writer
        self.store_id, self.recovery = opened.store_id, opened.recovery
        self.generation, self.restored = opened.generation, opened.restored
        try:
            writer.compactor = start_compactor(
                opts.compactor, self.path, opts.compactor_interval, opts.min_tail_bytes,
                opts.retain, max_chain=opts.max_chain, full_ratio=opts.full_ratio,
                wal=writer.wal,
            )  # fmt: skip
        except BaseException:
            self.close()
            raise

    @staticmethod
    def open(path: str | Path, **options: Any) -> StateStore:
        """Alias of :func:`statelog.open`."""
        return open(path, **options)

    @property
    def options(self) -> StoreOptions:
        """The options this store was opened with."""
        return self._options

    # -- context manager -------------------------------------------------
    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------
    def commit(
        self,
        put: Puts = _EMPTY,
        *,
        delete: Iterable[Key] = (),
        offsets: Mapping[str, int] | None = None,
        low_watermark_ms: int | None = None,
        table: str = "default",
    ) -> int:
        """Commit one atomic checkpoint: offset advances, the watermark and one table's delta.

        ``offsets`` updates the named partitions (others keep their offset;
        omitted: none change); ``low_watermark_ms`` omitted keeps the
        watermark. Durable on return with ``durability="commit"``.

        :returns: the new epoch, the previous epoch + 1.
        :raises InvalidCommitError: bad input; nothing was written.
        :raises StorageError: the write or sync failed; the commit is not
            visible and will not be replayed.
        """
        started = time.perf_counter()
        with self._lock:
            self._check_writable()
            state = self._state
            offs = {} if offsets is None else check_offsets(offsets, state.offsets)
            wm = state.low_watermark_ms if low_watermark_ms is None else low_watermark_ms
            wm = check_watermark(wm, state.low_watermark_ms)
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
        w = self._writer
        assert w is not None  # _check_writable refused a read-only store
        group = w.group
        if group is not None and group.failure is not None:
            raise group.failure
        overlay = w.overlay
        if overlay is not None and overlay.full():
            overlay.wait()
        epoch = self._state.epoch + 1
        # Never below the commit before: a clock stepped back keeps the log in time order.
        commit_ms = max(time.time_ns() // 1_000_000, self._state.commit_ms)
        try:
            payload = encode_record(CommitRecord(epoch, offsets, wm, deltas, commit_ms))
        except ENCODE_ERRORS as exc:  # e.g. a lone surrogate in a name
            raise InvalidCommitError(f"the commit cannot be encoded: {exc}") from exc
        if len(payload) > w.max_record:
            raise InvalidCommitError(
                f"commit record is {len(payload)} bytes, over max_record_bytes={w.max_record}",
                hint="split the commit into smaller ones or raise max_record_bytes",
            )
        wal = w.wal
        sync = w.sync_each
        wal.append(payload, sync=sync)
        if sync:
            w.synced_epoch = epoch
        with self._view:
            state = self._state
            if wal.sequence != state.generations[-1].segment:
                state.begin_generation(wal.sequence)
            rows = ((d.name, d.keys, d.values, d.deletes) for d in deltas)
            state.apply(epoch, offsets, wm, rows, len(payload))
            state.commit_ms = commit_ms
        if group is not None:
            group.written_up_to(epoch)
        m = w.metrics
        m.commits.inc()
        m.commit_seconds.observe(time.perf_counter() - started)
        return epoch

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        if self._standby is not None:
            raise ReadOnlyStoreError(
                f"store {self.path} is a standby of {self._standby.source}",
                hint="promote() it to commit (once its source's writer has stopped)",
            )
        if self.readonly:
            raise ReadOnlyStoreError(f"store {self.path} was opened read-only")

    # -- durability ------------------------------------------------------
    def flush(self) -> None:
        """Make every commit so far durable now (a no-op with ``durability="commit"``).

        Durability is :mod:`statelog.store.writer`'s; a read-only store has nothing to sync.

        :raises StorageError: the sync failed.
        """
        if self._writer is not None:
            self._writer.flush()

    def wait_durable(self, epoch: int, timeout: timedelta | float | None = None) -> bool:
        """Block until commit ``epoch`` is durable; False if ``timeout`` passed first.

        ``timeout`` is a timedelta or seconds (None: no limit).

        :raises EpochNotCommittedError: a writer's ``epoch`` is beyond its last
            commit (it would never become durable); the message names the latest.
            A read-only store answers whether it holds ``epoch``, without waiting.
        :raises InvalidOptionError: ``epoch`` is not an int, or ``timeout`` is negative.
        :raises StorageError: a background sync failed before ``epoch`` was durable.
        """
        secs = check_wait(epoch, timeout)
        latest = self._state.epoch
        if self._writer is None:  # a reader's state moves only with a standby: no waiting
            return epoch <= latest
        if epoch > latest:
            raise EpochNotCommittedError(
                f"epoch {epoch} was not committed: the latest epoch of {self.path} is {latest}"
            )
        return self._writer.wait_durable(epoch, secs)

    # -- closing ---------------------------------------------------------
    def close(self) -> None:
        """Flush, seal the active segment, release the lock. Idempotent.

        In order: refuse further commits; stop the writer's threads; unmap
        the base (and remove a read-only store's private image); seal.

        :raises StorageError: sealing failed; the lock is released anyway and
            the next open recovers the unsealed segment.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True  # from here on, commits are refused
        w = self._writer
        if w is not None:
            w.stop()  # unlocked: the flusher takes _lock to find the file it syncs
        if self._standby is not None:
            self._standby.stop()  # unlocked: its look in progress applies under the view lock
        with self._view:
            if self._standby is not None:
                self._standby.close()
            elif self._ro is not None:
                self._ro.close()
            else:
                self._state.base.close()
        if self._standby_lock is not None:
            self._standby_lock.release()
        if w is not None:
            with self._lock:
                w.finish()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        mode: str = "readonly" if self.readonly else self._options.durability
        if self._standby is not None:
            mode = f"standby of {self._standby.source}"
        return (
            f"<StateStore {self.path} epoch={self.epoch} {mode}{' closed' if self._closed else ''}>"
        )


def open(path: str | Path, *, options: StoreOptions | None = None, **kwargs: Any) -> StateStore:
    """Create or recover the store at ``path``; see :class:`StoreOptions` for the options.

    Options are :class:`StoreOptions` fields as keywords
    (``statelog.open(path, durability="group")``), or one object
    (``statelog.open(path, options=StoreOptions(durability="group"))``);
    not both. Use as a context manager: ``with statelog.open(path) as store: ...``.

    :raises InvalidOptionError: an unknown or bad option; nothing was changed.
    :raises StorageError: an I/O error (permissions, a read-only file system, ...).
    :raises StatelogError: as :class:`StateStore`.
    """
    try:
        return StateStore(path, options=options, **kwargs)
    except StatelogError:
        raise
    except OSError as exc:  # permissions, a read-only file system, ...
        raise StorageError(
            f"opening {path} failed: {exc}",
            errno=exc.errno,
            hint="check that the path is a writable directory; nothing was changed",
        ) from exc


def _recover_readonly(path: Path, files: FileLayer, opts: StoreOptions) -> ReadOnlyRecovery:
    """The read-only recovery ``opts`` asks for: the newest state, or the one ``at``."""
    if opts.at is not None:
        return recover_at(path, opts.at, files=files, strict=opts.strict)
    return recover_readonly(path, files=files, strict=opts.strict)
