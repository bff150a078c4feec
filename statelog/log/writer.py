"""The WAL writer: frames records, appends them to the active segment, rolls and seals.

The layout it writes is defined in :mod:`statelog.format.wal` and specified
in ``docs/format.md``. The writer never reads; recovery
(:mod:`statelog.recovery.replay`) decides where it starts (sequence, LSN, chain).

Failure contract: an append or sync that fails is rolled back (the file is
truncated to where it was), so a failed commit is neither visible nor
replayed. If even the rollback fails the writer is *poisoned*: every later
append raises :class:`~statelog.errors.StorageError` until the store is
reopened and recovery has re-read the log.

Fencing (``docs/remote.md``): a writer opened with a remote generation
stamps it in every segment header it creates, re-checks it before each
roll (``fence_check``) and every ``remote_check`` interval
(:class:`FenceWatch`). Once another generation owns the store the writer is
*fenced*: every later append raises :class:`~statelog.errors.FencedError`;
records already appended stay, and sealing still works.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from statelog.errors import FencedError, RemoteError, StorageError
from statelog.format.wal import (
    SEAL_PAYLOAD,
    FrameType,
    SegmentHeader,
    pack_frame_header,
    padding,
    segment_name,
)
from statelog.log.counters import WalMetrics
from statelog.storage.fileio import AppendFile, Buffer, FileLayer

__all__ = ["FenceWatch", "WalWriter"]

log = logging.getLogger("statelog.wal")

_ZEROS = bytes(8)


class WalWriter:
    """Appends framed records to ``wal_dir``; one instance per writing store."""

    def __init__(
        self,
        files: FileLayer,
        wal_dir: Path,
        store_id: uuid.UUID,
        *,
        segment_bytes: int,
        fragment_bytes: int,
        generation: int = 0,
    ) -> None:
        self._files = files
        self._dir = wal_dir
        self._store_id = store_id
        self._segment_bytes = segment_bytes
        self._fragment_bytes = fragment_bytes
        self._file: AppendFile | None = None
        self.sequence = 0
        self.last_crc = 0
        self.next_lsn = 1
        self.poisoned: str | None = None
        self.generation = generation
        """Stamped in every header this writer creates; 0: no remote generation."""
        self.fenced: FencedError | None = None
        """Set once another generation owns the store; appends are refused from then on."""
        self.fence_check: Callable[[], None] | None = None
        """Called before each roll: raises FencedError if this generation no longer owns the
        store (any other RemoteError is logged and the roll goes ahead)."""
        self._roll_pending = False
        self._unsynced = False  # records appended since the last sync the writer made
        self.on_seal: Callable[[int, int], None] | None = None
        """Called with (last LSN, seal crc) after each seal: the log's segment boundaries."""
        self.metrics: WalMetrics | None = None
        """Bound by the store: bytes appended and fsync seconds are counted here."""
        self.unsealed_since: float | None = None
        """``time.monotonic()`` when the active segment got its first record not yet sealed
        (None: it holds none): what sealing by age (``max_ship_lag``) measures."""

    @property
    def active_path(self) -> Path | None:
        return self._file.path if self._file is not None else None

    @property
    def active_file(self) -> AppendFile | None:
        return self._file

    def start_segment(self, sequence: int, first_lsn: int, prev_crc: int) -> Path:
        """Create segment ``sequence`` and make it the active one.

        Durable steps: header written to a temp file, fsync, rename into
        ``wal/``, fsync of ``wal/`` (:meth:`FileLayer.create_durable`). A crash
        leaves no segment or a complete header, never a half-written one.

        :raises OSError: the segment could not be created; nothing changed.
        """
        header = SegmentHeader(
            self._store_id, sequence, first_lsn, prev_crc, generation=self.generation
        )
        path = self._dir / segment_name(sequence, first_lsn)
        self._files.create_durable(path, header.pack())
        self._file = self._files.open_append(path)
        self.sequence, self.next_lsn, self.last_crc = sequence, first_lsn, prev_crc
        self._roll_pending = False
        self.unsealed_since = None
        log.info("segment=%s event=segment_created first_lsn=%d", path.name, first_lsn)
        return path

    def adopt(
        self, path: Path, sequence: int, next_lsn: int, chain: int, *, has_records: bool = False
    ) -> None:
        """Continue an existing, verified segment (recovery found it unsealed).

        ``has_records``: it holds records already, which count as unsealed from now.
        """
        self._file = self._files.open_append(path)
        self.sequence, self.next_lsn, self.last_crc = sequence, next_lsn, chain
        self._roll_pending = False
        self.unsealed_since = time.monotonic() if has_records else None

    def _frames(self, payload: bytes) -> tuple[list[Buffer], int]:
        """Frame ``payload``, fragmenting past ``fragment_bytes``; returns chunks and last crc."""
        view = memoryview(payload)
        n = len(view)
        step = self._fragment_bytes
        prev = self.last_crc
        chunks: list[Buffer] = []
        pos = 0
        while True:
            piece = view[pos : pos + step]
            end = pos + len(piece)
            if pos == 0:
                ftype = FrameType.FULL if end >= n else FrameType.FIRST
            else:
                ftype = FrameType.LAST if end >= n else FrameType.MIDDLE
            header = pack_frame_header(ftype, piece, prev)
            prev = struct.unpack_from("<I", header)[0]
            chunks.append(header)
            chunks.append(piece)
            pad = padding(len(piece))
            if pad:
                chunks.append(_ZEROS[:pad])
            pos = end
            if pos >= n:
                return chunks, prev

    def append(self, payload: bytes, *, sync: bool) -> None:
        """Append one record (one LSN); with ``sync``, fdatasync before returning.

        Rolls to a new segment first when the active one has reached
        ``segment_bytes`` (or after a failed sync). Fragments of one record
        never span two segments.

        :raises StorageError: the roll, the write or the sync failed. The file
            was cut back to its previous length; the record will not be replayed.
        :raises FencedError: another writer generation owns the store (found
            now, before the roll, or earlier); nothing was written.
        """
        self._check_usable()
        self._check_not_fenced()
        f = self._file
        if f is None or self._roll_pending or f.size >= self._segment_bytes:
            self._check_fence_before_roll()
            self.roll()
            f = self._file
            assert f is not None
        chunks, crc = self._frames(payload)
        self._write(f, chunks, sync=sync, what="append")
        self.last_crc = crc
        self.next_lsn += 1
        if self.unsealed_since is None:
            self.unsealed_since = time.monotonic()

    def _check_usable(self) -> None:
        if self.poisoned:
            raise StorageError(
                f"the log writer stopped after an earlier failure: {self.poisoned}",
                hint="close and reopen the store: recovery re-reads the log; the failed "
                "commit may or may not be there, so check store.epoch before retrying",
            )

    def mark_fenced(self, exc: FencedError) -> None:
        """Refuse every later append with ``exc``'s generations. Idempotent; thread-safe."""
        if self.fenced is None:
            self.fenced = exc
            log.critical(
                "event=writer_fenced generation=%d current=%d segment=%s",
                exc.ours, exc.current, self.active_path.name if self.active_path else "-",
            )  # fmt: skip

    def _check_not_fenced(self) -> None:
        gone = self.fenced
        if gone is not None:
            # A new exception each time: re-raising one instance would chain tracebacks.
            raise FencedError(
                "this writer was fenced: another host took the store over; commit refused",
                ours=gone.ours,
                current=gone.current,
            )

    def _check_fence_before_roll(self) -> None:
        """Re-check the generation before a new segment opens (a roll is when a segment
        becomes shippable, so a zombie is stopped there at the latest)."""
        if self.fence_check is None:
            return
        try:
            self.fence_check()
        except FencedError as exc:
            self.mark_fenced(exc)
            self._check_not_fenced()
        except RemoteError as exc:
            # Availability over an early stop: the remote copy stays fenced
            # anyway, since shipping checks the generation before uploading.
            log.warning("event=fence_check_failed when=roll error=%r", exc.message)

    def _write(self, f: AppendFile, chunks: list[Buffer], *, sync: bool, what: str) -> None:
        """Write (and sync) ``chunks`` at the end of ``f``, or leave ``f`` as it was.

        Any exception, an interrupt included, rolls the bytes back, so a
        record that was not acknowledged never reappears on replay.
        """
        before = f.size
        written = False
        m = self.metrics
        try:
            f.write(chunks)
            written = True
            if sync:
                synced = time.perf_counter()
                f.sync()
                if m is not None:
                    m.fsync_seconds.observe(time.perf_counter() - synced)
        except BaseException as exc:
            self._rollback(f, before, exc, sync_failed=written and sync)
            if isinstance(exc, OSError):
                raise StorageError(
                    f"{what} to {f.path.name} failed: {exc.strerror or exc}", errno=exc.errno
                ) from exc
            raise
        if sync:
            self._unsynced = False
        else:
            self._unsynced = True
        if m is not None:
            m.appended_bytes.inc(f.size - before)

    def _rollback(self, f: AppendFile, size: int, exc: BaseException, *, sync_failed: bool) -> None:
        """Cut ``f`` back to ``size`` after a failed write or sync; poison if that is not enough."""
        if sync_failed and self._unsynced:
            # The failed sync was also the only sync of earlier records
            # (group or no durability): they may be gone from the page cache,
            # so only a reopen can tell what is durable.
            self._poison(f, f"sync failed with unsynced records before it: {exc}")
            with contextlib.suppress(OSError):
                f.truncate(size)
            return
        try:
            f.truncate(size)
            if sync_failed:
                # After a failed fsync the kernel may have dropped the dirty
                # pages; make the cut durable and leave this file behind.
                f.sync()
                self._roll_pending = True
        except OSError as again:
            self._poison(f, f"{exc}; rollback failed: {again}")

    def _poison(self, f: AppendFile, why: str) -> None:
        self.poisoned = why
        log.critical("segment=%s event=writer_poisoned reason=%r", f.path.name, why)

    def sync(self) -> None:
        """fdatasync the active segment.

        :raises StorageError: the sync failed; the writer is poisoned, since
            appends already acknowledged to callers may not be durable.
        """
        f = self._file
        if f is None or f.closed:
            return
        try:
            synced = time.perf_counter()
            f.sync()
            if self.metrics is not None:
                self.metrics.fsync_seconds.observe(time.perf_counter() - synced)
        except OSError as exc:
            self._poison(f, f"sync failed: {exc}")
            raise StorageError(f"sync of {f.path.name} failed: {exc}", errno=exc.errno) from exc
        self._unsynced = False

    def seal(self) -> None:
        """Append a SEAL frame naming the last LSN, fsync, and close the segment.

        A sealed segment is immutable: the compactor may read it. If the
        write fails the segment stays open and unsealed, so a later roll or
        close tries again. A segment that saw a failed sync is closed
        without a seal.

        :raises StorageError: the write or the sync failed.
        """
        f = self._file
        if f is None:
            return
        self._check_usable()
        if self._roll_pending:
            # A sync of this file failed: write nothing more to it. It stays
            # unsealed; recovery verifies it and the next segment chains to it.
            f.close()
            self._file = None
            return
        payload = SEAL_PAYLOAD.pack(self.next_lsn - 1)
        header = pack_frame_header(FrameType.SEAL, payload, self.last_crc)
        chunks: list[Buffer] = [header, payload]
        pad = padding(len(payload))
        if pad:
            chunks.append(_ZEROS[:pad])
        self._write(f, chunks, sync=True, what="seal")
        f.close()
        self._file = None
        self.unsealed_since = None
        self.last_crc = struct.unpack_from("<I", header)[0]
        if self.on_seal is not None:
            self.on_seal(self.next_lsn - 1, self.last_crc)
        log.info("segment=%s event=segment_sealed last_lsn=%d", f.path.name, self.next_lsn - 1)

    def roll(self) -> None:
        """Seal the active segment and start the next one, chained to it.

        :raises StorageError: sealing or creating the next segment failed;
            a later append retries the roll.
        """
        self.seal()
        try:
            self.start_segment(self.sequence + 1, self.next_lsn, self.last_crc)
        except OSError as exc:
            raise StorageError(
                f"creating segment {self.sequence + 1} failed: {exc.strerror or exc}",
                errno=exc.errno,
            ) from exc

    def close(self) -> None:
        """Close without sealing (used when the writer was poisoned)."""
        if self._file is not None:
            self._file.close()
            self._file = None


class FenceWatch:
    """Re-checks a writer's remote generation every ``interval`` seconds, in a daemon thread.

    ``check`` raises :class:`~statelog.errors.FencedError` once another
    generation owns the store: the writer is then marked fenced and the
    watch ends. Any other :class:`~statelog.errors.RemoteError` (the object
    store unreachable) is logged at WARNING and tried again next interval.
    The thread never touches the log, so it needs no lock of the writer.
    """

    def __init__(self, writer: WalWriter, check: Callable[[], None], interval: float) -> None:
        self._writer = writer
        self._check = check
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="statelog-fence", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval) and self._writer.fenced is None:
            try:
                self._check()
            except FencedError as exc:
                self._writer.mark_fenced(exc)
            except RemoteError as exc:
                log.warning("event=fence_check_failed when=interval error=%r", exc.message)
            except Exception as exc:  # a bug must not end the checks silently
                log.error("event=fence_check_failed when=interval error=%r", exc, exc_info=True)

    def stop(self) -> None:
        """End the thread; waits for a check in flight (bounded by the client's timeouts)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
