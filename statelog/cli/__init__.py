"""The ``statelog`` command: inspect, verify, recover, compact, dump, tail, audit, drill,
restore and promote.

Each subcommand lives in its own module with ``add_parser`` and ``run``;
:func:`main` parses, dispatches, and turns every error into one line on
stderr and a documented exit status (``statelog --help``, ``docs/cli.md``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from collections.abc import Callable

from statelog.cli import (
    audit,
    compact,
    drill,
    dump,
    inspect,
    promote,
    recover,
    restore,
    tail,
    verify,
)
from statelog.cli.exits import EXIT_BROKEN_PIPE, EXIT_CODES_HELP, EXIT_USAGE
from statelog.cli.output import CliParser, say_error, version_text
from statelog.compaction.logfmt import KeyValueFormatter
from statelog.errors import DataLossWarning

__all__ = ["build_parser", "main"]

_RUN: dict[str, Callable[[argparse.Namespace], int]] = {
    "inspect": inspect.run,
    "verify": verify.run,
    "recover": recover.run,
    "compact": compact.run,
    "dump": dump.run,
    "audit": audit.run,
    "drill": drill.run,
    "restore": restore.run,
    "tail": tail.run,
    "promote": promote.run,
}


def _common(*, suppress: bool) -> argparse.ArgumentParser:
    """The options every subcommand takes, before or after its name.

    Under a subcommand their defaults are suppressed, so an option given
    before the subcommand's name is not reset by the subcommand's parser.
    """
    flag: object = argparse.SUPPRESS if suppress else False
    count: object = argparse.SUPPRESS if suppress else 0
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-q", "--quiet", action="store_true", default=flag, help="no progress on stderr")
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=count,
        help="log statelog's key=value lines on stderr (-v: INFO, -vv: DEBUG)",
    )
    p.add_argument(
        "--traceback", action="store_true", default=flag, help="show the traceback of an error"
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, subcommands included."""
    parser = CliParser(
        prog="statelog",
        description="Operate statelog stores: see their state, verify every byte, plan or "
        "run a recovery, compact, dump, follow the log's changes, read the audit trail, "
        "drill crash recovery, restore a store from its remote copy, and promote a standby.",
        epilog=EXIT_CODES_HELP + "\nSee docs/cli.md for every subcommand.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_common(suppress=False)],
    )
    parser.add_argument(
        "--version", action="version", version=version_text(), help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parents = [_common(suppress=True)]
    for module in (inspect, verify, recover, compact, dump, tail, audit, drill, restore, promote):
        module.add_parser(sub, parents)
    return parser


def _setup_logging(verbose: int) -> logging.Handler | None:
    if not verbose:
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger("statelog")
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)
    return handler


def main(argv: list[str] | None = None) -> int:
    """Run ``statelog`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Every :class:`~statelog.errors.StatelogError` (and any other error)
    becomes one line on stderr with its hint, never a traceback unless
    ``--traceback`` is given.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help exits 0; a usage error exits EXIT_USAGE
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler = _setup_logging(args.verbose)
    try:
        with warnings.catch_warnings():
            # Each command reports what a recovery lost in its own output.
            warnings.simplefilter("ignore", DataLossWarning)
            return _RUN[args.command](args)
    except BrokenPipeError:
        # The reader went away (`statelog dump S | head`): stop quietly, as a
        # process killed by SIGPIPE would, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (Exception, KeyboardInterrupt) as exc:
        if args.traceback:
            import traceback

            traceback.print_exc(file=sys.stderr)
        return say_error(exc)
    finally:
        if handler is not None:
            logging.getLogger("statelog").removeHandler(handler)
