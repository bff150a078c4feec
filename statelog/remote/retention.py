"""Remote retention: mirror local retention on the object store, honouring remote pins.

Rules, the local ones (:mod:`statelog.compaction.retention`) applied to the manifest:

* keep the ``retain`` newest restore points listed (snapshots whose whole
  chain the manifest lists: :meth:`.plan.Planner.chain_of`) and every
  snapshot of their chains, so no kept chain is ever left broken in the
  bucket; every other snapshot goes (older ones, and any whose chain the
  manifest already breaks);
* with a window (``retain_for``), also keep every restore point back to the
  newest one whose entry's ``time_ms`` is at or before the window's start
  (now minus the window): the union with the ``retain`` newest. An entry
  with no ``time_ms`` (shipped before entries carried one) is never taken
  to be that old, so it and everything older are kept until a newer entry
  with a time is. While no kept restore point is that old, no segment goes
  either: the window's first epochs may be only in the log;
* keep every segment a replay from the oldest kept restore point needs, and
  the one that snapshot ends in: only segments whose SEAL is before its LSN
  go. With no restore point listed, nothing goes (the log from LSN 1 is
  the only way back);
* nothing a live remote pin names is deleted (:mod:`.pins`).

Order of steps, each one safe to stop after:

1. one conditional manifest write (:func:`.manifest.commit`, fenced by the
   generation) moves the doomed keys from the index to ``garbage``; from
   then on no new restore plans with them;
2. list the live pins (expired ones are deleted);
3. delete each garbage key that no pin names, logging each deletion;
4. one more conditional write keeps in ``garbage`` only the keys deferred
   because pinned; the next pass tries them again.

A fenced writer fails at step 1 and deletes nothing.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

import msgspec

from statelog.compaction.window import check_window, cutoff_ms
from statelog.errors import InvalidOptionError
from statelog.remote.client import RemoteClient
from statelog.remote.entry import Entry
from statelog.remote.manifest import Manifest, commit
from statelog.remote.pins import ALL, live_pinned_keys
from statelog.remote.plan import Planner

__all__ = [
    "RemoteRetentionResult",
    "apply_remote_retention",
    "check_retention",
    "retain_after_ship",
]

log = logging.getLogger("statelog.remote")


@dataclass(frozen=True)
class RemoteRetentionResult:
    dropped: tuple[str, ...] = ()  # keys removed from the index by this pass
    deleted: tuple[str, ...] = ()  # objects deleted (this pass's and earlier garbage)
    deferred: tuple[str, ...] = ()  # garbage kept because a live pin names it


def _before(e: Entry, cutoff: int | None) -> bool:
    """Whether snapshot entry ``e`` is at or before the window's start (no time: never)."""
    return cutoff is None or 0 < e.time_ms <= cutoff


def _doomed(m: Manifest, retain: int, cutoff: int | None = None) -> list[str]:
    """The keys the rules above drop from ``m`` (``cutoff``: the window's start, Unix ms)."""
    planner = Planner(m)
    points: list[tuple[Entry, ...]] = []
    for snap in planner.snapshots:  # newest first
        chain = planner.chain_of(snap)
        if not isinstance(chain, str):
            points.append(chain)
        if len(points) >= retain and _before(points[-1][-1], cutoff):
            break
    if not points:
        return []
    keep = {e.key for chain in points for e in chain}
    oldest_lsn = points[-1][-1].last_lsn
    anchored = _before(points[-1][-1], cutoff)
    segs = [e for e in m.segments if anchored and e.last_lsn < oldest_lsn]
    return [e.key for e in planner.snapshots if e.key not in keep] + [e.key for e in segs]


def apply_remote_retention(
    client: RemoteClient,
    store_id: uuid.UUID,
    generation: int,
    *,
    retain: int,
    retain_for: timedelta | None = None,
    now_ms: int | None = None,
) -> RemoteRetentionResult:
    """Apply the rules above to the store's objects (steps in the module docstring).

    :param retain: the newest restore points to keep, at least 1.
    :param retain_for: also keep every epoch committed after now minus this
        window restorable from the remote (a positive ``timedelta``; None: by
        count only): every restore point back to the newest whose entry's
        ``time_ms`` is at or before the window's start; an entry that records
        no time is never taken to be before it.
    :param now_ms: the window's end, Unix ms (default: the clock now).

    :raises InvalidOptionError: ``retain`` is not an int >= 1, or ``retain_for``
        not a positive timedelta; nothing was changed.
    :raises FencedError: ``generation`` no longer owns the store; nothing was deleted.
    :raises RemoteError: a request failed; what was deleted stays deleted (all garbage).
    """
    _check_retain(retain)
    check_window(retain_for)
    cutoff = cutoff_ms(retain_for, now_ms)
    dropped: list[str] = []

    def drop(m: Manifest) -> Manifest:
        doomed = set(_doomed(m, retain, cutoff))
        dropped[:] = sorted(doomed)
        return msgspec.structs.replace(
            m,
            objects=tuple(e for e in m.objects if e.key not in doomed),
            garbage=tuple(sorted(set(m.garbage) | doomed)),
        )

    m = commit(client, store_id, generation, drop)
    if not m.garbage:
        return RemoteRetentionResult()
    pinned = live_pinned_keys(client, store_id)
    if ALL in pinned:
        log.warning("event=remote_retention_deferred store_id=%s reason=unreadable_pin", store_id)
        return RemoteRetentionResult(tuple(dropped), (), m.garbage)
    deleted: list[str] = []
    deferred: list[str] = []
    for key in m.garbage:
        if key in pinned:
            log.info(
                "event=remote_deletion_deferred store_id=%s key=%s reason=pinned", store_id, key
            )
            deferred.append(key)
            continue
        client.delete(key)
        deleted.append(key)
        log.info("event=remote_deleted store_id=%s key=%s retain=%d", store_id, key, retain)
    gone = set(deleted)
    commit(
        client,
        store_id,
        generation,
        lambda cur: msgspec.structs.replace(
            cur, garbage=tuple(k for k in cur.garbage if k not in gone)
        ),
    )
    return RemoteRetentionResult(tuple(dropped), tuple(deleted), tuple(deferred))


def check_retention(retain: int | None, retain_for: timedelta | None) -> None:
    """Check remote retention's options (``retain`` None: not given, as ``ship`` takes it).

    :raises InvalidOptionError: ``retain`` is not None or an int >= 1, or
        ``retain_for`` is not None or a positive timedelta.
    """
    if retain is not None:
        _check_retain(retain)
    check_window(retain_for)


def _check_retain(retain: object) -> None:
    """:raises InvalidOptionError: ``retain`` is not an int >= 1."""
    if not isinstance(retain, int) or isinstance(retain, bool) or retain < 1:
        raise InvalidOptionError(f"retain={retain!r}", hint="an integer >= 1")


def retain_after_ship(
    client: RemoteClient,
    store_id: uuid.UUID,
    generation: int,
    retain: int | None,
    retain_for: timedelta | None,
) -> RemoteRetentionResult | None:
    """Remote retention as ``ship(retain=, retain_for=)`` applies it: none when neither is
    given; a window without ``retain`` also keeps the newest restore point.

    :raises InvalidOptionError, FencedError, RemoteError: as :func:`apply_remote_retention`.
    """
    if retain is None and retain_for is None:
        return None
    keep = 1 if retain is None else retain
    return apply_remote_retention(client, store_id, generation, retain=keep, retain_for=retain_for)
