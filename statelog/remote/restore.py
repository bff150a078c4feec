"""Restore: rebuild a store from the object store, verifying everything it reads.

:func:`restore` works in a staging directory beside the destination and
renames it into place only at the end, so a restore that fails or dies
leaves no half-restored store behind. Steps, in order:

1. refuse a destination that exists and is not an empty directory (before
   any request);
2. read the MANIFEST, pin every object it lists (:mod:`.pins`), read the
   MANIFEST again, and start over if it changed meanwhile: the objects of
   the version read stay until the pin is released or expires;
3. plan with the ladder's rules (:mod:`.plan`): the newest snapshot that
   links to the remote log. Download it, check its SHA-256 against the
   manifest and the object's metadata, then verify its own footer hash;
   a snapshot that fails is logged at ERROR, named in ``rejected``, left
   on the remote as evidence, and the plan walks back to an older one (or
   to the log from LSN 1); nothing left: :class:`ResnapshotRequired`;
4. download the segments that follow, each hash-checked and scanned whole
   (header, frames, chain from the previous one, its SEAL). A damaged
   segment stops the restore at the last good epoch before it: later
   segments cannot be replayed without it and no older snapshot skips it.
   The lost epochs are reported and logged CRITICAL; ``strict=True``
   raises :class:`RemoteIntegrityError` instead;
5. write ``IDENTITY`` and ``remote.json`` (what is already on the remote);
   every file goes through temp, fsync, rename, fsync of its directory;
6. unless ``check=False``, open the staging copy read-only and require the
   epoch planned; then rename the staging directory to the destination and
   fsync its parent.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from statelog.errors import (
    CorruptionError,
    FormatVersionError,
    NotAStoreError,
    RemoteError,
    ResnapshotRequired,
)
from statelog.format.records import RecordSchemaError, decode_record
from statelog.log.reader import SegmentScan, StopKind, scan_segment
from statelog.recovery.readonly import recover_readonly
from statelog.remote.client import SHA256_ATTR, RemoteClient
from statelog.remote.errors import RemoteIntegrityError, RemoteNotFoundError
from statelog.remote.manifest import Entry, Manifest, acquire, read_manifest
from statelog.remote.pins import remote_pin
from statelog.remote.plan import plan_restore
from statelog.remote.record import Shipped, ShipRecord, save_record
from statelog.remote.url import StoreKeys
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import IDENTITY, SNAPSHOT_DIR, WAL_DIR, StoreLayout
from statelog.storage.snapshots import verify_snapshot

__all__ = ["RestoreResult", "find_store", "restore"]

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
    ids: list[uuid.UUID] = []
    for name in client.list_dirs(None):
        with contextlib.suppress(ValueError):
            ids.append(uuid.UUID(name))
    if not ids:
        raise RemoteNotFoundError(f"no statelog store under {client.where}")
    if len(ids) > 1:
        raise RemoteError(
            f"{len(ids)} stores under {client.where}: {', '.join(map(str, sorted(ids)))}",
            hint="pass the store id of the one to restore (give each shard its own prefix)",
        )
    return ids[0]


class _Staging:
    """The directory a restore fills before it becomes the store."""

    def __init__(self, root: Path, client: RemoteClient, files: FileLayer) -> None:
        self.root, self.client, self.files = root, client, files
        self.bytes = 0

    def fetch(self, e_key: str, sha: str, dest: Path) -> None:
        """Download ``e_key`` to ``dest``: temp file, hash check, fsync, rename, fsync dir.

        :raises RemoteIntegrityError: the bytes do not hash to ``sha`` (dest not created).
        """
        tmp = dest.with_name(dest.name + ".tmp")
        try:
            with open(tmp, "wb") as out:
                got, attrs, size = self.client.get_into(e_key, out)
                out.flush()
                os.fsync(out.fileno())
            self.bytes += size
            if got != sha:
                raise RemoteIntegrityError(e_key, f"sha256 {got[:16]}..., manifest {sha[:16]}...")
            if attrs.get(SHA256_ATTR, sha) != sha:
                raise RemoteIntegrityError(e_key, "the object's sha256 metadata disagrees")
            self.files.rename(tmp, dest)
        except BaseException:
            self.files.remove(tmp)
            raise
        self.files.fsync_dir(dest.parent)


def _check_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise NotAStoreError(
            f"{dest} exists and is not an empty directory",
            hint="restore into a new or empty directory; nothing was changed",
        )


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
) -> RestoreResult:
    """Restore the store shipped under ``url`` into ``dest`` (steps in the module docstring).

    :param store_id: which store under the prefix (default: the only one).
    :param strict: raise on a damaged segment instead of stopping before it.
    :param check: recover the staging copy read-only before it becomes ``dest``.
    :param pin_ttl: how long the remote pin protects the objects being read.
    :param take_over: acquire a new writer generation *before* reading the
        manifest (so the previous owner can add nothing after what is
        restored) and record it in ``remote.json``: the failover form.
    :raises NotAStoreError: ``dest`` is not empty; nothing was changed.
    :raises RemoteNotFoundError: no store or no manifest at ``url``.
    :raises ResnapshotRequired: no snapshot verifies and the remote log does not reach LSN 1.
    :raises RemoteIntegrityError: ``strict`` and a segment is damaged.
    :raises RemoteError: requests failed after their retries; ``dest`` was not created.
    :raises OSError: writing the local files failed; ``dest`` was not created.
    """
    started = time.perf_counter()
    dest = Path(dest)
    _check_dest(dest)
    files = files or FileLayer()
    client = client or RemoteClient.from_url(url)
    sid = store_id or find_store(client)
    staging = dest.parent / f".{dest.name}.restoring"
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
            if staging.exists():
                shutil.rmtree(staging)  # a restore that died before its rename
            try:
                result = _restore(
                    client, cur.manifest, sid, staging, dest, strict, check, files, generation
                )
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        files.makedirs(dest.parent)
        if dest.exists():
            dest.rmdir()  # empty, checked above; rename() cannot replace it atomically anyway
        files.rename(staging, dest)
        files.fsync_dir(dest.parent)
        done = RestoreResult(**{**result.__dict__, "seconds": time.perf_counter() - started})
        log.info(
            "event=restored dest=%s store_id=%s epoch=%d shipped_epoch=%d rejected=%d lost=%d "
            "bytes=%d seconds=%.3f",
            dest, sid, done.epoch, done.shipped_epoch, len(done.rejected),
            len(done.lost_epochs), done.bytes_downloaded, done.seconds,
        )  # fmt: skip
        return done
    raise RemoteError(f"the MANIFEST of {sid} kept changing while a restore tried to pin it")


def _restore(
    client: RemoteClient,
    m: Manifest,
    sid: uuid.UUID,
    root: Path,
    dest: Path,
    strict: bool,
    check: bool,
    files: FileLayer,
    generation: int,
) -> RestoreResult:
    st = _Staging(root, client, files)
    files.makedirs(root / WAL_DIR)
    files.makedirs(root / SNAPSHOT_DIR)
    identity = client.get(StoreKeys(sid).identity).data
    if m.identity_sha256 and hashlib.sha256(identity).hexdigest() != m.identity_sha256:
        raise RemoteIntegrityError(StoreKeys(sid).identity, "sha256 differs from the manifest's")
    files.create_durable(root / IDENTITY, identity)
    if StoreLayout(root).read_identity(files) != sid:
        raise RemoteIntegrityError(StoreKeys(sid).identity, "IDENTITY names another store")
    rejected: dict[str, str] = {}
    while True:
        plan = plan_restore(m, refused=rejected)
        if plan is None:
            tried = [(Path(k), why) for k, why in rejected.items()]
            raise ResnapshotRequired(
                f"no remote snapshot of {sid} verifies and the remote log does not reach LSN 1",
                tried,
            )
        if plan.snapshot is None or _snapshot_ok(st, plan.snapshot, sid, rejected):
            break
    restored: list[Entry] = [plan.snapshot] if plan.snapshot else []
    if plan.covering is not None and _segment_ok(st, plan.covering, sid, None, rejected):
        restored.append(plan.covering)
    epoch = plan.snapshot.last_lsn if plan.snapshot else 0
    chain = plan.snapshot.end_crc if plan.snapshot else 0
    for e in plan.segments:
        if not _segment_ok(st, e, sid, chain, rejected):
            if strict:
                raise RemoteIntegrityError(e.key, rejected[e.key])
            log.critical(
                "event=remote_segment_damaged key=%s reason=%r restored_to=%d lost_epochs=%d-%d",
                e.key, rejected[e.key], epoch, epoch + 1, plan.epoch,
            )  # fmt: skip
            break
        restored.append(e)
        epoch, chain = e.last_lsn, e.end_crc
    now = int(time.time() * 1000)
    record = ShipRecord(
        url=client.where, store_id=str(sid), generation=generation, last_epoch=m.last_epoch,
        last_ship_ms=now,
        files={
            f"{WAL_DIR if e.kind == 'wal' else SNAPSHOT_DIR}/{e.name}": Shipped(
                e.key, e.sha256, e.size, now
            )
            for e in restored
        },
    )  # fmt: skip
    save_record(root, record, files)
    if check:
        _check_recovers(root, epoch)
    return RestoreResult(
        dest, sid, m.generation, epoch, m.last_epoch,
        plan.snapshot.key if plan.snapshot else None,
        tuple(e.key for e in restored if e.kind == "wal"),
        tuple(rejected.items()), range(epoch + 1, max(epoch, m.last_epoch) + 1), st.bytes, 0.0,
    )  # fmt: skip


def _refuse(rejected: dict[str, str], key: str, why: str) -> bool:
    log.error("event=remote_object_rejected key=%s reason=%r", key, why)
    rejected[key] = why
    return False


def _snapshot_ok(st: _Staging, e: Entry, sid: uuid.UUID, rejected: dict[str, str]) -> bool:
    path = st.root / SNAPSHOT_DIR / e.name
    try:
        st.fetch(e.key, e.sha256, path)
        meta = verify_snapshot(st.files, path, store_id=sid)
    except (RemoteIntegrityError, CorruptionError, FormatVersionError, RemoteNotFoundError) as exc:
        st.files.remove(path)
        return _refuse(rejected, e.key, getattr(exc, "reason", None) or str(exc))
    if (meta.lsn, meta.chain) != (e.last_lsn, e.end_crc):
        st.files.remove(path)
        return _refuse(rejected, e.key, "snapshot header disagrees with the manifest")
    return True


def _segment_ok(
    st: _Staging, e: Entry, sid: uuid.UUID, chain: int | None, rejected: dict[str, str]
) -> bool:
    path = st.root / WAL_DIR / e.name
    try:
        st.fetch(e.key, e.sha256, path)
    except (RemoteIntegrityError, RemoteNotFoundError) as exc:
        return _refuse(rejected, e.key, getattr(exc, "reason", None) or str(exc))
    scan = scan_segment(path, path.read_bytes(), store_id=sid, prev_crc=chain, is_last=False)
    why = None
    if scan.stop.kind is not StopKind.CLEAN:
        why = scan.stop.reason
    elif (scan.sealed_lsn, scan.end_crc) != (e.last_lsn, e.end_crc):
        why = "the segment's SEAL disagrees with the manifest"
    else:
        why = _schema_problem(scan)
    if why is not None:
        st.files.remove(path)
        return _refuse(rejected, e.key, why)
    return True


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
    with recover_readonly(root) as ro:
        got = ro.state.epoch
    if got != epoch:
        raise RemoteError(
            f"the restored copy recovers to epoch {got}, the plan reached {epoch}",
            hint="report this as a bug with the restore log; the destination was not created",
        )
