"""The power-loss model behind :meth:`statelog.kit.FaultyFiles.crash`.

What a disk still holds after the power went off. The rules, each a real
disk's:

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
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["CrashMode", "DirOp", "DiskModel", "Tracked", "lose_unsynced", "undo"]

CrashMode = Literal["drop", "zeros", "prefix"]
"""What a crash does to bytes appended after the last sync: drop them, keep
the size with zeros in place of the data, or keep a random prefix of them."""


@dataclass
class Tracked:
    """What the disk holds of one inode: its current name and its synced size."""

    path: Path
    synced: int


@dataclass(frozen=True)
class DirOp:
    """One directory-entry change not yet made durable by an fsync of ``path.parent``."""

    kind: Literal["create", "mkdir", "rename", "remove"]
    path: Path  # the entry created, removed, or the rename's destination
    src: Path | None = None  # the rename's source (same directory)
    saved: bytes | None = None  # durable content of a file the op removed or replaced


class DiskModel:
    """Per inode its synced size, per directory its journal of unsynced entry changes.

    Not locked: :class:`statelog.kit.FaultyFiles` calls it under its own lock.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[int, Tracked] = {}
        self.journal: list[DirOp] = []

    def track(self, fd: int, path: Path, synced: int | None = None) -> int:
        """Register the inode behind ``fd``; an unknown one is assumed durable as it is."""
        st = os.fstat(fd)
        t = self.files.get(st.st_ino)
        if t is None:
            t = self.files[st.st_ino] = Tracked(path, st.st_size if synced is None else synced)
        elif synced is not None:
            t.synced = synced
        t.path = path
        return st.st_ino

    def synced(self, ino: int, size: int) -> None:
        """A sync that began at ``size`` bytes succeeded."""
        t = self.files.get(ino)
        if t is not None:
            t.synced = size

    def cut(self, ino: int, size: int) -> None:
        """The file was truncated to ``size``: durable at once."""
        t = self.files.get(ino)
        if t is not None:
            t.synced = min(t.synced, size)

    def durable_content(self, path: Path) -> bytes | None:
        """What the disk holds of ``path`` right now (its synced prefix); None: no file."""
        if not path.is_file():
            return None
        data = path.read_bytes()
        t = self.files.get(path.stat().st_ino)
        return data if t is None else data[: t.synced]

    def forget(self, path: Path) -> None:
        """``path`` is unlinked or replaced: its inode is no longer tracked."""
        with contextlib.suppress(FileNotFoundError):
            self.files.pop(path.stat().st_ino, None)

    def renamed(self, src: Path, dst: Path, saved: bytes | None) -> None:
        """Bookkeeping of ``os.rename(src, dst)``, made by the caller in between."""
        self.journal.append(DirOp("rename", dst, src, saved))
        self.files[dst.stat().st_ino].path = dst

    def dir_synced(self, path: Path) -> None:
        """The entries of directory ``path`` are durable."""
        self.journal = [op for op in self.journal if op.path.parent != path]

    def crash(self, mode: CrashMode, into: Path | None, seed: int) -> None:
        """Rewrite ``root`` (or a copy of it at ``into``) as the disk holds it now."""
        rng = random.Random(seed)
        root = self.root
        if into is None:

            def where(p: Path) -> Path | None:
                return p

        else:
            if root.exists():
                shutil.copytree(root, into)

            def where(p: Path) -> Path | None:
                return into / p.relative_to(root) if p.is_relative_to(root) else None

        for t in self.files.values():
            target = where(t.path)
            if target is not None and target.is_file():
                lose_unsynced(target, t.synced, mode, rng)
        for op in reversed(self.journal):
            undo(op, where)


def lose_unsynced(path: Path, synced: int, mode: CrashMode, rng: random.Random) -> None:
    """Rewrite ``path`` as the disk holds it when only ``synced`` bytes were synced."""
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


def undo(op: DirOp, where: Callable[[Path], Path | None]) -> None:
    """Take back one journalled entry change; ``where`` maps a path into the crashed copy."""
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
