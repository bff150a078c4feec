"""Which stores a ship round may skip: those with nothing new to ship on this host.

Each ship asks the bucket for the store's manifest, so a round that ships a store
with nothing new costs a request (billed by the provider) for nothing, every
quarter ``--max-ship-lag``, for every store of the host. A round skips a store
whose shippable files are as they were before its last ship that succeeded:
every snapshot and the ship record by name, size, times and inode, every sealed
segment the same way, and the newest segment by name, inode and whether it is
sealed. The newest segment grows with every commit, but nothing ships it before
its seal; counting its size would make every round of a busy writer ship for
nothing. Its seal (by age, by size or at close), or the next segment the writer
rolls to, changes the state, and the next round ships.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path

from statelog.format.wal import parse_segment_name
from statelog.log.reader import peek_seal
from statelog.storage.layout import REMOTE_RECORD, StoreLayout

__all__ = ["Idle", "LocalState", "local_state"]

Stamp = tuple[str, int, int, int, int]
LocalState = tuple[Stamp, ...]


def _stamp(name: str, st: os.stat_result) -> Stamp:
    # The inode and ctime too: a file replaced by one of the same size within one tick
    # of a coarse mtime clock still differs.
    return (name, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def local_state(store: Path) -> LocalState | None:
    """What a ship of ``store`` would read on this host (module docstring); None when
    it cannot be read (the ship then runs and reports the error for this store alone).
    A file gone while it is listed is left out (the newest segment gone before its
    seal is read: None), which only makes the answer differ from the last one."""
    layout = StoreLayout(store)
    try:
        wal = _entries(layout.wal)
        segments = [e for e in wal if parse_segment_name(e[0])]
        newest = max(segments, key=lambda e: Path(e[0]).name, default=None)
        found = [_active(*e) if e is newest else _stamp(*e) for e in wal]
        found += [_stamp(*e) for e in _entries(layout.snapshots)]
        with contextlib.suppress(FileNotFoundError):
            found.append(_stamp(REMOTE_RECORD, (store / REMOTE_RECORD).stat()))
    except OSError:
        return None
    return tuple(sorted(found))


def _entries(folder: Path) -> list[tuple[str, os.stat_result]]:
    """Each entry of ``folder`` (none if it is missing) with its ``stat``.

    :raises OSError: listing it failed.
    """
    out: list[tuple[str, os.stat_result]] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                out.append((entry.path, entry.stat()))
    return out


def _active(path: str, st: os.stat_result) -> Stamp:
    """The newest segment's stamp: its size and times only once it is sealed.

    :raises OSError: reading its last bytes failed (FileNotFoundError: it went away).
    """
    if not stat.S_ISREG(st.st_mode):  # never opened: a FIFO would block
        return _stamp(path, st)
    if peek_seal(Path(path), st.st_size) is not None:
        return _stamp(path, st)
    return (path, -1, 0, st.st_ino, 0)


class Idle:
    """The stores a round may skip: unchanged since their last ship that succeeded,
    and shipped less than ``recheck`` seconds ago."""

    def __init__(self, recheck: float) -> None:
        self._recheck = recheck
        self._shipped: dict[Path, tuple[LocalState, float]] = {}

    def unchanged(self, store: Path, state: LocalState | None) -> bool:
        last = self._shipped.get(store)
        if state is None or last is None:
            return False
        return last[0] == state and time.monotonic() - last[1] < self._recheck

    def shipped(self, store: Path, before: LocalState | None) -> None:
        """Record a ship of ``store`` that found ``before``; None: it failed, ship it again."""
        if before is None:
            self._shipped.pop(store, None)
        else:
            self._shipped[store] = (before, time.monotonic())
