"""The single-writer lock (design brief, invariant 9).

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

from .errors import StoreLockedError

__all__ = ["StoreLock"]

LOCK_NAME = "LOCK"


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or "x")
    except (ValueError, OSError):
        return None


class StoreLock:
    """An acquired writer lock; :meth:`release` (or process death) frees it."""

    def __init__(self, store: Path) -> None:
        """Take the lock on ``store``.

        :raises StoreLockedError: another writer holds it (its pid is named).
        """
        self.path = store / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise StoreLockedError(store, pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)
