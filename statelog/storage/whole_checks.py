"""Files this process has read whole and found intact, so it need not read them again soon.

A store's snapshots and base images are never rewritten in place: a new
state is a new file. A process that has checked one whole (a snapshot's
SHA-256 against its footer, its record stream parsed, an image's CRC-32C
against its stamp) and finds the same file again learns little by reading
it again within the hour, and a compactor daemon that did would pay the
state's size on every pass: retention would hash a 10M-key full snapshot
(hundreds of MB) every few seconds, and a writer swapping in each delta of
a chain would re-check the chain's full image every time.

The same file means the same device, inode, size, mtime and ctime (ctime
cannot be set back by ``utime``, and a new file on a recycled inode gets
a new one) and the same expected checksum. A verdict lasts
:data:`RECHECK_AFTER`, counted on a clock that keeps running while the
host sleeps; after that the next use reads the file whole again. What
this leaves unseen is damage that changes no metadata (bit rot under an
unchanged inode) for up to the hour: retention reads the full snapshots it
keeps again before it deletes an older full snapshot, and ``statelog
verify`` and every recovery that extracts a snapshot read it whole
regardless.

Threads share the record (the daemon ships beside its passes): one lock.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from datetime import timedelta
from pathlib import Path

__all__ = [
    "HASHED",
    "PARSED",
    "READ_BACK",
    "RECHECK_AFTER",
    "check_once",
    "forget_all",
    "note_intact",
    "now",
    "seen_intact",
]

RECHECK_AFTER = timedelta(hours=1)
"""How long a whole check of an unchanged file is trusted by the process that made it."""

HASHED = "sha256"
"""The tag of a snapshot's hash verdict, ``(HASHED, footer hex)``: the SHA-256 of its
bytes equals its footer's."""

PARSED = "parsed"
"""The tag of a snapshot's parse verdict, ``(PARSED, footer hex)``: its record stream
checked in full, not only its hash. A snapshot a process wrote itself, from an image it
verified, counts as parsed by that process."""

READ_BACK = "sha256-read"
"""The tag of a snapshot hashed by reading its bytes back from the file,
``(READ_BACK, footer hex)``: unlike :data:`HASHED`, never noted on trust (a settled
stamp) nor by the writer, who hashed the bytes it wrote from memory."""

_Key = tuple[int, int, int, int, int, Hashable]
_verdicts: dict[_Key, float] = {}  # identity -> clock reading at the check
_lock = threading.Lock()
_pruned_at = [64]  # prune expired verdicts once the record doubles from its last size


def now() -> float:
    """Seconds on the clock verdicts are stamped with, one that does not stop while the
    host is suspended: what a caller passes back as ``since`` to :func:`seen_intact`."""
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))


def _identity(path: Path, what: Hashable) -> _Key:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, what)


def seen_intact(path: Path, what: Hashable, *, since: float | None = None) -> bool:
    """Whether this process found ``path`` intact against ``what`` (a tag and the
    checksum it must have), the file unchanged since and less than
    :data:`RECHECK_AFTER` ago.

    :param since: a reading of :func:`now`: only a check made at or after it counts.
    :raises OSError: ``path`` cannot be stat'ed.
    """
    key = _identity(path, what)
    with _lock:
        at = _verdicts.get(key)
    if at is None or (since is not None and at < since):
        return False
    return now() - at < RECHECK_AFTER.total_seconds()


def note_intact(path: Path, what: Hashable) -> None:
    """Record that ``path``, as it is now, was just checked whole against ``what``.

    Call it only after the check passed (or after writing and hashing the
    file oneself), never before it.

    :raises OSError: ``path`` cannot be stat'ed.
    """
    key, at = _identity(path, what), now()
    with _lock:
        _verdicts[key] = at
        if len(_verdicts) >= 2 * _pruned_at[0]:  # a daemon notes a few per snapshot, for months
            limit = RECHECK_AFTER.total_seconds()
            for k in [k for k, t in _verdicts.items() if at - t >= limit]:
                del _verdicts[k]
            _pruned_at[0] = max(64, len(_verdicts))


def check_once(path: Path, what: Hashable, check: Callable[[], bool]) -> bool:
    """True without calling ``check`` if :func:`seen_intact`; else ``check()``, noted if True.

    :raises OSError: ``path`` cannot be stat'ed, or as ``check`` raises.
    """
    if seen_intact(path, what):
        return True
    ok = bool(check())
    if ok:
        note_intact(path, what)
    return ok


def forget_all() -> None:
    """Drop every verdict: the next use of each file reads it whole again (tests, and a
    process that wants every file read again)."""
    with _lock:
        _verdicts.clear()
