"""Small marks a store directory carries about its role: ``STANDBY`` and the reading of such marks.

``STANDBY`` is written into a standby's copy when it is first followed, and
removed only by its promotion: a writer's open (and a compactor) refuses a
directory that holds it, so a copy opened without ``follow=`` never becomes
a second, unfenced writer of its source's log. It is one JSON object
(``docs/format.md``): ``source`` (what the copy follows: a directory or a
URL) and ``at_ms``. Durable order on creation: temp, fsync, rename, fsync of
the directory; on removal: unlink, fsync of the directory.

Marks may come from anywhere (a directory copied in, a file planted): they are
read bounded, from regular files only, and checked before they are parsed.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from statelog.errors import StandbyCopyError
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import STANDBY, parse_json_doc

__all__ = [
    "MAX_MARK_BYTES",
    "check_not_standby",
    "clear_standby",
    "mark_standby",
    "read_mark",
    "standby_source",
]

MAX_MARK_BYTES = 1 << 16
"""The largest mark file read; a longer one is unreadable (``{}``), as is any damage."""


def read_mark(path: Path) -> dict[str, Any] | None:
    """The JSON object in the mark file ``path`` (None: there is none); ``{}`` if unreadable.

    Never blocks: a FIFO or a device is opened non-blocking and not read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}  # a FIFO or a device would block or never end: not a mark we wrote
        raw = os.read(fd, MAX_MARK_BYTES + 1)
    except OSError:
        return {}
    finally:
        os.close(fd)
    try:
        return parse_json_doc(raw, max_bytes=MAX_MARK_BYTES)
    except ValueError:
        return {}


def mark_standby(store: Path, source: str, files: FileLayer | None = None) -> None:
    """Write ``store/STANDBY`` naming ``source`` (durable order in the module docstring).

    :raises OSError: it could not be written; ``store`` holds no new mark.
    """
    doc = {"source": source, "at_ms": int(time.time() * 1000)}
    (files or FileLayer()).create_durable(store / STANDBY, json.dumps(doc).encode() + b"\n")


def clear_standby(store: Path, files: FileLayer | None = None) -> None:
    """Remove ``store/STANDBY`` (if there) and fsync the directory.

    :raises OSError: the unlink or the directory's fsync failed.
    """
    files = files or FileLayer()
    path = store / STANDBY
    if path.exists() or path.is_symlink():
        files.remove(path)
        files.fsync_dir(store)


def standby_source(store: Path) -> str | None:
    """The source the standby copy at ``store`` follows (None: not marked, or unreadable)."""
    doc = read_mark(store / STANDBY)
    if not doc or not isinstance(doc.get("source"), str):
        return None
    return str(doc["source"])[:4096]


def check_not_standby(store: Path) -> None:
    """:raises StandbyCopyError: ``store`` is a standby's copy (it holds ``STANDBY``)."""
    if read_mark(store / STANDBY) is None:
        return
    source = standby_source(store)
    raise StandbyCopyError(
        f"{store} is a standby's copy of {source!r}, not promoted: it has no writer"
        if source
        else f"{store} holds a STANDBY mark that cannot be read: it is a standby's copy"
    )
