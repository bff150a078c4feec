"""The MANIFEST object: the writer generation (fencing) and the index of shipped objects.

``<prefix>/<store-id>/MANIFEST`` is the one mutable object of a store. It is
created with If-None-Match (never over an existing one) and replaced only
with If-Match on the ETag read, so two writers can never both succeed from
the same version. Its ``generation`` is the writer that owns the store:

* :func:`acquire` bumps it (a takeover): every writer that read an older
  version loses its next conditional write;
* :func:`create_first` creates generation 1 of a store never shipped, and
  is idempotent for one store directory: the writer's claim and the
  daemon's first ship may both call it at once, and both end holding
  generation 1 (the manifest names the directory that created it,
  ``origin``); a copy of the directory is refused;
* :func:`commit` (used by shipping and retention) first checks that the
  generation read is the caller's; if not it raises
  :class:`~statelog.errors.FencedError` and writes nothing.

The index lists every object a restore may use, with its SHA-256, size and
place in the log. An uploaded object that no manifest version lists (a
fenced writer's last uploads, a crash between upload and commit) is
invisible to restore. The body is JSON followed by a line
``sha256:<hex of the JSON>``, checked on every read, as is every entry's
grammar (:func:`.checks.check_entries`) before anything it names is
requested. With a shipping key (:mod:`.signing`) every version written
carries ``signature``, the HMAC-SHA256 of :func:`canonical`, and a version
read must carry a valid one.

A retried conditional write may be refused because its first attempt
landed and only the answer was lost: each version carries a random
``write_id``, and a refused writer re-reads and compares it before
deciding that someone else won.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from statelog.errors import FencedError, RemoteError
from statelog.remote.checks import MANIFEST_LIMIT, check_entries, check_garbage
from statelog.remote.client import RemoteClient
from statelog.remote.entry import BOUND_FORMAT, ENCODED_FORMAT, FORMAT, Entry
from statelog.remote.errors import ConditionFailedError, RemoteIntegrityError, RemoteNotFoundError
from statelog.remote.signing import KEY_ENV, sign, verify
from statelog.remote.url import StoreKeys

__all__ = [
    "BOUND_FORMAT",
    "ENCODED_FORMAT",
    "FORMAT",
    "Manifest",
    "Versioned",
    "acquire",
    "acquire_after",
    "canonical",
    "check",
    "commit",
    "create_first",
    "created_by",
    "read_manifest",
]

log = logging.getLogger("statelog.remote")

_FORMATS = (FORMAT, ENCODED_FORMAT, BOUND_FORMAT)
_ROUNDS = 20  # conditional-write rounds before giving up on a busy manifest


class Manifest(msgspec.Struct, frozen=True):
    """One version of the MANIFEST object."""

    format: int
    store_id: str
    generation: int
    writer: str  # host and pid of the acquirer
    write_id: str
    updated_ms: int
    last_epoch: int = 0  # the newest epoch a restore reaches if nothing is damaged
    identity_sha256: str = ""
    objects: tuple[Entry, ...] = ()
    garbage: tuple[str, ...] = ()  # keys dropped from the index, deleted once unpinned
    origin: str = ""  # the store directory that created generation 1 (record.origin_of)
    signature: str = ""  # with a shipping key: HMAC-SHA256 of canonical(self), hex

    def encode(self, key: bytes | None = None) -> bytes:
        """The object's bytes: JSON, then its checksum line; signed first if ``key`` is given."""
        # Unsigned without a key: a signature carried over from the version read would be stale.
        signed = sign(key, canonical(self)) if key is not None else ""
        body = msgspec.json.encode(msgspec.structs.replace(self, signature=signed))
        return body + b"\nsha256:" + hashlib.sha256(body).hexdigest().encode() + b"\n"

    @property
    def segments(self) -> list[Entry]:
        return [e for e in self.objects if e.kind == "wal"]

    @property
    def snapshots(self) -> list[Entry]:
        """Snapshot entries, newest first."""
        snaps = [e for e in self.objects if e.kind == "snapshot"]
        return sorted(snaps, key=lambda e: (e.epoch, e.last_lsn), reverse=True)


@dataclass(frozen=True)
class Versioned:
    """A manifest as read, with the ETag a conditional replace must name."""

    manifest: Manifest
    etag: str


def canonical(m: Manifest) -> bytes:
    """The bytes a signature covers: ``m``'s JSON with ``signature`` empty (fields in order)."""
    return msgspec.json.encode(msgspec.structs.replace(m, signature=""))


def _decode(key: str, data: bytes, secret: bytes | None) -> Manifest:
    body, sep, tail = data.rstrip(b"\n").rpartition(b"\nsha256:")
    if not sep or hashlib.sha256(body).hexdigest().encode() != tail:
        raise RemoteIntegrityError(key, "manifest checksum line missing or wrong")
    try:
        m = msgspec.json.decode(body, type=Manifest)
    except (msgspec.DecodeError, RecursionError) as exc:  # nesting too deep: crafted
        raise RemoteIntegrityError(key, f"manifest does not decode: {exc}") from exc
    if m.format not in _FORMATS:
        raise RemoteError(
            f"{key}: manifest format {m.format}, this statelog reads {FORMAT} to {BOUND_FORMAT}",
            hint="upgrade statelog on this host; nothing was changed",
        )
    if secret is not None and not (m.signature and verify(secret, canonical(m), m.signature)):
        raise RemoteIntegrityError(
            key,
            "manifest signature does not verify" if m.signature else "manifest is not signed",
            hint=f"a shipping key is set ({KEY_ENV}) and this MANIFEST was not signed with "
            "it: either the key is wrong on this host or someone without the key wrote the "
            "bucket; nothing was downloaded or written",
        )
    return m


def read_manifest(client: RemoteClient, store_id: uuid.UUID) -> Versioned | None:
    """The current manifest of ``store_id``, verified, or None if none was ever written.

    Checked in order: its size (at most :data:`.checks.MANIFEST_LIMIT`, refused
    before it is read whole), its checksum line, its format, its signature
    (with the client's key), its store id and the grammar of every entry.

    :raises RemoteIntegrityError: the object does not verify.
    """
    keys = StoreKeys(store_id)
    try:
        got = client.get(keys.manifest, limit=MANIFEST_LIMIT)
    except RemoteNotFoundError:
        return None
    m = _decode(keys.manifest, got.data, client.key)
    if m.store_id != str(store_id):
        raise RemoteIntegrityError(keys.manifest, f"manifest of store {m.store_id}")
    check_entries(keys.manifest, store_id, m.objects, fmt=m.format)
    check_garbage(keys.manifest, store_id, m.garbage)
    return Versioned(m, got.etag or "")


def _who() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def acquire(client: RemoteClient, store_id: uuid.UUID, *, origin: str = "") -> int:
    """Take the store over: create the manifest at generation 1, or bump its generation.

    One conditional write per round (If-None-Match to create, If-Match to
    bump); a refused round re-reads and tries again. After this returns
    ``g``, every writer holding a generation below ``g`` is fenced.

    :param origin: the directory taking over (:func:`.record.origin_of`),
        recorded if this call creates the manifest.
    :returns: the new generation, owned by the caller.
    :raises RemoteError: the manifest stayed busy for every round.
    """
    keys = StoreKeys(store_id)
    for _ in range(_ROUNDS):
        cur = read_manifest(client, store_id)
        write_id = secrets.token_hex(12)
        if cur is None:
            new = Manifest(FORMAT, str(store_id), 1, _who(), write_id, _now_ms(), origin=origin)
            try:
                client.put_new(keys.manifest, new.encode(client.key))
                gen = 1
            except ConditionFailedError:
                if _landed(client, store_id, write_id):
                    gen = 1
                else:
                    continue
        else:
            new = msgspec.structs.replace(
                cur.manifest,
                generation=cur.manifest.generation + 1,
                writer=_who(),
                write_id=write_id,
                updated_ms=_now_ms(),
            )
            try:
                client.put_if_match(keys.manifest, new.encode(client.key), cur.etag)
            except ConditionFailedError:
                if not _landed(client, store_id, write_id):
                    continue
            gen = new.generation
        log.warning("event=generation_acquired store_id=%s generation=%d", store_id, gen)
        return gen
    raise RemoteError(f"{keys.manifest}: still changing after {_ROUNDS} takeover attempts")


def acquire_after(client: RemoteClient, store_id: uuid.UUID, generation: int) -> int | None:
    """Take the store over from ``generation`` only: bump it to ``generation + 1``.

    The promotion of a standby: of several standbys that saw the same writer
    generation, exactly one takes the next. Each round reads the manifest and
    writes the bump with If-Match on its ETag; a round refused because the
    current writer committed meanwhile (same generation) is repeated.

    :returns: the new generation, owned by the caller; None if the manifest no
        longer names ``generation`` (another takeover got there first: nothing
        was written).
    :raises RemoteNotFoundError: the store has no manifest.
    :raises RemoteError: the manifest stayed busy for every round.
    """
    keys = StoreKeys(store_id)
    for _ in range(_ROUNDS):
        cur = read_manifest(client, store_id)
        if cur is None:
            raise RemoteNotFoundError(f"no MANIFEST for store {store_id} at {client.where}")
        if cur.manifest.generation != generation:
            return None
        new = msgspec.structs.replace(
            cur.manifest,
            generation=generation + 1,
            writer=_who(),
            write_id=secrets.token_hex(12),
            updated_ms=_now_ms(),
        )
        try:
            client.put_if_match(keys.manifest, new.encode(client.key), cur.etag)
        except ConditionFailedError:
            if not _landed(client, store_id, new.write_id):
                continue
        log.warning("event=generation_acquired store_id=%s generation=%d", store_id, new.generation)
        return new.generation
    raise RemoteError(f"{keys.manifest}: still changing after {_ROUNDS} takeover attempts")


def created_by(m: Manifest, origin: str) -> bool:
    """Whether ``m`` is still the generation 1 that the directory ``origin`` created."""
    return bool(origin) and m.generation == 1 and m.origin == origin


def create_first(client: RemoteClient, store_id: uuid.UUID, origin: str) -> int:
    """Create generation 1 of a store never shipped, or join the one its own directory created.

    One conditional create (If-None-Match). If it is refused, the manifest
    is read back: our own write (a retry whose first attempt landed), or a
    generation 1 created from the same directory (``origin``: the writer's
    claim and the daemon's first ship racing), is accepted as is; the two
    callers then hold the same generation and neither fences the other.
    Anything else means another copy of the store got there first.

    :param origin: this store directory (:func:`.record.origin_of`); never empty.
    :returns: 1, the generation the caller now holds.
    :raises FencedError: the manifest exists and was not created from this
        directory, or was taken over since (``ours`` is 0).
    :raises RemoteError: the object store could not be reached.
    """
    keys = StoreKeys(store_id)
    for _ in range(_ROUNDS):
        write_id = secrets.token_hex(12)
        new = Manifest(FORMAT, str(store_id), 1, _who(), write_id, _now_ms(), origin=origin)
        try:
            client.put_new(keys.manifest, new.encode(client.key))
        except ConditionFailedError:
            cur = read_manifest(client, store_id)
            if cur is None:
                continue  # removed again meanwhile: create it once more
            m = cur.manifest
            if m.write_id != write_id and not created_by(m, origin):
                raise FencedError(
                    f"store {store_id} at {client.where} has a manifest this directory did "
                    "not create",
                    ours=0,
                    current=m.generation,
                    hint="restore the store from the remote into an empty directory, or take "
                    "it over explicitly if this copy is the one to keep",
                ) from None
            log.info("event=generation_joined store_id=%s generation=1", store_id)
            return 1
        log.warning("event=generation_acquired store_id=%s generation=1", store_id)
        return 1
    raise RemoteError(f"{keys.manifest}: created and removed again {_ROUNDS} times")


def _landed(client: RemoteClient, store_id: uuid.UUID, write_id: str) -> bool:
    cur = read_manifest(client, store_id)
    return cur is not None and cur.manifest.write_id == write_id


def check(client: RemoteClient, store_id: uuid.UUID, generation: int) -> Versioned:
    """The current manifest, if ``generation`` still owns the store.

    :raises FencedError: the manifest names another generation (the store was taken over).
    :raises RemoteNotFoundError: no manifest exists (call :func:`acquire` first).
    """
    cur = read_manifest(client, store_id)
    if cur is None:
        raise RemoteNotFoundError(
            f"no MANIFEST for store {store_id} at {client.where}",
            hint="ship the store once (the first ship creates generation 1) or acquire it",
        )
    if cur.manifest.generation != generation:
        raise FencedError(
            f"store {store_id} at {client.where} belongs to another writer",
            ours=generation,
            current=cur.manifest.generation,
        )
    return cur


def commit(
    client: RemoteClient,
    store_id: uuid.UUID,
    generation: int,
    change: Callable[[Manifest], Manifest],
) -> Manifest:
    """Apply ``change`` to the current manifest and write it back with If-Match.

    Each round: read (:func:`check`: FencedError if the generation moved),
    apply ``change`` (a pure function of the version read), write with
    If-Match on its ETag. A refused write is re-read: our own write id
    means it landed; another generation means we were fenced; otherwise
    (a concurrent writer of the same generation) the round repeats. A change
    that changes nothing writes nothing (the version read is returned, its
    generation checked): an idle store's ships, four a second per store with
    the daemon's default bound, add no versions and no PUT requests.

    :raises FencedError: the store belongs to another generation; nothing was written.
    :raises RemoteError: the manifest stayed busy for every round.
    """
    keys = StoreKeys(store_id)
    for _ in range(_ROUNDS):
        cur = check(client, store_id, generation)
        changed = change(cur.manifest)
        if changed == cur.manifest:
            return cur.manifest
        write_id = secrets.token_hex(12)
        new = msgspec.structs.replace(changed, write_id=write_id, updated_ms=_now_ms())
        # Never publish what every reader would refuse: the same checks as a read.
        check_entries(keys.manifest, store_id, new.objects, fmt=new.format)
        try:
            client.put_if_match(keys.manifest, new.encode(client.key), cur.etag)
            return new
        except ConditionFailedError:
            if _landed(client, store_id, write_id):
                return new
            log.info("event=manifest_contended store_id=%s generation=%d", store_id, generation)
    raise RemoteError(f"{keys.manifest}: still changing after {_ROUNDS} attempts")
