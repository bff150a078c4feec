"""The command line of ``statelog-compactor``: its options, their checks and the exit statuses.

:func:`parse_args` refuses every bad option (the usage message, exit 3:
:data:`EXIT_BAD_OPTIONS`) before the daemon touches a store: value ranges,
options that need another, and a ``--remote`` URL or ``AWS_*`` environment
the client refuses.

The exit statuses are the ``statelog`` command's (:mod:`statelog.cli.exits`):
the names below are the daemon's outcomes as statuses of that table. So are
the option syntaxes: every duration is :func:`~statelog.cli.output.duration_arg`'s
(``30``, ``30s``, ``500ms``, ``5m``, ``1h``, ``7d``), every byte count
:func:`~statelog.cli.output.size_arg`'s (``67108864``, ``64k``, ``64MiB``, ``1G``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

from statelog.cli.exits import EXIT_BUSY, EXIT_CODES_HELP, EXIT_ERROR, EXIT_OK, EXIT_USAGE
from statelog.cli.output import (
    CliParser,
    add_chain_options,
    duration_arg,
    seconds_arg,
    size_arg,
    version_text,
)
from statelog.errors import StatelogError
from statelog.remote import RemoteClient

__all__ = [
    "EXIT_BAD_OPTIONS",
    "EXIT_FAILED",
    "EXIT_FENCED",
    "EXIT_LOCKED",
    "EXIT_OK",
    "PASS_NICE",
    "build_parser",
    "parse_args",
]

EXIT_FAILED = EXIT_ERROR
"""A pass failed, or an unexpected error (5)."""
EXIT_BAD_OPTIONS = EXIT_USAGE
"""Bad options, or the ``--metrics-port`` cannot be bound (3)."""
EXIT_LOCKED = EXIT_BUSY
"""Another compactor holds a store (4)."""
EXIT_FENCED = EXIT_BUSY
"""``--remote``: another host took a store over (4)."""
PASS_NICE = 5
"""``--nice``'s default: how many steps nicer than the daemon its passes run. A pass is
background work that takes every cycle it gets; nicer, a busy writer's commits and the
ship process (which keeps the daemon's priority) come first, and the passes take what
they leave, so the ship process's cycles come out of the passes' share, not the
writer's."""

_EPILOG = (
    EXIT_CODES_HELP
    + """
what makes the daemon exit with which:
  0  --once: every pass done; the daemon: stopped by SIGTERM/SIGINT (locks released)
  1  the SHARDS manifest of a sharded root is damaged (at start); with --once:
     a store's IDENTITY is damaged, or a pass walked past damaged files
  2  --once: a pass found no snapshot that verifies and a log that does not
     begin at epoch 1 (a re-snapshot is required)
  3  bad options, or the --metrics-port cannot be bound (in use, bad address);
     with --once: a store named is missing or is not a statelog store
  4  a store is being compacted by another compactor (its pid is named):
     --once: any store named (after passing the others); without --once:
     every store given, at start. --remote: a store was taken over by
     another host (fenced); stop this daemon
  5  a pass failed (--once), a SHARDS manifest cannot be read (I/O, newer
     version), or an unexpected error
With --once and several outcomes, the status is the gravest: 4, then 2, 1, 5, 3.

A STORE that is a sharded root (a directory holding SHARDS) stands for every
shard under it. Without --once, a store another compactor holds is logged
(event=locked, ERROR) and its lock tried again every --interval while the
daemon serves the other stores; it is compacted once its lock is free.

DURATION: seconds, or a number with ms, s, m, h or d: 30, 30s, 1.5s, 500ms,
5m, 1h, 7d. SIZE: bytes, or with k/KiB, m/MiB, g/GiB (powers of 1024, any
case): 67108864, 64k, 64KiB, 64MiB, 1G. The same as the statelog command's.

Every line on stderr is `ts=... level=... event=... store=... key=value`.
With --metrics-port, GET http://ADDR:PORT/metrics serves the statelog_*
Prometheus series (docs/metrics.md) for as long as the daemon runs; with
--remote too, the shipping lag (statelog_remote_lag_bytes|seconds|epochs).
With --remote URL each pass ships, compacts and ships again (docs/remote.md);
the AWS_* environment configures the connection.
The daemon reads only sealed segments and snapshots; the writer keeps running.
SIGUSR1 starts the next round now (a writer sends it to the daemon it started).
"""
)


def _bounded(
    low: float, kind: type[int] | type[float], high: float | None = None
) -> Callable[[str], int | float]:
    """An argparse type: a ``kind`` from ``low`` to ``high`` (None: no upper bound)."""

    def parse(text: str) -> int | float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{text} is below {low}")
        if high is not None and v > high:
            raise argparse.ArgumentTypeError(f"{text} is above {high}")
        return v

    return parse


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (1-65535)")
    return port


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``statelog-compactor``."""
    p = CliParser(
        prog="statelog-compactor",
        description="Fold sealed WAL segments of statelog stores into snapshots, "
        "and apply retention. One compactor per store.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "stores",
        nargs="+",
        metavar="STORE",
        type=Path,
        help="store directories, or sharded roots (every shard under the root)",
    )
    p.add_argument(
        "--version", action="version", version=version_text(), help="print the version and exit"
    )
    p.add_argument(
        "--interval",
        type=seconds_arg,
        default=30.0,
        metavar="DURATION",
        help="between rounds of passes: seconds, or 500ms, 30s, 5m, 1h (default 30s)",
    )
    p.add_argument(
        "--min-tail-bytes",
        type=size_arg,
        metavar="SIZE",
        default=64 << 20,
        help="compact once the sealed tail after the newest snapshot holds this many bytes "
        "(default 64MiB; 0: off)",
    )
    p.add_argument(
        "--min-tail-records",
        type=_bounded(0, int),
        default=0,
        help="compact once the sealed tail holds this many records (default 0: off); "
        "a pass compacts when any trigger that is on is reached",
    )
    p.add_argument(
        "--retain", type=_bounded(1, int), default=3, help="verified snapshots to keep (3)"
    )
    p.add_argument(
        "--retain-for",
        type=duration_arg,
        default=None,
        metavar="DURATION",
        help="also keep every epoch committed in the last DURATION restorable (seconds, or "
        "500ms, 90s, 30m, 1.5h, 7d): the newest snapshot at or before now-DURATION, every snapshot "
        "after it and the log from it; with --retain, whichever keeps more (default: by "
        "count only). Local only: --remote-retain-for is the remote's",
    )
    _add_pass_options(p)
    add_chain_options(p)
    p.add_argument(
        "--once",
        action="store_true",
        help="one pass over every store, then exit (4 if any store was locked)",
    )
    _add_remote_options(p)
    p.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics over HTTP on this port (default: off)",
    )
    p.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics server binds (127.0.0.1; 0.0.0.0 or :: for every interface)",
    )
    _add_log_options(p)
    return p


def _add_pass_options(p: argparse.ArgumentParser) -> None:
    """``--level`` and ``--nice``: how a pass compresses, and at what CPU priority it runs."""
    p.add_argument("--level", type=_bounded(1, int, 22), default=3, help="zstd level, 1-22 (3)")
    p.add_argument(
        "--nice",
        type=_bounded(0, int, 19),
        default=PASS_NICE,
        metavar="N",
        help=f"run the passes N steps nicer than the daemon, 0-19 ({PASS_NICE}; 0: its own "
        "priority): under load the writers and the shipping keep more of the cores, and "
        "the log after the newest snapshot grows",
    )


def _add_log_options(p: argparse.ArgumentParser) -> None:
    """``--log-level``, and ``-v``/``-q`` as the ``statelog`` command spells them."""
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log level (INFO)",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="same as --log-level DEBUG")
    p.add_argument("-q", "--quiet", action="store_true", help="same as --log-level WARNING")


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, RemoteClient | None]:
    """Parse and check ``argv``; with ``--remote``, also build its client.

    Touches no store: a client is built from the URL and the environment
    without a request.

    :raises SystemExit: status 3 (:data:`EXIT_BAD_OPTIONS`), after the usage and why
        were printed; status 0 after ``--help`` or ``--version``.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose and args.quiet:
        parser.error("-q/--quiet and -v/--verbose: give one of them")
    if args.verbose:
        args.log_level = "DEBUG"
    elif args.quiet:
        args.log_level = "WARNING"
    if args.remote_retain is not None and args.remote is None:
        parser.error("--remote-retain needs --remote")
    if args.remote_retain_for is not None and args.remote is None:
        parser.error("--remote-retain-for needs --remote")
    if args.max_ship_lag < timedelta(milliseconds=10):
        parser.error(f"--max-ship-lag {args.max_ship_lag}: at least 10 ms")
    client = None
    if args.remote is not None:
        try:
            client = RemoteClient.from_url(args.remote)
        except StatelogError as exc:
            parser.error(f"--remote {args.remote}: {exc.message} (hint: {exc.command_hint})")
    return args, client


def _add_remote_options(p: argparse.ArgumentParser) -> None:
    """``--remote`` and its retention options."""
    p.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="ship sealed segments and snapshots to s3://bucket/prefix before and after each "
        "pass (default: off)",
    )
    p.add_argument(
        "--remote-retain",
        type=_bounded(1, int),
        default=None,
        metavar="N",
        help="with --remote: keep this many snapshots on the remote, and the segments they "
        "need (default: keep everything)",
    )
    p.add_argument(
        "--remote-retain-for",
        type=duration_arg,
        default=None,
        metavar="DURATION",
        help="with --remote: keep every epoch committed in the last DURATION restorable from "
        "the remote, as --retain-for does locally; with --remote-retain, whichever keeps "
        "more; alone, it turns remote retention on (the window, and at least the newest "
        "snapshot) (default: off)",
    )
    p.add_argument(
        "--max-ship-lag",
        type=duration_arg,
        default=timedelta(seconds=1),
        metavar="DURATION",
        help="with --remote: ship what the writers sealed every quarter of DURATION, in a "
        "process beside the passes; writers of shipped stores seal their active segment once its "
        "oldest commit is half their max_ship_lag old (1s unless set), so an acknowledged "
        "commit reaches the bucket within about DURATION (default: 1s)",
    )
