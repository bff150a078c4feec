"""The command line of ``statelog-compactor``: its options, their checks and the exit statuses.

:func:`parse_args` refuses every bad option (argparse's usage message, exit
2) before the daemon touches a store: value ranges, options that need
another, and a ``--remote`` URL or ``AWS_*`` environment the client refuses.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

from statelog.cli.output import add_chain_options, duration_arg
from statelog.errors import StatelogError
from statelog.remote import RemoteClient

__all__ = [
    "EXIT_BAD_OPTIONS",
    "EXIT_FAILED",
    "EXIT_FENCED",
    "EXIT_LOCKED",
    "EXIT_OK",
    "build_parser",
    "parse_args",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_OPTIONS = 2
EXIT_LOCKED = 3
EXIT_FENCED = 4

_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30}
_UNITS["gib"] = 1 << 30

_EPILOG = """\
exit status:
  0  --once pass done, or stopped by SIGTERM/SIGINT (graceful: locks released)
  1  a pass failed (--once), a store is missing (--once), the SHARDS manifest
     of a sharded root cannot be read (at start), or an unexpected error
  2  bad options, or the --metrics-port cannot be bound (in use, bad address)
  3  a store is already being compacted by another compactor (its pid is named):
     --once: any store named (after passing the others); without --once:
     every store given, at start
  4  --remote: a store was taken over by another host (fenced); stop this daemon

A STORE that is a sharded root (a directory holding SHARDS) stands for every
shard under it. Without --once, a store another compactor holds is logged
(event=locked, ERROR) and its lock tried again every --interval while the
daemon serves the other stores; it is compacted once its lock is free.

Every line on stderr is `ts=... level=... event=... store=... key=value`.
With --metrics-port, GET http://ADDR:PORT/metrics serves the statelog_*
Prometheus series (docs/metrics.md) for as long as the daemon runs; with
--remote too, the shipping lag (statelog_remote_lag_bytes|seconds|epochs).
With --remote URL each pass ships, compacts and ships again (docs/remote.md);
the AWS_* environment configures the connection.
The daemon reads only sealed segments and snapshots; the writer keeps running.
"""


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 67108864, 64MiB, 512k)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _bounded(low: float, kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{text} is below {low}")
        return v

    return parse


def _duration(text: str) -> timedelta:
    """A retention window: ``90s``, ``30m``, ``1h``, ``7d`` or seconds, at least 1 ms
    (the unit commit times are kept in) and at most what a ``timedelta`` holds.

    :raises argparse.ArgumentTypeError: anything else (argparse: usage, exit 2).
    """
    try:
        window = duration_arg(text)
    except OverflowError:
        window = timedelta.max
    if window == timedelta.max or window < timedelta(milliseconds=1):
        raise argparse.ArgumentTypeError(
            f"not a usable duration: {text!r} (at least 1 ms and at most 999999999 days: "
            "90s, 30m, 1h, 7d, or seconds)"
        )
    return window


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
    p = argparse.ArgumentParser(
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
        "--interval", type=_bounded(0.001, float), default=30.0, help="seconds between passes (30)"
    )
    p.add_argument(
        "--min-tail-bytes",
        type=_size,
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
        type=_duration,
        default=None,
        metavar="DURATION",
        help="also keep every epoch committed in the last DURATION restorable (90s, 30m, 1h, "
        "7d, or seconds): the newest snapshot at or before now-DURATION, every snapshot "
        "after it and the log from it; with --retain, whichever keeps more (default: by "
        "count only). Local only: --remote-retain-for is the remote's",
    )
    p.add_argument("--level", type=_bounded(1, int), default=3, help="zstd level, 1-22 (3)")
    add_chain_options(p)
    p.add_argument(
        "--once",
        action="store_true",
        help="one pass over every store, then exit (3 if any store was locked)",
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
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log level (INFO)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="same as --log-level DEBUG")
    return p


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, RemoteClient | None]:
    """Parse and check ``argv``; with ``--remote``, also build its client.

    Touches no store: a client is built from the URL and the environment
    without a request.

    :raises SystemExit: status 2, after argparse printed the usage and why.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.level > 22:
        parser.error(f"--level {args.level}: zstd levels go up to 22")
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
            parser.error(f"--remote {args.remote}: {exc.message} (hint: {exc.hint})")
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
        type=_duration,
        default=None,
        metavar="DURATION",
        help="with --remote: keep every epoch committed in the last DURATION restorable from "
        "the remote, as --retain-for does locally; with --remote-retain, whichever keeps "
        "more; alone, it turns remote retention on (the window, and at least the newest "
        "snapshot) (default: off)",
    )
    p.add_argument(
        "--max-ship-lag",
        type=_duration,
        default=timedelta(seconds=1),
        metavar="DURATION",
        help="with --remote: ship what the writers sealed every half of DURATION, in a "
        "thread beside the passes; writers of shipped stores seal their active segment once its "
        "oldest commit is this old (their max_ship_lag, 1s unless set), so an acknowledged "
        "commit reaches the bucket within about DURATION (default: 1s)",
    )
