"""Files this process has read whole and found intact, so it need not read them again soon.

A store's snapshots and base images are never rewritten in place: a new
state is a new file. A process that has checked one whole (a snapshot's
SHA-256 against its footer, an image's CRC-32C against its stamp) and
finds the same file again (device, inode, size and mtime unchanged, and
the same expected checksum) learns nothing new by reading it again soon:
the second read is served from the page cache, not from the medium, so it
could not see bit rot underneath anyway. Without this, a compactor
daemon's retention would hash a 10M-key full snapshot (hundreds of MB) on
every pass, and a writer swapping in each delta of a chain would re-check
the chain's full image every time.

A verdict lasts :data:`RECHECK_AFTER`; after that the next use reads the
file whole again. A file written since (new inode, size or mtime) is
checked again at once. ``statelog verify`` and every recovery that
extracts a snapshot read it whole regardless: this registry only spares
repeated checks of the same unchanged file by one process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Hashable
from datetime import timedelta
from pathlib import Path

__all__ = ["PARSED", "RECHECK_AFTER", "check_once", "forget_all", "note_intact", "seen_intact"]

RECHECK_AFTER = timedelta(hours=1)
"""How long a whole check of an unchanged file is trusted by the process that made it."""

PARSED = "parsed"
"""The tag of a snapshot's parse-in-full verdict, ``(PARSED, footer hex)``: its record
stream checked, not only its hash (``("sha256", footer hex)``). A snapshot a process
wrote itself, from an image it verified, counts as parsed by that process."""

_Key = tuple[int, int, int, int, Hashable]
_verdicts: dict[_Key, float] = {}  # identity -> monotonic time of the check


def _identity(path: Path, what: Hashable) -> _Key:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, what)


def seen_intact(path: Path, what: Hashable) -> bool:
    """Whether this process found ``path`` intact against ``what`` (the checksum it
    must have), with the file unchanged since and less than :data:`RECHECK_AFTER` ago.

    :raises OSError: ``path`` cannot be stat'ed.
    """
    at = _verdicts.get(_identity(path, what))
    return at is not None and time.monotonic() - at < RECHECK_AFTER.total_seconds()


def note_intact(path: Path, what: Hashable) -> None:
    """Record that ``path``, as it is now, was just checked whole against ``what``.

    Call it only after the check passed (or after writing and hashing the
    file oneself), never before it.

    :raises OSError: ``path`` cannot be stat'ed.
    """
    _verdicts[_identity(path, what)] = time.monotonic()


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
    """Drop every verdict (tests, and a process that wants every file read again)."""
    _verdicts.clear()
