"""Planning a restore from the manifest alone: which snapshot, which segments, which epoch.

The ladder's rules (:mod:`statelog.recovery.ladder`), applied to the index instead
of a directory: a snapshot is usable if the log continues from it (the
first segment after its LSN starts at LSN + 1 with a header chained to the
snapshot's ``chain``), or if the log simply ends at it. Segments are
followed by their chain values, not by their names: from ``(lsn, crc)`` the
next segment is the one that starts at ``lsn + 1`` and whose header links
to ``crc``; its SEAL gives the next ``(lsn, crc)``. Following links rather
than sequence numbers keeps a restore on one unbroken history.

The manifest is untrusted and may list many thousand entries, so a
:class:`Planner` indexes it once (dicts by link, by SEAL and by first LSN)
and every question after that costs time in proportion to its answer:
walking back past rejected snapshots asks about each snapshot once, and
only the chain of the snapshot accepted is walked.

A delta snapshot is a restore point only with its whole snapshot chain:
:meth:`Planner.chain_of` follows each entry's ``parent`` by name back to a
full snapshot, and requires every parent's ``digest`` to be the one its
child names (``parent_sha256``; an entry of an old manifest records none,
and the restore checks it on the downloaded file instead) and its depth to
be one less. A snapshot whose chain breaks in the manifest is passed over
as a damaged one is, and the walk goes on to an older restore point.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from statelog.remote.entry import Entry
from statelog.remote.manifest import Manifest

__all__ = ["Plan", "Planner", "follow_chain", "plan_restore"]

log = logging.getLogger("statelog.remote")

_Link = tuple[int, int]  # (lsn, crc): where the log stands after a segment or snapshot
Found: TypeAlias = "tuple[Entry, ...] | str"  # a snapshot's chain, full first; or why none


@dataclass(frozen=True)
class Plan:
    """What a restore downloads, in order, and the epoch it reaches if all verifies."""

    snapshot: Entry | None
    covering: Entry | None  # the segment the snapshot ends in (keeps sequence numbers going)
    segments: tuple[Entry, ...]
    epoch: int
    chain: tuple[Entry, ...] = ()  # the snapshot's chain, full first, ``snapshot`` last


def _next_by_link(segments: Sequence[Entry]) -> dict[_Link, Entry]:
    """For each link, the segment that continues it: at a fork the newest generation won."""
    groups: dict[_Link, list[Entry]] = {}
    for e in segments:
        groups.setdefault((e.first_lsn - 1, e.prev_crc), []).append(e)
    out: dict[_Link, Entry] = {}
    for link, group in groups.items():
        if len(group) > 1:
            keys = ",".join(e.key for e in group)
            log.warning("event=chain_fork lsn=%d keys=%s", link[0], keys)
        out[link] = max(group, key=lambda e: (e.generation, -e.sequence))
    return out


class Planner:
    """One manifest, indexed once (linear in its entries); see the module docstring."""

    def __init__(self, manifest: Manifest) -> None:
        segs = manifest.segments
        self.snapshots = manifest.snapshots
        self._next = _next_by_link(segs)
        self._by_seal: dict[_Link, Entry] = {}
        for e in segs:
            self._by_seal.setdefault((e.last_lsn, e.end_crc), e)
        self._last_first = max((e.first_lsn for e in segs), default=-1)
        self._by_name: dict[str, list[Entry]] = {}
        for e in self.snapshots:  # newest generation first among entries of one name
            self._by_name.setdefault(e.name, []).append(e)
        for group in self._by_name.values():
            group.sort(key=lambda e: e.generation, reverse=True)
        self._chains: dict[str, Found] = {}

    def _parent(self, child: Entry) -> Entry | str:
        """The entry ``child`` names as its parent, or why no entry is it."""
        named = self._by_name.get(child.parent, [])
        if not named:
            return f"chain: {child.parent}, the parent of {child.name}, is not in the manifest"
        match = [e for e in named if e.digest in ("", child.parent_sha256)]
        if not match:
            return (
                f"chain: {child.parent} has digest {named[0].digest[:16]}..., "
                f"{child.name} names {child.parent_sha256[:16]}..."
            )
        parent = match[0]
        if parent.depth != child.depth - 1:
            return (
                f"chain: {parent.name} has depth {parent.depth}, {child.name} says "
                f"{child.depth - 1}"
            )
        return parent

    def chain_of(self, snap: Entry) -> Found:
        """``snap``'s chain as the manifest lists it, full snapshot first; or why it breaks.

        Memoised per entry, so asking about every snapshot of a manifest costs
        time in proportion to its entries times the chains' depth.
        """
        pending: list[Entry] = []
        e = snap
        while (memo := self._chains.get(e.key)) is None:
            pending.append(e)
            if e.depth == 0:
                memo = ()
                break
            parent = self._parent(e)
            if isinstance(parent, str):
                memo = parent
                break
            e = parent  # depth falls by one per step: the walk ends
        found: Found = memo
        for link in reversed(pending):  # the deepest link first: each extends its parent
            found = found if isinstance(found, str) else (*found, link)
            self._chains[link.key] = found
        return found

    def chain(self, lsn: int, crc: int) -> list[Entry]:
        """Segments that continue the log from ``(lsn, crc)``, in log order, until a link is
        missing or a segment would repeat."""
        out: list[Entry] = []
        seen: set[str] = set()
        while (e := self._next.get((lsn, crc))) is not None and e.key not in seen:
            seen.add(e.key)
            out.append(e)
            lsn, crc = e.last_lsn, e.end_crc
        return out

    def links(self, snap: Entry) -> bool:
        """Whether the remote log continues from ``snap``, or ends at it."""
        if self._last_first <= snap.last_lsn:
            return True  # the log ends at the snapshot (or retention removed what it covers)
        return (snap.last_lsn, snap.end_crc) in self._next

    def plan(self, snap: Entry | None) -> Plan | None:
        """The plan starting at ``snap`` (None: the log from LSN 1); None if nothing does."""
        if snap is None:
            chain = self.chain(0, 0)
            return Plan(None, None, tuple(chain), chain[-1].last_lsn) if chain else None
        snaps = self.chain_of(snap)
        if isinstance(snaps, str):
            return None
        chain = self.chain(snap.last_lsn, snap.end_crc)
        covering = self._by_seal.get((snap.last_lsn, snap.end_crc))
        epoch = chain[-1].last_lsn if chain else snap.last_lsn
        return Plan(snap, covering, tuple(chain), max(epoch, snap.last_lsn), snaps)

    def walk(
        self,
        accept: Callable[[Entry], bool],
        unusable: Callable[[Entry, str], object] | None = None,
    ) -> Plan | None:
        """The plan from the newest linking restore point that ``accept`` takes, else from
        LSN 1.

        ``accept`` is asked about each linking snapshot whose chain is whole
        (:meth:`chain_of`) once, newest first (a restore downloads and
        verifies the chain there); ``unusable`` is told of each linking one
        whose chain breaks in the manifest, and why. Only the accepted one's
        log is walked.
        """
        for snap in self.snapshots:
            if not self.links(snap):
                continue
            found = self.chain_of(snap)
            if isinstance(found, str):
                if unusable is not None:
                    unusable(snap, found)
                continue
            if accept(snap):
                return self.plan(snap)
        return self.plan(None)


def follow_chain(segments: Sequence[Entry], lsn: int, crc: int) -> list[Entry]:
    """Segments that continue the log from ``(lsn, crc)``, in log order, until a link is missing."""
    return Planner(Manifest(0, "", 0, "", "", 0, objects=tuple(segments))).chain(lsn, crc)


def plan_restore(manifest: Manifest, *, refused: Collection[str] = ()) -> Plan | None:
    """The best plan not using a snapshot key in ``refused``; None if nothing reaches back.

    Newest linking snapshot first; with none, the log from LSN 1 (a segment
    starting at LSN 1 whose header links to 0, as a new store's first does).
    """
    return Planner(manifest).walk(lambda snap: snap.key not in refused)
