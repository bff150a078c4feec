"""Listing a store's directories: only regular files are the store's files.

A directory, a FIFO, a socket or a device that someone left under a name
statelog uses (``snapshots/*.snap``, ``wal/*.wal``) is not a snapshot or a
segment: opening it fails (a directory), or blocks forever (a FIFO waits for
a writer). :func:`regular_files` leaves such entries out of every listing that
names files to read, and logs each one once per process at WARNING, so an
open, a verify or a pass walks past it as past a file that is not there, and
nothing on disk is changed. A symlink counts as what it points to.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

__all__ = ["regular_files"]

log = logging.getLogger("statelog.storage")

_warned: set[str] = set()
_warned_lock = threading.Lock()


def regular_files(directory: Path, suffix: str) -> list[Path]:
    """The regular files (or symlinks to them) directly in ``directory`` whose names
    end with ``suffix``, in no order; any other entry of that suffix is logged once.

    :raises FileNotFoundError: ``directory`` does not exist.
    :raises OSError: it cannot be listed.
    """
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not entry.name.endswith(suffix):
                continue
            try:
                regular = entry.is_file()  # the listing's file type: no stat on most file systems
            except OSError:  # removed meanwhile: nothing to read
                regular = False
            if regular:
                found.append(Path(entry.path))
            else:
                _warn_once(entry.path)
    return found


def _warn_once(path: str) -> None:
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    log.warning("event=not_a_regular_file path=%s action=ignored", path)
