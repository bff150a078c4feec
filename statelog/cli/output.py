"""What every subcommand shares: the parser class, errors as one line, JSON, progress.

Also what both commands (``statelog`` and ``statelog-compactor``) share on
their command lines: the exit-status table (:mod:`statelog.cli.exits`), one
syntax for durations (:func:`duration_arg`) and one for byte counts
(:func:`size_arg`), and ``--version`` (:func:`version_text`).

The command prints (it is the one part of statelog that does); the library
only logs. Human output goes to stdout, JSON (``--json``) to stdout as one
document, errors and progress to stderr, so ``statelog verify --json S |
jq`` always gets clean JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any, NoReturn

from statelog.cli.exits import EXIT_USAGE, exit_code_for
from statelog.compaction.delta import MAX_CHAIN_LIMIT, MAX_FULL_RATIO, ChainPolicy
from statelog.errors import StatelogError

__all__ = [
    "DURATION_EXAMPLES",
    "SIZE_EXAMPLES",
    "CliParser",
    "ProgressFn",
    "add_chain_options",
    "duration_arg",
    "fmt_age",
    "fmt_bytes",
    "full_ratio_arg",
    "max_chain_arg",
    "print_json",
    "progress",
    "say_error",
    "seconds_arg",
    "size_arg",
    "version_text",
]

ProgressFn = Callable[[str, int, int], None]


class CliParser(argparse.ArgumentParser):
    """An argument parser whose usage errors exit 3, not argparse's 2 (2 means unrecoverable)."""

    def error(self, message: str) -> NoReturn:
        """Print usage and ``message`` on stderr; exit :data:`EXIT_USAGE`."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")
_BYTES = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20}
_BYTES |= {"g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}
SIZE_EXAMPLES = "67108864, 64k, 64KiB, 64MiB, 1G, 1.5GiB"

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_SECONDS = {None: 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
# Half of what a timedelta holds: a window is subtracted from and added to
# times, and either must still fit.
_MAX_SECONDS = Decimal(timedelta.max.days // 2 * 86400)
DURATION_EXAMPLES = "30 (seconds), 30s, 90s, 1.5s, 500ms, 5m, 1h, 7d"


def size_arg(text: str) -> int:
    """An argparse type: a byte count, for every byte-count option of both commands.

    A whole number of bytes, optionally with a binary unit in any case
    (``k``/``KiB`` 1024, ``m``/``MiB``, ``g``/``GiB``, ``t``/``TiB``; ``b``
    bytes): ``67108864``, ``64k``, ``64KiB``, ``64MiB``, ``1G``; a fraction
    only where it makes whole bytes (``1.5GiB``). ``64KB`` is refused:
    decimal or binary would be a guess.

    :raises argparse.ArgumentTypeError: anything else, with examples (the
        command exits with the usage status).
    """
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m is not None else None
    n = Decimal(m.group(1)) * _BYTES[unit] if m is not None and unit in _BYTES else None
    if n is None or n != n.to_integral_value():
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (hint: a whole number of bytes, or a number with k, KiB, "
            f"m, MiB, g, GiB, t or TiB, powers of 1024, in any case: {SIZE_EXAMPLES})"
        )
    return int(n)


def duration_arg(text: str) -> timedelta:
    """An argparse type: a duration, for every duration option of both commands.

    A number of seconds, or a number with ``ms``, ``s``, ``m``, ``h`` or
    ``d``: ``30``, ``30s``, ``1.5s``, ``500ms``, ``5m``, ``1h``, ``7d``;
    at least 1 ms (the unit commit times are kept in) and at most half of
    what a ``timedelta`` holds.

    :raises argparse.ArgumentTypeError: anything else (``0``, ``-5``,
        ``1w``, ``1e3``), with examples (the command exits with the usage
        status).
    """
    m = _DURATION.fullmatch(text)
    if m is None:
        seconds = Decimal(0)
    elif m.group(2) == "ms":
        seconds = Decimal(m.group(1)) / 1000
    else:
        seconds = Decimal(m.group(1)) * _SECONDS[m.group(2)]
    if not Decimal("0.001") <= seconds <= _MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (hint: a number of seconds, or one with ms, s, m, h "
            f"or d, from 1 ms to {int(_MAX_SECONDS // 86400)} days: {DURATION_EXAMPLES})"
        )
    return timedelta(seconds=float(seconds))


def seconds_arg(text: str) -> float:
    """An argparse type: :func:`duration_arg`, as a number of seconds (``5m`` is 300.0).

    :raises argparse.ArgumentTypeError: as :func:`duration_arg`.
    """
    return duration_arg(text).total_seconds()


def version_text() -> str:
    """What ``--version`` prints for both commands: ``statelog X.Y.Z``.

    The installed distribution's version; for a source tree run without
    installing, the package's ``__version__``.
    """
    try:
        version = importlib.metadata.version("statelog")
    except importlib.metadata.PackageNotFoundError:
        # Read from the loaded package: its modules never import the package's
        # top module (an import contract), and it is always loaded before them.
        version = str(getattr(sys.modules.get("statelog"), "__version__", "unknown"))
    return f"statelog {version}"


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


def say_error(exc: BaseException) -> int:
    """Print ``exc`` as one line on stderr (with its hint); return its exit status.

    A statelog error's hint is the one for command users (``command_hint``):
    it names subcommands and options, not Python keyword arguments.
    """
    if isinstance(exc, StatelogError):
        text = f"{type(exc).__name__}: {exc.message} (hint: {exc.command_hint})"
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
