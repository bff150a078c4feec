"""A ship's uploads and the manifest writes that list them (steps 2 and 3 of
:mod:`statelog.remote.ship`).

The sealed segments are uploaded and listed first, then the snapshots: a
snapshot a pass just wrote (191 MiB at 10M keys) never holds the sealed log
back from the bucket, so the recovery point is the log's. Segments that would
make the manifest restore to an older epoch wait for the snapshots' write
instead. A write refused because the store was taken over deletes only what
was uploaded since the last write that landed, and nothing the current
manifest lists.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from statelog.errors import FencedError, RemoteError
from statelog.remote.client import RemoteClient
from statelog.remote.entry import BOUND_FORMAT, ENCODED_FORMAT, FORMAT, Entry
from statelog.remote.manifest import Manifest, commit, read_manifest
from statelog.remote.plan import plan_restore
from statelog.remote.record import Shipped
from statelog.remote.upload import Uploader
from statelog.remote.url import StoreKeys
from statelog.storage.layout import SNAPSHOT_DIR, WAL_DIR

__all__ = ["Found", "Published", "publish"]

log = logging.getLogger("statelog.remote")

Found = Iterator[tuple[Entry, bytes] | Path]
"""Files to ship, verified, one at a time, each with its object; a damaged one as its path."""


@dataclass
class Published:
    """A ship's bookkeeping: ``shipped`` (``remote.json``'s files, added to as files
    are shipped or found there), ``damaged`` (added to), the ship's time, the
    hash of the store's ``IDENTITY``, and ``listed``: called with the manifest once
    the segments' own write landed, before any snapshot is uploaded (``shipped``
    then holds the segments and no new snapshot), so that ``remote.json`` and the
    lag it gives count them even if the snapshots' upload then fails."""

    shipped: dict[str, Shipped]
    damaged: list[Path]
    now_ms: int
    identity_sha: str
    listed: Callable[[Manifest], object] | None = None


def publish(
    up: Uploader, segments: Found, snapshots: Found, book: Published
) -> tuple[list[Entry], Manifest]:
    """Upload ``segments`` and list them, then ``snapshots`` and list them.

    :returns: the entries listed, and the manifest as the last write left it.
    :raises FencedError: the store was taken over; what was uploaded since the last
        write that landed was deleted again, except what the current manifest lists.
    :raises RemoteError: a request failed after its retries.
    """
    client, sid, gen, sha = up.client, up.keys.store_id, up.gen, book.identity_sha
    listed = 0  # how many of up.uploaded a manifest that landed lists: never discarded
    try:
        segs = _upload(segments, WAL_DIR, up, book)
        result, early = None, False
        if segs:
            result = commit(client, sid, gen, lambda cur: _no_older(cur, segs, sha))
            early = _lists(result, segs)
            if early:
                listed = len(up.uploaded)
                if book.listed is not None:
                    book.listed(result)
        snaps = _upload(snapshots, SNAPSHOT_DIR, up, book)
        if snaps or not early:
            both = snaps if early else segs + snaps
            result = commit(client, sid, gen, lambda cur: with_entries(cur, both, sha))
    except FencedError:
        _discard(client, sid, up.uploaded[listed:])
        raise
    assert result is not None
    return segs + snaps, result


def _upload(found: Found, folder: str, up: Uploader, book: Published) -> list[Entry]:
    """Upload each file of ``found`` (the files of ``folder``) not listed yet; each is
    added to ``book.shipped`` as ``folder/name``, the way ``remote.json`` names it.

    :returns: the manifest entries to add.
    """
    new: list[Entry] = []
    for item in found:
        if isinstance(item, Path):
            book.damaged.append(item)
            continue
        e, data = item
        added = up.entry(e, data)
        if added is not None:
            new.append(added)
        listed = added or up.known[(e.kind, e.name)]
        book.shipped[f"{folder}/{e.name}"] = Shipped(
            listed.key, listed.sha256, listed.size, book.now_ms
        )
    return new


def _format_needed(objects: Iterable[Entry]) -> int:
    """The oldest manifest format that can list ``objects``."""
    encoded = [e for e in objects if e.encoding]
    if any(not e.file_sha256 for e in encoded):
        return BOUND_FORMAT
    return ENCODED_FORMAT if encoded else FORMAT


def with_entries(cur: Manifest, new: list[Entry], identity_sha: str) -> Manifest:
    """``cur`` listing ``new`` too (once each), its ``last_epoch`` recomputed."""
    present = {e.key for e in cur.objects}
    objects = cur.objects + tuple(e for e in new if e.key not in present)
    fmt = max(cur.format, _format_needed(objects))
    m = msgspec.structs.replace(cur, objects=objects, identity_sha256=identity_sha, format=fmt)
    plan = plan_restore(m)
    return msgspec.structs.replace(m, last_epoch=plan.epoch if plan else 0)


def _no_older(cur: Manifest, new: list[Entry], identity_sha: str) -> Manifest:
    """``cur`` listing ``new``, or ``cur`` itself (no write) if that would restore to an
    older epoch: segments after a gap stop the snapshot before it being a restore point."""
    m = with_entries(cur, new, identity_sha)
    return m if m.last_epoch >= cur.last_epoch else cur


def _lists(m: Manifest, entries: list[Entry]) -> bool:
    keys = {e.key for e in m.objects}
    return all(e.key in keys for e in entries)


def _discard(client: RemoteClient, sid: uuid.UUID, keys: list[str]) -> None:
    """Best effort: remove a fenced ship's uploads that no manifest lists.

    The manifest is read again first: a write of ours that landed but whose answer
    was lost may be listed by the version the takeover built on, and what that lists
    is the new owner's. When it cannot be read, nothing is removed (garbage, not loss).
    """
    try:
        now = read_manifest(client, sid)
    except RemoteError as exc:
        log.warning("event=fenced_uploads_left count=%d reason=%r", len(keys), str(exc))
        return
    owned = set() if now is None else {e.key for e in now.manifest.objects}
    if now is not None and now.manifest.identity_sha256:
        owned.add(StoreKeys(sid).identity)  # named by its hash, not by an entry
    keys = [k for k in keys if k not in owned]
    for key in keys:
        try:
            client.delete(key)
        except RemoteError as exc:  # left: garbage no manifest lists
            log.warning("event=fenced_upload_left key=%s reason=%r", key, str(exc))
    if keys:
        log.warning("event=fenced_uploads_removed count=%d", len(keys))
