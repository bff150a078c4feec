"""The segments of a store's log, found by name.

Only names are read here: a segment's bytes are the reader's business
(:mod:`statelog.log.reader`), and what to do with them is recovery's.
"""

from __future__ import annotations

from pathlib import Path

from statelog.format.wal import parse_segment_name

__all__ = ["list_segments"]


def list_segments(wal_dir: Path) -> list[tuple[int, int, Path]]:
    """``(sequence, first_lsn, path)`` of every segment in ``wal_dir``, in log order."""
    found = []
    for p in wal_dir.iterdir():
        parsed = parse_segment_name(p)
        if parsed is not None:
            found.append((parsed[0], parsed[1], p))
    return sorted(found)
