"""The statelog compaction daemon (``statelog-compactor``, or ``python -m compactor``).

It folds sealed WAL segments into full snapshots in its own process, reading
only immutable files (sealed segments and snapshots, never the writer's
memory or its active segment), and applies retention. One compactor per
store, enforced by ``STORE/COMPACTOR.LOCK``.

* :func:`compact`: one pass over one store (library use, tests, ``--once``).
* :func:`main`: the command line (:func:`compactor.daemon.main`); its exit
  statuses are the ``statelog`` command's (:mod:`statelog.cli.exits`).
"""

from collections.abc import Sequence

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
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``statelog-compactor`` with ``argv`` (default: ``sys.argv[1:]``); return its status.

    The daemon and its metrics server are imported only here, so that
    ``from compactor import compact`` stays light.

    :raises SystemExit: a bad option (status 3, after the usage message),
        ``--help`` or ``--version`` (status 0), as :func:`compactor.daemon.main`.
    """
    from compactor.daemon import main as run

    return run(argv)
