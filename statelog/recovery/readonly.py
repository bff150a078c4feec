"""Read-only recovery: the last durable state of a store, without changing a byte of it.

What a read-only open sees, for the read-only store and for every tool that
must know what an open would reach (``verify``, a restore's final check):
the identity is read, then :func:`~statelog.recovery.ladder.recover_store`
runs with ``repair=False``. Nothing is moved aside, cut or created in the
store; the chosen snapshot's image is extracted to a private temporary
directory, removed again by :meth:`ReadOnlyRecovery.close`. An unfinished
tail is ignored (``report.truncated_bytes`` counts it), not cut. The one
exception is a caller that passes its own ``image_dir`` (a restore's check
of its staging copy, which nothing else reads): images are then extracted
into it, and other images there removed, as for a writer's ``base/``.

No lock is taken: a writer may keep appending meanwhile, and what is
recovered is the log as it was when each file was read.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
import weakref
from pathlib import Path

from statelog.errors import StorageError
from statelog.recovery.intent import checked_rewind
from statelog.recovery.ladder import recover_store
from statelog.recovery.report import RecoveryReport
from statelog.state.live import LiveState
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout

__all__ = ["ReadOnlyRecovery", "recover_readonly"]


class ReadOnlyRecovery:
    """A store recovered read-only: its state, the report, and the image it maps.

    Use as a context manager, or call :meth:`close` to unmap the base level
    and remove the private image directory (a caller's own directory stays).
    ``state`` must not be read after.
    """

    __slots__ = (
        "__weakref__", "_image_dir", "_remove", "report", "root", "state", "store_id", "upto",
    )  # fmt: skip

    def __init__(
        self,
        root: Path,
        store_id: uuid.UUID,
        state: LiveState,
        report: RecoveryReport,
        image_dir: Path,
        upto: int | None = None,
        *,
        owned: bool = True,
    ) -> None:
        self.root = root
        self.upto = upto
        """The epoch the recovery was held to (a view of the past, or a pending rewind's);
        None: the newest."""
        self.store_id = store_id
        self.state = state
        """The recovered state: every commit of the verified log, nothing more."""
        self.report = report
        self._image_dir: Path | None = image_dir
        # A store never closed still leaves no directory behind: removed when it is
        # collected, or at the latest when the interpreter exits.
        self._remove = (
            weakref.finalize(self, shutil.rmtree, image_dir, ignore_errors=True)
            if owned
            else None  # the caller's directory stays
        )

    @property
    def image_dir(self) -> Path | None:
        """The directory of the mapped snapshot images (private unless the caller's);
        None once closed."""
        return self._image_dir

    @property
    def closed(self) -> bool:
        return self._image_dir is None

    def close(self) -> None:
        """Unmap the base level and remove the private image directory (not a caller's
        own). Idempotent."""
        if self._image_dir is None:
            return
        self.state.base.close()
        if self._remove is not None:
            self._remove()
        self._image_dir = None

    def __enter__(self) -> ReadOnlyRecovery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ReadOnlyRecovery {self.root} epoch={self.report.epoch}>"


def recover_readonly(
    root: Path,
    *,
    files: FileLayer | None = None,
    strict: bool = False,
    upto: int | None = None,
    image_dir: Path | None = None,
    values_checked: bool = False,
    state: LiveState | None = None,
) -> ReadOnlyRecovery:
    """Recover the store at ``root`` read-only (see the module docstring).

    Steps: read ``IDENTITY``; make a private temporary directory; recover
    into a fresh :class:`LiveState`, extracting a snapshot's image there.
    A failure closes the base and removes the directory before it raises.

    ``image_dir``: instead of a temporary directory, one the caller owns and
    no other process writes (a restore's staging ``base/``): its stamped
    images are mapped in place, not copied; a missing one is extracted there;
    other images there are removed; the directory stays after :meth:`close`.

    :param files: the file operations to go through (default: the real ones).
    :param strict: raise :class:`CorruptionError` on damage before the log's
        tail instead of recovering to the last good commit.
    :param upto: recover the state as of this epoch, not the newest (the state
        may end before it: see :func:`~statelog.recovery.timeline.recover_at`).
    :param values_checked: every value of the log was decoded before (a restore's
        check of each segment it wrote): the replay does not decode them again.
    :param state: the empty state to recover into (default a new :class:`LiveState`;
        :class:`~statelog.state.live.EpochsOnly` to learn only where the log ends).
    :raises StoreNotFoundError: ``root`` holds no store.
    :raises NotAStoreError: ``root`` is a file.
    :raises CorruptionError: the identity is unreadable, or ``strict`` and
        the log is damaged.
    :raises ResnapshotRequired: no usable snapshot and the log does not reach epoch 1.
    :raises FormatVersionError: files of a newer format.
    :raises StorageError: an I/O error while reading.
    """
    files = files or FileLayer()
    layout = StoreLayout(Path(root))
    store_id = layout.read_identity(files)
    pending = checked_rewind(layout.root, files)
    if pending is not None:
        # A rewind whose intent is durable (and matches the log): the store is the
        # rewound one, even before a writer's open finishes moving its files.
        epoch = int(pending["epoch"])
        upto = epoch if upto is None else min(upto, epoch)
    owned = image_dir is None
    try:
        if image_dir is None:
            image_dir = Path(tempfile.mkdtemp(prefix="statelog-ro-"))
    except OSError as exc:
        raise StorageError(
            f"creating a temporary directory for {root} failed: {exc}",
            errno=exc.errno,
            hint="set TMPDIR to a writable directory; the store was not changed",
        ) from exc
    state = LiveState() if state is None else state
    try:
        report, _ = recover_store(
            files, layout, store_id, state, image_dir=image_dir, repair=False, strict=strict,
            upto=upto, values_checked=values_checked,
        )  # fmt: skip
    except BaseException:
        state.base.close()
        if owned:
            shutil.rmtree(image_dir, ignore_errors=True)
        raise
    return ReadOnlyRecovery(layout.root, store_id, state, report, image_dir, upto, owned=owned)
