"""The daemon's shipping: one store to ``--remote``, in a process of its own.

Shipping runs every quarter ``--max-ship-lag`` beside the passes (which stay
``--interval`` apart): the writers seal by age at half their bound, so what
they commit reaches the bucket within about ``--max-ship-lag`` even while a
long pass runs. It runs in a child process, not a thread: a full merge keeps
the daemon's interpreter busy for seconds, and a ship thread beside it waits
for the GIL after every read, hash and request (ships of one segment took
0.2 s beside a pass where they take 0.03 s alone). The passes' own ships go
through the same process, so one store's ships never overlap.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

from compactor.options import EXIT_FAILED, EXIT_FENCED
from statelog.cli.exits import exit_code_for
from statelog.compaction.logfmt import LOGGER, KeyValueFormatter, kv
from statelog.errors import FencedError, StatelogError
from statelog.remote import RemoteClient, ship
from statelog.storage.fileio import FileLayer

__all__ = [
    "STOP_SIGNALS",
    "ShipFailedError",
    "ShipLoop",
    "fenced_exit",
    "ship_store",
    "wait_for_round",
]

log = logging.getLogger(LOGGER)

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""The signals that stop the daemon (blocked, and waited for with ``sigtimedwait``)."""
_STOP_WAIT = 120.0
"""Seconds :meth:`ShipLoop.stop` waits for a ship in flight before killing the process."""

_Reply = tuple[str, ...] | tuple[str, str, str, int, int, str]


class ShipFailedError(StatelogError):
    """A ship through :class:`ShipLoop` failed; ``status`` is the exit status its error maps to."""

    hint = "see the daemon's event=ship_failed line; the next round ships again"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ShipLoop:
    """Ships every store the daemon passed every quarter ``--max-ship-lag``, in a child process.

    :meth:`ship` asks the child to ship one store now and waits for it (a
    pass ships before and after it compacts); each store shipped that way is
    shipped by the child's rounds from then on. A failed round ship is logged
    and tried again; a takeover (:class:`FencedError`) ends the child, and is
    kept in :attr:`fenced` for the daemon to act on. The child ignores the
    daemon's stop signals (its mask is inherited), ends when told by
    :meth:`stop`, and ends by itself when the daemon is gone (its pipe closes).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._fenced: tuple[Path, FencedError] | None = None
        self._conn: Connection | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the child process (``python -m compactor.shipping FD``, the options
        sent over the socket ``FD``); it inherits the daemon's blocked stop signals."""
        ours, theirs = socket.socketpair()
        with ours, theirs:
            proc = subprocess.Popen(
                [sys.executable, "-m", "compactor.shipping", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            )  # fmt: skip
            conn = Connection(ours.detach())
        self._conn, self._proc = conn, proc
        conn.send(self._args)
        log.info("%s", kv(event="ship_process_started", pid=proc.pid))

    @property
    def fenced(self) -> tuple[Path, FencedError] | None:
        """The store a round ship found taken over, and the error; None while none was."""
        if self._fenced is None and self._conn is not None:
            try:
                while self._conn.poll(0):
                    self._take(self._conn.recv())
            except (EOFError, OSError):
                pass
        return self._fenced

    def ship(self, store: Path) -> None:
        """Ship ``store`` now, in the child (serialised with its rounds).

        A child that died (a bug, an OOM kill) is started again first.

        :raises FencedError: the store was taken over by another host.
        :raises ShipFailedError: the ship failed; ``status`` is its exit status.
        """
        if self.fenced is not None:
            raise self.fenced[1]
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:
                log.error("%s", kv(event="ship_process_lost", status=self._proc.returncode))
                self._close()
            self.start()
        assert self._conn is not None
        try:
            self._conn.send(("ship", str(store)))
            while True:
                reply = self._conn.recv()
                if reply[0] == "fenced":
                    self._take(reply)
                    break
                if reply[0] == "done":
                    return
                if reply[0] == "failed":
                    raise ShipFailedError(reply[2], int(reply[1]))
        except (EOFError, OSError) as exc:
            if self._fenced is None:
                raise ShipFailedError(f"the ship process ended: {exc!r}", EXIT_FAILED) from None
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
        """End the child; a ship in flight finishes first (killed after two minutes)."""
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


def _serve(conn: Connection, args: argparse.Namespace) -> None:
    """The child: ship what :meth:`ShipLoop.ship` asks, and every store it named each period."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    logging.getLogger("statelog").addHandler(handler)
    logging.getLogger("statelog").setLevel(args.log_level)
    client, files = RemoteClient.from_url(args.remote), FileLayer()
    stores: list[Path] = []
    period = args.max_ship_lag.total_seconds() / 4
    due = time.monotonic() + period
    while True:
        try:
            if conn.poll(max(0.0, due - time.monotonic())):
                ask = conn.recv()
                if ask[0] != "ship":
                    return
                store = Path(ask[1])
                stores += [] if store in stores else [store]
                reply = _ship_reply(store, args, files, client)
                conn.send(reply)
                if reply[0] == "fenced":
                    return
                continue
            due = time.monotonic() + period
            for store in stores:
                reply = _ship_reply(store, args, files, client)
                if reply[0] == "fenced":
                    conn.send(reply)
                    return
        except (EOFError, OSError):
            return  # the daemon is gone: nothing is left to ship for


def _ship_reply(
    store: Path, args: argparse.Namespace, files: FileLayer, client: RemoteClient
) -> _Reply:
    """Ship ``store``; the reply to send: ``done``, ``failed`` (status, text) or ``fenced``."""
    try:
        ship_store(store, args, files, client)
    except FencedError as exc:
        return ("fenced", str(store), exc.message, exc.ours, exc.current, exc.hint)
    except (StatelogError, OSError) as exc:
        log.error("%s", kv(event="ship_failed", store=store, error=str(exc)))
        return ("failed", str(exit_code_for(exc)), str(exc))
    except Exception as exc:  # a bug must not end the shipping silently
        log.error("%s", kv(event="ship_failed", store=store, error=repr(exc)), exc_info=True)
        return ("failed", str(EXIT_FAILED), repr(exc))
    return ("done",)


def wait_for_round(seconds: float, shipper: ShipLoop | None) -> bool:
    """Wait ``seconds`` for the next round, waking early if the ship loop was fenced.

    :returns: whether a stop signal arrived.
    """
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if signal.sigtimedwait(STOP_SIGNALS, max(0.0, min(left, 0.5))) is not None:
            return True
        if left <= 0.5 or (shipper is not None and shipper.fenced is not None):
            return False


def ship_store(
    store: Path, args: argparse.Namespace, files: FileLayer, client: RemoteClient
) -> None:
    """Ship ``store`` to ``--remote`` (the library logs ``event=shipped``)."""
    ship(
        store, args.remote, retain=args.remote_retain, retain_for=args.remote_retain_for,
        client=client, files=files,
    )  # fmt: skip


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
    """``python -m compactor.shipping FD``: the child of :meth:`ShipLoop.start`."""
    conn = Connection(int(argv[0]))
    try:
        args = conn.recv()
    except (EOFError, OSError):
        return
    _serve(conn, args)


if __name__ == "__main__":
    _main(sys.argv[1:])
