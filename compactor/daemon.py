"""``statelog-compactor``: the compaction daemon (also ``python -m compactor``).

Life of the daemon, in order:

1. Parse options; send structured log lines to stderr.
2. Block SIGTERM and SIGINT in the main thread. They stay pending until the
   daemon looks: between stores, between segments of a fold, and while it
   sleeps (``sigtimedwait``, which wakes at once). No handler runs at an
   arbitrary moment, so a stop never lands in the middle of a durable step.
   With ``--metrics-port``, start the metrics server now: its threads
   inherit the blocked signals, so a stop still reaches only the main
   thread. A port that cannot be bound exits 2 before any store is touched.
3. For each store named: read its identity, then take its
   ``COMPACTOR.LOCK`` for the daemon's whole life. Held by another
   compactor: say so and exit 3 (locks already taken are released).
4. Passes: :func:`compactor.fold.compact` on each store in turn, then sleep
   ``--interval`` seconds. A pass that fails is logged at ERROR and retried
   at the next interval (``--once``: exit 1 after the pass). With
   ``--remote URL`` a pass is ship, compact, ship (:func:`statelog.remote.ship`):
   shipping first means local retention never deletes a segment the remote
   lacks; a ship that fails fails the pass before it compacts. A store
   fenced by a takeover (:class:`~statelog.errors.FencedError`) stops the
   daemon: exit 4.
5. On SIGTERM or SIGINT: abandon the fold in progress at its next
   checkpoint (a snapshot already being written is finished: it is atomic),
   skip retention, remove the scratch space, release every lock, exit 0.

Exit codes: 0 done or stopped by a signal; 1 a pass failed or a store is
missing (``--once``), or an unexpected error; 2 bad options; 3 a store is
locked by another compactor; 4 a store was taken over by another host
(fenced) while shipping to ``--remote``.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import start_http_server
from prometheus_client.registry import Collector

from statelog import metrics
from statelog.errors import CompactorLockedError, FencedError, StatelogError, StoreNotFoundError
from statelog.fileio import FileLayer
from statelog.layout import StoreLayout

from .fold import compact
from .lock import CompactorLock
from .logfmt import LOGGER, KeyValueFormatter, kv

if TYPE_CHECKING:
    from statelog.remote import RemoteClient

__all__ = [
    "EXIT_BAD_OPTIONS",
    "EXIT_FAILED",
    "EXIT_FENCED",
    "EXIT_LOCKED",
    "EXIT_OK",
    "build_parser",
    "main",
]

log = logging.getLogger(LOGGER)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_OPTIONS = 2
EXIT_LOCKED = 3
EXIT_FENCED = 4
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30}
_UNITS["gib"] = 1 << 30

_EPILOG = """\
exit status:
  0  --once pass done, or stopped by SIGTERM/SIGINT (graceful: locks released)
  1  a pass failed (--once), a store is missing (--once), or an unexpected error
  2  bad options, or the --metrics-port cannot be bound (in use, bad address)
  3  a store is already being compacted by another compactor (its pid is named)
  4  --remote: a store was taken over by another host (fenced); stop this daemon

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
    p.add_argument("stores", nargs="+", metavar="STORE", type=Path, help="store directories")
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
    p.add_argument("--level", type=_bounded(1, int), default=3, help="zstd level, 1-22 (3)")
    p.add_argument("--once", action="store_true", help="one pass over every store, then exit")
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


def _stopping() -> bool:
    return bool(signal.sigpending() & STOP_SIGNALS)


def _setup_logging(level: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger("statelog")
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def main(argv: Sequence[str] | None = None, *, files: FileLayer | None = None) -> int:
    """Run the daemon (steps in the module docstring); return the exit status.

    :param files: the file layer every durable step goes through (tests
        substitute one that fails or dies at a chosen step).
    """
    args = build_parser().parse_args(argv)
    if args.level > 22:
        build_parser().error(f"--level {args.level}: zstd levels go up to 22")
    if args.remote_retain is not None and args.remote is None:
        build_parser().error("--remote-retain needs --remote")
    client = None
    if args.remote is not None:
        from statelog.remote import RemoteClient  # only a remote daemon loads the client

        try:
            client = RemoteClient.from_url(args.remote)
        except StatelogError as exc:
            build_parser().error(f"--remote {args.remote}: {exc.message} (hint: {exc.hint})")
    handler = _setup_logging("DEBUG" if args.verbose else args.log_level)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    locks: dict[Path, CompactorLock] = {}
    try:
        with _metrics_server(args) as started:
            if not started:
                return EXIT_BAD_OPTIONS
            return _run(args, files or FileLayer(), locks, client)
    except Exception as exc:  # a bug: say it on one line, exit non-zero
        log.critical("%s", kv(event="crashed", error=repr(exc)), exc_info=True)
        return EXIT_FAILED
    finally:
        for lock in locks.values():
            lock.release()
        while _stopping():  # consume, so unblocking does not kill us now
            signal.sigtimedwait(STOP_SIGNALS, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        logging.getLogger("statelog").removeHandler(handler)


@contextmanager
def _metrics_server(args: argparse.Namespace) -> Iterator[bool]:
    """Serve :data:`statelog.metrics.REGISTRY` while the daemon runs, if ``--metrics-port``.

    Called with the stop signals blocked, so the server's threads never
    take a SIGTERM meant for the main thread. Yields False (after saying
    why on stderr) when the port cannot be bound; the server is shut down
    and its socket closed on the way out.
    """
    metrics.install()
    stores = [Path(os.path.abspath(s)) for s in args.stores]
    for store in stores:
        metrics.watch(store)
    try:
        if args.metrics_port is None:
            yield True
            return
        try:
            server, thread = start_http_server(
                args.metrics_port, addr=args.metrics_addr, registry=metrics.REGISTRY
            )
        except OSError as exc:
            why = "address already in use" if exc.errno == errno.EADDRINUSE else str(exc)
            where = f"{args.metrics_addr} port {args.metrics_port}"
            port = args.metrics_port
            log.error(
                "%s", kv(event="metrics_unavailable", addr=args.metrics_addr, port=port, error=why)
            )
            print(
                f"statelog-compactor: cannot serve metrics on {where}: {why}; pick a free "
                "--metrics-port or stop the program holding it (exiting, status 2)",
                file=sys.stderr,
            )
            yield False
            return
        port = server.server_port
        log.info(
            "%s", kv(event="metrics_serving", addr=args.metrics_addr, port=port, path="/metrics")
        )
        lag = _lag_collector(stores) if args.remote is not None else None
        try:
            yield True
        finally:
            if lag is not None:
                metrics.REGISTRY.unregister(lag)
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
    finally:
        for store in stores:
            metrics.unwatch(store)


def _lag_collector(stores: list[Path]) -> Collector:
    """Register the shipping-lag gauges of ``stores`` (unregistered when the server stops)."""
    from statelog.remote import LagCollector

    # The same ``store`` label as every other per-store series: the resolved path.
    lag = LagCollector([Path(metrics.store_label(s)) for s in stores])
    metrics.REGISTRY.register(lag)
    return lag


def _run(
    args: argparse.Namespace,
    files: FileLayer,
    locks: dict[Path, CompactorLock],
    client: RemoteClient | None,
) -> int:
    stores: list[Path] = list(dict.fromkeys(Path(os.path.abspath(s)) for s in args.stores))
    log.info(
        "%s",
        kv(
            event="started", pid=os.getpid(), stores=len(stores), interval=args.interval,
            min_tail_bytes=args.min_tail_bytes, min_tail_records=args.min_tail_records,
            retain=args.retain, once=args.once, remote=args.remote,
            remote_retain=args.remote_retain,
        ),
    )  # fmt: skip
    while True:
        failed = 0
        for store in stores:
            if _stopping():
                break
            if store not in locks:
                status = _acquire(store, files, locks, once=args.once)
                if status == EXIT_LOCKED:
                    return EXIT_LOCKED
                if status != EXIT_OK:
                    failed += 1
                    continue
            try:
                if not _pass(store, args, files, locks[store], client):
                    failed += 1
            except FencedError as exc:
                log.error(
                    "%s",
                    kv(event="fenced", store=store, generation=exc.ours, current=exc.current,
                       hint=exc.hint),
                )  # fmt: skip
                print(
                    f"statelog-compactor: {store} was taken over by another host (generation "
                    f"{exc.current}, this store holds {exc.ours}); stop this daemon and the "
                    "writer here (exiting, status 4)",
                    file=sys.stderr,
                )
                return EXIT_FENCED
        if _stopping():
            break
        if args.once:
            log.info("%s", kv(event="once_done", stores=len(stores), failed=failed))
            return EXIT_FAILED if failed else EXIT_OK
        if signal.sigtimedwait(STOP_SIGNALS, args.interval) is not None:
            break
    log.info("%s", kv(event="stopped", reason="signal", pid=os.getpid()))
    return EXIT_OK


def _acquire(store: Path, files: FileLayer, locks: dict[Path, CompactorLock], *, once: bool) -> int:
    """Take ``store``'s compactor lock: EXIT_OK, EXIT_LOCKED, or EXIT_FAILED (not a store)."""
    try:
        StoreLayout(store).read_identity(files)
        locks[store] = CompactorLock(store)
    except CompactorLockedError as exc:
        log.error("%s", kv(event="locked", store=store, pid=exc.pid, hint=exc.hint))
        print(f"statelog-compactor: {exc.message}; exiting (status 3)", file=sys.stderr)
        return EXIT_LOCKED
    except StoreNotFoundError as exc:
        level = logging.ERROR if once else logging.WARNING
        log.log(level, "%s", kv(event="store_missing", store=store, error=exc.message))
        return EXIT_FAILED
    except (StatelogError, OSError) as exc:
        log.error("%s", kv(event="store_unusable", store=store, error=str(exc)))
        return EXIT_FAILED
    log.info("%s", kv(event="locked_store", store=store, lock=locks[store].path.name))
    return EXIT_OK


def _pass(
    store: Path,
    args: argparse.Namespace,
    files: FileLayer,
    lock: CompactorLock,
    client: RemoteClient | None,
) -> bool:
    """One pass over ``store`` (with ``client``: ship, compact, ship); False if it failed.

    :raises FencedError: shipping found the store taken over; nothing was uploaded
        by the call that found it.
    """
    try:
        if client is not None:
            _ship(store, args, files, client)
        compact(
            store,
            files=files,
            min_tail_bytes=args.min_tail_bytes,
            min_tail_records=args.min_tail_records,
            retain=args.retain,
            level=args.level,
            lock=lock,
            stop=_stopping,
        )
        if client is not None and not _stopping():
            _ship(store, args, files, client)
    except FencedError:
        raise
    except (StatelogError, OSError) as exc:
        log.error("%s", kv(event="pass_failed", store=store, error=str(exc)))
        return False
    except Exception as exc:  # e.g. lmdb.Error (a full disk under the scratch image)
        log.error("%s", kv(event="pass_failed", store=store, error=repr(exc)), exc_info=True)
        return False
    return True


def _ship(store: Path, args: argparse.Namespace, files: FileLayer, client: RemoteClient) -> None:
    """Ship ``store`` to ``--remote`` (the library logs ``event=shipped``)."""
    from statelog.remote import ship

    ship(store, args.remote, retain=args.remote_retain, client=client, files=files)
