"""One ship call's uploads: create each object once, adopt what an earlier call left.

Every object is created with If-None-Match and never overwritten. A key
that exists already is an earlier upload of this generation whose manifest
commit never landed (a crash, a lost answer): adopted if it holds the same
object, or, for a segment, the same file in another form (uploaded raw by
an older statelog, or compressed by another zstandard version), in which
case the entry added to the manifest describes the object that is there.
"""

from __future__ import annotations

import hashlib

import msgspec

from statelog.errors import RemoteError
from statelog.remote.checks import encoding_problem
from statelog.remote.client import RemoteClient
from statelog.remote.encoding import decode_to_bytes
from statelog.remote.entry import BOUND_FORMAT, Entry
from statelog.remote.errors import ObjectExistsError, RemoteIntegrityError, RemoteNotFoundError
from statelog.remote.manifest import Manifest
from statelog.remote.url import StoreKeys

__all__ = ["Uploader"]

_FRAME_SLACK = 1 << 16
"""Bytes a zstd frame may add to incompressible data (well above its worst case)."""


class Uploader:
    """Uploads one call's files and remembers what it did."""

    def __init__(self, client: RemoteClient, keys: StoreKeys, gen: int, m: Manifest) -> None:
        self.client, self.keys, self.gen = client, keys, gen
        self.known = {(e.kind, e.name): e for e in m.objects}
        self.uploaded: list[str] = []
        self.adopted: list[str] = []
        self.bytes = 0

    def put(self, key: str, data: bytes, sha: str, e: Entry | None = None) -> Entry | None:
        """Create ``key``; an existing object with the same hash is ours (a retried upload).

        :param e: the entry ``data`` is the object of, if any.
        :returns: ``e``, or the entry of the equivalent object found at ``key``.
        :raises RemoteError: an existing object that holds something else (never
            overwritten).
        """
        try:
            self.client.put_new(key, data, metadata={"statelog-generation": str(self.gen)})
        except ObjectExistsError:
            theirs = self.client.head_sha256(key)
            found = e if theirs == sha else self._same_file(e, data)
            if found is None:
                raise RemoteError(
                    f"{key} exists with sha256 {theirs}, ours is {sha}",
                    hint="shipped objects are immutable; two histories diverged: run "
                    "`statelog verify` and restore this store from the remote",
                ) from None
            self.adopted.append(key)
            return found
        self.uploaded.append(key)
        self.bytes += len(data)
        return e

    def _same_file(self, e: Entry | None, ours: bytes) -> Entry | None:
        """The entry of the object at ``e.key`` if it holds the file of ``e`` (whose
        object is ``ours``) raw or encoded otherwise (read to at most the file's size
        plus a frame's slack); else None."""
        if e is None or not e.encoding:
            return None
        try:
            body = self.client.get(e.key, limit=e.file_size + _FRAME_SLACK).data
        except RemoteIntegrityError:
            return None
        file, sha = decode_to_bytes(e, ours), hashlib.sha256(body).hexdigest()
        raw = msgspec.structs.replace(
            e, sha256=sha, size=len(body), encoding="", file_size=0, file_sha256=""
        )
        encoded = msgspec.structs.replace(e, sha256=sha, size=len(body))
        for found in (raw, encoded):
            if encoding_problem(found, BOUND_FORMAT) is None and _holds(found, body, file):
                return found
        return None

    def _listed_holds(self, listed: Entry, e: Entry, data: bytes) -> bool:
        """Whether ``listed`` holds the same file as ``e`` (whose object is ``data``),
        each raw or encoded: by hash where the entries tell, else by downloading
        ``listed``'s object (an entry of :data:`BOUND_FORMAT` names no file hash), read
        only if it is no larger than the file plus a frame's slack: the manifest is
        untrusted, and a size it names must not size a read."""
        if listed.local_size != e.local_size:
            return False
        if listed.local_sha256 == e.local_sha256 != "" or (
            (listed.sha256, listed.encoding) == (e.sha256, e.encoding)
        ):
            return True
        file = decode_to_bytes(e, data) if e.encoding else data
        if listed.local_sha256:
            return hashlib.sha256(file).hexdigest() == listed.local_sha256
        if listed.size > len(file) + _FRAME_SLACK:
            return False
        try:
            body = self.client.get(listed.key, limit=listed.size).data
        except (RemoteIntegrityError, RemoteNotFoundError):
            return False
        return hashlib.sha256(body).hexdigest() == listed.sha256 and _holds(listed, body, file)

    def entry(self, e: Entry, data: bytes) -> Entry | None:
        """Ship ``data`` as ``e`` unless the manifest lists it already; the entry to add.

        A listed file of the same name but other bytes is an error if our own
        generation listed it; from an older generation it is a history this
        writer superseded (it restored to an earlier epoch), shipped under our
        key beside it: restore follows the newest generation at a fork.
        """
        listed = self.known.get((e.kind, e.name))
        if listed is not None:
            if self._listed_holds(listed, e, data):
                return None
            if listed.generation >= self.gen:
                raise RemoteError(
                    f"{e.kind} {e.name} differs from the copy shipped as {listed.key}",
                    hint="this store and the remote diverged; restore it from the remote",
                )
        return self.put(e.key, data, e.sha256, e)


def _holds(e: Entry, body: bytes, file: bytes) -> bool:
    """Whether ``body``, the object of ``e``, holds the file ``file`` (decoded, if ``e``
    is encoded; a frame that does not decode holds nothing)."""
    if not e.encoding:
        return body == file
    try:
        return decode_to_bytes(e, body) == file
    except RemoteIntegrityError:
        return False
