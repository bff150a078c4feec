"""Listing a store's directories: only regular files are the store's files.

A directory, a FIFO, a socket or a device that someone left under a name
statelog uses (``snapshots/*.snap``, ``wal/*.wal``) is not a snapshot or a
segment: opening it fails (a directory), or blocks forever (a FIFO waits for
a writer). :func:`regular_files` never opens one; it reports each to the
caller, who decides: a snapshot so named is left out of the listing and
logged once per process at WARNING (:func:`warn_once`), so an open, a verify
or a pass walks past it as past a snapshot that is not there; a segment so
named is refused (:func:`statelog.log.segments.list_segments`), since it
stands where the log's records should be. Nothing on disk is changed either
way. A symlink counts as what it points to.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["regular_files", "warn_once"]

log = logging.getLogger("statelog.storage")

_warned: set[Path] = set()
_warned_lock = threading.Lock()


def regular_files(
    directory: Path,
    named: Callable[[str], object],
    other: Callable[[Path], None] | None = None,
) -> list[Path]:
    """The regular files (or symlinks to them) directly in ``directory`` whose names
    ``named`` accepts (a true result), in no order. Each other entry so named is left
    out and handed to ``other`` (None: :func:`warn_once`), which may raise.

    :raises FileNotFoundError: ``directory`` does not exist.
    :raises OSError: it cannot be listed, or as ``other`` raises.
    """
    other = other or warn_once
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
            else:
                other(Path(entry.path))
    return found


def warn_once(path: Path) -> None:
    """Log at WARNING, once per process, that ``path`` is not a regular file and is
    ignored."""
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    log.warning("event=not_a_regular_file path=%s action=ignored", path)
