"""Downloading a restore's segments ahead of its checks, in one thread beside them.

A restore checks each segment it downloads (frames, chain, SEAL, every
record's schema: Python work that holds the GIL) and only then decides
whether the next one is wanted. The download itself (the request, zstd,
SHA-256, the file's write and fsync) mostly releases the GIL, so fetching
segment *i + 1* while segment *i* is checked overlaps the two on a second
core instead of adding them.

What must not change: the checks still run in log order and decide alone
what the restore keeps. A segment fetched ahead is only a file in the
staging directory; the restore either checks it before it uses it, or
(:meth:`Prefetch.close`) removes it before it writes anything else, so a
copy never holds a segment after the one a restore stopped at. A download
error of a segment the restore never asks for is dropped with its file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from statelog.remote.entry import Entry
from statelog.remote.staging import Staging

__all__ = ["AHEAD", "Prefetch"]

AHEAD = 2
"""Segments downloaded ahead of the one being checked: two keep the thread busy while
a check runs, and bound what a restore that stops early fetched for nothing."""


class Prefetch:
    """Fetch ``entries`` through ``st`` in order, :data:`AHEAD` ahead of :meth:`fetch`.

    Use it as a context manager: leaving it waits for every download started
    and removes the files of those :meth:`fetch` did not hand out.
    """

    def __init__(self, st: Staging, entries: Sequence[Entry], ahead: int = AHEAD) -> None:
        self._st = st
        self._entries = list(entries)
        self._index = {x.key: i for i, x in enumerate(self._entries)}
        self._ahead = ahead
        self._started: dict[str, Future[Path]] = {}
        self._handed: set[str] = set()
        self._next = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="statelog-fetch")

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(self, e: Entry) -> Path:
        """``st.fetch(e)``, from the download started ahead if there is one.

        :raises: what :meth:`~statelog.remote.staging.Staging.fetch` raises for ``e``.
        """
        at = self._index.get(e.key)
        if at is None:
            return self._st.fetch(e)  # not one of the plan's: fetched now, as before
        while self._next < len(self._entries) and self._next <= at + self._ahead:
            self._start_next()
        self._handed.add(e.key)
        return self._started[e.key].result()

    def _start_next(self) -> None:
        e = self._entries[self._next]
        self._next += 1
        self._started[e.key] = self._pool.submit(self._st.fetch, e)

    def close(self) -> None:
        """Wait for every download started; remove what was fetched but not handed out."""
        self._pool.shutdown(wait=True)
        for e in self._entries:
            f = self._started.get(e.key)
            if f is None or e.key in self._handed:
                continue
            with contextlib.suppress(Exception):  # its error was never asked for
                f.result()
            with contextlib.suppress(OSError):
                self._st.remove(e)
