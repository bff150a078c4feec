"""Remote pins: objects a restore in progress reads, which remote retention must not delete.

A pin is the small object ``<store-id>/pins/<token>.pin`` holding JSON:
the keys pinned, who pinned them, and an absolute expiry. A reader pins
*before* trusting its copy of the manifest and re-reads the manifest after
(:mod:`.restore`); retention drops keys from the manifest *before* listing
pins (:mod:`.retention`). So a pin either is seen by retention, or landed
after retention's manifest change, which the reader then sees and re-plans
from. Object stores give no lock that dies with its holder, hence the
expiry: a crashed restore's pin stops protecting anything once it expires.
Retention honours a pin until ``expires_ms`` plus :data:`CLOCK_SKEW`, so
hosts whose clocks disagree by less than that cannot misjudge one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta

from statelog.remote.checks import PIN_LIMIT
from statelog.remote.client import RemoteClient
from statelog.remote.errors import RemoteIntegrityError, RemoteNotFoundError
from statelog.remote.url import StoreKeys
from statelog.storage.layout import parse_json_doc

__all__ = ["ALL", "CLOCK_SKEW", "RemotePin", "live_pinned_keys", "remote_pin"]

log = logging.getLogger("statelog.remote")

ALL = "*"
"""Returned in :func:`live_pinned_keys`' set when a live pin cannot be read: all is pinned."""
CLOCK_SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class RemotePin:
    key: str
    keys: frozenset[str]
    expires_ms: int


@contextlib.contextmanager
def remote_pin(
    client: RemoteClient,
    store_id: uuid.UUID,
    keys: Iterable[str],
    *,
    ttl: timedelta,
    purpose: str,
) -> Iterator[RemotePin]:
    """Pin ``keys`` for the ``with`` block (and at most ``ttl``).

    The pin object is created with If-None-Match under a random name; on exit
    it is deleted (best effort: if that fails, it expires).

    :raises RemoteError: the pin could not be written (nothing is pinned).
    """
    names = frozenset(keys)
    token = f"{int(time.time() * 1000):013d}-{secrets.token_hex(8)}"
    key = StoreKeys(store_id).pin(token)
    expires = int((time.time() + ttl.total_seconds()) * 1000)
    doc = {
        "purpose": purpose,
        "holder": f"{socket.gethostname()}:{os.getpid()}",
        "expires_ms": expires,
        "keys": sorted(names),
    }
    client.put_new(key, json.dumps(doc).encode())
    log.info("event=remote_pinned pin=%s keys=%d expires_ms=%d", key, len(names), expires)
    try:
        yield RemotePin(key, names, expires)
    finally:
        try:
            client.delete(key)
        except Exception as exc:  # it expires anyway; never mask the caller's error
            log.warning("event=remote_unpin_failed pin=%s reason=%r", key, str(exc))


def live_pinned_keys(
    client: RemoteClient, store_id: uuid.UUID, *, now_ms: int | None = None
) -> set[str]:
    """Keys named by every unexpired pin of ``store_id``; expired pins are deleted.

    A pin that cannot be parsed, or is over :data:`.checks.PIN_LIMIT` (not
    read), counts as live and pinning everything (:data:`ALL`): a deleter
    that honours pins then deletes nothing.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    grace = int(CLOCK_SKEW.total_seconds() * 1000)
    pinned: set[str] = set()
    for key, _size in client.list_objects(StoreKeys(store_id).pins):
        try:
            doc = parse_json_doc(client.get(key, limit=PIN_LIMIT).data)
            expires = int(doc["expires_ms"])
            names = [str(k) for k in doc["keys"]]
        except RemoteNotFoundError:
            continue  # released meanwhile
        except (ValueError, KeyError, TypeError, RecursionError, RemoteIntegrityError) as exc:
            log.error("event=remote_pin_unreadable pin=%s reason=%r", key, str(exc))
            pinned.add(ALL)
            continue
        if expires + grace < now:
            client.delete(key)
            log.info("event=remote_pin_expired pin=%s", key)
            continue
        pinned.update(names)
    return pinned
