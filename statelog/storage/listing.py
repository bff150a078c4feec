"""Listing a store's directories: only regular files are the store's files.

A directory, a FIFO, a socket or a device that someone left under a name
statelog uses (``snapshots/*.snap``, ``wal/*.wal``) is not a snapshot or a
segment: opening it fails (a directory), or blocks forever (a FIFO waits for
a writer). :func:`regular_files` never opens one. A snapshot so named is left
out of the listing and logged once per process at WARNING, so an open, a
verify or a pass walks past it as past a snapshot that is not there. A
segment so named is refused with :class:`~statelog.errors.StorageError`: it
stands where the log's records should be, and leaving it out would make the
log look shorter (acknowledged epochs lost without a word). Nothing on disk is
changed either way. A symlink counts as what it points to.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from statelog.errors import StorageError

__all__ = ["regular_files"]

log = logging.getLogger("statelog.storage")

_warned: set[str] = set()
_warned_lock = threading.Lock()


def regular_files(
    directory: Path, named: Callable[[str], object], *, refuse: bool = False
) -> list[Path]:
    """The regular files (or symlinks to them) directly in ``directory`` whose names
    ``named`` accepts (a true result), in no order.

    Any other entry so named is logged once and left out, or, with ``refuse``, makes
    the listing fail: a segment that is not a file is a segment missing from the log,
    which no reader may take for a shorter log.

    :raises StorageError: with ``refuse``, an entry so named is not a regular file.
    :raises FileNotFoundError: ``directory`` does not exist.
    :raises OSError: it cannot be listed.
    """
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not named(entry.name):
                continue
            try:
                regular = entry.is_file()  # the listing's file type: no stat on most file systems
            except OSError:  # removed meanwhile: nothing to read
                regular = False
            if regular:
                found.append(Path(entry.path))
            elif refuse:
                raise StorageError(
                    f"{entry.path} is named like a log segment but is not a regular file",
                    hint="move it out of the store's wal/ directory, or put the segment "
                    "back; nothing was changed",
                )
            else:
                _warn_once(entry.path)
    return found


def _warn_once(path: str) -> None:
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    log.warning("event=not_a_regular_file path=%s action=ignored", path)
