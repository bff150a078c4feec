"""A fault-injecting file layer: power loss and I/O errors on demand.

:class:`FaultyFiles` is a :class:`statelog.storage.fileio.FileLayer` that makes the
real system calls (fsyncs only on request: the model, not the kernel,
decides what survives) and, beside them, keeps a small model of what a disk
would still hold after the power went off. It does two things.

**Power loss** (:meth:`FaultyFiles.crash`). The rules, each a real disk's:

* File data reaches the medium only through ``fsync``/``fdatasync``. The
  layer records, per file (per inode, so renames and ``dup()`` handles
  share it), the file size when the last successful sync *began*; bytes
  appended after that are volatile. A crash drops them (``"drop"``), or
  keeps the new size with zeros where the data should be (``"zeros"``: the
  size reached the disk before the data did, as with ext4 writeback), or
  keeps a random prefix of them (``"prefix"``: write-back got part way).
* A directory entry (create, rename, unlink, mkdir) reaches the medium only
  through an ``fsync`` of *that* directory: fsyncing a file does not persist
  its name. The layer journals every entry change per directory and forgets
  the journal of a directory when it is fsynced. A crash undoes the journal
  newest first: new files and directories vanish, renames go back,
  unlinked files come back with their durable content.
* A file truncation is taken as durable at once (the synced size drops
  with it). statelog only cuts back bytes that were never synced, or
  fsyncs the cut, so this does not hide a bug.
* Files the layer never saw (the ``LOCK`` file, files present before the
  layer was created) are assumed durable as they are.

``crash()`` rewrites the real files in place and leaves the layer dead.
``crash(into=dir)`` writes the durable image of the store into ``dir``
instead and lets the run go on: one run can then be "crashed" after every
commit. While the layer is *dead* (after :meth:`power_off`, a crash or a
power cut armed with :meth:`cut_power`) every operation fails with EIO and
changes nothing, so closing an abandoned store cannot write behind the
crash's back.

**Errors** (:meth:`FaultyFiles.fail`). Every operation passes one or more
*fault points* of a kind: ``open``, ``create`` (the ``O_CREAT`` of a new
file), ``write``, ``sync`` (file fsync/fdatasync), ``fsync_dir``,
``truncate``, ``rename``, ``remove``, ``mkdir``, ``read``. A rule fails the
chosen points of a kind with an :class:`OSError` carrying a real errno
(ENOSPC, EIO), optionally after writing a prefix of the bytes (a short
write, as a filling disk gives). :meth:`free_space` drops every rule: the
disk has room again. ``create_durable`` fails as the real one does: a
failed write or sync leaves the ``.tmp`` file behind (the next open removes
it), a failed rename removes it.
"""

from __future__ import annotations

import contextlib
import errno as errnos
import os
import random
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import statelog
from statelog.storage.fileio import AppendFile, Buffer, FileLayer

__all__ = [
    "CrashMode",
    "FaultyAppendFile",
    "FaultyFiles",
    "Kind",
    "commit_with_model",
    "model_of",
]

Kind = Literal[
    "open", "create", "write", "sync", "fsync_dir", "truncate", "rename", "remove", "mkdir", "read"
]
CrashMode = Literal["drop", "zeros", "prefix"]


@dataclass
class _Rule:
    """Fail points of ``kind``: skip ``after`` of them, then fail ``times`` (None: until freed)."""

    kind: Kind
    errno: int
    after: int
    times: int | None
    partial: int
    match: str | None

    def fires(self, kind: Kind, path: Path) -> bool:
        if kind != self.kind or (self.match is not None and not path.name.endswith(self.match)):
            return False
        if self.after > 0:
            self.after -= 1
            return False
        if self.times is None:
            return True
        if self.times > 0:
            self.times -= 1
            return True
        return False


@dataclass
class _Tracked:
    """What the disk holds of one inode: its current name and its synced size."""

    path: Path
    synced: int


@dataclass(frozen=True)
class _DirOp:
    """One directory-entry change not yet made durable by an fsync of ``path.parent``."""

    kind: Literal["create", "mkdir", "rename", "remove"]
    path: Path  # the entry created, removed, or the rename's destination
    src: Path | None = None  # the rename's source (same directory)
    saved: bytes | None = None  # durable content of a file the op removed or replaced


class FaultyFiles(FileLayer):
    """A :class:`FileLayer` that injects errors and can simulate a power loss of ``root``.

    Thread-safe: one lock covers every operation and its bookkeeping, so a
    crash image taken while a group-commit flusher runs is consistent.
    """

    def __init__(self, root: Path, *, real_sync: bool = False) -> None:
        """Model power loss of the store at ``root``.

        :param real_sync: also make the real fsync/fdatasync calls. Off by
            default: the model, not the kernel, decides what a crash keeps,
            and skipping the calls keeps the tests fast on a busy disk.
        """
        self.root = root
        self.real_sync = real_sync
        self.ops = 0  # fault points passed so far (numbered from 1)
        self.trace: list[str] = []  # "kind name" of every point, for choosing cut points
        self._mu = threading.RLock()
        self._rules: list[_Rule] = []
        self._cut_at: int | None = None
        self._dead = False
        self._files: dict[int, _Tracked] = {}
        self._journal: list[_DirOp] = []

    # -- controls ----------------------------------------------------------
    def fail(
        self,
        kind: Kind,
        *,
        errno: int = errnos.ENOSPC,
        after: int = 0,
        times: int | None = 1,
        partial: int = 0,
        match: str | None = None,
    ) -> None:
        """Fail points of ``kind`` with ``errno``.

        :param after: let this many matching points succeed first.
        :param times: fail this many points, or every one until :meth:`free_space`.
        :param partial: for ``write``: append this many bytes before failing
            (a short write then the error, as a disk that just filled up gives).
        :param match: only points whose file name ends with this string.
        """
        with self._mu:
            self._rules.append(_Rule(kind, errno, after, times, partial, match))

    def free_space(self) -> None:
        """Drop every armed failure: the disk has room (or the device works) again."""
        with self._mu:
            self._rules.clear()

    def cut_power(self, *, at: int) -> None:
        """Let the power go off just before fault point number ``at`` (see :attr:`ops`)."""
        with self._mu:
            self._cut_at = at

    def power_off(self) -> None:
        """The power goes off now: every later operation fails with EIO and does nothing."""
        with self._mu:
            self._dead = True

    @property
    def dead(self) -> bool:
        return self._dead

    def abandon(self, store: statelog.StateStore) -> None:
        """Power off, then let ``store`` release its lock, threads and descriptors.

        With the power off ``close()`` cannot change the disk (its seal fails
        with EIO); it only frees what the process held, as death would.
        """
        self.power_off()
        with contextlib.suppress(statelog.StorageError, OSError):
            store.close()

    # -- the crash ---------------------------------------------------------
    def crash(self, mode: CrashMode = "drop", *, into: Path | None = None, seed: int = 0) -> None:
        """Rewrite the files as a disk would hold them after a power loss now.

        Without ``into``: in place; the layer is dead afterwards, so abandon
        the store first (:meth:`abandon`). With ``into``: copy ``root`` to
        ``into`` (which must not exist) and crash the copy; the run goes on.
        """
        rng = random.Random(seed)
        with self._mu:
            root = self.root
            if into is None:
                self._dead = True

                def where(p: Path) -> Path | None:
                    return p

            else:
                if root.exists():
                    shutil.copytree(root, into)

                def where(p: Path) -> Path | None:
                    return into / p.relative_to(root) if p.is_relative_to(root) else None

            for t in self._files.values():
                target = where(t.path)
                if target is not None and target.is_file():
                    _lose_unsynced(target, t.synced, mode, rng)
            for op in reversed(self._journal):
                _undo(op, where)

    # -- bookkeeping -------------------------------------------------------
    def _point(self, kind: Kind, path: Path) -> _Rule | None:
        """Pass one fault point: die, fail by a rule (returned for writes), or go on."""
        if not self._dead:
            self.ops += 1
            self.trace.append(f"{kind} {path.name}")
            self._dead = self._cut_at is not None and self.ops >= self._cut_at
        if self._dead:
            raise OSError(errnos.EIO, "power is off (simulated)", str(path))
        for rule in self._rules:
            if rule.fires(kind, path):
                if kind == "write" and rule.partial:
                    return rule
                raise _error(rule.errno, path)
        return None

    def _track(self, fd: int, path: Path, synced: int | None = None) -> int:
        """Register the inode behind ``fd``; an unknown one is assumed durable as it is."""
        st = os.fstat(fd)
        t = self._files.get(st.st_ino)
        if t is None:
            t = self._files[st.st_ino] = _Tracked(path, st.st_size if synced is None else synced)
        elif synced is not None:
            t.synced = synced
        t.path = path
        return st.st_ino

    def _fsync(self, fd: int) -> None:
        if self.real_sync:
            os.fsync(fd)

    def _synced(self, ino: int, size: int) -> None:
        t = self._files.get(ino)
        if t is not None:
            t.synced = size

    def _cut(self, ino: int, size: int) -> None:
        t = self._files.get(ino)
        if t is not None:
            t.synced = min(t.synced, size)

    def _durable_content(self, path: Path) -> bytes:
        """What the disk holds of an existing file right now (its synced prefix)."""
        data = path.read_bytes()
        t = self._files.get(path.stat().st_ino)
        return data if t is None else data[: t.synced]

    def _forget(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._files.pop(path.stat().st_ino, None)

    # -- the FileLayer interface ------------------------------------------
    def open_append(self, path: Path) -> AppendFile:
        with self._mu:
            self._point("open", path)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            ino = self._track(fd, path)
            return FaultyAppendFile(self, ino, path, fd, os.fstat(fd).st_size)

    def create_durable(self, path: Path, data: Buffer) -> None:
        """The same durable steps as the real layer, each its own fault point."""
        with self._mu:
            tmp = path.with_name(path.name + ".tmp")
            existed = tmp.exists()
            self._point("create", tmp)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            if not existed:
                self._journal.append(_DirOp("create", tmp))
            try:
                ino = self._track(fd, tmp, synced=0)
                view = memoryview(data)
                rule = self._point("write", tmp)
                if rule is not None:
                    os.write(fd, view[: rule.partial])
                    raise _error(rule.errno, tmp)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                self._point("sync", tmp)
                self._fsync(fd)
                self._synced(ino, len(data))
            finally:
                os.close(fd)
            try:
                self.rename(tmp, path)
            except OSError:
                self.remove(tmp)
                raise
            self.fsync_dir(path.parent)

    def read(self, path: Path) -> bytes:
        with self._mu:
            self._point("read", path)
            return super().read(path)

    def truncate(self, path: Path, size: int) -> None:
        with self._mu:
            self._point("truncate", path)
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                ino = self._track(fd, path)
                os.ftruncate(fd, size)
                self._cut(ino, size)
                self._point("sync", path)
                self._fsync(fd)
                self._synced(ino, size)
            finally:
                os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        assert src.parent == dst.parent, "statelog renames within one directory"
        with self._mu:
            self._point("rename", dst)
            saved = self._durable_content(dst) if dst.is_file() else None
            fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
            try:
                self._track(fd, src)
            finally:
                os.close(fd)
            self._forget(dst)
            os.rename(src, dst)
            self._files[dst.stat().st_ino].path = dst
            self._journal.append(_DirOp("rename", dst, src, saved))

    def remove(self, path: Path) -> None:
        with self._mu:
            self._point("remove", path)
            if not path.exists():
                return
            saved = self._durable_content(path)
            self._forget(path)
            os.unlink(path)
            self._journal.append(_DirOp("remove", path, saved=saved))

    def fsync_dir(self, path: Path) -> None:
        with self._mu:
            self._point("fsync_dir", path)
            if self.real_sync:
                super().fsync_dir(path)
            self._journal = [op for op in self._journal if op.path.parent != path]

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
                self._journal.append(_DirOp("mkdir", d))
                self.fsync_dir(d.parent)


class FaultyAppendFile(AppendFile):
    """An open segment whose writes and syncs pass the layer's fault points."""

    def __init__(self, layer: FaultyFiles, ino: int, path: Path, fd: int, size: int) -> None:
        super().__init__(path, fd, size)
        self._layer = layer
        self._ino = ino

    def write(self, chunks: Sequence[Buffer]) -> None:
        with self._layer._mu:
            rule = self._layer._point("write", self.path)
            if rule is not None:
                os.write(self._fd, b"".join(chunks)[: rule.partial])
                raise _error(rule.errno, self.path)
            super().write(chunks)

    def sync(self) -> None:
        # fdatasync persists what was written before it began, through any
        # descriptor of the inode (group commit syncs a dup()).
        with self._layer._mu:
            self._layer._point("sync", self.path)
            size = os.fstat(self._fd).st_size
            if self._layer.real_sync:
                super().sync()
            self._layer._synced(self._ino, size)

    def truncate(self, size: int) -> None:
        with self._layer._mu:
            self._layer._point("truncate", self.path)
            super().truncate(size)
            self._layer._cut(self._ino, size)

    def dup(self) -> AppendFile:
        return FaultyAppendFile(self._layer, self._ino, self.path, os.dup(self._fd), self.size)


def _error(code: int, path: Path) -> OSError:
    return OSError(code, os.strerror(code), str(path))


def _lose_unsynced(path: Path, synced: int, mode: CrashMode, rng: random.Random) -> None:
    size = path.stat().st_size
    if size <= synced:
        return
    with path.open("r+b") as fh:
        if mode == "drop":
            fh.truncate(synced)
        elif mode == "zeros":
            fh.seek(synced)
            fh.write(bytes(size - synced))
        else:
            fh.truncate(synced + rng.randrange(size - synced + 1))


def _undo(op: _DirOp, where: Callable[[Path], Path | None]) -> None:
    path = where(op.path)
    if path is None:
        return
    if op.kind == "create":
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    elif op.kind == "mkdir":
        shutil.rmtree(path, ignore_errors=True)
    elif op.kind == "remove":
        if path.parent.is_dir():
            path.write_bytes(op.saved or b"")
    else:
        assert op.src is not None
        src = where(op.src)
        if src is not None and path.exists():
            path.rename(src)
            if op.saved is not None:
                path.write_bytes(op.saved)


def commit_with_model(store: statelog.StateStore, models: list[dict[str, Any]], commit: Any) -> int:
    """Commit a :class:`tests.helpers.Commit` as ``build_store`` does; on success extend ``models``.

    ``models[e]`` is the model at epoch ``e`` (as ``build_store`` returns), so
    ``len(models) - 1`` is always the last acknowledged epoch.
    """
    nxt = model_of(models[-1], commit, len(models))
    epoch = store.commit(
        offsets=commit.offsets if commit.offsets is not None else {"p0": len(models)},
        low_watermark_ms=nxt["low_watermark_ms"],
        put=commit.put,
        delete=commit.delete,
        table=commit.table,
    )
    models.append(nxt)
    return epoch


def model_of(prev: dict[str, Any], commit: Any, epoch: int) -> dict[str, Any]:
    """The model after applying ``commit`` as epoch ``epoch`` on top of ``prev``."""
    offsets = commit.offsets if commit.offsets is not None else {"p0": epoch}
    wm = commit.watermark if commit.watermark is not None else epoch * 10
    tables = {t: dict(kv) for t, kv in prev["tables"].items()}
    t = tables.setdefault(commit.table, {})
    for k in commit.delete:
        t.pop(k, None)
    t.update(commit.put)
    return {"offsets": {**prev["offsets"], **offsets}, "low_watermark_ms": wm, "tables": tables}
