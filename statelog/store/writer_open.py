"""The writer's open sequence: from an empty or existing directory to a log it can append to.

:func:`open_writer`, called by :class:`~statelog.store.store.StateStore` with its
checked :class:`~statelog.store.options.StoreOptions`, runs these steps in
order and returns the store's :class:`~statelog.store.writer.StoreWriter`;
every write of a step is durable before the next step begins:

0. Refuse a directory that holds anything but a statelog store.
1. With ``remote=URL``, before the writer's lock: :func:`restore_from_remote`
   restores a missing or empty directory from the remote copy (a takeover;
   the restore takes a new writer generation first). A directory that
   holds a store is left alone.
2. Take the writer's lock (``STORE/LOCK``) and refuse a store whose standby
   was promoted away (``PROMOTED``, :mod:`statelog.replica.promoted`), and a
   standby's copy that was not promoted (``STANDBY``,
   :mod:`statelog.storage.marks`); finish a rewind in place that died after
   its intent (``REWIND``, :mod:`statelog.recovery.rewind`); then :func:`open_log`:

   a. ``IDENTITY``: read it, or create the store (directories, the first
      segment, then the identity, each fsynced: :meth:`StoreLayout.create`);
   b. remove ``wal/*.tmp`` and ``IDENTITY.tmp`` left by a writer that died
      while creating files;
   c. recovery (:func:`statelog.recovery.ladder.recover_store`): the newest snapshot
      that verifies and links to the log, then the log after it, with torn
      tails cut and damage moved aside;
   d. with ``remote``: claim the writer generation (:func:`statelog.remote.claim`)
      before this writer writes any segment header, so that every segment it
      writes names its generation, and install the fence check a roll runs;
   e. continue the log: a new segment after a clean close; else adopt the
      unsealed last segment recovery verified and cut back, and seal it and
      roll to a new one after corruption, or when its header names another
      writer generation (a header names exactly one).

3. Start the group flusher (``durability="group"``), the base watcher, the
   store's scrape-time metrics and, with ``remote``, the fence watch.

A failure in step 2 releases the lock and closes the base; it leaves what
recovery already repaired repaired (each repair is itself durable and safe
to find again), and nothing half-written: the next open starts over. The
store starts the in-process compactor last, and closes itself if that fails.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from statelog.errors import FencedError, StorageError
from statelog.format.wal import parse_segment_name
from statelog.log.writer import FenceWatch, WalWriter
from statelog.ops import metrics
from statelog.ops.metrics import StoreMetrics
from statelog.recovery.ladder import recover_store
from statelog.recovery.report import RecoveryReport
from statelog.recovery.rewind import finish_rewind
from statelog.replica.promoted import check_not_promoted, check_not_standby_copy
from statelog.state.live import LiveState
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.lock import StoreLock
from statelog.store.age_seal import AgeSealer
from statelog.store.base_watcher import BaseWatcher
from statelog.store.options import StoreOptions
from statelog.store.overlay import OverlayBound
from statelog.store.writer import StoreWriter

if TYPE_CHECKING:
    from statelog.remote import RemoteClient, RestoreResult

__all__ = ["OpenedLog", "OpenedWriter", "open_log", "open_writer", "restore_from_remote"]

# The writer's own logger: these lines are the open of a store.
log = logging.getLogger("statelog.store.store")

_CHECK_DEADLINE = timedelta(seconds=5)  # a fence check on the commit path, retries included


@dataclass(frozen=True, slots=True)
class OpenedLog:
    """What :func:`open_log` hands to :func:`open_writer`."""

    store_id: uuid.UUID
    recovery: RecoveryReport
    wal: WalWriter  # positioned to append the next epoch
    generation: int  # the remote writer generation claimed (0: no remote)


@dataclass(frozen=True, slots=True)
class OpenedWriter:
    """What :func:`open_writer` hands to the store."""

    writer: StoreWriter
    store_id: uuid.UUID
    recovery: RecoveryReport
    generation: int  # the remote writer generation claimed (0: no remote)
    restored: RestoreResult | None  # what the restore of ``remote=`` did, if it ran


def open_writer(
    layout: StoreLayout,
    files: FileLayer,
    state: LiveState,
    view: threading.Lock,
    commits: threading.Lock,
    options: StoreOptions,
) -> OpenedWriter:
    """Steps 0-3 of the module docstring; ``state`` is the store's, loaded by recovery.

    ``view`` is the store's view lock (the base watcher swaps under it);
    ``commits`` its commit lock (the writer's syncs take it).

    :raises NotAStoreError: the path holds something else.
    :raises StoreLockedError, StorePromotedError: as :func:`_lock`.
    :raises FencedError, RemoteError: ``remote``: as :func:`restore_from_remote`
        and :func:`open_log`.
    :raises StorageError, CorruptionError, FormatVersionError, ResnapshotRequired:
        as :func:`open_log`.
    """
    path = layout.root
    layout.check_can_host()
    remote = restored = None
    if options.remote is not None:
        client, restored = restore_from_remote(path, options.remote)
        remote = (options.remote, client)
    files.makedirs(path)
    lock = _lock(path)
    store_metrics = metrics.bind(path)
    boundaries: dict[int, int] = {}
    try:
        opened = open_log(
            path,
            layout,
            files,
            state,
            boundaries,
            strict=options.strict,
            segment_bytes=options.segment_bytes,
            fragment_bytes=options.fragment_size,
            store_metrics=store_metrics,
            remote=remote,
        )
        writer = StoreWriter(
            path=path,
            wal=opened.wal,
            file_lock=lock,
            commits=commits,
            state=state,
            durability=options.durability,
            group_delay=options.group_delay,
            max_record=options.max_record_bytes,
            store_metrics=store_metrics,
        )
    except BaseException:
        state.base.close()
        lock.release()
        raise
    if options.max_overlay_bytes is not None:
        wait = options.overlay_wait.total_seconds()
        writer.overlay = OverlayBound(path, state, store_metrics, options.max_overlay_bytes, wait)
    writer.watcher = BaseWatcher(
        files=files,
        snapshots=layout.snapshots,
        image_dir=layout.base,
        store_id=opened.store_id,
        state=state,
        view=view,
        boundaries=boundaries,
        interval=options.base_refresh.total_seconds(),
        on_swap=None if writer.overlay is None else writer.overlay.folded,
    )
    if writer.overlay is not None:
        writer.overlay.poke = writer.watcher.poke
    metrics.watch(path)  # the writer's stop() unwatches, also on a failure after this
    _start_log_threads(writer, options)
    return OpenedWriter(writer, opened.store_id, opened.recovery, opened.generation, restored)


def _start_log_threads(writer: StoreWriter, options: StoreOptions) -> None:
    """The fence watch (with ``remote=``) and the sealer by age, beside the writer."""
    wal = writer.wal
    if wal.fence_check is not None:
        interval = options.remote_check.total_seconds()
        writer.fence = FenceWatch(wal, wal.fence_check, interval)
    shipped = options.remote is not None
    writer.sealer = AgeSealer(
        writer.path, wal, writer.commits, options.max_ship_lag, shipped=shipped
    )


def _lock(path: Path) -> StoreLock:
    """Take the writer's lock, then refuse a store whose standby was promoted away, and
    a standby's copy that was not promoted.

    :raises StoreLockedError: another writer has the store open.
    :raises StorePromotedError: ``PROMOTED`` exists (the lock is released again).
    :raises StandbyCopyError: ``STANDBY`` exists (the lock is released again).
    :raises CorruptionError: ``REWIND`` exists but is no rewind's intent.
    :raises OSError: finishing a pending rewind failed (it stays pending).
    """
    lock = StoreLock(path)
    try:
        check_not_promoted(path)
        check_not_standby_copy(path)
        finish_rewind(path)  # a rewind that died after its intent: the store is the rewound one
    except BaseException:
        lock.release()
        raise
    return lock


def restore_from_remote(path: Path, url: str) -> tuple[RemoteClient, RestoreResult | None]:
    """Step 1: restore ``path`` from ``url`` if it is missing or empty.

    :returns: the client (reused for the claim), and what the restore did,
        or None when ``path`` already held something.
    :raises RemoteConfigError: a bad URL or ``AWS_*`` environment.
    :raises RemoteError: the restore failed; ``path`` is as it was.
    """
    # Not at import: the remote tier (obstore) adds about 45 ms to `import statelog`.
    from statelog.remote import RemoteClient, restore_if_empty

    client = RemoteClient.from_url(url)
    return client, restore_if_empty(path, url, client=client)


def open_log(
    path: Path,
    layout: StoreLayout,
    files: FileLayer,
    state: LiveState,
    boundaries: dict[int, int],
    *,
    strict: bool,
    segment_bytes: int,
    fragment_bytes: int,
    store_metrics: StoreMetrics,
    remote: tuple[str, RemoteClient] | None,
) -> OpenedLog:
    """Steps 2a-2e; the caller holds the writer's lock.

    Recovery loads ``state``; ``boundaries`` (last LSN -> seal crc of every
    sealed segment, shared with the base watcher) gets the sealed segments
    replayed, and every seal the writer makes from here on.

    :raises FencedError: ``remote``: another generation owns the store, or
        the local log holds a newer generation than the one claimed.
    :raises RemoteError: ``remote``: the claim could not reach the object store.
    :raises ResnapshotRequired: no usable snapshot and the log does not reach epoch 1.
    :raises CorruptionError: ``strict`` and the log is damaged.
    :raises FormatVersionError: files of a newer format.
    :raises StorageError: an I/O error while reading, repairing or continuing the log.
    """
    if layout.identity.exists():
        store_id = layout.read_identity(files)
    else:
        store_id = layout.create(files)
        log.info("store=%s event=store_created store_id=%s", path, store_id)
    for p in layout.remove_temp_files(files):
        log.info("store=%s event=temp_removed file=%s", path, p.name)
    recovery, end = recover_store(
        files, layout, store_id, state, image_dir=layout.base, repair=True, strict=strict
    )
    boundaries.update(end.boundaries)
    wal = WalWriter(
        files, layout.wal, store_id, segment_bytes=segment_bytes, fragment_bytes=fragment_bytes
    )
    wal.metrics = store_metrics
    generation = 0
    if remote is not None:
        generation = _claim(path, store_id, wal, end.generation, *remote)

    def on_seal(lsn: int, crc: int) -> None:
        # An empty sealed segment repeats the LSN: the first seal is the link.
        boundaries.setdefault(lsn, crc)

    wal.on_seal = on_seal
    epoch = state.epoch
    try:
        if end.unsealed is None:
            wal.start_segment(end.sequence + 1, epoch + 1, end.chain)
        else:
            # Verified (and cut back past any torn tail) by recovery: append to it.
            named = parse_segment_name(end.unsealed)
            has_records = named is not None and named[1] <= epoch
            wal.adopt(end.unsealed, end.sequence, epoch + 1, end.chain, has_records=has_records)
            # After corruption the log goes on in a new segment; and a
            # header names one writer generation, so a new one rolls too.
            if end.fresh or end.last_generation != wal.generation:
                wal.roll()
    except OSError as exc:
        raise StorageError(f"continuing the log in {layout.wal} failed: {exc}") from exc
    r = recovery
    log.info(
        "store=%s event=recovered epoch=%d outcome=%s replayed=%d truncated_bytes=%d "
        "lost_epochs=%d seconds=%.3f",
        path,
        r.epoch,
        r.outcome,
        r.replayed,
        r.truncated_bytes,
        len(r.lost_epochs),
        r.seconds,
    )
    return OpenedLog(store_id, recovery, wal, generation)


def _claim(
    path: Path,
    store_id: uuid.UUID,
    wal: WalWriter,
    logged: int,
    url: str,
    client: RemoteClient,
) -> int:
    """Step 2d: claim the writer generation; return it.

    :param logged: the highest generation named in the headers of the log kept.
    :raises FencedError: another generation owns the store, or ``logged`` is
        newer than the generation claimed.
    :raises RemoteError: the object store could not be reached.
    """
    from statelog.remote import RemoteClient, RetryPolicy, check, claim  # as above: 45 ms

    gen = claim(path, url, client=client)
    if gen < logged:
        raise FencedError(
            f"the log of {path} holds segments of a newer writer generation",
            ours=gen,
            current=logged,
        )
    # A commit that rolls waits for this check: a few seconds at most, then
    # the roll goes ahead (the remote copy stays fenced by shipping's check).
    quick = RetryPolicy(attempts=3, maximum=timedelta(seconds=1), deadline=_CHECK_DEADLINE)
    fast = RemoteClient.from_url(url, retry=quick, timeout=_CHECK_DEADLINE)
    wal.generation = gen
    wal.fence_check = lambda: check(url, store_id, gen, client=fast)
    log.info("store=%s event=remote_claimed url=%s generation=%d", path, url, gen)
    return gen
