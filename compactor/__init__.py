"""The statelog compaction daemon (``statelog-compactor``, or ``python -m compactor``).

It folds sealed WAL segments into full snapshots in its own process, reading
only immutable files (sealed segments and snapshots, never the writer's
memory or its active segment), and applies retention. One compactor per
store, enforced by ``STORE/COMPACTOR.LOCK``.

* :func:`compact`: one pass over one store (library use, tests, ``--once``).
* :func:`compactor.daemon.main`: the command line.
"""

from statelog.compaction.fold import SCRATCH_DIR, CompactionResult, compact
from statelog.compaction.lock import CompactorLock
from statelog.compaction.retention import RetentionResult, apply_retention

__all__ = [
    "SCRATCH_DIR",
    "CompactionResult",
    "CompactorLock",
    "RetentionResult",
    "apply_retention",
    "compact",
]
