"""``statelog-compactor``: the compaction daemon (also ``python -m compactor``).

Life of the daemon, in order:

1. Parse options (:mod:`compactor.options`; bad ones exit 3); send
   structured log lines to stderr.
2. Block SIGTERM, SIGINT and SIGUSR1 (the wake) in the main thread. They stay pending
   until the daemon looks: between stores, between segments of a fold, and while it
   sleeps (``sigtimedwait``, which wakes at once). No handler runs at an arbitrary
   moment, so a stop never lands in the middle of a durable step.
3. The stores: each sharded root named (a directory holding ``SHARDS``) is
   replaced by its shard directories (:func:`statelog.sharding.partition.expand_stores`,
   which reads only manifests), then duplicates (by absolute path) are
   dropped. A manifest that cannot be read exits before any store is touched
   (1 if it is damaged, else 5).
4. With ``--metrics-port``, start the metrics server: its threads inherit
   the blocked signals, so a stop still reaches only the main thread. A port
   that cannot be bound exits 3 before any store is touched.
5. Rounds: for each store, read its identity and take its ``COMPACTOR.LOCK``
   the first time it is reached (then hold it for the daemon's whole life),
   and pass it: :func:`statelog.compaction.fold.compact`, or with ``--remote URL``
   ship, compact, ship (:func:`statelog.remote.ship`; shipping first means
   local retention never deletes a segment the remote lacks, and a ship
   that fails fails the pass before it compacts); and a child process
   ships every store every quarter ``--max-ship-lag`` beside the passes,
   the passes' own ships included (:class:`compactor.shipping.ShipLoop`;
   with ``--once``, the passes ship in this process). With ``--nice N``,
   the passes run N steps nicer. Then sleep ``--interval``
   seconds, unless some pass of the round wrote a snapshot: the writer may
   have sealed more log meanwhile, so the next round starts at once, and a
   busy store is folded back to back instead of an interval apart (SIGUSR1, which
   a writer sends the daemon it started on each seal, ends the sleep). A pass
   that fails is logged at ERROR and retried next round. A store fenced by
   a takeover (:class:`~statelog.errors.FencedError`) stops
   the daemon: exit 4 (busy).
6. A store whose lock another compactor holds is logged (``event=locked``,
   ERROR) and skipped; the next round tries its lock again, so it is
   served once the other compactor lets go. Only when every store was
   locked in the first round does the daemon exit 4. ``--once`` makes one
   round over every store, then exits: 4 if a store was locked, else the
   gravest status of the others (:func:`statelog.cli.exits.gravest`), else 0.
7. On SIGTERM or SIGINT: abandon the fold in progress at its next
   checkpoint (a snapshot already being written is finished: it is atomic),
   skip retention, let the ship process finish the ship in flight (killed
   after two minutes), remove the scratch space, release every lock, exit 0.

Exit codes are the ``statelog`` command's (:mod:`statelog.cli.exits`); which
outcome gives which: the epilog of ``statelog-compactor --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path

from compactor.options import (
    EXIT_BAD_OPTIONS,
    EXIT_FAILED,
    EXIT_FENCED,
    EXIT_LOCKED,
    EXIT_OK,
    build_parser,
    parse_args,
)
from compactor.serving import metrics_server as _metrics_server
from compactor.shipping import (
    STOP_SIGNALS,
    WAKE_SIGNAL,
    ShipFailedError,
    ShipLoop,
    fenced_exit,
    ship_store,
    wait_for_round,
)
from statelog.cli.exits import EXIT_DAMAGED, EXIT_UNRECOVERABLE, exit_code_for, gravest
from statelog.compaction.fold import compact
from statelog.compaction.lock import CompactorLock
from statelog.compaction.logfmt import LOGGER, KeyValueFormatter, kv
from statelog.errors import (
    CompactorLockedError,
    DataLossWarning,
    FencedError,
    StatelogError,
    StoreNotFoundError,
)
from statelog.remote import RemoteClient
from statelog.sharding.partition import expand_stores
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout

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

_ShipNow = Callable[[Path], None]
"""Ships one store now (a pass's ships): through the ship process, or in this one."""


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

    :param files: the file layer every durable step of this process goes through
        (tests substitute one that fails or dies at a chosen step); the ship
        process's own ships, ``--remote`` without ``--once``, use the plain one.
    """
    args, client = parse_args(argv)
    handler = _setup_logging("DEBUG" if args.verbose else args.log_level)
    # Wakes are taken by sigtimedwait; the handler only keeps a late one from ending us.
    handler_before = signal.signal(WAKE_SIGNAL, lambda signum, frame: None)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS | {WAKE_SIGNAL})
    locks: dict[Path, CompactorLock] = {}
    try:
        stores = _stores(args.stores)
        if isinstance(stores, int):
            return stores
        with _metrics_server(args, stores) as started, warnings.catch_warnings():
            warnings.simplefilter("ignore", DataLossWarning)  # its passes log what they found
            if not started:
                return EXIT_BAD_OPTIONS
            return _run(args, stores, files or FileLayer(), locks, client)
    except Exception as exc:  # a bug: say it on one line, exit non-zero
        log.critical("%s", kv(event="crashed", error=repr(exc)), exc_info=True)
        return EXIT_FAILED
    finally:
        for lock in locks.values():
            lock.release()
        while _stopping():  # consume, so unblocking does not kill us now
            signal.sigtimedwait(STOP_SIGNALS, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        signal.signal(WAKE_SIGNAL, handler_before)
        logging.getLogger("statelog").removeHandler(handler)


def _stores(given: Sequence[Path]) -> list[Path] | int:
    """The stores to serve: sharded roots expanded to their shards, duplicates dropped.

    An exit status instead (after logging ``event=shards_unreadable``) when a
    root's ``SHARDS`` cannot be read: its shards are unknown, and serving the
    other stores would hide that they are never compacted.
    """
    found: list[Path] = []
    for path in given:
        try:
            found.extend(expand_stores([path]))
        except StatelogError as exc:  # damaged, of a newer version, or an I/O error
            root = os.path.abspath(path)
            log.error("%s", kv(event="shards_unreadable", store=root, error=str(exc)))
            return exit_code_for(exc)
    return list(dict.fromkeys(Path(os.path.abspath(s)) for s in found))


def _run(
    args: argparse.Namespace,
    stores: list[Path],
    files: FileLayer,
    locks: dict[Path, CompactorLock],
    client: RemoteClient | None,
) -> int:
    """The rounds of passes (steps 5-6 of the module docstring); returns the exit status."""
    log.info(
        "%s",
        kv(
            event="started", pid=os.getpid(), stores=len(stores), interval=args.interval,
            min_tail_bytes=args.min_tail_bytes, min_tail_records=args.min_tail_records,
            retain=args.retain, retain_for=_seconds(args.retain_for), max_chain=args.max_chain,
            full_ratio=args.full_ratio, nice=args.nice, once=args.once, remote=args.remote,
            remote_retain=args.remote_retain, remote_retain_for=_seconds(args.remote_retain_for),
            max_ship_lag=_seconds(args.max_ship_lag) if args.remote else None,
        ),
    )  # fmt: skip
    shipper = None if client is None or args.once else ShipLoop(args)
    ship_now: _ShipNow | None = None
    if shipper is not None:
        shipper.start()  # before the passes' thread is made nicer: the child keeps the priority
        ship_now = shipper.ship
    elif client is not None:  # --once: the passes' own ships, in this process

        def ship_now(store: Path) -> None:
            ship_store(store, args, files, client)

    try:
        with nicer(args.nice):
            return _rounds(args, stores, files, locks, shipper, ship_now)
    finally:
        if shipper is not None:
            shipper.stop()


def _rounds(
    args: argparse.Namespace,
    stores: list[Path],
    files: FileLayer,
    locks: dict[Path, CompactorLock],
    shipper: ShipLoop | None,
    ship_now: _ShipNow | None,
) -> int:
    """Rounds of passes until a stop signal, ``--once`` or a fence; returns the exit status."""
    first = True
    while True:
        folded = 0
        failed: list[int] = []  # the exit status of each store that failed this round
        # Stores another compactor held when this round tried them.
        locked: dict[Path, CompactorLockedError] = {}
        for store in stores:
            if _stopping():
                break
            if store not in locks:
                status = _acquire(store, files, locks, locked, once=args.once)
                if status != EXIT_OK and store not in locked:
                    failed.append(status)
                if status != EXIT_OK:
                    continue
            try:
                if shipper is not None and shipper.fenced is not None:
                    return fenced_exit(*shipper.fenced)
                wrote, status = _pass(store, args, files, locks[store], ship_now)
                failed += [status] if status != EXIT_OK else []
                folded += wrote
            except FencedError as exc:
                # A round ship of another store may be what found the takeover.
                found = shipper.fenced if shipper is not None else None
                return fenced_exit(*(found or (store, exc)))
        if _stopping():
            break
        if args.once:
            log.info(
                "%s",
                kv(event="once_done", stores=len(stores), failed=len(failed), locked=len(locked)),
            )
            if locked:
                _say_locked(locked, everything=len(locked) == len(stores))
                return EXIT_LOCKED
            return gravest(failed)
        if first and len(locked) == len(stores):
            # Nothing to serve: a daemon waiting on locks it may never get
            # would look healthy while compacting nothing.
            _say_locked(locked, everything=True)
            return EXIT_LOCKED
        first = False
        if wait_for_round(0 if folded else args.interval, shipper):
            break
        if shipper is not None and shipper.fenced is not None:
            return fenced_exit(*shipper.fenced)
    log.info("%s", kv(event="stopped", reason="signal", pid=os.getpid()))
    return EXIT_OK


def _say_locked(locked: dict[Path, CompactorLockedError], *, everything: bool) -> None:
    """The plain lines before exit 4: one per store another compactor holds."""
    why = "" if everything else "; it was not passed, the other stores were"
    for exc in locked.values():
        print(
            f"statelog-compactor: {exc.message}{why}; exiting (status {EXIT_LOCKED})",
            file=sys.stderr,
        )


def _acquire(
    store: Path,
    files: FileLayer,
    locks: dict[Path, CompactorLock],
    locked: dict[Path, CompactorLockedError],
    *,
    once: bool,
) -> int:
    """Take ``store``'s compactor lock into ``locks``.

    :returns: EXIT_OK; EXIT_LOCKED (another compactor holds it: logged, and
        recorded in ``locked``); or the status of the error that made it unusable.
    """
    try:
        StoreLayout(store).read_identity(files)
        locks[store] = CompactorLock(store)
    except CompactorLockedError as exc:
        log.error("%s", kv(event="locked", store=store, pid=exc.pid, hint=exc.command_hint))
        locked[store] = exc
        return EXIT_LOCKED
    except StoreNotFoundError as exc:
        level = logging.ERROR if once else logging.WARNING
        log.log(level, "%s", kv(event="store_missing", store=store, error=exc.message))
        return exit_code_for(exc)
    except (StatelogError, OSError) as exc:
        log.error("%s", kv(event="store_unusable", store=store, error=str(exc)))
        return exit_code_for(exc)
    log.info("%s", kv(event="locked_store", store=store, lock=locks[store].path.name))
    return EXIT_OK


@contextlib.contextmanager
def nicer(steps: int) -> Iterator[None]:
    """Run the body with the calling thread (the passes') ``steps`` nicer, up to 19.

    A pass is background work that uses every cycle it gets: a full merge of a
    large store runs for seconds. On a host whose cores the writers keep busy, at
    the daemon's own priority it takes an equal share from them; nicer, it takes
    what they leave. The ship process and the metrics server's threads keep the
    daemon's priority (started before). Only this thread changes (on Linux,
    ``setpriority`` on a thread id is per thread), and its priority is put back
    on the way out where the system allows it (raising it needs privilege; the
    daemon is leaving then anyway). A refusal is logged, not fatal; 0: unchanged.
    """
    tid = threading.get_native_id()
    before = None
    if steps > 0:
        try:
            before = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, before + steps))
        except OSError as exc:
            log.warning("%s", kv(event="nice_refused", steps=steps, error=str(exc)))
            before = None
    try:
        yield
    finally:
        if before is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, before)


def _seconds(window: timedelta | None) -> str | None:
    """A retention window as the ``started`` line shows it: ``1800s`` (None: off, ``-``)."""
    return None if window is None else f"{window.total_seconds():g}s"


def _pass(
    store: Path,
    args: argparse.Namespace,
    files: FileLayer,
    lock: CompactorLock,
    ship_now: _ShipNow | None,
) -> tuple[bool, int]:
    """One pass over ``store`` (with ``ship_now``: ship, compact, ship).

    :returns: whether it wrote a snapshot, and the pass's exit status (as for
        ``statelog compact``: 1 damage walked past, 2 no base, 5 failed).

    :raises FencedError: shipping found the store taken over; nothing was uploaded
        by the call that found it.
    """
    try:
        if ship_now is not None:
            ship_now(store)
        result = compact(
            store,
            files=files,
            min_tail_bytes=args.min_tail_bytes,
            min_tail_records=args.min_tail_records,
            retain=args.retain,
            retain_for=args.retain_for,
            level=args.level,
            max_chain=args.max_chain,
            full_ratio=args.full_ratio,
            lock=lock,
            stop=_stopping,
        )
        if ship_now is not None and not _stopping():
            ship_now(store)
    except FencedError:
        raise
    except (StatelogError, OSError) as exc:
        log.error("%s", kv(event="pass_failed", store=store, error=str(exc)))
        return False, exc.status if isinstance(exc, ShipFailedError) else exit_code_for(exc)
    except Exception as exc:  # e.g. lmdb.Error (a full disk under the scratch image)
        log.error("%s", kv(event="pass_failed", store=store, error=repr(exc)), exc_info=True)
        return False, EXIT_FAILED
    damaged = EXIT_DAMAGED if result.damaged or result.skipped == "damaged" else EXIT_OK
    return (
        result.snapshot is not None,
        EXIT_UNRECOVERABLE if result.skipped == "no_base" else damaged,
    )
