"""The exit statuses of both operator commands, ``statelog`` and ``statelog-compactor``.

One table, defined here only: :mod:`statelog.cli.output` re-exports it for
the subcommands, and :mod:`compactor.options` maps the daemon's outcomes
onto it, so a script or a systemd unit reads a status the same way
whichever command it ran. :data:`EXIT_CODES_HELP` is the table as both
commands' ``--help`` prints it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from pathlib import Path

from statelog.errors import (
    AuditError,
    ChangesUnavailableError,
    CompactorLockedError,
    CorruptionError,
    EpochUnavailableError,
    FencedError,
    InvalidOptionError,
    NotAStoreError,
    PromotionLostError,
    ResnapshotRequired,
    StandbyCopyError,
    StoreLockedError,
    StoreNotFoundError,
    StorePromotedError,
)
from statelog.storage.layout import IDENTITY

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_BUSY",
    "EXIT_CODES",
    "EXIT_CODES_HELP",
    "EXIT_DAMAGED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNRECOVERABLE",
    "EXIT_USAGE",
    "exit_code_for",
    "gravest",
]

EXIT_OK = 0
EXIT_DAMAGED = 1
EXIT_UNRECOVERABLE = 2
EXIT_USAGE = 3
EXIT_BUSY = 4
EXIT_ERROR = 5
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a reader that left

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done; the store is clean (the daemon: stopped by SIGTERM or SIGINT)"),
    (EXIT_DAMAGED, "damage found, but the store is recoverable (or: an audit or drill problem)"),
    (
        EXIT_UNRECOVERABLE,
        "not recoverable: a re-snapshot (restore or rebuild from the source) is required, "
        "or IDENTITY is damaged",
    ),
    (EXIT_USAGE, "usage error (a bad option or value), or the path is not a statelog store"),
    (
        EXIT_BUSY,
        "the store is busy: another writer or compactor holds its lock, another host took "
        "it over (fenced), a promoted standby became its writer, or it is a standby's copy",
    ),
    (EXIT_ERROR, "any other error (I/O error, unknown format version, a failed pass, ...)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
    (EXIT_BROKEN_PIPE, "stdout was closed early (a reader such as `head` left)"),
)
"""``(status, meaning)`` of every documented exit status, in order."""


def _help() -> str:
    lines = ["exit status (statelog and statelog-compactor alike):"]
    for code, meaning in EXIT_CODES:
        lines += textwrap.wrap(
            meaning, width=79, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7
        )
    return "\n".join(lines) + "\n"


EXIT_CODES_HELP = _help()
"""The table as both commands' ``--help`` epilog prints it (raw text)."""

# Which status wins when several stores of one run ended differently:
# the one an operator must act on first.
_GRAVITY = (EXIT_BUSY, EXIT_UNRECOVERABLE, EXIT_DAMAGED, EXIT_ERROR, EXIT_USAGE)


def gravest(codes: Iterable[int]) -> int:
    """The one status for several outcomes: busy, then unrecoverable, damaged, error, usage.

    :returns: :data:`EXIT_OK` when ``codes`` holds nothing but ``EXIT_OK``
        (or nothing); a status not in the table ranks after all of them.
    """
    seen = {c for c in codes if c != EXIT_OK}
    for code in _GRAVITY:
        if code in seen:
            return code
    return min(seen, default=EXIT_OK)


def exit_code_for(exc: BaseException) -> int:
    """The documented exit status for an error that ended a command (or one store's turn)."""
    if isinstance(exc, ResnapshotRequired | ChangesUnavailableError | EpochUnavailableError):
        return EXIT_UNRECOVERABLE
    if isinstance(exc, StoreNotFoundError | NotAStoreError | InvalidOptionError):
        return EXIT_USAGE
    if isinstance(exc, StoreLockedError | CompactorLockedError | FencedError):
        return EXIT_BUSY
    if isinstance(exc, PromotionLostError | StorePromotedError | StandbyCopyError):
        return EXIT_BUSY
    if isinstance(exc, CorruptionError) and Path(exc.path).name == IDENTITY:
        return EXIT_UNRECOVERABLE  # no open can use the store until IDENTITY is repaired
    if isinstance(exc, CorruptionError | AuditError):
        return EXIT_DAMAGED
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_ERROR
