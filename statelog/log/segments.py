"""The segments of a store's log, found by name.

Only names are read here: a segment's bytes are the reader's business
(:mod:`statelog.log.reader`), and what to do with them is recovery's.
"""

from __future__ import annotations

from pathlib import Path

from statelog.errors import StorageError
from statelog.format.wal import parse_segment_name
from statelog.storage.listing import regular_files

__all__ = ["list_segments"]


def list_segments(wal_dir: Path) -> list[tuple[int, int, Path]]:
    """``(sequence, first_lsn, path)`` of every segment in ``wal_dir``, in log order.

    Anything named like a segment that is not a regular file is refused, never opened
    (:func:`~statelog.storage.listing.regular_files`): a FIFO would block a read forever,
    and leaving it out would make the log look shorter.

    :raises StorageError: an entry named like a segment is not a regular file.
    :raises FileNotFoundError: ``wal_dir`` does not exist.
    :raises OSError: it cannot be listed.
    """
    found = []
    for p in regular_files(wal_dir, parse_segment_name, _refuse):
        parsed = parse_segment_name(p)
        if parsed is not None:
            found.append((parsed[0], parsed[1], p))
    return sorted(found)


def _refuse(path: Path) -> None:
    """A segment that is not a file is a segment missing from the log: no reader may
    take the log for a shorter one (acknowledged epochs lost without a word)."""
    raise StorageError(
        f"{path} is named like a log segment but is not a regular file",
        hint="move it out of the store's wal/ directory, or put the segment back; "
        "nothing was changed",
    )
