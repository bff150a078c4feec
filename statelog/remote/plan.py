"""Planning a restore from the manifest alone: which snapshot, which segments, which epoch.

The ladder's rules (:mod:`statelog.recovery.ladder`), applied to the index instead
of a directory: a snapshot is usable if the log continues from it (the
first segment after its LSN starts at LSN + 1 with a header chained to the
snapshot's ``chain``), or if the log simply ends at it. Segments are
followed by their chain values, not by their names: from ``(lsn, crc)`` the
next segment is the one that starts at ``lsn + 1`` and whose header links
to ``crc``; its SEAL gives the next ``(lsn, crc)``. Following links rather
than sequence numbers keeps a restore on one unbroken history.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from statelog.remote.manifest import Entry, Manifest

__all__ = ["Plan", "follow_chain", "plan_restore"]

log = logging.getLogger("statelog.remote")


@dataclass(frozen=True)
class Plan:
    """What a restore downloads, in order, and the epoch it reaches if all verifies."""

    snapshot: Entry | None
    covering: Entry | None  # the segment the snapshot ends in (keeps sequence numbers going)
    segments: tuple[Entry, ...]
    epoch: int


def follow_chain(segments: Sequence[Entry], lsn: int, crc: int) -> list[Entry]:
    """Segments that continue the log from ``(lsn, crc)``, in log order, until a link is missing."""
    out: list[Entry] = []
    seen: set[str] = set()
    while True:
        nxt = [e for e in segments if e.first_lsn == lsn + 1 and e.prev_crc == crc]
        nxt = [e for e in nxt if e.key not in seen]
        if not nxt:
            return out
        if len(nxt) > 1:
            # Two histories forked here: the newest generation is the one that won.
            log.warning("event=chain_fork lsn=%d keys=%s", lsn, ",".join(e.key for e in nxt))
        e = max(nxt, key=lambda e: (e.generation, -e.sequence))
        seen.add(e.key)
        out.append(e)
        lsn, crc = e.last_lsn, e.end_crc


def _links(snap: Entry, segments: Sequence[Entry]) -> bool:
    later = [e for e in segments if e.first_lsn > snap.last_lsn]
    if not later:
        return True  # the log ends at the snapshot (or retention removed what it covers)
    return any(e.first_lsn == snap.last_lsn + 1 and e.prev_crc == snap.end_crc for e in later)


def plan_restore(manifest: Manifest, *, refused: Collection[str] = ()) -> Plan | None:
    """The best plan not using a snapshot key in ``refused``; None if nothing reaches back.

    Newest linking snapshot first; with none, the log from LSN 1 (a segment
    starting at LSN 1 whose header links to 0, as a new store's first does).
    """
    segs = manifest.segments
    for snap in manifest.snapshots:
        if snap.key in refused or not _links(snap, segs):
            continue
        chain = follow_chain(segs, snap.last_lsn, snap.end_crc)
        covering = next(
            (e for e in segs if e.last_lsn == snap.last_lsn and e.end_crc == snap.end_crc), None
        )
        epoch = chain[-1].last_lsn if chain else snap.last_lsn
        return Plan(snap, covering, tuple(chain), max(epoch, snap.last_lsn))
    chain = follow_chain(segs, 0, 0)
    if not chain:
        return None
    return Plan(None, None, tuple(chain), chain[-1].last_lsn)
