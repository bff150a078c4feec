"""The single-writer lock (invariant 9 of docs/architecture.md).

``STORE/LOCK`` is held with ``flock(LOCK_EX | LOCK_NB)`` for as long as a
writer has the store open, and holds the holder's pid for error messages
and for operators. The kernel releases a flock when its holder dies,
so a SIGKILLed writer never leaves a stale lock behind. Each open of the
file is its own lock owner, so a second ``statelog.open`` of the same store
in the same process is refused too: with an error that says so, since the
pid in the file is then the caller's own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from statelog.errors import StatelogError, StoreLockedError

__all__ = ["PidLock", "StoreLock"]

LOCK_NAME = "LOCK"

# (device, inode) of every lock file held here -> the holder's pid: a loser
# whose file is in here lost to its own process, not to another one (the pid
# tells a child forked with the parent's table from the parent).
_held_here: dict[tuple[int, int], int] = {}


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or "x")
    except (ValueError, OSError):
        return None


class PidLock:
    """An exclusive, non-blocking flock on ``store/<name>`` that records the holder's pid.

    Steps: open (creating) the file, ``flock`` it without waiting, then
    write the pid. The pid is informational and not fsynced: the lock lives
    in the kernel and dies with its holder. :meth:`release` (or process
    death) frees it; subclasses name the file and the error a loser gets.
    """

    name = "LOCK"

    def __init__(self, store: Path) -> None:
        """:raises StatelogError: (the subclass's) another process holds the lock."""
        self.store = store
        self.path = store / self.name
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            st = os.fstat(fd)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            if _held_here.get((st.st_dev, st.st_ino)) == os.getpid():
                raise self.locked_here(store) from None
            raise self.locked(store, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd
        self._key = (st.st_dev, st.st_ino)
        _held_here[self._key] = os.getpid()

    def locked(self, store: Path, pid: int | None) -> StatelogError:
        """The error for a process that finds the lock taken."""
        return StoreLockedError(store, pid)

    def locked_here(self, store: Path) -> StatelogError:
        """The error for a second lock of the same file by the process that holds it."""
        return self.locked(store, os.getpid())

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Clear the pid and drop the lock. Idempotent."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            _held_here.pop(self._key, None)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)


class StoreLock(PidLock):
    """The single writer's lock, ``STORE/LOCK``: a second writer gets StoreLockedError."""

    name = LOCK_NAME

    def locked_here(self, store: Path) -> StatelogError:
        return StoreLockedError(store, os.getpid(), this_process=True)
