"""Store events: what recovery, the compactor and the writer tell operators about.

Code that does something an operator must be able to see afterwards (a
recovery, an integrity mismatch, a truncation, a compaction, a retention
deletion, a base swap) calls :func:`emit` once, with the store's root and
plain ``key=value`` fields. Listeners turn events into durable records
(the audit trail, ``statelog.ops.audit``) and counters (``statelog.ops.metrics``).
Emitting never raises into the caller: a listener that fails is logged at
ERROR and the others still run, because losing a metric must never fail a
recovery or a compaction.

Events are never emitted on the commit path; per-commit counters are kept
by ``statelog.ops.metrics`` directly.

Kinds and their fields (every field is JSON-serialisable):

``recovery``
    ``epoch``, ``snapshot`` (name or None), ``replay_from`` and
    ``replay_to`` (LSNs replayed), ``records_replayed``, ``outcome``
    (``clean``, ``torn-tail``, ``corruption``: ``statelog.Outcome``),
    ``rejected`` (list of ``{"file", "offset", "reason"}``), ``lost_epochs``,
    ``seconds``, ``readonly``.
``integrity_mismatch``
    ``file``, ``offset`` (or None), ``reason``, ``source`` (recovery,
    compactor, swap).
``walk_back``
    ``file`` (the snapshot refused), ``reason``, ``source``.
``truncation``
    ``file``, ``offset``, ``bytes_dropped``, ``reason`` (torn, corrupt),
    ``saved_as`` (the ``.broken`` or ``.corrupt`` evidence file).
``compaction``
    ``snapshot``, ``epoch``, ``lsn``, ``base`` (snapshot folded from or
    None), ``segments``, ``records``, ``snapshot_kind`` (``full`` or
    ``delta``), ``depth`` (deltas down to the chain's full snapshot, 0 for a
    full one), ``written_bytes`` (the snapshot file's size), ``bytes``
    (bytes read), ``seconds``.
``retention_delete``
    ``files`` (list of ``{"file", "reason"}``, every file one retention
    pass deleted) and ``count``: one event per pass, so a pass that
    deletes thousands of segments costs one audit entry.
``base_swap``
    ``snapshot``, ``epoch``.
``rewind``
    ``epoch`` (the store's epoch after it), ``discarded`` (``[first, last]``
    epochs set aside), ``evidence`` (the directory holding what was set
    aside), ``files`` (the files moved there), ``cut`` (``{"file",
    "offset", "bytes"}`` or None).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = ["KINDS", "Event", "Listener", "emit", "subscribe"]

log = logging.getLogger("statelog.events")

KINDS: Final = frozenset(
    {
        "recovery",
        "integrity_mismatch",
        "walk_back",
        "truncation",
        "compaction",
        "retention_delete",
        "base_swap",
        "rewind",
    }
)


@dataclass(frozen=True)
class Event:
    """One event of one store.

    :ivar kind: one of :data:`KINDS`.
    :ivar store: the store's root directory.
    :ivar fields: the event's ``key=value`` fields (see the module docstring).
    :ivar writable: False when the emitting process holds no write access
        to the store (a read-only open, ``recover --dry-run``): listeners
        must then change nothing on disk.
    """

    kind: str
    store: Path
    fields: Mapping[str, Any] = field(default_factory=dict)
    writable: bool = True


Listener = Callable[[Event], None]

_listeners: list[Listener] = []
_guard = threading.Lock()


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` for every event emitted in this process from now on.

    :returns: a function that unsubscribes ``listener`` (idempotent).
    """
    with _guard:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _guard:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def emit(store: Path, kind: str, *, writable: bool = True, **fields: Any) -> None:
    """Tell every listener that ``kind`` happened to ``store``.

    Never raises (a failing listener is logged at ERROR), except for an
    unknown ``kind``, which is a programming error.

    :raises ValueError: ``kind`` is not one of :data:`KINDS`.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    event = Event(kind, Path(store), dict(fields), writable)
    with _guard:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(event)
        except Exception:
            log.exception("event=listener_failed kind=%s store=%s", kind, store)
