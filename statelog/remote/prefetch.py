"""Downloading a restore's segments ahead of its checks, in threads beside them.

A restore checks each segment it downloads (frames, chain, SEAL, every
record's schema: Python work that holds the GIL) and only then decides
whether the next one is wanted. The download itself (the request, zstd,
SHA-256, the file's write and fsync) mostly releases the GIL, so fetching
segments *i + 1* and *i + 2* while segment *i* is checked overlaps them on
the other cores instead of adding them.

What must not change: the checks still run in log order and decide alone
what the restore keeps. A segment fetched ahead is only a file in the
staging directory; the restore either checks it before it uses it, or
(:meth:`Prefetch.close`) removes it before it writes anything else, so a
copy never holds a segment after the one a restore stopped at. A download
error of a segment the restore never asks for is dropped with its file.
Leaving, even on an error or an interrupt (again and again), waits for the
downloads under way and starts no other, so no thread writes into the
staging directory once the restore has let go of it. Two of the plan's
entries that name one local file (a manifest may list the same name under
two generations' keys) would let one download replace a file already
checked: such a plan is fetched one segment at a time, as without this.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from statelog.remote.entry import Entry
from statelog.remote.staging import Staging

__all__ = ["AHEAD", "WORKERS", "Prefetch"]

AHEAD = 2
"""Segments downloaded ahead of the one being checked: two keep the threads busy while
a check runs, and bound what a restore that stops early fetched for nothing."""
WORKERS = 2
"""Downloads run at once: decoding and hashing one segment is a core's work, so two
overlap where the checks alone would leave a core idle."""


class Prefetch:
    """Fetch ``entries`` through ``st`` in order, :data:`AHEAD` ahead of :meth:`fetch`.

    Use it as a context manager: leaving it waits for the downloads under way, cancels
    the others and removes the files of those :meth:`fetch` did not hand out.
    """

    def __init__(self, st: Staging, entries: Sequence[Entry], ahead: int = AHEAD) -> None:
        self._st = st
        self._entries = list(entries)
        self._index = {x.key: i for i, x in enumerate(self._entries)}
        paths = {st.path_of(x) for x in self._entries}
        self._ahead = ahead if len(paths) == len(self._entries) == len(self._index) else 0
        self._started: dict[str, Future[Path]] = {}
        self._handed: set[str] = set()
        self._next = 0
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        self.close(failing=kind is not None)

    def fetch(self, e: Entry) -> Path:
        """``st.fetch(e)``, from the download started ahead if there is one.

        :raises: what :meth:`~statelog.remote.staging.Staging.fetch` raises for ``e``.
        """
        at = self._index.get(e.key)
        if at is not None and self._ahead:
            while self._next < len(self._entries) and self._next <= at + self._ahead:
                if not self._start_next():
                    break
        self._handed.add(e.key)
        started = self._started.get(e.key)
        if started is None or started.cancelled():  # never started: see _start_next
            return self._st.fetch(e)
        return started.result()

    def _start_next(self) -> bool:
        """Start the next download; False if no thread could be started (then none runs).

        The pool queues a download before it starts a thread for it, so when that start
        fails the download is queued all the same, and a thread already running could
        take it up untracked. Every download not handed out is then cancelled or waited
        for, and that one's file removed: from then on each is fetched in the caller's
        thread, as without this.

        :raises OSError: that file could not be removed.
        """
        e = self._entries[self._next]
        try:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=WORKERS, thread_name_prefix="statelog-fetch"
                )
            self._started[e.key] = self._pool.submit(self._st.fetch, e)
        except RuntimeError:  # no thread to be had
            self._ahead = 0
            interrupted = self._drain()
            self._st.remove(e)
            if interrupted is not None:
                raise interrupted from None
            return False
        self._next += 1
        return True

    def _drain(self) -> BaseException | None:
        """Cancel every download not handed out and wait for those under way, even through
        interrupts (the first is returned): afterwards no thread of the pool runs.

        Cancelling each first, rather than leaving it to the pool's shutdown, leaves no
        download that an interrupted shutdown took off its queue neither run nor cancelled
        (its result would never come).
        """
        interrupted: BaseException | None = None
        unused = [f for key, f in self._started.items() if key not in self._handed]
        while True:
            try:
                for f in unused:
                    f.cancel()  # one under way is not stopped: the shutdown waits for it
                if self._pool is not None:
                    self._pool.shutdown(wait=True, cancel_futures=True)
                return interrupted
            except BaseException as exc:  # an interrupt: the threads must still end first
                interrupted = interrupted or exc

    def close(self, *, failing: bool = False) -> None:
        """Wait for the downloads under way, cancel the rest, and remove what was fetched
        but not handed out.

        :param failing: the restore is failing anyway (its staging directory will be
            discarded): a file that cannot be removed is left to that.
        :raises OSError: an unused segment could not be removed (the copy would hold a
            segment after the one the restore stopped at), unless ``failing``.
        """
        interrupted = self._drain()
        for key, f in self._started.items():
            if key in self._handed or f.cancelled():
                continue
            with contextlib.suppress(Exception):  # its error was never asked for
                f.result()
            try:
                self._st.remove(self._entries[self._index[key]])
            except OSError:
                if not (failing or interrupted):
                    raise
        if interrupted is not None:
            raise interrupted
