"""The segments of a store's log, found by name.

Only names are read here: a segment's bytes are the reader's business
(:mod:`statelog.log.reader`), and what to do with them is recovery's.
"""

from __future__ import annotations

from pathlib import Path

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
    for p in regular_files(wal_dir, parse_segment_name, refuse=True):
        parsed = parse_segment_name(p)
        if parsed is not None:
            found.append((parsed[0], parsed[1], p))
    return sorted(found)
