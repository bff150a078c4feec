"""Running the compactor beside the writer: ``statelog.open(..., compactor="thread"|"process")``.

The deployment the docs lead with is the daemon, ``statelog-compactor``, in
its own process (and, if need be, on its own host). For a single process
that wants compaction without a second service, the writer can start one:

* ``"process"``: a child process running the daemon on this store (the
  same code, its own core, its own lock; ``python -P``, so that a
  ``compactor`` directory where the writer runs cannot stand in for the
  installed package); stopped with SIGTERM on close;
* ``"thread"``: a thread of the writing process running one pass every
  interval. It shares the GIL with commits: simplest, and slowest.

Either is woken when the writer seals a segment (:meth:`InProcessCompactor.wake`:
the child gets SIGUSR1, the daemon's wake signal), so a pass starts as soon as
there is sealed log to fold, not up to an interval later: a writer held back by
``max_overlay_bytes`` waits for that pass.

Either takes the store's compactor lock; when a daemon already holds it,
the writer logs that and leaves compaction to the daemon (the child
process exits with status 3, which a watcher thread logs).

The child process is bound to the writer's life: on Linux it asks the
kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), so a
writer killed with SIGKILL does not leave a compactor behind. The signal
follows the thread that opened the store: open a store with
``compactor="process"`` from a thread that outlives it (the main thread,
typically).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from statelog.compaction.lock import CompactorLock
from statelog.errors import CompactorLockedError
from statelog.log.writer import WalWriter
from statelog.store.options import CompactorMode

__all__ = ["CompactorSettings", "InProcessCompactor", "start_compactor"]

log = logging.getLogger("statelog.store.store")


class InProcessCompactor(Protocol):
    def wake(self) -> None:
        """Start the next pass now rather than at the interval: a segment was sealed.
        Never blocks, and never raises for a compactor that has exited."""

    def stop(self) -> None: ...


@dataclass(frozen=True)
class CompactorSettings:
    """What every pass of an in-process compactor is given (checked by ``StoreOptions``)."""

    interval: float  # seconds between passes
    min_tail_bytes: int
    retain: int
    max_chain: int = 8
    full_ratio: float = 0.5


class _ThreadCompactor:
    def __init__(self, store: Path, s: CompactorSettings) -> None:
        self._lock = CompactorLock(store)  # raises CompactorLockedError
        self._stop = threading.Event()
        self._wake = threading.Event()

        def run() -> None:
            # Loaded here, not at import: most writers leave compaction to the
            # daemon, and the engine adds 14-18 ms to every `import statelog`.
            from statelog.compaction.fold import compact

            wait = s.interval
            while True:
                self._wake.wait(wait)
                self._wake.clear()
                if self._stop.is_set():
                    return
                wait = s.interval
                try:
                    result = compact(
                        store,
                        min_tail_bytes=s.min_tail_bytes,
                        retain=s.retain,
                        max_chain=s.max_chain,
                        full_ratio=s.full_ratio,
                        lock=self._lock,
                        stop=self._stop.is_set,
                    )
                    if result.snapshot is not None:
                        wait = 0  # more log may be sealed already: fold it back to back
                except Exception:  # never let compaction take the writer down
                    log.exception("store=%s event=inprocess_compaction_failed", store)

        self._thread = threading.Thread(target=run, name="statelog-compactor", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self._lock.release()


class _ProcessCompactor:
    def __init__(self, store: Path, s: CompactorSettings) -> None:
        argv = [
            sys.executable, "-P", "-m", "compactor",
            "--interval", str(s.interval),
            "--min-tail-bytes", str(s.min_tail_bytes),
            "--retain", str(s.retain),
            "--max-chain", str(s.max_chain),
            "--full-ratio", repr(float(s.full_ratio)),
            str(store),
        ]  # fmt: skip
        self._stopping = False
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self._watch = threading.Thread(
            target=self._watch_exit, args=(store,), name="statelog-compactor-watch", daemon=True
        )
        self._watch.start()

    def _watch_exit(self, store: Path) -> None:
        code = self._proc.wait()
        if not self._stopping:
            # 4: busy, in the exit-status table the daemon shares with `statelog`
            why = "another compactor holds the store" if code == 4 else "see its log"
            log.warning(
                "store=%s event=compactor_process_exited code=%d reason=%r", store, code, why
            )

    def wake(self) -> None:
        # A wake is an optimisation: a child that is gone, or any refusal, must never fail
        # the commit whose seal sent it (the pass runs at the next interval instead).
        with contextlib.suppress(OSError):
            self._proc.send_signal(signal.SIGUSR1)

    def stop(self) -> None:
        self._stopping = True
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux; elsewhere a no-op).

    Also block SIGUSR1, the daemon's wake signal, which the mask carries through
    exec: a wake sent before the daemon blocks it itself would otherwise kill it
    (SIGUSR1's default action); blocked, it waits for the daemon's first sleep.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def start_compactor(
    mode: CompactorMode,
    store: Path,
    interval: timedelta,
    min_tail_bytes: int,
    retain: int,
    *,
    max_chain: int = 8,
    full_ratio: float = 0.5,
    wal: WalWriter | None = None,
) -> InProcessCompactor | None:
    """Start the compactor ``mode`` asks for (options already checked), or None for ``"none"``.

    ``max_chain`` and ``full_ratio`` reach every pass (the thread's
    ``compact`` call, the child's ``--max-chain`` and ``--full-ratio``). With
    ``wal``, each segment it seals wakes the compactor, after its own ``on_seal``.
    """
    if mode == "none":
        return None
    settings = CompactorSettings(
        interval.total_seconds(), min_tail_bytes, retain, max_chain, full_ratio
    )
    started: InProcessCompactor
    if mode == "process":
        started = _ProcessCompactor(store, settings)
    else:
        try:
            started = _ThreadCompactor(store, settings)
        except CompactorLockedError as exc:
            log.warning("store=%s event=compactor_already_running detail=%r", store, str(exc))
            return None
    if wal is not None:
        wal.on_seal = _then_wake(wal.on_seal, started)
    return started


def _then_wake(
    on_seal: Callable[[int, int], None] | None, compactor: InProcessCompactor
) -> Callable[[int, int], None]:
    def sealed(lsn: int, crc: int) -> None:
        if on_seal is not None:
            on_seal(lsn, crc)
        compactor.wake()

    return sealed
