"""A store's standby role: opening as a standby, its lag, and promotion to writer.

:class:`StandbyRole` is the part of :class:`~statelog.store.store.StateStore`
that ``statelog.open(path, follow=SOURCE)`` uses. The standby
(:class:`~statelog.replica.standby.Standby`) keeps ``path`` a copy of
``SOURCE`` and the store's state current; the store holds ``path``'s writer
lock all the while, so no writer and no second standby opens the copy.

Promotion (:meth:`StandbyRole.promote`), in order, holding the commit lock so
that no commit can start half-way:

1. stop following, then claim the source (:func:`_claim`). A directory: one
   last look (what the source published since the last look is copied and
   applied; a source that cannot be read refuses the promotion unless it is
   forced, since nothing can then tell a dead writer from an unreachable
   one); a refusal, changing nothing but that catch-up, while the source's
   writer still holds the source's ``LOCK`` (on one host, or where the shared
   file system carries ``flock``); then ``PROMOTED`` created in the source,
   exclusively (:mod:`statelog.replica.promoted`). A remote: the next writer
   generation taken in the MANIFEST by a conditional write, from the one the
   standby last saw, then the last look and the copy's ``remote.json``
   (:func:`statelog.replica.remote_mirror.claim_copy`). Either way, of two
   promotions at once exactly one claims the source; the other raises
   :class:`~statelog.errors.PromotionLostError` and goes on following. Then
   the copy's ``STANDBY`` mark is removed (:mod:`statelog.storage.marks`;
   written when the copy was first followed, it refuses every writer's open
   of a copy that was not promoted);
2. release the copy's state and lock, and open ``path`` as a writer (with
   ``remote=`` the URL for a remote source): the usual open sequence
   (:mod:`statelog.store.writer_open`), whose recovery seals the copied
   prefix of the source's live segment and continues after it;
3. install the writer's state and return the epoch, offsets and watermark a
   reconciler resumes from.

A promotion that fails in step 2 leaves the store closed, ``path`` a store a
writer can open, and the source claimed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from statelog.errors import (
    CorruptionError,
    InvalidOptionError,
    PromotionRefusedError,
    StatelogError,
    StorageError,
    StoreClosedError,
    StoreLockedError,
    StorePromotedError,
)
from statelog.recovery.report import RecoveryReport
from statelog.replica.promoted import check_unclaimed, claim_source, read_promoted
from statelog.replica.standby import Lag, Standby
from statelog.state.live import LiveState
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import REMOTE_RECORD, StoreLayout
from statelog.storage.lock import LOCK_NAME, StoreLock
from statelog.storage.marks import clear_standby, mark_standby, standby_source
from statelog.store.options import StoreOptions
from statelog.store.writer import StoreWriter
from statelog.store.writer_open import open_writer

if TYPE_CHECKING:
    from statelog.replica.remote_mirror import RemoteSource

__all__ = ["Promotion", "StandbyRole"]

log = logging.getLogger("statelog.store.standby_role")


@dataclass(frozen=True, slots=True)
class Promotion:
    """Where the promoted writer stands: what a reconciler resumes from."""

    epoch: int
    offsets: dict[str, int]
    low_watermark_ms: int


class StandbyRole:
    """Standby attributes and methods of a store; the store sets the attributes."""

    path: Path
    readonly: bool
    recovery: RecoveryReport
    _options: StoreOptions
    _state: LiveState
    _view: threading.Lock
    _lock: threading.Lock
    _writer: StoreWriter | None
    _closed: bool
    _standby: Standby | None
    _standby_lock: StoreLock | None
    generation: int

    def _open_standby(self, opts: StoreOptions, files: FileLayer) -> Standby:
        """Take ``path``'s writer lock and start following ``opts.follow`` into it."""
        assert opts.follow is not None
        source: Path | RemoteSource
        if isinstance(opts.follow, str) and "://" in opts.follow:
            # Not at import: the remote tier (obstore) adds about 45 ms to `import statelog`.
            from statelog.replica.remote_mirror import RemoteSource

            source = RemoteSource(opts.follow)
        else:
            source = Path(opts.follow)
            if source.resolve() == self.path.resolve():
                raise InvalidOptionError(
                    f"follow={source}: a store cannot follow itself",
                    hint="give the standby a directory of its own",
                )
            check_unclaimed(source, self.path)
        _check_not_claimed_copy(self.path)
        if read_promoted(self.path) is not None:
            raise StorePromotedError(
                f"{self.path} holds PROMOTED: a standby of it was promoted, so it cannot "
                "be a standby's copy (its own promotion could never claim it)",
                hint="give the standby an empty directory, or move this one aside",
            )
        layout = StoreLayout(self.path)
        layout.check_can_host()
        files.makedirs(self.path)
        self._standby_lock = StoreLock(self.path)
        try:
            # A fresh copy is marked before its first byte, an existing one once it
            # proved to be this source's copy: never a directory the look refuses.
            fresh = not layout.identity.exists()
            named = _source_name(opts.follow)
            if fresh:
                mark_standby(self.path, named, files)
            standby = Standby(
                self.path, source, view=self._view, install=self._install_state,
                poll=opts.follow_poll.total_seconds(), files=files,
            )  # fmt: skip
        except BaseException:
            self._standby_lock.release()
            raise
        if not fresh and standby_source(self.path) != named:
            mark_standby(self.path, named, files)
        return standby

    def _install_state(self, state: LiveState) -> None:
        """Called by the standby, under the view lock, with each state it recovers."""
        self._state = state

    @property
    def standby(self) -> bool:
        """Whether this store is a standby (opened with ``follow=``, not promoted)."""
        return self._standby is not None

    @property
    def lag(self) -> Lag | None:
        """How far this standby is behind its source (None: not a standby)."""
        return None if self._standby is None else self._standby.lag

    def catch_up(self) -> Lag:
        """Look at the source now and apply what it published; the lag after that look.

        :raises InvalidOptionError: this store is not a standby.
        :raises StatelogError: the look failed (the state is unchanged).
        """
        standby = self._standby
        if standby is None:
            raise InvalidOptionError(
                f"store {self.path} is not a standby", hint="open it with follow=SOURCE"
            )
        standby.step()
        return standby.lag

    def promote(self, *, force: bool = False) -> Promotion:
        """Turn this standby into the writer of its copy (steps in the module docstring).

        :param force: promote even when the source cannot be read one last time (its
            host is gone): the copy's state is promoted as its last look left it. Only
            when the source's writer is certainly dead: nothing can check it then.
        :returns: the epoch, offsets and watermark the reconciler resumes from.
        :raises InvalidOptionError: this store is not a standby.
        :raises StoreClosedError: the store is closed.
        :raises StoreLockedError: the source's writer still holds its lock; the standby
            goes on following, nothing was changed.
        :raises PromotionRefusedError: the source could not be read and ``force`` is
            False; the standby goes on following, nothing was changed.
        :raises StatelogError: the writer's open failed (the store is left closed).
        """
        with self._lock:
            if self._closed:
                raise StoreClosedError(f"store {self.path} is closed")
            standby = self._standby
            if standby is None:
                raise InvalidOptionError(
                    f"store {self.path} is not a standby", hint="open it with follow=SOURCE"
                )
            standby.stop()
            try:
                remote = _claim(standby, force=force)
            except StatelogError:
                standby.start()
                raise
            try:
                clear_standby(self.path, self._options.file_layer)
            except OSError as exc:
                self._closed = True
                self._standby = None
                standby.close()
                if self._standby_lock is not None:
                    self._standby_lock.release()
                    self._standby_lock = None
                raise StorageError(
                    f"promoting {self.path}: its STANDBY mark could not be removed: {exc}",
                    errno=exc.errno,
                    hint="the source is claimed for this copy already; fix the copy's "
                    "directory (permissions, the device), then open it as a writer: its "
                    "open removes STANDBY and finishes the promotion",
                ) from exc
            return self._become_writer(standby, remote)

    def _become_writer(self, standby: Standby, remote: str | None) -> Promotion:
        """Open the copy as a writer, then install its state; readers keep reading the
        standby's (stopped) state until then, and it is unmapped only after."""
        opts = dataclasses.replace(self._options, follow=None, readonly=False, remote=remote)
        files = opts.file_layer or FileLayer()
        if self._standby_lock is not None:
            self._standby_lock.release()
            self._standby_lock = None
        state = LiveState()
        try:
            opened = open_writer(StoreLayout(self.path), files, state, self._view, self._lock, opts)
        except BaseException:
            self._closed = True
            self._standby = None
            standby.close()
            raise
        with self._view:
            self._state = state
            self._writer = opened.writer
            self._standby = None
            self._options, self.readonly, self.recovery = opts, False, opened.recovery
            self.generation = opened.generation
            promoted = Promotion(state.epoch, dict(state.offsets), state.low_watermark_ms)
        standby.close()
        return promoted


def _claim(standby: Standby, *, force: bool) -> str | None:
    """Steps 1 and 2: catch up with the source and claim it; the remote URL the promoted
    writer ships to (None: a directory source).

    :raises StoreLockedError: the source's writer holds its lock.
    :raises PromotionLostError: another promotion claimed the source first.
    :raises PromotionRefusedError: the source cannot be read (and not ``force``).
    """
    source = standby.source
    if not isinstance(source, Path):
        from statelog.replica.remote_mirror import claim_copy  # not at import: as above

        try:
            claim_copy(source, standby.path, standby.step, lambda: standby.state.epoch)
        except PromotionRefusedError:
            raise
        except (StatelogError, OSError) as exc:
            raise PromotionRefusedError(
                f"the remote {source} of standby {standby.path} could not be claimed: {exc}",
                hint="promote again once the remote answers (force cannot help: the "
                "writer generation lives there); if it was claimed already, the old writer "
                "is fenced and the next promotion takes the generation after it",
            ) from exc
        return source.url
    try:
        standby.step()
        _check_source_free(source)
        claim_source(source, standby.path, standby.state.epoch)
    except (StoreLockedError, PromotionRefusedError):
        raise
    except (StatelogError, OSError) as exc:
        if not force:
            raise PromotionRefusedError(
                f"the source {source} of standby {standby.path} could not be read and "
                f"claimed one last time: {exc}"
            ) from exc
        log.warning(
            "event=promote_forced store=%s source=%s epoch=%d error=%s",
            standby.path, source, standby.state.epoch, exc,
        )  # fmt: skip
    return None


def _check_source_free(source: Path) -> None:
    """:raises StoreLockedError: a writer holds ``source``'s lock (it is not dead)."""
    try:
        fd = os.open(source / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = None
        with contextlib.suppress(ValueError, OSError):
            pid = int(os.pread(fd, 32, 0).decode().strip() or "x")
        raise StoreLockedError(
            source,
            pid,
            hint="the source's writer still runs: stop it (or its host) before promoting "
            "its standby, so that two writers never continue the same log",
        ) from None
    finally:
        os.close(fd)


def _check_not_claimed_copy(copy: Path) -> None:
    """:raises StorePromotedError: ``copy`` holds a remote writer generation (promoted)."""
    if not (copy / REMOTE_RECORD).exists():
        return
    from statelog.remote.record import load_record  # not at import: as above

    try:
        rec = load_record(copy)
    except (CorruptionError, OSError):
        return  # not a promoted copy's record: the standby's look judges the copy
    if rec is not None and rec.generation:
        raise StorePromotedError(
            f"{copy} holds writer generation {rec.generation} of {rec.url}: it was promoted "
            "(or is a writer's store)",
            hint=f"open it as a writer with remote={rec.url!r}, or give the standby an empty "
            "directory",
        )


def _source_name(follow: object) -> str:
    """How the copy's ``STANDBY`` names its source: a URL as given, a directory as its
    absolute real path (so a promotion from any working directory finds it)."""
    text = str(follow)
    return text if "://" in text else os.path.realpath(text)
