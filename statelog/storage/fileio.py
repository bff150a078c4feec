"""The file layer: every durable step statelog takes goes through here.

Keeping the system calls in one small class serves two ends. The order of
durable steps (write temp, fsync, rename, fsync directory) is written down
once, in :meth:`FileLayer.create_durable`. And tests substitute a subclass
that injects ENOSPC or EIO, or forgets every write that was not synced, to
simulate a power loss (:mod:`statelog.kit`, statelog's testing kit).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["AppendFile", "FileLayer", "ReadBuffer"]

Buffer = bytes | bytearray | memoryview
_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 16


class AppendFile:
    """An open segment: append-only writes, data syncs, truncation on rollback."""

    def __init__(self, path: Path, fd: int, size: int) -> None:
        self.path = path
        self._fd = fd
        self.size = size
        self.closed = False

    def write(self, chunks: Sequence[Buffer]) -> None:
        """Append every chunk, in order, at the end of the file.

        A short write is continued, so on return every byte is in the page
        cache. ``size`` only advances when all bytes were written.

        :raises OSError: the write failed; some prefix of the bytes may be in
            the file past ``size`` (the caller truncates them away).
        """
        total = 0
        # The kernel takes at most IOV_MAX buffers per writev.
        for i in range(0, len(chunks), _IOV_MAX):
            batch = chunks[i : i + _IOV_MAX]
            want = sum(len(c) for c in batch)
            written = os.writev(self._fd, batch)
            if written != want:
                # writev may stop early (signals, a disk that fills up):
                # finish the rest with plain writes, or raise what they raise.
                rest = memoryview(b"".join(batch))[written:]
                while rest:
                    n = os.write(self._fd, rest)
                    rest = rest[n:]
            total += want
        self.size += total

    def sync(self) -> None:
        """Make every written byte durable (fdatasync: data and the file size).

        :raises OSError: the device reported an error; nothing written since
            the last successful sync may be assumed durable.
        """
        os.fdatasync(self._fd)

    def truncate(self, size: int) -> None:
        """Cut the file back to ``size`` bytes (rollback of a failed append)."""
        os.ftruncate(self._fd, size)
        self.size = size

    def dup(self) -> AppendFile:
        """A second handle on the same file, so another thread can sync it without a lock."""
        return AppendFile(self.path, os.dup(self._fd), self.size)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self._fd)


class FileLayer:
    """System calls used by the writer and by recovery. Subclassed by fault-injection tests."""

    def open_append(self, path: Path) -> AppendFile:
        """Open an existing file for appending at its current end."""
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return AppendFile(path, fd, os.fstat(fd).st_size)

    def create_durable(self, path: Path, data: Buffer) -> None:
        """Create ``path`` holding ``data`` so that it is never seen half-written.

        Durable steps, in order: write ``<path>.tmp``, fsync it, rename it to
        ``path``, fsync the directory. A crash at any point leaves either no
        file at ``path`` or the whole file (plus, at worst, a stray ``.tmp``).

        :raises OSError: any step failed; ``path`` was not created.
        """
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.rename(tmp, path)
        except OSError:
            self.remove(tmp)
            raise
        self.fsync_dir(path.parent)

    def read(self, path: Path) -> bytes:
        """Read a whole file. An OSError propagates: an I/O error is never corruption."""
        with open(path, "rb") as fh:
            return fh.read()

    def read_reusing(self, path: Path, reads: ReadBuffer) -> memoryview:
        """:meth:`read` into ``reads``: the view is valid until its next read
        (:class:`ReadBuffer`). A subclass that watches or fails reads does so here too.

        :raises OSError: as :meth:`read`.
        """
        return reads.read(path)

    def truncate(self, path: Path, size: int) -> None:
        """Cut ``path`` to ``size`` bytes and fsync it."""
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        """Rename within one directory; the caller fsyncs the directory."""
        os.rename(src, dst)

    def remove(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def fsync_file(self, path: Path) -> None:
        """Make the bytes another writer (LMDB) put in ``path`` durable.

        :raises OSError: the device reported an error.
        """
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def fsync_dir(self, path: Path) -> None:
        """Persist the directory entries of ``path`` (creates, renames, unlinks)."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def makedirs(self, path: Path) -> None:
        """Create ``path`` and missing parents, fsyncing each parent that gained an entry."""
        missing: list[Path] = []
        p = path
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            os.mkdir(d)
            self.fsync_dir(d.parent)


class ReadBuffer:
    """Whole files read one after another into one buffer that is kept between reads.

    Reading a file of tens of MiB into a fresh ``bytes`` makes the kernel fault in
    and zero a new page for every 4 KiB of it, which costs about twice the copy
    itself; a buffer kept between reads pays that once, for the largest file. For
    a reader that reads many large files in turn and keeps none of their bytes: a
    pass's fold, recovery's replay, the shipper verifying sealed segments, a
    restore checking each segment it downloaded.
    The buffer grows to the largest file read and stays that size while its
    owner keeps it.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def read(self, path: Path) -> memoryview:
        """The bytes of ``path``, as far as its size when opened.

        The view is valid only until the next call, which overwrites it: keep
        nothing that points into it (copy what must outlive it).

        :raises OSError: opening or reading failed (an I/O error is never corruption).
        """
        with open(path, "rb", buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > len(self._buf):
                # A new buffer, not a resize: a view a caller still holds stays valid.
                self._buf = bytearray(size)
            view = memoryview(self._buf)
            got = 0
            while got < size:
                n = fh.readinto(view[got:size])
                if not n:
                    break  # cut short meanwhile: the bytes that are there
                got += n
        return view[:got]
