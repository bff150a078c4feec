"""Delta passes: what a tail changed, written as a delta snapshot on top of its chain.

A pass whose base is a snapshot folds the sealed tail into :class:`Changes`
(the tail's net effect per key, never the state), then either

* writes a **delta snapshot**: the changed keys, sorted, deletes and puts,
  linked to the base by the base's name and SHA-256 (:func:`write_delta`),
  at a cost that follows the tail, not the state; or
* when :class:`ChainPolicy` says the chain has grown long or heavy enough,
  a **full merge**: the chain's full image, each delta's image in order,
  then the tail, merged in key order into a fresh image
  (:func:`~statelog.compaction.merge.merge_levels`) and written as a full
  snapshot that starts a new chain.

The merge rule is size-tiered: a full snapshot is written once the deltas
since the last one would hold more than ``full_ratio`` of its body; a chain
that would pass ``max_chain`` deltas has its newest ones merged into one
(a rebase, :meth:`ChainPolicy.rebase_keep`). So the bytes written per pass
stay bounded by a small multiple of what the tail changed, and restart
reads at most ``max_chain`` deltas besides the full snapshot.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from statelog.compaction.replay import Folding
from statelog.errors import InvalidOptionError
from statelog.format.snapshot import DeltaDoc
from statelog.storage.image import Delta, encode_keys
from statelog.storage.layered import LayeredBase
from statelog.storage.levels import Chain
from statelog.storage.snapshot_body import TOMBSTONE, StreamBuild, stream_delta
from statelog.storage.snapshots import SnapshotMeta

PassKind = Literal["delta", "rebase", "full"]

__all__ = [
    "MAX_CHAIN_LIMIT",
    "MAX_FULL_RATIO",
    "ChainPolicy",
    "Changes",
    "DeltaPlan",
    "PassKind",
    "delta_meta",
    "plan_delta",
]

MAX_CHAIN_LIMIT = 64
"""The largest ``max_chain`` a store accepts (readers follow longer chains: ``MAX_DEPTH``)."""
MAX_FULL_RATIO = 10.0
"""The largest ``full_ratio`` a store accepts."""


@dataclass(frozen=True)
class ChainPolicy:
    """What a pass writes: a delta, a delta merged down onto the full snapshot, or a full one.

    ``max_chain``: the most deltas above a full snapshot (0: every pass
    writes a full snapshot, as a store without deltas does); a chain that
    long has its newest deltas merged into one (:meth:`rebase_keep`).
    ``full_ratio``: a full snapshot is written once the chain's delta bytes,
    this pass's tail included, would exceed this fraction of the full
    snapshot's body.
    """

    max_chain: int = 8
    full_ratio: float = 0.5

    @classmethod
    def checked(cls, max_chain: object, full_ratio: object) -> ChainPolicy:
        """The policy of these settings, validated: the one check every caller runs
        (``compact()``, the store's settings, before any file is touched).

        :raises InvalidOptionError: ``max_chain`` not an int from 0 to
            :data:`MAX_CHAIN_LIMIT`, or ``full_ratio`` not a number above 0 and at
            most :data:`MAX_FULL_RATIO`.
        """
        if (
            not isinstance(max_chain, int)
            or isinstance(max_chain, bool)
            or not 0 <= max_chain <= MAX_CHAIN_LIMIT
        ):
            raise InvalidOptionError(
                f"max_chain={max_chain!r}",
                hint=f"an int from 0 to {MAX_CHAIN_LIMIT}: the most deltas above a full "
                "snapshot (0: every pass writes a full snapshot)",
            )
        if (
            not isinstance(full_ratio, int | float)
            or isinstance(full_ratio, bool)
            or not 0.0 < float(full_ratio) <= MAX_FULL_RATIO
        ):
            raise InvalidOptionError(
                f"full_ratio={full_ratio!r}",
                hint=f"a number above 0 and at most {MAX_FULL_RATIO:g}, such as 0.5: the "
                "share of the full snapshot's body the chain's deltas may reach",
            )
        return cls(max_chain, float(full_ratio))

    def choose(self, parent: SnapshotMeta, tail_bytes: int, *, portable: bool) -> PassKind:
        """What a pass on ``parent`` with a tail of ``tail_bytes`` log bytes writes.

        ``"full"``: the chain's deltas and the tail would outweigh ``full_ratio`` of
        the full snapshot's body, or ``max_chain`` is 0, or the full snapshot is of
        format 1 (not ``portable``: no delta ever rests on one). ``"rebase"``: the
        chain is ``max_chain`` deltas long but still light: its newest deltas and the
        tail are merged into one delta (:meth:`rebase_keep`; the cost of those
        deltas, not of the state). ``"delta"``: a delta on top of ``parent``. The tail's log
        bytes stand in for the delta's body (an upper bound: a delta holds each
        changed key once).
        """
        if not portable or self.max_chain == 0:
            return "full"
        link = parent.delta
        chain_bytes = link.chain_bytes if link is not None else 0
        full_bytes = link.full_bytes if link is not None else parent.body_bytes
        if chain_bytes + tail_bytes > self.full_ratio * full_bytes:
            return "full"
        return "rebase" if parent.depth + 1 > self.max_chain else "delta"

    def rebase_keep(self, metas: Sequence[SnapshotMeta]) -> int:
        """How many snapshots of a chain (``metas``, its full snapshot first) a rebase
        keeps below the one delta it merges the rest and the tail into.

        Size-tiered: the newest delta is always merged, then each older one whose body
        is at most the bodies merged so far, and as many more as keep the new delta
        within ``max_chain``. The chain's bodies then shrink from old to new, and a
        large old delta is rewritten only once the newer ones together outweigh it:
        with ``max_chain`` of at least about log2(passes between full merges), a byte
        of change is rewritten about that many times before the next full merge; a
        shorter ``max_chain`` forces wider merges. At least the full snapshot is kept.
        """
        keep = len(metas) - 1
        merged = metas[-1].body_bytes
        while keep > 1 and (metas[keep - 1].body_bytes <= merged or keep > self.max_chain):
            keep -= 1
            merged += metas[keep].body_bytes
        return keep


class Changes:
    """The net effect of folded records: per table, encoded key -> value (None: deleted)."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[bytes, bytes | None]] = {}

    def load_level(self, table: str, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        """Apply one delta image's entries of ``table`` (a :data:`TOMBSTONE` a delete)."""
        entries = self.tables.setdefault(table, {})
        entries.update((k, None if v == TOMBSTONE else v) for k, v in pairs)

    def apply_batch(self, deltas: Iterable[Delta]) -> None:
        """Apply deltas in order, each its deletes before its puts (as a commit does)."""
        for table, keys, values, deletes in deltas:
            entries = self.tables.setdefault(table, {})
            if deletes:
                entries.update(dict.fromkeys(encode_keys(deletes)))
            entries.update(zip(encode_keys(keys), values, strict=True))


@dataclass
class DeltaPlan:
    """A delta ready to write: its tables' deletes and puts, and the state's counts after it.

    ``size`` is the bytes of its keys and values (what its image holds,
    before LMDB's own overhead).
    """

    tables: list[tuple[str, list[bytes], list[tuple[bytes, bytes]]]]
    counts: dict[str, int]
    size: int = 0

    def stream(self, write: Callable[[bytes], object]) -> tuple[int, dict[str, int]]:
        """Write the delta's record stream through ``write``; its size and counts."""
        return stream_delta(self.tables, write)

    def build_image(self, path: Path) -> None:
        """The delta's image at ``path``: its puts, and :data:`TOMBSTONE` for its deletes,
        each table in key order in one append (so its pages are filled)."""
        build = StreamBuild(path, tables=len(self.tables), size_hint=self.size)
        try:
            for table, deletes, puts in self.tables:
                if deletes:
                    dead = ((k, TOMBSTONE) for k in deletes)
                    build.append_sorted(table, heapq.merge(dead, puts, key=_first))
                elif puts:
                    build.append_sorted(table, puts)
        finally:
            build.close()


def _first(entry: tuple[bytes, bytes]) -> bytes:
    return entry[0]


def plan_delta(base: LayeredBase, parent: SnapshotMeta, changes: Changes) -> DeltaPlan:
    """What the delta of ``changes`` over the state ``base`` holds, and the counts after it.

    One batched lookup per table tells which changed keys the state held:
    a delete of a key it did not hold is left out, and each table's count
    moves by the keys added less the keys deleted.
    """
    counts = dict(parent.tables)
    tables = []
    size = 0
    for table in sorted(changes.tables, key=lambda t: t.encode("utf-8")):
        entries = changes.tables[table]
        ekeys = sorted(entries)
        before = base.get_many(table, ekeys)
        news = list(map(entries.__getitem__, ekeys))
        deletes: list[bytes] = []
        if None in news:  # some keys deleted: a delete of a key the state lacks is left out
            deletes = [
                k
                for k, n, o in zip(ekeys, news, before, strict=True)
                if n is None and o is not None
            ]
            puts = [(k, n) for k, n in zip(ekeys, news, strict=True) if n is not None]
            added = sum(1 for n, o in zip(news, before, strict=True) if n is not None and o is None)
        else:
            puts = list(zip(ekeys, news, strict=True))  # type: ignore[arg-type]
            added = before.count(None)
        size += sum(map(len, ekeys)) + sum(map(len, filter(None, news)))
        counts[table] = counts.get(table, 0) + added - len(deletes)
        tables.append((table, deletes, puts))
    return DeltaPlan(tables, {t: n for t, n in counts.items() if n > 0}, size)


def delta_meta(chain: Chain, fold: Folding, plan: DeltaPlan) -> SnapshotMeta:
    """The meta of the delta that ``fold`` and ``plan`` make on top of ``chain``
    (``body_bytes`` and the link's ``changes`` and ``chain_bytes`` are completed
    by :func:`~statelog.storage.snapshots.write_delta_snapshot`)."""
    parent = chain.meta
    link = parent.delta
    doc = DeltaDoc(
        parent=chain.snapshots[-1].name,
        parent_sha256=parent.sha256,
        depth=parent.depth + 1,
        chain_bytes=link.chain_bytes if link is not None else 0,
        full_bytes=link.full_bytes if link is not None else parent.body_bytes,
        changes={},
    )
    return SnapshotMeta(
        parent.store_id, fold.good_epoch, fold.good_epoch, fold.good_chain,
        dict(fold.good_offsets), fold.good_wm, plan.counts, 0, int(time.time() * 1000), doc,
        commit_ms=fold.good_commit_ms,
    )  # fmt: skip
