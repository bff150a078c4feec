"""Mirroring a shipped store: the standby's copy of what a remote's MANIFEST lists.

:func:`mirror_remote` brings the copy up to date with one look at the remote,
in this order:

1. the MANIFEST is read and checked as a restore checks it (bounded,
   checksummed, signed when a shipping key is set, every name in the store's
   grammar) before any object is requested;
2. a new copy gets the store's ``IDENTITY``, its hash checked against the
   manifest's (directories first, the identity last, as a store is created);
   an existing copy must carry the same store id;
3. the newest restore point is planned with the restore's rules
   (:mod:`statelog.remote.plan`): a snapshot chain and the sealed segments
   that continue the log after it. What of it the copy lacks is pinned on the
   remote, the MANIFEST read again under the pin (if it moved, the look starts
   over), then downloaded (temp file, fsync, rename, fsync of the directory)
   and its SHA-256 checked against the manifest; each new segment is scanned
   whole as a restore scans it (header, frames, the chain from the segment
   before, its SEAL, every record's schema). An object that fails is removed
   from the copy, remembered as refused (this standby never downloads it
   again) and logged at ERROR: a snapshot is walked past to an older restore
   point; a segment stops the look at the segment before it;
4. files older than everything the plan uses are deleted from the copy (pins
   of the copy honoured), so its disk stays bounded as the remote's does.

Only sealed segments reach a remote, so a remote standby trails its writer by
the shipping interval plus one look. Nothing here decodes a snapshot: the
standby's recovery of the copy verifies it as any read does.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection
from datetime import timedelta
from pathlib import Path

from statelog.errors import (
    NotAStoreError,
    PromotionLostError,
    PromotionRefusedError,
    RemoteError,
    StorageError,
)
from statelog.log.segments import list_segments
from statelog.remote.checks import Confined
from statelog.remote.client import RemoteClient
from statelog.remote.encoding import holds_file
from statelog.remote.entry import Entry
from statelog.remote.errors import RemoteIntegrityError, RemoteNotFoundError
from statelog.remote.manifest import Manifest, acquire_after, read_manifest
from statelog.remote.pins import remote_pin
from statelog.remote.plan import Plan, Planner
from statelog.remote.record import Shipped, ShipRecord, update_record
from statelog.remote.restore import find_store, identity_bytes, segment_problem
from statelog.remote.staging import download
from statelog.replica.mirror import MirrorResult, prune
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import SNAPSHOT_DIR, WAL_DIR, StoreLayout

__all__ = ["RemoteSource", "claim_copy", "mirror_remote"]

log = logging.getLogger("statelog.replica.standby")

_ROUNDS = 5  # looks started over because the MANIFEST moved under the pin
_PIN_TTL = timedelta(minutes=30)
_NO_SEGMENT = 1 << 62  # above every segment sequence: prune all of them


class RemoteSource:
    """A remote URL followed by a standby: its client, its store and what it refused.

    :raises RemoteNotFoundError: nothing was shipped under ``url``.
    :raises RemoteError: several stores are there, or the remote cannot be reached.
    """

    def __init__(self, url: str, *, client: RemoteClient | None = None) -> None:
        self.url = url
        self.client = client or RemoteClient.from_url(url)
        self.store_id: uuid.UUID = find_store(self.client)
        self.refused: dict[str, str] = {}
        """Keys of objects that failed their checks, and why: never downloaded again."""
        self.generation = 0
        """The writer generation that owned the store at the last look."""
        self.manifest: Manifest | None = None
        """The MANIFEST the last look read."""
        self.held: dict[str, str] = {}
        """Copy files this process knows to hold an object: local name -> its key."""

    def __str__(self) -> str:
        return self.url

    def mirror(self, dest: Path, files: FileLayer | None = None) -> MirrorResult:
        """One look: :func:`mirror_remote` into ``dest``."""
        return mirror_remote(self, dest, files)


def mirror_remote(src: RemoteSource, dest: Path, files: FileLayer | None = None) -> MirrorResult:
    """Bring the copy at ``dest`` up to date with the remote (module docstring).

    :raises RemoteNotFoundError: the store has no MANIFEST (any more).
    :raises RemoteIntegrityError: the MANIFEST or ``IDENTITY`` does not verify.
    :raises NotAStoreError: ``dest`` holds another store, or a file; a symlink was
        planted in it.
    :raises ResnapshotRequired: no restore point of the remote verifies.
    :raises RemoteError: the requests failed after their retries, or the MANIFEST
        kept changing.
    :raises StorageError: an I/O error on the copy (nothing partial is visible).
    """
    files = files or FileLayer()
    try:
        for _ in range(_ROUNDS):
            cur = read_manifest(src.client, src.store_id)
            if cur is None:
                raise RemoteNotFoundError(
                    f"store {src.store_id} has no MANIFEST at {src.url}",
                    hint="the store was never shipped there, or its remote copy was removed",
                )
            taken_over = bool(src.generation) and cur.manifest.generation != src.generation
            src.generation, src.manifest = cur.manifest.generation, cur.manifest
            _identity(src, cur.manifest, dest, files)
            result = MirrorResult(source_epoch=cur.manifest.last_epoch)
            if taken_over:
                # Another writer took the store over, perhaps from an earlier point: its
                # log need not continue what was applied, so the state is rebuilt.
                result.rewound.append("MANIFEST")
            plan = _plan(src, cur.manifest, dest)
            if plan is None:
                return result  # nothing shipped that reaches back to a restore point yet
            wanted = [e for e in _uses(plan, src.refused) if not _present(src, dest, e)]
            if wanted:
                keys = [e.key for e in wanted]
                with remote_pin(src.client, src.store_id, keys, ttl=_PIN_TTL, purpose="standby"):
                    again = read_manifest(src.client, src.store_id)
                    if again is None or again.etag != cur.etag:
                        continue  # retention or a ship moved on: plan the new version
                    if not _fetch(src, dest, files, plan, wanted, result):
                        continue  # a snapshot was refused: plan an older restore point
            _prune(dest, plan, files, result)
            return result
    except OSError as exc:
        raise StorageError(f"mirroring {src.url} to {dest} failed: {exc}", errno=exc.errno) from exc
    raise RemoteError(f"the MANIFEST of {src.store_id} kept changing while a standby read it")


def _identity(src: RemoteSource, m: Manifest, dest: Path, files: FileLayer) -> None:
    layout = StoreLayout(dest)
    if layout.identity.exists():
        if layout.read_identity(files) != src.store_id:
            raise NotAStoreError(
                f"{dest} holds another store than {src.url}",
                hint="give the standby an empty directory of its own",
            )
        return
    data = identity_bytes(src.client, m, src.store_id)
    layout.check_can_host()
    for d in (layout.wal, layout.snapshots):
        files.makedirs(d)
    files.create_durable(layout.identity, data)
    if layout.read_identity(files) != src.store_id:
        files.remove(layout.identity)
        raise RemoteIntegrityError(f"{src.store_id}/IDENTITY", "IDENTITY names another store")


def _plan(src: RemoteSource, m: Manifest, dest: Path) -> Plan | None:
    """The newest restore point whose chain holds no refused object."""
    planner = Planner(m)

    def usable(snap: Entry) -> bool:
        chain = planner.chain_of(snap)
        return not isinstance(chain, str) and all(e.key not in src.refused for e in chain)

    return planner.walk(usable)


def _uses(plan: Plan, refused: Collection[str] = ()) -> list[Entry]:
    """Every object the plan restores from, snapshots first, then the log in order up
    to the first segment in ``refused`` (the log cannot be replayed past it)."""
    covering = [plan.covering] if plan.covering is not None else []
    log_entries = [*covering, *plan.segments]
    cut = next((i for i, e in enumerate(log_entries) if e.key in refused), len(log_entries))
    return [*plan.chain, *log_entries[:cut]]


def _path(dest: Path, e: Entry) -> Path:
    return Confined(dest).path(WAL_DIR if e.kind == "wal" else SNAPSHOT_DIR, e.name)


def _present(src: RemoteSource, dest: Path, e: Entry) -> bool:
    """Whether the copy holds ``e`` (files appear by rename, never partly): a file of its
    name and size that this process downloaded as ``e``, or whose SHA-256 is ``e``'s (a
    file of another writer generation may have the same name and size)."""
    path = _path(dest, e)
    try:
        if path.stat().st_size != e.local_size:
            return False
    except FileNotFoundError:
        return False
    if src.held.get(e.name) == e.key:
        return True
    if not holds_file(path, e):
        return False
    src.held[e.name] = e.key
    return True


def _fetch(
    src: RemoteSource,
    dest: Path,
    files: FileLayer,
    plan: Plan,
    wanted: list[Entry],
    result: MirrorResult,
) -> bool:
    """Download ``wanted``; False if a snapshot of the plan was refused (plan again)."""
    root = Confined(dest)
    todo = {e.key for e in wanted}
    chain = plan.snapshot.end_crc if plan.snapshot is not None else 0
    for e in _uses(plan, src.refused):
        link = None if e.kind != "wal" or e is plan.covering else chain
        if e.key in todo and not _download(src, root, files, e, link):
            if e.kind == "snapshot":
                return False
            break  # later segments cannot be replayed without this one
        if e.key in todo:
            which = result.snapshots if e.kind == "snapshot" else result.segments
            which.append(f"{SNAPSHOT_DIR if e.kind == 'snapshot' else WAL_DIR}/{e.name}")
            result.copied_bytes += e.local_size
        if e.kind == "wal" and e is not plan.covering:
            chain = e.end_crc
    return True


def _download(
    src: RemoteSource, root: Confined, files: FileLayer, e: Entry, chain: int | None
) -> bool:
    """Download and check one object; refuse it (and remove it) if it fails.

    :param chain: the chain value a segment must continue (None: not checked, as for
        the segment a snapshot ends in, whose start lies before the snapshot).
    """
    sub = WAL_DIR if e.kind == "wal" else SNAPSHOT_DIR
    for left in (".tmp", ".obj.tmp"):  # left by a look that died mid-download
        files.remove(root.path(sub, e.name + left))
    try:
        path = download(src.client, root, files, e)
    except (RemoteIntegrityError, RemoteNotFoundError) as exc:
        return _refuse(src, e, getattr(exc, "reason", None) or str(exc))
    why = segment_problem(path, e, src.store_id, chain) if e.kind == "wal" else None
    if why is not None:
        files.remove(path)
        return _refuse(src, e, why)
    src.held[e.name] = e.key
    return True


def _refuse(src: RemoteSource, e: Entry, why: str) -> bool:
    src.refused[e.key] = why
    log.error(
        "event=standby_damage source=%s key=%s reason=%r hint=%s",
        src.url, e.key, why,
        "the standby walks past a damaged snapshot, and stops before a damaged segment "
        "until a snapshot past it is shipped",
    )  # fmt: skip
    return False


def _prune(dest: Path, plan: Plan, files: FileLayer, result: MirrorResult) -> None:
    """Delete what is older than everything the plan uses.

    With a snapshot, every segment before the first one the plan uses goes,
    all of them if it uses none: a segment the remote no longer lists (the
    one the snapshot ends in, deleted before it was shipped) must not leave
    an older one in the copy that recovery would take for it.
    """
    used = {e.name for e in _uses(plan) if e.kind == "wal"}
    for _seq, _lsn, path in list_segments(StoreLayout(dest).wal):
        if path.name not in used and (plan.snapshot is None or _seq >= _first_seq(plan)):
            # A segment of a history the remote no longer lists (a takeover from an
            # earlier point): recovery must not replay it after the plan's.
            files.remove(path)
            result.deleted.append(f"{WAL_DIR}/{path.name}")
            result.rewound.append(f"{WAL_DIR}/{path.name}")
    if plan.snapshot is None:
        return
    seqs = [e.sequence for e in _uses(plan) if e.kind == "wal"]
    kept = {e.name for e in plan.chain}
    prune(dest, min(seqs, default=_NO_SEGMENT), kept, plan.chain[0].last_lsn, files, result)


def _first_seq(plan: Plan) -> int:
    return min((e.sequence for e in _uses(plan) if e.kind == "wal"), default=_NO_SEGMENT)


def claim_copy(
    src: RemoteSource,
    dest: Path,
    look: Callable[[], object],
    applied: Callable[[], int],
    files: FileLayer | None = None,
) -> int:
    """Make the standby's copy the writer of the remote store: the promotion's remote steps.

    ``look`` is the standby's step (:func:`mirror_remote`, then applying) and
    ``applied`` the epoch its state stands at. Durable order: a look, refused
    unless the copy then holds every epoch the MANIFEST lists (a promoted copy
    that stopped short, at an object it refused, would continue the log from
    an older epoch than the bucket's, and discard acknowledged epochs); the
    MANIFEST's conditional write of the generation after the one that look
    saw (:func:`~statelog.remote.manifest.acquire_after`; from then on the old
    writer is fenced, and what the manifest lists is final); the last look,
    checked the same way, which brings the copy up to all of it; the copy's
    ``remote.json`` (temp, fsync, rename, fsync of the directory), naming the
    generation, every object the copy holds as already shipped and its highest
    segment as adopted history, so the copy's writer claims the generation on
    open and its daemon ships only what is new.

    :returns: the generation the copy's writer now owns.
    :raises PromotionRefusedError: the copy cannot apply every epoch the
        MANIFEST lists (an object failed its checks); before the generation was
        taken nothing was written, after it the old writer is fenced and the
        copy was not claimed.
    :raises PromotionLostError: the manifest names another generation than the
        standby's last look saw (another promotion won); nothing was written.
    :raises RemoteError: the remote could not be read or written; if the
        generation was taken already, the old writer is fenced and promoting
        again takes the next one.
    :raises StorageError: an I/O error on the copy.
    """
    files = files or FileLayer()
    look()
    _check_complete(src, dest, applied(), taken=False)
    gen = acquire_after(src.client, src.store_id, src.generation)
    if gen is None:
        raise PromotionLostError(
            f"store {src.store_id} at {src.url} was taken over since the standby's last "
            f"look (it saw writer generation {src.generation})"
        )
    src.generation = gen
    look()
    manifest = _check_complete(src, dest, applied(), taken=True)
    now = int(time.time() * 1000)
    shipped = {
        f"{WAL_DIR if e.kind == 'wal' else SNAPSHOT_DIR}/{e.name}": Shipped(
            e.key, e.sha256, e.size, now
        )
        for e in manifest.objects
        if _present(src, dest, e)
    }
    through = max((seq for seq, _f, _p in list_segments(StoreLayout(dest).wal)), default=0)

    def record(_cur: ShipRecord | None) -> ShipRecord:
        return ShipRecord(
            url=src.url, store_id=str(src.store_id), generation=gen,
            last_epoch=manifest.last_epoch, last_ship_ms=now, files=shipped,
            adopted_through=through,
        )  # fmt: skip

    update_record(dest, record, files)
    log.warning(
        "event=standby_claimed store=%s source=%s generation=%d epoch=%d",
        dest, src.url, gen, manifest.last_epoch,
    )  # fmt: skip
    return gen


def _check_complete(src: RemoteSource, dest: Path, epoch: int, *, taken: bool) -> Manifest:
    """The MANIFEST of the last look, if the copy's ``epoch`` reaches its last epoch.

    :raises PromotionRefusedError: it does not (the objects refused are named).
    """
    manifest = src.manifest
    assert manifest is not None  # set by the look before
    if epoch >= manifest.last_epoch:
        return manifest
    refused = "; ".join(f"{key}: {why}" for key, why in sorted(src.refused.items())[:3])
    fenced = (
        f"writer generation {src.generation} was taken, so the old writer is fenced; "
        if taken
        else "nothing was changed; "
    )
    raise PromotionRefusedError(
        f"standby {dest} holds epochs through {epoch} but {src.url} lists epochs through "
        f"{manifest.last_epoch}: {refused or 'the objects after it could not be applied'}",
        hint=f"{fenced}promoting would discard the acknowledged epochs {epoch + 1}.."
        f"{manifest.last_epoch}. Put intact copies of the refused objects back (from the "
        "old host's disk if it survives) and promote again; or, to accept the loss, "
        "`statelog restore` the remote into a new directory (it reports what is lost)",
    )
