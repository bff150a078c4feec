"""One fault-injecting file layer: crashes, pauses, I/O errors and power loss on demand.

:class:`FaultyFiles` is a :class:`statelog.storage.fileio.FileLayer`; a
store, recovery or the compactor takes it through ``file_layer=`` /
``files=`` and never knows. It is a testing kit: statelog's own tests and
its drill use it, and so can the authors of a reconciler who want to see
what their code does when the disk fills, the process dies mid-write or the
power goes off. Nothing on statelog's commit path imports it.

Every operation passes one or more *steps* of a kind (:data:`statelog.kit.spec.KINDS`);
faults (:mod:`statelog.kit.spec`) armed with :meth:`FaultyFiles.add` act on
chosen steps. ``create_durable`` fails as the real one does: a failed write
or sync leaves the ``.tmp`` file behind (the next open removes it), a failed
rename removes it.

**Power loss** (given ``root``): beside the real system calls the layer
keeps the model of :mod:`statelog.kit.power`; :meth:`FaultyFiles.crash`
applies it. While the layer is *dead* (power off, crashed in place, or cut
by a :class:`~statelog.kit.spec.PowerCut`) every operation fails with EIO
and changes nothing, so closing an abandoned store cannot write behind the
crash's back.
"""

from __future__ import annotations

import contextlib
import errno as errnos
import functools
import os
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from statelog.errors import StatelogError
from statelog.kit.power import CrashMode, DirOp, DiskModel
from statelog.kit.spec import Crash, Fail, Fault, Kind, Pause, PowerCut, Step, Then
from statelog.storage.fileio import AppendFile, Buffer, FileLayer, ReadBuffer

if TYPE_CHECKING:
    from statelog.store.store import StateStore

__all__ = ["CrashMode", "FaultyAppendFile", "FaultyFiles", "sigkill"]

_Data = TypeVar("_Data", bytes, memoryview)


def sigkill(step: Step) -> None:
    """Die as a killed process does: SIGKILL to ourselves, no cleanup, no flush."""
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class _Cut:
    """A write to make in part: ``size`` bytes, then ``finish()`` (which raises or dies)."""

    size: int
    finish: Callable[[], NoReturn]


class FaultyFiles(FileLayer):
    """A :class:`FileLayer` with a hook at every step, driven by armed :class:`Fault` specs.

    Thread-safe: one lock covers every operation and its bookkeeping, so a
    crash image taken while a group-commit flusher runs is consistent (a
    :class:`~statelog.kit.spec.Pause` waits holding it).
    """

    def __init__(
        self, root: Path | None = None, faults: Iterable[Fault] = (), *,
        real_sync: bool | None = None, die: Callable[[Step], None] = sigkill,
    ) -> None:  # fmt: skip
        """Hook every step; model power loss of the store at ``root`` if given.

        :param faults: armed at once (more with :meth:`add`).
        :param real_sync: also make the real fsync/fdatasync calls. Default:
            only without ``root``. With a power model the model, not the
            kernel, decides what a crash keeps, and skipping the calls
            keeps tests fast on a busy disk.
        :param die: how a :class:`Crash` kills the process (SIGKILL). A test
            may pass one that raises instead; if it returns, the layer
            raises :class:`SystemExit`.
        """
        self.root = root
        self.real_sync = root is None if real_sync is None else real_sync
        self.ops = 0  # steps passed so far (numbered from 1)
        self.trace: list[str] = []  # "kind name" of every step, for choosing cut points
        self._die = die
        self._mu = threading.RLock()
        self._faults: list[Fault] = []
        self._after: list[Fault] = []
        self._dead = False
        self._disk = DiskModel(root) if root is not None else None
        self.add(*faults)

    def add(self, *faults: Fault) -> None:
        """Arm ``faults``; each counts matching steps from the next one on."""
        with self._mu:
            self._faults.extend(faults)

    def fail(
        self, kind: Kind, *, errno: int = errnos.ENOSPC, after: int = 0,
        times: int | None = 1, partial: int = 0, match: str | None = None,
    ) -> None:  # fmt: skip
        """Fail steps of ``kind`` with ``errno`` (shorthand for adding a :class:`Fail`).

        :param after: let this many matching steps succeed first.
        :param times: fail this many steps, or every one until :meth:`free_space`.
        :param partial: for ``write``: append this many bytes before failing.
        :param match: only steps whose file name ends with this string.
        """
        self.add(Fail(kind, after + 1, match, errno=errno, times=times, partial=partial))

    def free_space(self) -> None:
        """Drop every armed failure: the disk has room (or the device works) again."""
        with self._mu:
            self._faults = [f for f in self._faults if not isinstance(f, Fail)]

    def cut_power(self, *, at: int) -> None:
        """Let the power go off just before step number ``at`` (see :attr:`ops`)."""
        self.add(PowerCut(None, max(1, at - self.ops)))

    def power_off(self) -> None:
        """The power goes off now: every later operation fails with EIO and does nothing."""
        with self._mu:
            self._dead = True

    @property
    def dead(self) -> bool:
        """True once the power is off."""
        return self._dead

    def abandon(self, store: StateStore) -> None:
        """Power off, then let ``store`` release its lock, threads and descriptors.

        With the power off ``close()`` cannot change the disk (its seal fails
        with EIO); it only frees what the process held, as death would.
        """
        self.power_off()
        with contextlib.suppress(StatelogError, OSError):
            store.close()

    def crash(self, mode: CrashMode = "drop", *, into: Path | None = None, seed: int = 0) -> None:
        """Rewrite the files as a disk would hold them after a power loss now.

        Without ``into``: in place; the layer is dead afterwards, so abandon
        the store first (:meth:`abandon`). With ``into``: copy ``root`` to
        ``into`` (which must not exist) and crash the copy; the run goes on.

        :raises ValueError: the layer was made without ``root`` (no power model).
        """
        if self._disk is None:
            raise ValueError("crash() needs the power model: make the layer with root=")
        with self._mu:
            if into is None:
                self._dead = True
            self._disk.crash(mode, into, seed)

    def _point(self, kind: Kind, path: Path, chunks: Sequence[Buffer] = ()) -> _Cut | None:
        """Pass one step: act on the faults it hits; a partial write is returned, not made."""
        self._after = []  # waited for a step that failed: that step was never done
        if not self._dead:
            self.ops += 1
            self.trace.append(f"{kind} {path.name}")
        if self._dead:
            raise OSError(errnos.EIO, "power is off (simulated)", str(path))
        step = Step(kind, path, self.ops, chunks)
        for fault in list(self._faults):
            if not fault.hit(step):
                continue
            if isinstance(fault, PowerCut):
                self._dead = True
                raise OSError(errnos.EIO, "power is off (simulated)", str(path))
            if isinstance(fault, Pause):
                fault.wait(step)
            elif isinstance(fault, Then) or (isinstance(fault, Crash) and fault.after):
                self._after.append(fault)
            elif isinstance(fault, Crash):
                if fault.frac is None or kind != "write":
                    self._kill(step)
                size = sum(len(c) for c in chunks)
                keep = max(0, min(size - 1, int(size * fault.frac)))
                return _Cut(keep, lambda: self._kill(step))
            elif isinstance(fault, Fail):
                code = fault.errno
                if kind == "write" and fault.partial:
                    return _Cut(fault.partial, functools.partial(_raise, code, path))
                _raise(code, path)
        return None

    def _done(self, kind: Kind, path: Path) -> None:
        """The step just passed is done: run what waited for it (crash after, arm more)."""
        after, self._after = self._after, []
        for fault in after:
            if isinstance(fault, Then):
                self.add(*fault.faults)
            else:
                self._kill(Step(kind, path, self.ops))

    def _kill(self, step: Step) -> NoReturn:
        self._die(step)
        raise SystemExit(f"statelog.kit: died at {step.label}")

    def _fsync(self, fd: int) -> None:
        if self.real_sync:
            os.fsync(fd)

    def _track(self, fd: int, path: Path, synced: int | None = None) -> int:
        if self._disk is None:
            return 0
        return self._disk.track(fd, path, synced)

    def _synced(self, ino: int, size: int) -> None:
        if self._disk is not None:
            self._disk.synced(ino, size)

    def _cut(self, ino: int, size: int) -> None:
        if self._disk is not None:
            self._disk.cut(ino, size)

    def _journal_op(self, op: DirOp) -> None:
        if self._disk is not None:
            self._disk.journal.append(op)

    # -- the FileLayer interface ------------------------------------------
    def open_append(self, path: Path) -> AppendFile:
        with self._mu:
            self._point("open", path)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            ino = self._track(fd, path)
            f = FaultyAppendFile(self, ino, path, fd, os.fstat(fd).st_size)
            self._done("open", path)
            return f

    def create_durable(self, path: Path, data: Buffer) -> None:
        """The same durable steps as the real layer, each its own hooked step."""
        with self._mu:
            tmp = path.with_name(path.name + ".tmp")
            existed = tmp.exists()
            self._point("create", tmp)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            if not existed:
                self._journal_op(DirOp("create", tmp))
            self._done("create", tmp)
            try:
                ino = self._track(fd, tmp, synced=0)
                view = memoryview(data)
                cut = self._point("write", tmp, (view,))
                if cut is not None:
                    os.write(fd, view[: cut.size])
                    cut.finish()
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                self._done("write", tmp)
                self._point("sync", tmp)
                self._fsync(fd)
                self._synced(ino, len(data))
                self._done("sync", tmp)
            finally:
                os.close(fd)
            try:
                self.rename(tmp, path)
            except OSError:
                self.remove(tmp)
                raise
            self.fsync_dir(path.parent)

    def read(self, path: Path) -> bytes:
        return self._read(path, super().read)

    def read_reusing(self, path: Path, reads: ReadBuffer) -> memoryview:
        return self._read(path, functools.partial(super().read_reusing, reads=reads))

    def _read(self, path: Path, read: Callable[[Path], _Data]) -> _Data:
        with self._mu:
            self._point("read", path)
            data = read(path)
            self._done("read", path)
            return data

    def truncate(self, path: Path, size: int) -> None:
        with self._mu:
            self._point("truncate", path)
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                ino = self._track(fd, path)
                os.ftruncate(fd, size)
                self._cut(ino, size)
                self._done("truncate", path)
                self._point("sync", path)
                self._fsync(fd)
                self._synced(ino, size)
                self._done("sync", path)
            finally:
                os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        assert src.parent == dst.parent, "statelog renames within one directory"
        with self._mu:
            self._point("rename", dst)
            disk = self._disk
            saved = None
            if disk is not None:
                saved = disk.durable_content(dst)
                fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    disk.track(fd, src)
                finally:
                    os.close(fd)
                disk.forget(dst)
            os.rename(src, dst)
            if disk is not None:
                disk.renamed(src, dst, saved)
            self._done("rename", dst)

    def remove(self, path: Path) -> None:
        with self._mu:
            self._point("remove", path)
            if path.exists():
                disk = self._disk
                saved = None
                if disk is not None:
                    saved = disk.durable_content(path)
                    disk.forget(path)
                os.unlink(path)
                self._journal_op(DirOp("remove", path, saved=saved))
            self._done("remove", path)

    def fsync_dir(self, path: Path) -> None:
        with self._mu:
            self._point("fsync_dir", path)
            if self.real_sync:
                super().fsync_dir(path)
            if self._disk is not None:
                self._disk.dir_synced(path)
            self._done("fsync_dir", path)

    def makedirs(self, path: Path) -> None:
        with self._mu:
            missing: list[Path] = []
            p = path
            while not p.exists():
                missing.append(p)
                p = p.parent
            for d in reversed(missing):
                self._point("mkdir", d)
                os.mkdir(d)
                self._journal_op(DirOp("mkdir", d))
                self._done("mkdir", d)
                self.fsync_dir(d.parent)


class FaultyAppendFile(AppendFile):
    """An open segment whose writes, syncs and truncations pass the layer's hooks."""

    def __init__(self, layer: FaultyFiles, ino: int, path: Path, fd: int, size: int) -> None:
        super().__init__(path, fd, size)
        self._layer = layer
        self._ino = ino

    def write(self, chunks: Sequence[Buffer]) -> None:
        with self._layer._mu:
            cut = self._layer._point("write", self.path, chunks)
            if cut is not None:
                os.write(self._fd, b"".join(bytes(c) for c in chunks)[: cut.size])
                cut.finish()
            super().write(chunks)
            self._layer._done("write", self.path)

    def sync(self) -> None:
        # fdatasync persists what was written before it began, through any
        # descriptor of the inode (group commit syncs a dup()).
        with self._layer._mu:
            self._layer._point("sync", self.path)
            size = os.fstat(self._fd).st_size
            if self._layer.real_sync:
                super().sync()
            self._layer._synced(self._ino, size)
            self._layer._done("sync", self.path)

    def truncate(self, size: int) -> None:
        with self._layer._mu:
            self._layer._point("truncate", self.path)
            super().truncate(size)
            self._layer._cut(self._ino, size)
            self._layer._done("truncate", self.path)

    def dup(self) -> AppendFile:
        return FaultyAppendFile(self._layer, self._ino, self.path, os.dup(self._fd), self.size)


def _raise(code: int, path: Path) -> NoReturn:
    raise OSError(code, os.strerror(code), str(path))
