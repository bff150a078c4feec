"""``statelog verify``'s check of delta chains: does every delta stand on the parent it names?

A delta snapshot restores nothing by itself: its state is its parent's
plus its own changes, down to a full snapshot. Each snapshot that verified
was hashed whole by then; this module walks each delta's chain over those
results, oldest first, and names every delta whose chain is broken:

* its parent is not in ``snapshots/`` (deleted, or never copied);
* its parent is there but did not verify (its own finding says why);
* its parent verified but is not the one it names: another SHA-256, a
  depth that is not one less, another store
  (:func:`statelog.storage.levels.link_problem`);
* its parent's chain is broken, so its own is.

Each broken chain is one finding of kind ``chain`` on the delta, whose
reason names the delta and its parent. A snapshot that does not link to
the log is damage (kind ``link``) only if it is no link of an intact
chain of a snapshot that does: retention keeps a chain's older links after
deleting the log they cover, and a restore never replays from them.
Recovery refuses a delta whose chain is broken and walks back to an older
restore point, so this is damage an open survives (verdict
``recoverable``) unless nothing older is left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence, Set
from pathlib import Path

from statelog.ops.verify_report import SnapshotCheck
from statelog.storage.levels import link_problem
from statelog.storage.snapshot_read import SnapshotMeta

__all__ = ["broken_chains", "chain_members", "check_chains"]

Report = Callable[[Path, str, str], None]
"""Called once per finding: ``(the snapshot's path, kind, why)``, kind ``chain`` or ``link``."""


def check_chains(
    checks: Sequence[SnapshotCheck], metas: Mapping[str, SnapshotMeta], report: Report
) -> tuple[SnapshotCheck, ...]:
    """``checks`` with each snapshot's depth, parent and chain verdict filled in.

    Also judges the snapshots that verified but do not link to the log: one
    that is a link of a restore point's chain (an older snapshot retention
    keeps because a delta above it needs it, after deleting the log it
    covers) is no damage; any other is a finding of kind ``link``.

    :param checks: one per snapshot listed, as verification left them (any
        order); ``links`` False with ``reason`` for one that does not link.
    :param metas: the meta of every snapshot that verified, by file name.
    :param report: told about each finding (see :data:`Report`).
    :returns: the checks in the order given.
    """
    broken = broken_chains(metas, {c.path.name for c in checks})
    restore = {c.path.name for c in checks if c.verified and c.links}
    needed = chain_members(metas, broken, restore)
    out = []
    for c in checks:
        found = metas.get(c.path.name)
        if found is None:
            out.append(c)
            continue
        parent = found.delta.parent if found.delta is not None else None
        why = broken.get(c.path.name)
        if why is not None:
            report(c.path, "chain", why)
        reason = c.reason
        if not c.links and c.path.name in needed:
            reason = f"not a restore point: a link of the chain of {needed[c.path.name]}"
        elif not c.links:
            report(c.path, "link", f"does not link to the log: {c.reason}")
        out.append(
            dataclasses.replace(c, depth=found.depth, parent=parent, chain=why, reason=reason)
        )
    return tuple(out)


def chain_members(
    metas: Mapping[str, SnapshotMeta], broken: Mapping[str, str], restore: Set[str]
) -> dict[str, str]:
    """The snapshots that are links of a restore point's intact chain, each with the
    newest restore point standing on it.

    :param restore: the snapshots that verified and link to the log.
    """
    members: dict[str, str] = {}
    for name in sorted(restore, key=lambda n: (-metas[n].lsn, n) if n in metas else (0, n)):
        meta = metas.get(name)
        if meta is None or name in broken:
            continue
        while meta.delta is not None and meta.delta.parent in metas:
            members.setdefault(meta.delta.parent, name)
            meta = metas[meta.delta.parent]
    return members


def broken_chains(metas: Mapping[str, SnapshotMeta], listed: Set[str]) -> dict[str, str]:
    """Why each delta's chain is broken, by file name; a delta whose chain holds is absent.

    :param metas: the meta of every snapshot that verified, by file name.
    :param listed: the names of every snapshot present, verified or not.
    """
    broken: dict[str, str] = {}
    # Oldest first, so each parent is judged before its children.
    for name in sorted(metas, key=lambda n: (metas[n].lsn, metas[n].epoch, n)):
        meta = metas[name]
        if meta.delta is None:
            continue
        why = _why_broken(name, meta, metas, listed, broken)
        if why is not None:
            broken[name] = why
    return broken


def _why_broken(
    name: str,
    meta: SnapshotMeta,
    metas: Mapping[str, SnapshotMeta],
    listed: Set[str],
    broken: Mapping[str, str],
) -> str | None:
    """Why the chain of the delta ``name`` does not hold; its parent was judged first."""
    assert meta.delta is not None
    parent = meta.delta.parent
    head = f"chain: {name} -> {parent}"
    if parent not in listed:
        return f"{head}: the parent is missing"
    found = metas.get(parent)
    if found is None:
        return f"{head}: the parent does not verify"
    if found.lsn >= meta.lsn:
        return f"{head}: the parent is not older than the delta"
    why = link_problem(meta, found)
    if why is not None:
        return f"{head}: {why}"
    if parent in broken:
        return f"{head}: the parent's chain is broken"
    return None
