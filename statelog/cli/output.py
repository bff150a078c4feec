"""What every subcommand shares: exit codes, the parser class, errors as one line, progress.

The command prints (it is the one part of statelog that does); the library
only logs. Human output goes to stdout, JSON (``--json``) to stdout as one
document, errors and progress to stderr, so ``statelog verify --json S |
jq`` always gets clean JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, NoReturn

from statelog.compaction.delta import MAX_CHAIN_LIMIT, MAX_FULL_RATIO, ChainPolicy
from statelog.errors import (
    AuditError,
    ChangesUnavailableError,
    CompactorLockedError,
    CorruptionError,
    EpochUnavailableError,
    InvalidOptionError,
    NotAStoreError,
    PromotionLostError,
    ResnapshotRequired,
    StandbyCopyError,
    StatelogError,
    StoreLockedError,
    StoreNotFoundError,
    StorePromotedError,
)

__all__ = [
    "EXIT_BUSY",
    "EXIT_CODES_HELP",
    "EXIT_DAMAGED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNRECOVERABLE",
    "EXIT_USAGE",
    "CliParser",
    "ProgressFn",
    "add_chain_options",
    "duration_arg",
    "exit_code_for",
    "fmt_age",
    "fmt_bytes",
    "full_ratio_arg",
    "max_chain_arg",
    "print_json",
    "progress",
    "say_error",
    "size_arg",
]

EXIT_OK = 0
EXIT_DAMAGED = 1
EXIT_UNRECOVERABLE = 2
EXIT_USAGE = 3
EXIT_BUSY = 4
EXIT_ERROR = 5
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """\
exit status (every subcommand):
  0    done; the store is clean
  1    damage found, but the store is recoverable (or: an audit or drill problem)
  2    not recoverable: a re-snapshot (restore or rebuild from the source) is required
  3    usage error, or the path is not a statelog store
  4    the store is busy: another writer or compactor holds its lock, another
       promoted standby became its writer, or it is a standby's copy (not promoted)
  5    any other error (I/O error, unknown format version, ...)
  130  interrupted (Ctrl-C)
"""

ProgressFn = Callable[[str, int, int], None]

_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20}
_UNITS |= {"g": 1 << 30, "gib": 1 << 30}


class CliParser(argparse.ArgumentParser):
    """An argument parser whose usage errors exit 3, not argparse's 2 (2 means unrecoverable)."""

    def error(self, message: str) -> NoReturn:
        """Print usage and ``message`` on stderr; exit :data:`EXIT_USAGE`."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def size_arg(text: str) -> int:
    """An argparse type: a byte count, ``67108864``, ``64MiB``, ``512k``."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 67108864, 64MiB, 512k)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


_UNITS_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_arg(text: str) -> timedelta:
    """An argparse type: a positive duration, ``90s``, ``30m``, ``1h``, ``7d`` or seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    seconds = float(m.group(1)) * _UNITS_S[m.group(2)] if m is not None else 0.0
    if not 0.001 <= seconds <= timedelta.max.total_seconds() / 2:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (a positive number with s, m, h or d, at least 1 ms: "
            "90s, 30m, 1h, 7d)"
        )
    return timedelta(seconds=seconds)


def max_chain_arg(text: str) -> int:
    """An argparse type: ``--max-chain``, the most deltas above a full snapshot, 0 to 64.

    0 makes every pass write a full snapshot. The same range as
    ``statelog.compaction.fold.compact(max_chain=)``, refused here so a bad
    value exits with the usage message before any store is touched.
    """
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an integer: {text!r} (hint: 0 to 64 deltas; 0: every pass writes a full one)"
        ) from None
    if not 0 <= v <= MAX_CHAIN_LIMIT:
        raise argparse.ArgumentTypeError(
            f"{text} is outside 0..{MAX_CHAIN_LIMIT} (hint: at most {MAX_CHAIN_LIMIT} deltas "
            "above a full snapshot; 0: every pass writes a full one)"
        )
    return v


def full_ratio_arg(text: str) -> float:
    """An argparse type: ``--full-ratio``, a number above 0 and at most 10.

    A pass writes a full snapshot once the chain's delta bytes would exceed
    this fraction of the full snapshot's body.
    """
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a number: {text!r} (hint: a fraction of the full snapshot, such as 0.5)"
        ) from None
    if not 0.0 < v <= MAX_FULL_RATIO:  # NaN fails this too
        raise argparse.ArgumentTypeError(
            f"{text} is outside (0, {MAX_FULL_RATIO:g}] (hint: a fraction of the full "
            "snapshot, such as 0.5)"
        )
    return v


def add_chain_options(p: argparse.ArgumentParser) -> None:
    """``--max-chain`` and ``--full-ratio``, for every command that runs compaction passes."""
    p.add_argument(
        "--max-chain",
        type=max_chain_arg,
        default=ChainPolicy.max_chain,
        metavar="N",
        help=f"the most delta snapshots above a full one, 0-{MAX_CHAIN_LIMIT} (default "
        f"{ChainPolicy.max_chain}; 0: every pass writes a full snapshot)",
    )
    p.add_argument(
        "--full-ratio",
        type=full_ratio_arg,
        default=ChainPolicy.full_ratio,
        metavar="F",
        help="write a full snapshot once the chain's deltas would exceed F times the full "
        f"snapshot's body, 0 < F <= {MAX_FULL_RATIO:g} (default {ChainPolicy.full_ratio:g})",
    )


def exit_code_for(exc: BaseException) -> int:
    """The documented exit status for an error that ended a subcommand."""
    if isinstance(exc, ResnapshotRequired | ChangesUnavailableError | EpochUnavailableError):
        return EXIT_UNRECOVERABLE
    if isinstance(exc, StoreNotFoundError | NotAStoreError | InvalidOptionError):
        return EXIT_USAGE
    if isinstance(exc, StoreLockedError | CompactorLockedError):
        return EXIT_BUSY
    if isinstance(exc, PromotionLostError | StorePromotedError | StandbyCopyError):
        return EXIT_BUSY
    if isinstance(exc, CorruptionError | AuditError):
        return EXIT_DAMAGED
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_ERROR


def say_error(exc: BaseException) -> int:
    """Print ``exc`` as one line on stderr (with its hint); return its exit status."""
    if isinstance(exc, StatelogError):
        text = f"{type(exc).__name__}: {exc.message} (hint: {exc.hint})"
    elif isinstance(exc, KeyboardInterrupt):
        text = "interrupted"
    elif isinstance(exc, OSError):
        text = f"I/O error: {exc} (hint: nothing was judged damaged; fix the cause and retry)"
    else:
        text = f"internal error: {exc!r} (hint: run again with --traceback and report it)"
    print(f"statelog: {' '.join(text.split())}", file=sys.stderr)
    return exit_code_for(exc)


def print_json(doc: Any) -> None:
    """One JSON document on stdout (paths and other objects as strings)."""
    print(json.dumps(doc, indent=2, default=str))


def fmt_bytes(n: int) -> str:
    """``n`` bytes for people: ``812 B``, ``4.0 KiB``, ``1.5 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_age(seconds: float) -> str:
    """An age for people: ``42s``, ``7m``, ``3h``, ``2d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


@contextlib.contextmanager
def progress(title: str, *, quiet: bool) -> Iterator[ProgressFn]:
    """A progress callback ``(item, done, total)`` for the ``with`` block.

    A bar on stderr when stderr is a terminal; otherwise a plain line at
    most every two seconds and one at the end; nothing with ``quiet``.
    """
    if quiet:
        yield lambda item, done, total: None
        return
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TextColumn("{task.fields[item]}"),
            console=Console(stderr=True),
            transient=True,
        )
        with bar:
            task = bar.add_task(title, total=None, item="")

            def update(item: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total or None, item=item)

            yield update
        return
    last = [0.0, 0, 0]

    def line(item: str, done: int, total: int) -> None:
        last[1:] = [done, total]
        now = time.monotonic()
        if now - last[0] >= 2.0:
            last[0] = now
            print(f"{title}: {fmt_bytes(done)} of {fmt_bytes(total)} ({item})", file=sys.stderr)

    yield line
    if last[2]:
        print(
            f"{title}: {fmt_bytes(int(last[1]))} of {fmt_bytes(int(last[2]))}, done",
            file=sys.stderr,
        )
