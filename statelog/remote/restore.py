"""Restore: rebuild a store from the object store, verifying everything it reads.

:func:`restore` works in a staging directory beside the destination and
renames it into place only at the end, so a restore that fails or dies
leaves no half-restored store behind. Steps, in order:

1. refuse a destination that exists and is not an empty directory (before
   any request); resolve it once, and the staging directory beside it
   (:mod:`.staging`): every path written or removed from then on is
   checked to stay under them;
2. read the MANIFEST (bounded, checksummed, its signature verified when a
   shipping key is set, every name checked against the store's grammar,
   all before any object is requested: :func:`.manifest.read_manifest`),
   pin every object it lists (:mod:`.pins`), read the MANIFEST again, and
   start over if it changed meanwhile: the objects of the version read
   stay until the pin is released or expires;
3. plan with the ladder's rules (:mod:`.plan`): the newest restore point
   (a snapshot whose whole chain the manifest lists) that links to the
   remote log. Download every link of its chain, full snapshot first, and
   verify each (:mod:`.links`: SHA-256 against the manifest and the
   object's metadata, its footer hash as its image is built in ``base/``,
   its digest against what its child names); a snapshot that fails, or
   whose chain fails, is logged at ERROR, named in ``rejected``, left on
   the remote as evidence, and the plan walks back to an older one (or to
   the log from LSN 1); nothing left: :class:`ResnapshotRequired`;
4. download the segments that follow, each hash-checked and scanned whole
   (header, frames, chain from the previous one, its SEAL), in log order,
   the next ones downloaded in two threads while one is checked
   (:mod:`.prefetch`: one fetched ahead and not used is removed). A damaged
   segment stops the restore at the last good epoch before it: later
   segments cannot be replayed without it and no older snapshot skips it.
   The lost epochs are reported and logged CRITICAL; ``strict=True``
   raises :class:`RemoteIntegrityError` instead;
5. write ``IDENTITY`` and ``remote.json`` (what is already on the remote);
   every file goes through temp, fsync, rename, fsync of its directory;
6. unless ``check=False``, recover the staging copy read-only and require
   the epoch planned (the images built in step 3 are mapped where they
   are, and left there for the first open; each record's schema is checked
   again, but not by decoding its values a second time: step 4 did); then
   rename the staging directory to the destination and fsync its parent.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from statelog.errors import (
    RemoteError,
    ResnapshotRequired,
)
from statelog.format.records import RecordSchemaError, decode_record
from statelog.log.reader import SegmentScan, StopKind, scan_segment
from statelog.recovery.readonly import recover_readonly
from statelog.remote.checks import IDENTITY_LIMIT, store_id_of
from statelog.remote.client import RemoteClient
from statelog.remote.entry import Entry
from statelog.remote.errors import RemoteIntegrityError, RemoteNotFoundError
from statelog.remote.links import ChainFetcher
from statelog.remote.links import refuse as _refuse
from statelog.remote.manifest import Manifest, acquire, read_manifest
from statelog.remote.pins import remote_pin
from statelog.remote.plan import Plan, Planner
from statelog.remote.point import Point, apply_cut
from statelog.remote.prefetch import Prefetch
from statelog.remote.record import RECORD, Shipped, ShipRecord, save_record
from statelog.remote.signing import KEY_ENV
from statelog.remote.staging import Staging, resolve_dest
from statelog.remote.url import StoreKeys
from statelog.state.live import EpochsOnly
from statelog.storage.fileio import FileLayer, ReadBuffer
from statelog.storage.layout import BASE_DIR, IDENTITY, SNAPSHOT_DIR, WAL_DIR, StoreLayout

__all__ = ["RestoreResult", "find_store", "identity_bytes", "restore", "segment_problem"]

log = logging.getLogger("statelog.remote")


@dataclass(frozen=True)
class RestoreResult:
    """What :func:`restore` did; ``epoch`` is what ``statelog.open(dest)`` recovers to."""

    dest: Path
    store_id: uuid.UUID
    generation: int  # the writer generation that owned the store when it was read
    epoch: int
    shipped_epoch: int  # the manifest's last_epoch: ``epoch`` unless something was damaged
    snapshot: str | None  # key of the snapshot used
    segments: tuple[str, ...]  # keys of the segments restored, in log order
    rejected: tuple[tuple[str, str], ...]  # (key, reason) of every object refused
    lost_epochs: range
    bytes_downloaded: int
    seconds: float


def find_store(client: RemoteClient) -> uuid.UUID:
    """The one store under the client's prefix.

    :raises RemoteNotFoundError: no store was shipped there.
    :raises RemoteError: several were: name one with ``store_id``.
    """
    ids = [sid for name in client.list_dirs(None) if (sid := store_id_of(name)) is not None]
    if not ids:
        raise RemoteNotFoundError(f"no statelog store under {client.where}")
    if len(ids) > 1:
        raise RemoteError(
            f"{len(ids)} stores under {client.where}: {', '.join(map(str, sorted(ids)))}",
            hint="pass the store id of the one to restore (give each shard its own prefix)",
        )
    return ids[0]


def restore(
    url: str,
    dest: Path,
    *,
    store_id: uuid.UUID | None = None,
    strict: bool = False,
    check: bool = True,
    pin_ttl: timedelta = timedelta(hours=1),
    take_over: bool = False,
    client: RemoteClient | None = None,
    files: FileLayer | None = None,
    upto: int | datetime | None = None,
) -> RestoreResult:
    """Restore the store shipped under ``url`` into ``dest`` (steps in the module docstring).

    :param store_id: which store under the prefix (default: the only one).
    :param strict: raise on a damaged segment instead of stopping before it.
    :param check: recover the staging copy read-only before it becomes ``dest``.
    :param pin_ttl: how long the remote pin protects the objects being read.
    :param take_over: acquire a new writer generation *before* reading the
        manifest (so the previous owner can add nothing after what is
        restored) and record it in ``remote.json``: the failover form.
    :param upto: restore the state as of this epoch (or the last epoch committed at or
        before this time), not the newest: the newest snapshot at or before it,
        the segments up to the one holding it, cut after its record (that
        segment is then not listed as shipped: it differs from the remote's).
        By time, a snapshot is chosen by the commit time its meta names, so
        snapshots after the time are downloaded and passed over.
    :raises EpochUnavailableError: ``upto`` cannot be reached (after the shipped
        log, or damage stops before it); ``dest`` was not created.
    :raises NotAStoreError: ``dest`` is not empty (or a dangling symlink), or a symlink
        stands where the staging directory goes; nothing was changed.
    :raises RemoteIntegrityError: the MANIFEST does not verify, is not signed with the
        shipping key, or names an object or a file outside the store's grammar (before
        any object is requested); or ``IDENTITY`` does not verify.
    :raises RemoteNotFoundError: no store or no manifest at ``url``.
    :raises ResnapshotRequired: no snapshot verifies and the remote log does not reach LSN 1.
    :raises RemoteIntegrityError: ``strict`` and a segment is damaged.
    :raises NotAStoreError: a symlink appeared inside the staging directory (it is removed).
    :raises RemoteError: requests failed after their retries; ``dest`` was not created.
    :raises OSError: writing the local files failed; ``dest`` was not created.
    """
    started = time.perf_counter()
    Point.of(upto)  # a bad point is refused before anything is contacted
    dest = resolve_dest(dest)
    files = files or FileLayer()
    client = client or RemoteClient.from_url(url)
    sid = store_id or find_store(client)
    generation = acquire(client, sid) if take_over else 0
    for _ in range(5):
        cur = read_manifest(client, sid)
        if cur is None:
            raise RemoteNotFoundError(f"store {sid} has no MANIFEST at {url}")
        names = [e.key for e in cur.manifest.objects] + [StoreKeys(sid).identity]
        with remote_pin(client, sid, names, ttl=pin_ttl, purpose="restore"):
            again = read_manifest(client, sid)
            if again is None or again.etag != cur.etag:
                continue  # retention (or a ship) moved on: pin the new version instead
            st = Staging(dest, client, files)
            try:
                result = _restore(st, cur.manifest, sid, dest, strict, check, generation, upto)
            except BaseException:
                st.discard()
                raise
        if dest.exists():
            dest.rmdir()  # empty, checked above; rename() cannot replace it atomically anyway
        files.rename(st.root, dest)
        files.fsync_dir(dest.parent)
        if generation:
            apply_cut(dest, client, sid, generation, files)  # this restore took it over
        done = RestoreResult(**{**result.__dict__, "seconds": time.perf_counter() - started})
        log.info(
            "event=restored dest=%s store_id=%s epoch=%d shipped_epoch=%d rejected=%d lost=%d "
            "bytes=%d seconds=%.3f",
            dest, sid, done.epoch, done.shipped_epoch, len(done.rejected),
            len(done.lost_epochs), done.bytes_downloaded, done.seconds,
        )  # fmt: skip
        return done
    raise RemoteError(f"the MANIFEST of {sid} kept changing while a restore tried to pin it")


def identity_bytes(client: RemoteClient, m: Manifest, sid: uuid.UUID) -> bytes:
    """Download ``IDENTITY`` (bounded) and check it against the manifest's hash.

    :raises RemoteIntegrityError: its hash differs, or a signed manifest lists none.
    """
    key = StoreKeys(sid).identity
    if not m.identity_sha256 and client.key is not None:
        raise RemoteIntegrityError(
            key, f"the signed manifest lists no hash of IDENTITY ({KEY_ENV} is set)"
        )
    identity = client.get(key, limit=IDENTITY_LIMIT).data
    if m.identity_sha256 and hashlib.sha256(identity).hexdigest() != m.identity_sha256:
        raise RemoteIntegrityError(key, "sha256 differs from the manifest's")
    return identity


def _identity(st: Staging, m: Manifest, sid: uuid.UUID) -> None:
    """Write the checked ``IDENTITY`` to staging; it must name store ``sid``."""
    st.write(IDENTITY, identity_bytes(st.client, m, sid))
    if StoreLayout(st.root).read_identity(st.files) != sid:
        raise RemoteIntegrityError(StoreKeys(sid).identity, "IDENTITY names another store")


def _restore(
    st: Staging,
    m: Manifest,
    sid: uuid.UUID,
    dest: Path,
    strict: bool,
    check: bool,
    generation: int,
    upto: int | datetime | None = None,
) -> RestoreResult:
    _identity(st, m, sid)
    rejected: dict[str, str] = {}
    planner = Planner(m)
    links = ChainFetcher(st, sid, rejected, planner.chain_of)
    point = Point.of(upto)

    def accept(snap: Entry) -> bool:
        return point.may_start(snap) and links.accept(snap) and point.starts(st, snap)

    plan = planner.walk(accept, lambda snap, why: _refuse(rejected, snap.key, why))
    if plan is None:
        tried = [(Path(k), why) for k, why in rejected.items()]
        raise ResnapshotRequired(
            f"no remote snapshot of {sid} verifies and the remote log does not reach LSN 1",
            tried,
        )
    links.keep_only({e.name for e in plan.chain})  # no snapshot left without its chain
    restored: list[Entry] = list(plan.chain)
    if plan.covering is not None and _segment_ok(st, plan.covering, sid, None, rejected):
        restored.append(plan.covering)
    # Segments after an epoch asked for are never wanted: not even fetched ahead.
    wanted = [e for e in plan.segments if point.may_want(e)]
    with Prefetch(st, wanted) as ahead:
        epoch = _follow(st, plan, sid, point, restored, rejected, strict, ahead.fetch)
    if point.bounded:
        epoch = point.cut(st, restored, epoch, m.last_epoch)
    now = int(time.time() * 1000)
    record = ShipRecord(
        url=st.client.where, store_id=str(sid), generation=generation,
        last_epoch=epoch if point.bounded else m.last_epoch, last_ship_ms=now,
        cut_at=epoch if point.bounded and epoch < m.last_epoch else 0,
        files={
            f"{WAL_DIR if e.kind == 'wal' else SNAPSHOT_DIR}/{e.name}": Shipped(
                e.key, e.sha256, e.size, now
            )
            for e in restored
        },
    )  # fmt: skip
    st.confined.path(RECORD)
    st.confined.path(RECORD + ".tmp")
    save_record(st.root, record, st.files)
    if check:
        _check_recovers(st.root, epoch)
    return RestoreResult(
        dest, sid, m.generation, epoch, m.last_epoch,
        plan.snapshot.key if plan.snapshot else None,
        tuple(e.key for e in restored if e.kind == "wal"),
        tuple(rejected.items()),
        range(0) if point.bounded else range(epoch + 1, max(epoch, m.last_epoch) + 1),
        st.bytes, 0.0,
    )  # fmt: skip


def _follow(
    st: Staging,
    plan: Plan,
    sid: uuid.UUID,
    point: Point,
    restored: list[Entry],
    rejected: dict[str, str],
    strict: bool,
    fetch: Callable[[Entry], Path],
) -> int:
    """Check the plan's segments in log order, adding each good one to ``restored``, up
    to the first damaged one or the point asked for; the epoch they reach."""
    epoch = plan.snapshot.last_lsn if plan.snapshot else 0
    chain = plan.snapshot.end_crc if plan.snapshot else 0
    for e in plan.segments:
        if not point.wants(e, epoch):
            break
        if not _segment_ok(st, e, sid, chain, rejected, fetch):
            if strict:
                raise RemoteIntegrityError(e.key, rejected[e.key])
            log.critical(
                "event=remote_segment_damaged key=%s reason=%r restored_to=%d lost_epochs=%d-%d",
                e.key, rejected[e.key], epoch, epoch + 1, plan.epoch,
            )  # fmt: skip
            break
        restored.append(e)
        epoch, chain = e.last_lsn, e.end_crc
        point.seen(st, e)
    return epoch


def _segment_ok(
    st: Staging,
    e: Entry,
    sid: uuid.UUID,
    chain: int | None,
    rejected: dict[str, str],
    fetch: Callable[[Entry], Path] | None = None,
) -> bool:
    try:
        path = (fetch or st.fetch)(e)
    except (RemoteIntegrityError, RemoteNotFoundError) as exc:
        return _refuse(rejected, e.key, getattr(exc, "reason", None) or str(exc))
    why = segment_problem(path, e, sid, chain, st.reads)
    if why is not None:
        st.remove(e)
        return _refuse(rejected, e.key, why)
    return True


def segment_problem(
    path: Path, e: Entry, sid: uuid.UUID, chain: int | None, reads: ReadBuffer | None = None
) -> str | None:
    """Why the downloaded segment ``path`` of entry ``e`` cannot be used, or None.

    Scanned whole: its header (of store ``sid``, continuing ``chain`` unless None),
    every frame and the chain through them, a SEAL that agrees with the manifest,
    and every record's schema. Read into ``reads`` if given (a caller checking
    many segments keeps one); nothing returned points into it.
    """
    data = (reads or ReadBuffer()).read(path)
    scan = scan_segment(path, data, store_id=sid, prev_crc=chain, is_last=False)
    if scan.stop.kind is not StopKind.CLEAN:
        return scan.stop.reason
    if (scan.sealed_lsn, scan.end_crc) != (e.last_lsn, e.end_crc):
        return "the segment's SEAL disagrees with the manifest"
    return _schema_problem(scan)


def _schema_problem(scan: SegmentScan) -> str | None:
    """Why a record of ``scan`` breaks the commit record schema, or None: a record
    that verifies but breaks it is damage, as a checksum mismatch there is."""
    for rec in scan.records:
        try:
            decode_record(rec.payload)
        except RecordSchemaError as exc:
            return f"offset {rec.offset}: {exc.message}"
    return None


def _check_recovers(root: Path, epoch: int) -> None:
    """Recover the staging copy read-only; it must reach ``epoch`` exactly."""
    # The staging copy is this restore's alone: its images (built while the chain was
    # verified) are mapped where they are, and stay for the first open.
    # Every segment here passed segment_problem, which decoded each value: not again.
    # Only the epoch reached is compared, so no overlay of the tail is built for it.
    with recover_readonly(
        root, image_dir=root / BASE_DIR, values_checked=True, state=EpochsOnly()
    ) as ro:
        got = ro.state.epoch
    if got != epoch:
        raise RemoteError(
            f"the restored copy recovers to epoch {got}, the plan reached {epoch}",
            hint="report this as a bug with the restore log; the destination was not created",
        )
