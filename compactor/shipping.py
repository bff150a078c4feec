"""The daemon's shipping: one store to ``--remote``, in a process of its own.

Shipping runs every quarter ``--max-ship-lag`` beside the passes (which stay
``--interval`` apart): the writers seal by age at half their bound, so what
they commit reaches the bucket within about ``--max-ship-lag`` even while a
long pass runs. It runs in a child process, not a thread: a full merge keeps
the daemon's interpreter busy for seconds, and a ship thread beside it waits
for the GIL after every read, hash and request, and the sealed log waits
behind the merge. The passes' own ships go through the same process, so
one store's ships never overlap.

A round skips a store with nothing new to ship since its last ship that
succeeded (:mod:`compactor.idle`: the newest segment only growing is nothing new,
since nothing ships it before its seal): that ship took everything there was, and
asking the bucket again would cost a request every quarter bound for every
store. Every :data:`IDLE_RECHECK` bounds each store is shipped all the
same (as it is by its passes), so a takeover of an idle store is still
noticed, and time-based remote retention still runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path

from compactor.idle import Idle, local_state
from compactor.options import EXIT_FAILED, EXIT_FENCED
from statelog.cli.exits import exit_code_for
from statelog.compaction.logfmt import LOGGER, KeyValueFormatter, kv
from statelog.errors import FencedError, StatelogError
from statelog.remote import RemoteClient, ship
from statelog.storage.fileio import FileLayer, ReadBuffer

__all__ = [
    "IDLE_RECHECK",
    "STOP_SIGNALS",
    "WAKE_SIGNAL",
    "ShipFailedError",
    "ShipLoop",
    "fenced_exit",
    "ship_store",
    "wait_for_round",
]

log = logging.getLogger(LOGGER)

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""The signals that stop the daemon (blocked, and waited for with ``sigtimedwait``)."""
WAKE_SIGNAL = signal.SIGUSR1
"""The signal that starts the daemon's next round now (blocked like the stop signals):
a writer that started the daemon as its child sends it when it seals a segment."""
_STOP_WAIT = 120.0
"""Seconds :meth:`ShipLoop.stop` waits for a ship in flight before killing the process."""

_Reply = tuple[str, ...] | tuple[str, str, str, int, int, str]
"""A message from the child: ``done``, ``failed`` (status, message, hint), ``fenced``."""


IDLE_RECHECK = 10
"""A store with nothing new on this host is shipped anyway every this many ``--max-ship-lag``."""


class ShipFailedError(StatelogError):
    """A ship through :class:`ShipLoop` failed; ``status`` is the exit status its error maps to."""

    hint = "see the ship process's event=ship_failed line; the next round ships again"

    def __init__(self, message: str, status: int, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status


class ShipLoop:
    """Ships every store the daemon passed every quarter ``--max-ship-lag``, in a child process.

    :meth:`ship` asks the child to ship one store now and waits for it (a
    pass ships before and after it compacts); each store shipped that way is
    shipped by the child's rounds from then on, and by a child started again
    after one was lost (noticed by :attr:`fenced`, which the daemon reads at
    least every half second). A failed round ship is logged and tried again;
    a takeover (:class:`FencedError`) ends the child, and is kept in
    :attr:`fenced` for the daemon to act on. The child ignores the daemon's
    stop signals (its mask is inherited), ends when told by :meth:`stop`, and
    ends by itself when the daemon is gone (its socket closes).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._fenced: tuple[Path, FencedError] | None = None
        self._conn: Connection | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stores: list[Path] = []
        self._nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        # Every child is spawned by this one thread, made on the first start (before the
        # daemon makes the passes' thread nicer): a child started again from a pass keeps
        # the daemon's priority, which an unprivileged child could not take back.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ship-spawner")

    def start(self) -> None:
        """Start the child process (``python -P -m compactor.shipping FD``: no directory
        of the caller's shadows the installed package), the options, the stores and the
        daemon's priority sent over the socket ``FD``; it inherits the blocked stop signals
        and the priority of the thread that first called this."""
        ours, theirs = socket.socketpair()
        with ours, theirs:
            proc = self._spawner.submit(
                subprocess.Popen,
                [sys.executable, "-P", "-m", "compactor.shipping", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            ).result()  # fmt: skip
            conn = Connection(ours.detach())
        self._conn, self._proc = conn, proc
        conn.send((self._args, [str(p) for p in self._stores], self._nice))
        log.info("%s", kv(event="ship_process_started", pid=proc.pid))

    def _alive(self) -> None:
        """Start the child again if it was lost (a bug, an OOM kill), unless it was fenced."""
        if self._proc is None or self._proc.poll() is None or self._fenced is not None:
            return
        log.error("%s", kv(event="ship_process_lost", status=self._proc.returncode))
        self._close()
        self.start()

    @property
    def fenced(self) -> tuple[Path, FencedError] | None:
        """The store a round ship found taken over, and the error; None while none was.

        Reading it also starts a lost child again."""
        if self._fenced is None and self._conn is not None:
            try:
                while self._conn.poll(0):
                    self._take(self._conn.recv())
            except (EOFError, OSError):
                pass
            self._alive()
        return self._fenced

    def ship(self, store: Path) -> None:
        """Ship ``store`` now, in the child (between two of its round ships).

        :raises FencedError: a store was taken over by another host (:attr:`fenced`
            says which: a round ship may have found another one).
        :raises ShipFailedError: the ship failed, or the child ended during it.
        """
        if self.fenced is not None:
            raise self.fenced[1]
        self._stores += [] if store in self._stores else [store]
        assert self._conn is not None and self._proc is not None
        try:
            self._conn.send(("ship", str(store)))
            while self._fenced is None:
                if not self._conn.poll(0.5):
                    if self._proc.poll() is not None:
                        raise EOFError(f"exit status {self._proc.returncode}")
                    continue
                reply = self._conn.recv()
                if reply[0] == "done":
                    return
                if reply[0] == "failed":
                    _kind, status, message, hint = reply
                    raise ShipFailedError(str(message), int(status), hint=str(hint))
                self._take(reply)
        except (EOFError, OSError) as exc:
            if self._fenced is None:
                raise ShipFailedError(f"the ship process ended: {exc}", EXIT_FAILED) from None
        assert self._fenced is not None
        raise self._fenced[1]

    def _take(self, reply: _Reply) -> None:
        """Keep a ``fenced`` message from the child; others are not expected here."""
        if reply[0] == "fenced":
            _kind, store, message, ours, current, hint = reply
            self._fenced = (
                Path(store),
                FencedError(str(message), ours=int(ours), current=int(current), hint=str(hint)),
            )

    def stop(self) -> None:
        """End the child: the ship in flight finishes first (killed after two minutes)."""
        if self._proc is None or self._conn is None:
            return
        with contextlib.suppress(OSError):  # gone already
            self._conn.send(("stop",))
        try:
            self._proc.wait(_STOP_WAIT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn, self._proc = None, None


def _serve(conn: Connection, args: argparse.Namespace, stores: list[Path]) -> None:
    """The child: ship what :meth:`ShipLoop.ship` asks, and every store it named each period
    (an idle one every :data:`IDLE_RECHECK` bounds: the module docstring).

    Requests are served between two stores of a round, so a pass waits for at most one
    ship of another store.
    """
    client, files = RemoteClient.from_url(args.remote), FileLayer()
    period = args.max_ship_lag.total_seconds() / 4
    idle = Idle(IDLE_RECHECK * args.max_ship_lag.total_seconds())
    due = time.monotonic() + period
    try:
        while _requests(conn, stores, args, files, client, max(0.0, due - time.monotonic())):
            due = time.monotonic() + period
            for store in list(stores):
                if not _requests(conn, stores, args, files, client, 0.0):
                    return
                # Read before the ship: a segment sealed while it runs differs next round.
                before = local_state(store)
                if idle.unchanged(store, before):
                    continue
                reply = _ship_reply(store, args, files, client)
                if reply[0] == "fenced":
                    conn.send(reply)
                    return
                idle.shipped(store, before if reply[0] == "done" else None)
    except (EOFError, OSError):
        return  # the daemon is gone: nothing is left to ship for


def _requests(
    conn: Connection,
    stores: list[Path],
    args: argparse.Namespace,
    files: FileLayer,
    client: RemoteClient,
    wait: float,
) -> bool:
    """Serve the requests that arrive within ``wait`` seconds (or are waiting now).

    :returns: False when the child must end: told to stop, or fenced.
    :raises EOFError: the daemon is gone.
    """
    while conn.poll(wait):
        ask = conn.recv()
        if ask[0] != "ship":
            return False
        store = Path(ask[1])
        stores += [] if store in stores else [store]
        reply = _ship_reply(store, args, files, client)
        conn.send(reply)
        if reply[0] == "fenced":
            return False
        wait = 0.0
    return True


def _ship_reply(
    store: Path, args: argparse.Namespace, files: FileLayer, client: RemoteClient
) -> _Reply:
    """Ship ``store``; the reply to send: ``done``, ``failed`` (status, text) or ``fenced``."""
    try:
        ship_store(store, args, files, client)
    except FencedError as exc:
        return ("fenced", str(store), exc.reason, exc.ours, exc.current, exc.hint)
    except (StatelogError, OSError) as exc:
        log.error("%s", kv(event="ship_failed", store=store, error=str(exc)))
        if isinstance(exc, StatelogError):
            return ("failed", str(exit_code_for(exc)), exc.message, exc.hint)
        return ("failed", str(exit_code_for(exc)), str(exc), ShipFailedError.hint)
    except Exception as exc:  # a bug must not end the shipping silently
        log.error("%s", kv(event="ship_failed", store=store, error=repr(exc)), exc_info=True)
        return ("failed", str(EXIT_FAILED), repr(exc), ShipFailedError.hint)
    return ("done",)


def wait_for_round(seconds: float, shipper: ShipLoop | None) -> bool:
    """Wait ``seconds`` for the next round, waking early if the ship loop was fenced
    or :data:`WAKE_SIGNAL` arrives (one that arrived during the round ends the wait
    at once, so a wake is never lost). A stop that arrives with a wake stays pending
    for the round's own look (``_stopping``).

    :returns: whether a stop signal arrived.
    """
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        got = signal.sigtimedwait(_WAITED, max(0.0, min(left, 0.5)))
        if got is not None:
            return got.si_signo != WAKE_SIGNAL
        if left <= 0.5 or (shipper is not None and shipper.fenced is not None):
            return False


_WAITED = STOP_SIGNALS | {WAKE_SIGNAL}


def ship_store(
    store: Path, args: argparse.Namespace, files: FileLayer, client: RemoteClient
) -> None:
    """Ship ``store`` to ``--remote`` (the library logs ``event=shipped``)."""
    ship(
        store, args.remote, retain=args.remote_retain, retain_for=args.remote_retain_for,
        client=client, files=files, reads=_READS,
    )  # fmt: skip


_READS = ReadBuffer()
"""One buffer for every segment this process reads to ship (ships follow one another):
it stays the size of the largest segment shipped, in the shipping process only."""


def fenced_exit(store: Path, exc: FencedError) -> int:
    """Log and say that ``store`` was taken over; the daemon's exit status for it."""
    log.error(
        "%s",
        kv(event="fenced", store=store, generation=exc.ours, current=exc.current, hint=exc.hint),
    )
    print(
        f"statelog-compactor: {store} was taken over by another host (generation "
        f"{exc.current}, this store holds {exc.ours}); stop this daemon and the "
        "writer here (exiting, status 4)",
        file=sys.stderr,
    )
    return EXIT_FENCED


def _main(argv: list[str]) -> None:
    """``python -P -m compactor.shipping FD``: the child of :meth:`ShipLoop.start`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the daemon stops it
    conn = Connection(int(argv[0]))
    try:
        args, stores, nice = conn.recv()
    except (EOFError, OSError):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    logging.getLogger("statelog").addHandler(handler)
    logging.getLogger("statelog").setLevel(args.log_level)
    if os.getpriority(os.PRIO_PROCESS, 0) != nice:  # not spawned at the daemon's priority
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError as exc:  # raising a priority needs privilege
            log.warning("%s", kv(event="nice_refused", nice=nice, error=str(exc)))
        else:
            log.info("%s", kv(event="ship_priority_restored", nice=nice))
    _serve(conn, args, [Path(p) for p in stores])


if __name__ == "__main__":
    _main(sys.argv[1:])
