"""One compactor per store: ``STORE/COMPACTOR.LOCK``.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on ``COMPACTOR.LOCK``, which holds
the holder's pid for the error message and for operators. It is separate
from the writer's ``LOCK``: the compactor never blocks the writer, and the
writer never waits for a compaction. The kernel drops a flock when its
holder dies, so a SIGKILLed compactor leaves no stale lock. Each open of
the file is its own lock owner, so a second compactor in the same process
is refused too.

Holding the lock is what makes the compactor's private scratch space
(``STORE/compactor.tmp/``) and ``snapshots/*.tmp`` safe to clear at the
start of a pass: no other compactor can be writing them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType

from statelog.errors import CompactorLockedError

__all__ = ["LOCK_NAME", "CompactorLock"]

LOCK_NAME = "COMPACTOR.LOCK"


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or "x")
    except (ValueError, OSError):
        return None


class CompactorLock:
    """An acquired compactor lock on one store; :meth:`release` (or death) frees it."""

    def __init__(self, store: Path) -> None:
        """Take the lock on ``store`` (a directory that exists).

        Steps: open (creating) ``COMPACTOR.LOCK``, ``flock`` it without
        waiting, then write the pid. The pid is informational and not
        fsynced: the lock itself lives in the kernel.

        :raises CompactorLockedError: another compactor holds it (its pid is named).
        :raises OSError: the lock file cannot be created (missing or read-only store).
        """
        self.store = store
        self.path = store / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise CompactorLockedError(store, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

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

    def __enter__(self) -> CompactorLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
