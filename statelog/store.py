"""StateStore: the public face of statelog.

A commit is one record in the write-ahead log: encode, frame, append,
fsync (by the durability policy), apply to the in-memory overlay, return
the new epoch. Reads never touch the log. Opening a store runs recovery
(:mod:`statelog.recovery`), then appends to the verified last segment, or
starts a new one after a clean close or after corruption.

With ``remote=URL`` (``docs/remote.md``) a missing or empty directory is
restored first (a takeover), and after recovery the writer claims its
generation: stamped in each segment header, re-checked at each roll and
every ``remote_check``.
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
from typing import TYPE_CHECKING, Any, Literal

from . import metrics
from .errors import (
    FencedError,
    InvalidCommitError,
    InvalidOptionError,
    ReadOnlyStoreError,
    StatelogError,
    StorageError,
    StoreClosedError,
)
from .fileio import FileLayer
from .group_commit import GroupCommitter
from .inproc import (
    CompactorMode,
    InProcessCompactor,
    check_compactor_options,
    start_compactor,
)
from .ladder import recover_store
from .layout import StoreLayout
from .lock import StoreLock
from .reads import StoreReads
from .records import CommitRecord, TableDelta, encode_record
from .state import Key, LiveState
from .swap import BaseWatcher
from .transaction import Transaction
from .validate import (
    ENCODE_ERRORS,
    check_offsets,
    check_options,
    check_remote_options,
    check_watermark,
    table_delta,
)
from .wal_writer import FenceWatch, WalWriter

if TYPE_CHECKING:
    from .recovery import LogEnd
    from .remote import RemoteClient, RestoreResult

__all__ = ["Durability", "StateStore", "open"]

log = logging.getLogger("statelog.store")

Durability = Literal["commit", "group", "none"]
Puts = Mapping[str, Any] | Mapping[bytes, Any] | Mapping[Key, Any]
"""What ``put=`` accepts: a mapping from str keys, bytes keys, or both (Mapping is invariant)."""
_EMPTY: Mapping[Any, Any] = types.MappingProxyType({})
_MiB = 1 << 20
_CHECK_DEADLINE = timedelta(seconds=5)  # a fence check on the commit path, retries included


class StateStore(StoreReads):
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
            self._wal: WalWriter | None = None
            return
        self._layout.check_can_host()
        client = None
        if remote is not None:
            from .remote import RemoteClient, restore_if_empty  # the remote tier imports us

            client = RemoteClient.from_url(remote)
            self.restored = restore_if_empty(self.path, remote, client=client)
        self._files.makedirs(self.path)
        self._writer_lock = StoreLock(self.path)
        self._metrics = metrics.bind(self.path)
        try:
            self._open_writer(strict, segment_bytes, fragment_bytes, group_delay, client)
        except BaseException:
            self._state.base.close()
            self._writer_lock.release()
            raise
        self._watcher = BaseWatcher(
            files=self._files,
            snapshots=self._layout.snapshots,
            image_dir=self._layout.base,
            store_id=self.store_id,
            state=self._state,
            view=self._view,
            boundaries=self._boundaries,
            interval=base_refresh.total_seconds(),
        )
        metrics.watch(self.path)  # close() unwatches, also on the failure below
        wal = self._wal
        if wal is not None and wal.fence_check is not None:
            self._fence = FenceWatch(wal, wal.fence_check, remote_check.total_seconds())
        try:
            self._compactor = start_compactor(
                compactor, self.path, compactor_interval, min_tail_bytes, retain
            )
        except BaseException:
            self.close()
            raise

    def _open_writer(
        self,
        strict: bool,
        segment_bytes: int,
        fragment_bytes: int,
        group_delay: timedelta,
        client: RemoteClient | None,
    ) -> None:
        layout = self._layout
        if layout.identity.exists():
            self.store_id = layout.read_identity(self._files)
        else:
            self.store_id = layout.create(self._files)
            log.info("store=%s event=store_created store_id=%s", self.path, self.store_id)
        for p in layout.remove_temp_files(self._files):
            log.info("store=%s event=temp_removed file=%s", self.path, p.name)
        self.recovery, end = recover_store(
            self._files,
            layout,
            self.store_id,
            self._state,
            image_dir=layout.base,
            repair=True,
            strict=strict,
        )
        self._boundaries.update(end.boundaries)
        wal = WalWriter(
            self._files,
            layout.wal,
            self.store_id,
            segment_bytes=segment_bytes,
            fragment_bytes=fragment_bytes,
        )
        wal.metrics = self._metrics
        if client is not None:
            self._claim(wal, end, client)

        def on_seal(lsn: int, crc: int) -> None:
            # An empty sealed segment repeats the LSN: the first seal is the link.
            self._boundaries.setdefault(lsn, crc)

        wal.on_seal = on_seal
        epoch = self._state.epoch
        try:
            if end.unsealed is None:
                wal.start_segment(end.sequence + 1, epoch + 1, end.chain)
            else:
                # Verified (and cut back past any torn tail) by recovery: append to it.
                wal.adopt(end.unsealed, end.sequence, epoch + 1, end.chain)
                # After corruption the log goes on in a new segment; and a
                # header names one writer generation, so a new one rolls too.
                if end.fresh or end.last_generation != wal.generation:
                    wal.roll()
        except OSError as exc:
            raise StorageError(f"continuing the log in {layout.wal} failed: {exc}") from exc
        self._wal = wal
        self._synced_epoch = epoch
        if self._durability == "group":
            self._group = GroupCommitter(self._group_sync, group_delay.total_seconds(), epoch)
        r = self.recovery
        log.info(
            "store=%s event=recovered epoch=%d outcome=%s replayed=%d truncated_bytes=%d "
            "lost_epochs=%d seconds=%.3f",
            self.path,
            r.epoch,
            r.outcome,
            r.replayed,
            r.truncated_bytes,
            len(r.lost_epochs),
            r.seconds,
        )

    def _claim(self, wal: WalWriter, end: LogEnd, client: RemoteClient) -> None:
        """Claim the writer generation (after recovery, before the first segment is written).

        :raises FencedError: another generation owns the store, or the local
            log already holds a newer generation than the one claimed.
        """
        from .remote import RemoteClient, RetryPolicy, check, claim

        url = self._remote
        assert url is not None
        gen = claim(self.path, url, client=client)
        if gen < end.generation:
            raise FencedError(
                f"the log of {self.path} holds segments of a newer writer generation",
                ours=gen,
                current=end.generation,
            )
        # A commit that rolls waits for this check: a few seconds at most, then
        # the roll goes ahead (the remote copy stays fenced by shipping's check).
        quick = RetryPolicy(attempts=3, maximum=timedelta(seconds=1), deadline=_CHECK_DEADLINE)
        fast = RemoteClient.from_url(url, retry=quick, timeout=_CHECK_DEADLINE)
        wal.generation = self.generation = gen
        wal.fence_check = lambda: check(url, self.store_id, gen, client=fast)
        log.info("store=%s event=remote_claimed url=%s generation=%d", self.path, url, gen)

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

    def _group_sync(self) -> None:
        with self._lock:
            f = self._wal.active_file if self._wal is not None else None
            handle = f.dup() if f is not None and not f.closed else None
        if handle is None:
            if self._wal is not None and self._wal.poisoned:
                raise StorageError(f"the log writer failed: {self._wal.poisoned}")
            return  # rolled or closed: sealing synced it
        try:
            synced = time.perf_counter()
            handle.sync()
            self._metrics.fsync_seconds.observe(time.perf_counter() - synced)
        except OSError as exc:
            raise StorageError(
                f"group sync of {handle.path.name} failed: {exc}", errno=exc.errno
            ) from exc
        finally:
            handle.close()

    def flush(self) -> None:
        """Make every commit so far durable now (a no-op with ``durability="commit"``).

        :raises StorageError: the sync failed.
        """
        if self._group is not None:
            if not self._group.flush_now():
                assert self._group.failure is not None
                raise self._group.failure
        elif self._durability == "none" and self._wal is not None:
            with self._lock:
                if not self._closed:  # close() sealed, and so synced, what it could
                    self._wal.sync()
                    self._synced_epoch = self._state.epoch

    def wait_durable(self, epoch: int, timeout: timedelta | float | None = None) -> bool:
        """Block until commit ``epoch`` is durable; False if ``timeout`` passed first.

        :raises StorageError: a background sync failed before ``epoch`` was durable.
        """
        if self._group is None:
            if self._durability == "none":
                self.flush()
            return epoch <= self._state.epoch
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        return self._group.wait(epoch, secs)

    @property
    def durable_epoch(self) -> int:
        """The highest epoch known to be synced to disk (for a read-only store: its epoch)."""
        if self._group is not None:
            return self._group.durable
        return self._synced_epoch

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
