"""The single-writer lock (invariant 9 of docs/architecture.md).

``STORE/LOCK`` is held with ``flock(LOCK_EX | LOCK_NB)`` for as long as a
writer has the store open, and holds the holder's pid for error messages
and for operators. The kernel releases a flock when its holder dies,
so a SIGKILLed writer never leaves a stale lock behind. Each open of the
file is its own lock owner, so a second ``statelog.open`` of the same store
in the same process is refused too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from statelog.errors import StatelogError, StoreLockedError

__all__ = ["PidLock", "StoreLock"]

LOCK_NAME = "LOCK"


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
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise self.locked(store, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def locked(self, store: Path, pid: int | None) -> StatelogError:
        """The error for a process that finds the lock taken."""
        return StoreLockedError(store, pid)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Clear the pid and drop the lock. Idempotent."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)


class StoreLock(PidLock):
    """The single writer's lock, ``STORE/LOCK``: a second writer gets StoreLockedError."""

    name = LOCK_NAME
