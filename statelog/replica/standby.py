"""A standby: a local copy of a store that keeps following its source, serving reads.

``statelog.open(path, follow=SOURCE)`` builds one (:class:`Standby`); the store
serves reads from :attr:`Standby.state` and refuses commits until
:meth:`~statelog.store.store.StateStore.promote`. Life of a standby:

1. :func:`~statelog.replica.mirror.mirror` copies the source into ``path`` (its
   snapshots, its sealed segments, the verified prefix of its live segment), or,
   for a remote URL, :func:`~statelog.replica.remote_mirror.mirror_remote`
   downloads the newest restore point the MANIFEST lists and the sealed
   segments after it;
   the copy is recovered without repairs (:func:`~statelog.recovery.ladder.recover_store`,
   every snapshot and record verified): that state is what readers see. Its
   snapshot images are built from the copied snapshots into ``path/base``,
   stamped, as a writer's are (the source's images are never copied: an LMDB
   image is trusted completely by LMDB, so one from another host is never
   mapped), so a promoted writer maps them instead of building them again.
2. A thread looks again every ``poll``: :meth:`Standby.step`. When the look
   copied a snapshot (or the source had cut its tail), the copy is recovered
   again in the thread and the new state installed under the store's view lock:
   reads move from one consistent state to the next, never see a mix. Otherwise
   the records the copy gained are read back verified
   (:func:`~statelog.log.changes.read_records`) and applied one commit at a time
   under the same lock, so a read sees whole commits only.
3. A look that fails (an I/O error, damage the copy's log holds) is logged at
   ERROR and tried again at the next one; the state stays at its last epoch.

The lag (:class:`Lag`) is measured at each look: the epochs and log bytes the
source held beyond what the standby had applied, and the seconds since the
standby was last caught up; ``statelog_standby_lag_{epochs,bytes,seconds}``
report it when scraped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from statelog.errors import ChangesUnavailableError, CorruptionError, StatelogError
from statelog.format.records import CommitRecord, RecordSchemaError, decode_record
from statelog.log.changes import read_records
from statelog.ops import metrics
from statelog.recovery.ladder import recover_store
from statelog.recovery.report import RecoveryReport
from statelog.replica.mirror import MirrorResult, Tails, mirror
from statelog.state.live import LiveState
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout

if TYPE_CHECKING:  # at run time the remote tier loads only for a remote source
    from statelog.replica.remote_mirror import RemoteSource

__all__ = ["Lag", "Standby"]

log = logging.getLogger("statelog.replica.standby")


@dataclass(frozen=True, slots=True)
class Lag:
    """How far a standby is behind its source, as its last look saw it."""

    epochs: int
    """Epochs the source's log held that the standby had not applied."""
    bytes: int
    """Log bytes the look copied that the standby had not applied yet (0 when caught up)."""
    seconds: float
    """Seconds since the standby was last caught up with its source (0: it is now)."""


class Standby:
    """A followed copy of ``source`` at ``path`` (module docstring).

    :param install: called under ``view`` with each new state the standby recovers.
    :raises StoreNotFoundError: ``source`` holds no store.
    :raises RemoteError: a remote ``source`` cannot be read, or holds no MANIFEST.
    :raises NotAStoreError: ``path`` holds another store, or a file.
    :raises StatelogError: as :func:`~statelog.recovery.readonly.recover_readonly`.
    :raises StorageError: an I/O error during the first copy.
    """

    def __init__(
        self,
        path: Path,
        source: Path | RemoteSource,
        *,
        view: threading.Lock,
        install: Callable[[LiveState], None],
        poll: float,
        files: FileLayer | None = None,
    ) -> None:
        self.path, self.source = path, source
        self._files = files or FileLayer()
        self._view, self._install, self._poll = view, install, poll
        self._tails: Tails = {}  # where the copy of the source's live segment was verified
        self._reading: tuple[int, str] | None = None  # segment of the last record read back
        first = self._look()
        self._layout = StoreLayout(path)
        self.store_id = self._layout.read_identity(self._files)
        self.state, self.report = self._recover_copy()
        self._steps = threading.Lock()  # one look at a time: the thread's or promote's
        self._caught_up = time.monotonic()
        self._lag = Lag(0, 0, 0.0)
        self._failed: str | None = None
        self._note_lag(first)
        metrics.watch_lag(path, self._lag_sample)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.start()

    def start(self) -> None:
        """Follow the source in a thread, one look every ``poll`` (again after :meth:`stop`)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="statelog-standby", daemon=True)
        self._thread.start()

    @property
    def lag(self) -> Lag:
        """The lag at the last look, its seconds counted up to now."""
        lag = self._lag
        behind = 0.0 if lag.epochs == 0 else time.monotonic() - self._caught_up
        return Lag(lag.epochs, lag.bytes, behind)

    def _lag_sample(self) -> tuple[int, int, float]:
        lag = self.lag
        return lag.epochs, lag.bytes, lag.seconds

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                self.step()
            except (StatelogError, OSError) as exc:
                if str(exc) != self._failed:  # once per distinct failure, not every poll
                    log.error("event=standby_failed store=%s error=%s", self.path, exc)
                self._failed = str(exc)

    def step(self) -> MirrorResult:
        """One look at the source: copy what is new, then apply it (module docstring).

        :raises StatelogError: the copy or the recovery failed; the state is unchanged.
        :raises OSError: as the copy's reads raise them.
        """
        with self._steps:
            result = self._look()
            if result.snapshots or result.rewound:
                self._recover()
            elif not self._apply_gained(result):
                try:
                    self._apply()
                except ChangesUnavailableError:
                    self._recover()
            self._failed = None
            self._note_lag(result)
            return result

    def _look(self) -> MirrorResult:
        if isinstance(self.source, Path):
            return mirror(self.source, self.path, self._files, self._tails)
        return self.source.mirror(self.path, self._files)

    def _apply_gained(self, result: MirrorResult) -> bool:
        """Apply the records the look appended to the segment the state was read up to;
        False (nothing applied) unless they are all of that look and continue the state's
        epoch: the copy is then read back instead."""
        gained = result.gained
        if not gained or self._reading is None or result.segments != [f"wal/{gained[0][0]}"]:
            return False
        sequence, name = self._reading
        decoded: list[tuple[CommitRecord, int]] = []
        epoch = self.state.epoch
        for seg, payload, size in gained:
            try:
                rec = decode_record(payload)
            except RecordSchemaError:
                return False  # read back, the reader names the damage
            if seg != name or rec.epoch != epoch + 1:
                return False
            epoch = rec.epoch
            decoded.append((rec, size))
        for rec, size in decoded:
            with self._view:
                self.state.begin_generation(sequence, limit=2, hold=2)
                self.state.apply_record(rec, size)
        return True

    def _apply(self) -> None:
        """Apply the records the copy holds after the state's epoch, one commit at a time."""
        records = read_records(self.path, self.state.epoch, files=self._files)
        try:
            for r in records:
                with self._view:
                    self.state.begin_generation(r.sequence, limit=2, hold=2)
                    self.state.apply_record(r.record, r.size)
                self._reading = (r.sequence, r.path.name)
        except CorruptionError:
            log.error(
                "event=standby_damage store=%s epoch=%d hint=%s",
                self.path,
                self.state.epoch,
                "the standby stays at this epoch until a snapshot past the damage arrives",
            )
            raise
        finally:
            records.close()

    def _recover_copy(self) -> tuple[LiveState, RecoveryReport]:
        """The copy recovered into a fresh state, its images in ``path/base``, nothing cut."""
        state = LiveState()
        try:
            report, _end = recover_store(
                self._files, self._layout, self.store_id, state,
                image_dir=self._layout.base, repair=False, settle=True,
            )  # fmt: skip
        except BaseException:
            state.base.close()
            raise
        return state, report

    def _recover(self) -> None:
        """Recover the copy again and install its state; the old one is closed after
        (its reads in flight end first: the base waits for them)."""
        state, report = self._recover_copy()
        self._reading = None
        with self._view:
            old, self.state, self.report = self.state, state, report
            self._install(state)
        old.base.close()
        log.info("event=standby_recovered store=%s epoch=%d", self.path, state.epoch)

    def _note_lag(self, result: MirrorResult) -> None:
        behind = max(0, result.source_epoch - self.state.epoch)
        if behind == 0:
            self._caught_up = time.monotonic()
        self._lag = Lag(behind, result.copied_bytes if behind else 0, 0.0)

    def stop(self) -> None:
        """Stop following (the thread ends after its look in progress). Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def close(self) -> None:
        """Stop following and unmap the state's base; the state must not be read after."""
        self.stop()
        metrics.unwatch_lag(self.path)
        self.state.base.close()
