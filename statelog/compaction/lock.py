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

from pathlib import Path
from types import TracebackType

from statelog.errors import CompactorLockedError, StatelogError
from statelog.storage.lock import PidLock

__all__ = ["LOCK_NAME", "CompactorLock"]

LOCK_NAME = "COMPACTOR.LOCK"


class CompactorLock(PidLock):
    """An acquired compactor lock on one store; :meth:`release` (or death) frees it.

    :raises CompactorLockedError: another compactor holds it (its pid is named).
    :raises OSError: the lock file cannot be created (missing or read-only store).
    """

    name = LOCK_NAME

    def locked(self, store: Path, pid: int | None) -> StatelogError:
        return CompactorLockedError(store, pid)

    def __enter__(self) -> CompactorLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
