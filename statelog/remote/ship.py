"""Shipping: upload every sealed segment and snapshot not shipped yet, then commit the index.

One call (:func:`ship`), in this order:

1. read ``IDENTITY`` and ``remote.json``; read the MANIFEST and check that
   this store's generation owns it (the first ship of a store with no
   manifest creates generation 1, or joins the generation 1 that the
   writer's claim of the same directory created: :func:`.manifest.create_first`);
   a stale generation is :class:`~statelog.errors.FencedError` before
   anything is uploaded;
2. upload ``IDENTITY`` once, then each sealed segment in log order (one
   zstd frame: :mod:`.encoding`), then (after step 3's first write) each
   snapshot oldest first (a delta's parent listed no later than the delta:
   :class:`.entry.Entry`).
   Every file is verified whole before it is read for upload (the segment
   scan, the snapshot hash): damage is never shipped. Each upload is a
   create (If-None-Match) of a key under this generation, carrying the
   SHA-256 of its bytes; a key that exists with the same hash is our own
   earlier upload and is adopted;
3. a conditional manifest write (If-Match, fenced) lists the new segments
   as soon as they are uploaded, and another lists the new snapshots after
   theirs: a snapshot a pass just wrote, megabytes to upload, never holds
   back the sealed log (with no new segment, one write lists everything).
   Until a write lands its objects are invisible to restore. If one is
   refused because the store was taken over, this call deletes what it
   uploaded since the last write that landed (a takeover that read that
   version owns what it lists) and raises FencedError;
4. ``remote.json`` is updated durably under its lock (temp, fsync, rename,
   fsync dir: :func:`.record.update_record`): once the segments' own write
   landed (so the lag it gives counts them even if a snapshot's upload then
   fails), and after the last write;
5. optionally, remote retention (:mod:`.retention`).

The writer's active segment is never shipped. Every step is safe to repeat.
A segment whose header names a generation below the one shipping
(:func:`header_generation`) is history this directory adopted at its
takeover if its sequence is at most ``adopted_through`` in ``remote.json``
(shipped like any other); otherwise a zombie's segment, refused with
FencedError, as is one that follows a segment of a higher generation
(rule H5 of ``docs/format.md``: recovery cuts it too).
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import msgspec

from statelog.compaction.verdicts import verified
from statelog.compaction.window import meta_time
from statelog.errors import CorruptionError, FencedError, FormatVersionError, RemoteError
from statelog.format.wal import SegmentHeader
from statelog.log.reader import StopKind, peek_generation, peek_seal, scan_segment
from statelog.log.segments import list_segments
from statelog.remote.checks import encoding_problem
from statelog.remote.client import RemoteClient
from statelog.remote.encoding import as_encoded, as_raw, encode_segment
from statelog.remote.entry import BOUND_FORMAT, Entry
from statelog.remote.errors import RemoteNotFoundError
from statelog.remote.manifest import (
    Manifest,
    create_first,
    created_by,
    read_manifest,
)
from statelog.remote.point import apply_cut
from statelog.remote.publish import Published, publish
from statelog.remote.record import Shipped, ShipRecord, load_record, origin_of, update_record
from statelog.remote.retention import RemoteRetentionResult, check_retention, retain_after_ship
from statelog.remote.upload import Uploader
from statelog.remote.url import StoreKeys
from statelog.storage.fileio import FileLayer, ReadBuffer
from statelog.storage.layout import IDENTITY, SNAPSHOT_DIR, WAL_DIR, StoreLayout
from statelog.storage.snapshots import list_snapshots

__all__ = ["ShipResult", "header_generation", "ship"]

log = logging.getLogger("statelog.remote")


@dataclass(frozen=True)
class ShipResult:
    """What one :func:`ship` call did."""

    store: Path
    store_id: uuid.UUID
    generation: int
    uploaded: tuple[str, ...] = ()  # keys created by this call
    adopted: tuple[str, ...] = ()  # already on the remote with the same hash
    bytes_uploaded: int = 0
    last_epoch: int = 0  # the epoch a restore reaches now
    damaged: tuple[Path, ...] = ()  # local files that failed verification (not shipped)
    retention: RemoteRetentionResult | None = None
    seconds: float = 0.0
    entries: tuple[Entry, ...] = field(default=(), repr=False)


def header_generation(header: bytes) -> int:
    """The writer generation in a segment header's reserved bytes (0: none recorded)."""
    return SegmentHeader.unpack(header).generation


def _owner(
    client: RemoteClient, store: Path, sid: uuid.UUID, rec: ShipRecord, generation: int | None
) -> tuple[int, Manifest]:
    """The generation this call ships as, and the manifest it checked against."""
    gen = generation if generation is not None else rec.generation
    cur = read_manifest(client, sid)
    if not gen:
        # Never shipped from here: create generation 1, or join the one this
        # directory's writer created (its claim may be racing this call).
        if cur is None:
            gen = create_first(client, sid, origin_of(store))
            cur = read_manifest(client, sid)
        elif created_by(cur.manifest, origin_of(store)):
            gen = 1
    elif cur is None:
        raise RemoteNotFoundError(
            f"store {sid} holds generation {gen} but {client.where} has no MANIFEST for it",
            hint="the remote copy was removed; take the store over again to re-ship it",
        )
    if cur is None:
        raise RemoteError(f"the MANIFEST of {sid} vanished right after it was created")
    if cur.manifest.generation != gen:
        raise FencedError(
            f"store {sid} at {client.where} belongs to another writer; nothing was shipped",
            ours=gen,
            current=cur.manifest.generation,
        )
    return gen, cur.manifest


def _segments(
    store: Path, sid: uuid.UUID, gen: int, adopted_through: int, done: set[str], reads: ReadBuffer
) -> Iterator[tuple[Entry, bytes] | Path]:
    """Sealed segments not in ``done``, verified, one at a time; a damaged one as its path.

    Each is read into ``reads``; the bytes yielded never point into it.

    :raises FencedError: a segment of an older generation that this
        directory's takeover did not adopt (see the module docstring).
    """
    try:
        listed = list_segments(store / WAL_DIR)
    except FileNotFoundError:
        return
    highest = 0  # the highest generation named by the headers before, as recovery's rule H5
    for seq, _lsn, path in listed:
        rel = f"{WAL_DIR}/{path.name}"
        if rel in done or peek_seal(path, path.stat().st_size) is None:
            highest = max(highest, _generation_of(path))
            continue  # shipped already; or the active segment (unsealed), never shipped
        data = reads.read(path)
        scan = scan_segment(path, data, store_id=sid, prev_crc=None, is_last=False, payloads=False)
        if scan.stop.kind is not StopKind.CLEAN or scan.header is None or scan.sealed_lsn is None:
            log.error("event=ship_skipped_damaged file=%s reason=%r", rel, scan.stop.reason)
            yield path
            continue
        written_by = scan.header.generation
        if written_by and written_by < highest:
            raise FencedError(
                f"{rel} follows a segment of generation {highest}: a fenced writer's",
                ours=written_by,
                current=highest,
                hint="stop the stale writer, then reopen the store: recovery sets the "
                "segment aside (rule H5), and shipping goes on",
            )
        if written_by and written_by < gen and seq > adopted_through:
            raise FencedError(
                f"{rel} was created by a writer of generation {written_by} after this store "
                f"was taken over (segments up to {adopted_through} were adopted)",
                ours=written_by,
                current=gen,
                hint="stop the stale writer; then take the store over again to adopt what it "
                "wrote, or restore the store from the remote into an empty directory",
            )
        if written_by and written_by < gen:
            log.info("event=segment_adopted file=%s written_by=%d generation=%d",
                     rel, written_by, gen)  # fmt: skip
        highest = max(highest, written_by)
        h, obj = scan.header, encode_segment(data)
        e = as_encoded(Entry(
            key=StoreKeys(sid).segment(gen, path.name), kind="wal", name=path.name,
            sha256="", size=0, generation=gen,
            sequence=h.sequence, first_lsn=h.first_lsn, prev_crc=h.prev_crc,
            last_lsn=scan.sealed_lsn, end_crc=scan.end_crc,
        ), obj, len(data))  # fmt: skip
        if encoding_problem(e, BOUND_FORMAT) is None:
            yield e, obj
        else:  # beyond what a reader accepts (too large, or compressing too far): as it is
            yield as_raw(e, data), bytes(data)


def _generation_of(path: Path) -> int:
    """The generation in ``path``'s header; 0 if it is gone or does not verify."""
    try:
        return peek_generation(path)
    except FileNotFoundError:
        return 0


def _snapshots(
    store: Path, files: FileLayer, sid: uuid.UUID, gen: int, done: set[str]
) -> Iterator[tuple[Entry, bytes] | Path]:
    """Snapshots not in ``done``, oldest first, verified; a damaged one as its path.

    Checked as retention checks them (:func:`~statelog.compaction.verdicts.verified`):
    the snapshot the daemon's own pass just wrote is not parsed again (a parse at 1M
    keys costs most of a second of CPU on the writer's host). A restore parses every
    shipped snapshot regardless: the bucket is not trusted.
    """
    for _epoch, _lsn, path in reversed(list_snapshots(store / SNAPSHOT_DIR)):
        rel = f"{SNAPSHOT_DIR}/{path.name}"
        if rel in done:
            continue
        try:
            meta = verified(files, path, sid)
            data = path.read_bytes()  # immutable once named: the bytes verified
        except (CorruptionError, FormatVersionError) as exc:
            log.error("event=ship_skipped_damaged file=%s reason=%r", rel, str(exc))
            yield path
            continue
        except FileNotFoundError:
            continue  # retention removed it meanwhile
        link = meta.delta  # a delta ships as it is; its entry names its parent for planning
        yield Entry(
            key=StoreKeys(sid).snapshot(gen, path.name), kind="snapshot", name=path.name,
            sha256=hashlib.sha256(data).hexdigest(), size=len(data), generation=gen,
            last_lsn=meta.lsn, end_crc=meta.chain, epoch=meta.epoch, digest=meta.sha256,
            parent=link.parent if link else "", depth=meta.depth,
            parent_sha256=link.parent_sha256 if link else "", time_ms=meta_time(meta),
        ), data  # fmt: skip


def _record(
    rec: ShipRecord, url: str, gen: int, up: Uploader, book: Published, m: Manifest
) -> Callable[[ShipRecord | None], ShipRecord]:
    """The change to ``remote.json`` once manifest ``m`` landed: ``book.shipped``'s files."""

    def change(cur: ShipRecord | None) -> ShipRecord:
        # Merged with what another process of this directory recorded meanwhile
        # (a claim): its files stay, and a newer generation it took is kept.
        base = cur or rec
        when = book.now_ms if up.uploaded or up.adopted or cur is None else base.last_ship_ms
        return msgspec.structs.replace(
            base, url=url, generation=max(base.generation, gen), last_epoch=m.last_epoch,
            last_ship_ms=when, files={**base.files, **book.shipped},
        )  # fmt: skip

    return change


def ship(
    store: Path,
    url: str,
    *,
    generation: int | None = None,
    retain: int | None = None,
    retain_for: timedelta | None = None,
    client: RemoteClient | None = None,
    files: FileLayer | None = None,
    reads: ReadBuffer | None = None,
) -> ShipResult:
    """Ship ``store`` to ``url`` (steps in the module docstring) and return what was done.

    :param generation: the writer generation to ship as (default: the one
        in ``remote.json``; a store that never shipped creates or joins
        generation 1, :func:`.manifest.create_first`).
    :param retain: after shipping, apply remote retention keeping this many snapshots.
    :param retain_for: after shipping, also keep every epoch of this window restorable.
    :param reads: where sealed segments are read to be verified and encoded; a
        process that ships again and again keeps one (default: a new one per call).
    :raises InvalidOptionError: ``retain`` or ``retain_for`` is out of range; nothing shipped.
    :raises StoreNotFoundError: ``store`` holds no statelog store.
    :raises FencedError: another generation owns the store, or a segment of
        an older generation was written after this directory's takeover;
        what this call uploaded since its last manifest write that landed was
        deleted again (unless the current manifest lists it).
    :raises RemoteError: a request failed after its retries, or a key holds
        other bytes (``remote.json`` is unchanged; run again).
    :raises OSError: reading a local file or writing ``remote.json`` failed.
    """
    check_retention(retain, retain_for)
    started, files, store = time.perf_counter(), files or FileLayer(), Path(store)
    sid = StoreLayout(store).read_identity(files)
    client = client or RemoteClient.from_url(url)
    rec = load_record(store, files) or ShipRecord(url=url, store_id=str(sid))
    gen, m = _owner(client, store, sid, rec, generation)
    if rec.cut_at and gen == rec.generation:  # a takeover's cut, not published yet
        apply_cut(store, client, sid, gen, files)
        gen, m = _owner(client, store, sid, rec := load_record(store, files) or rec, generation)
    keys = StoreKeys(sid)
    up = Uploader(client, keys, gen, m)
    identity = files.read(store / IDENTITY)
    identity_sha = hashlib.sha256(identity).hexdigest()
    if m.identity_sha256 != identity_sha:
        up.put(keys.identity, identity, identity_sha)
    shipped: dict[str, Shipped] = dict(rec.files)
    now = int(time.time() * 1000)
    damaged: list[Path] = []
    done = set(rec.files)

    book = Published(shipped, damaged, now, identity_sha)
    book.listed = lambda m: update_record(store, _record(rec, url, gen, up, book, m), files)
    new, result = publish(
        up,
        _segments(store, sid, gen, rec.adopted_through, done, reads or ReadBuffer()),
        _snapshots(store, files, sid, gen, done),
        book,
    )
    update_record(store, _record(rec, url, gen, up, book, result), files)
    kept = retain_after_ship(client, sid, gen, retain, retain_for)
    out = ShipResult(
        store, sid, gen, tuple(up.uploaded), tuple(up.adopted), up.bytes, result.last_epoch,
        tuple(damaged), kept, time.perf_counter() - started, tuple(new),
    )  # fmt: skip
    log.info(
        "event=shipped store=%s store_id=%s generation=%d uploaded=%d adopted=%d bytes=%d "
        "last_epoch=%d damaged=%d seconds=%.3f",
        store, sid, gen, len(out.uploaded), len(out.adopted), out.bytes_uploaded,
        out.last_epoch, len(damaged), out.seconds,
    )  # fmt: skip
    return out
