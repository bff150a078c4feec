"""What a MANIFEST may name, how much a remote object may weigh, where a restore may write.

The bucket is untrusted: whoever can write it chooses every name, size and
hash a MANIFEST lists. This module holds the checks made before any of
them names a local path, sizes a read or reaches a request:

* :func:`check_entries`: each entry's kind, key and local name follow the
  store's own grammar (segment and snapshot names exactly as
  :mod:`statelog.format.wal` and :mod:`statelog.format.snapshot` write
  them; the key exactly as :class:`.url.StoreKeys` builds it), its hash is
  64 lowercase hex digits and its numbers are not negative; a snapshot's
  chain fields (:func:`chain_problem`) are those of a full snapshot or of a
  delta naming an older snapshot of the same grammar;
* :func:`check_garbage`: retention deletes only this store's data objects;
* :func:`store_id_of`: a directory of an object listing is a store only if
  it is a UUID in its canonical spelling;
* :class:`Confined`: every path a restore writes or removes stays under its
  staging directory, resolved once, with no symlink on the way;
* the byte limits of the objects read whole into memory.

Pure checks except :class:`Confined`, which looks at the file system
(``lstat``, ``realpath``) and changes nothing.
"""

from __future__ import annotations

import os
import re
import stat
import uuid
from collections.abc import Iterable
from pathlib import Path

from statelog.errors import NotAStoreError
from statelog.format.snapshot import parse_snapshot_name, snapshot_name
from statelog.format.wal import parse_segment_name, segment_name
from statelog.remote.entry import BOUND_FORMAT, ENCODED_FORMAT, FORMAT, Entry
from statelog.remote.errors import RemoteIntegrityError
from statelog.remote.url import StoreKeys
from statelog.storage.levels import MAX_DEPTH

__all__ = [
    "IDENTITY_LIMIT",
    "KINDS",
    "MANIFEST_LIMIT",
    "MAX_DECODE_RATIO",
    "MAX_ENCODED_FILE",
    "PIN_LIMIT",
    "Confined",
    "chain_problem",
    "check_entries",
    "check_garbage",
    "encoding_problem",
    "local_name_problem",
    "store_id_of",
]

MANIFEST_LIMIT = 64 << 20
"""Largest MANIFEST read, in bytes: 100,000 entries take a few MB."""
MAX_DECODE_RATIO = 1024
"""The most an encoded object may claim to decode to, times its own size."""
MAX_ENCODED_FILE = 256 << 20
"""The largest file an encoded object may hold (four default segments; a restore reads a
segment whole, so this bounds what a small hostile object can make it hold); the
shipper sends larger segments raw."""
PIN_LIMIT = MANIFEST_LIMIT
"""Largest pin read: a pin names the keys of one MANIFEST version."""
IDENTITY_LIMIT = 64 << 10
"""Largest ``IDENTITY`` read; the file statelog writes is under 200 bytes."""

KINDS = {
    "wal": (parse_segment_name, segment_name),
    "snapshot": (parse_snapshot_name, snapshot_name),
}
"""Entry kinds, each with the parser and the writer of its local file names."""

_SHA256 = re.compile(r"[0-9a-f]{64}")
_NUMBERS = (
    "size", "generation", "sequence", "first_lsn", "prev_crc", "last_lsn", "end_crc", "epoch",
    "depth", "file_size",
)  # fmt: skip
_REFUSED = (
    "the MANIFEST names an object or a file outside the store's grammar; nothing was "
    "downloaded or written. Whoever wrote the bucket is not this store's shipper: check "
    "the bucket's access policy"
)


def local_name_problem(kind: str, name: str) -> str | None:
    """Why ``name`` is not a file name the store writes for ``kind``; None if it is one.

    The name must parse with the kind's parser and be spelled exactly as the
    kind's writer spells what it parsed, so ``../x``, ``/abs``, ``a/b``, a
    NUL, a trailing newline or an upper-case digit never pass.
    """
    grammar = KINDS.get(kind)
    if grammar is None:
        return f"unknown kind {kind!r}"
    parse, spell = grammar
    parsed = parse(name) if "\0" not in name else None
    if parsed is None or spell(*parsed) != name:
        return f"{kind} name {name!r} is not one this store writes"
    return None


def chain_problem(e: Entry) -> str | None:
    """Why ``e``'s chain fields (``digest``, ``parent``, ``parent_sha256``, ``depth``) are
    not ones the shipper writes; None if they are.

    A segment has none. A snapshot's ``digest`` is empty (an old manifest) or
    64 lower-case hex digits. A full snapshot (``depth`` 0) names no parent; a
    delta names a parent spelled by the snapshot grammar that sorts before it
    (an older ``(epoch, lsn)``), the parent's digest in hex, and a depth of at
    most :data:`~statelog.storage.levels.MAX_DEPTH`.
    """
    if e.kind != "snapshot":
        if e.digest or e.parent or e.parent_sha256 or e.depth:
            return f"{e.key!r} is a segment with snapshot chain fields"
        return None
    if e.digest and not _SHA256.fullmatch(e.digest):
        return f"{e.key!r} has a digest that is not 64 lower-case hex digits"
    if e.depth == 0:
        if e.parent or e.parent_sha256:
            return f"{e.key!r} names a parent but has depth 0"
        return None
    if e.depth > MAX_DEPTH:
        return f"{e.key!r} has depth {e.depth}, more than {MAX_DEPTH}"
    why = local_name_problem("snapshot", e.parent)
    if why is not None:
        return f"{e.key!r}: parent {why}"
    parent, child = parse_snapshot_name(e.parent), parse_snapshot_name(e.name)
    if parent is None or child is None or parent >= child:
        return f"{e.key!r} names parent {e.parent!r}, which does not sort before it"
    if not _SHA256.fullmatch(e.parent_sha256):
        return f"{e.key!r} has a parent digest that is not 64 lower-case hex digits"
    return None


def check_entries(
    manifest_key: str, store_id: uuid.UUID, entries: Iterable[Entry], *, fmt: int = FORMAT
) -> None:
    """Refuse the MANIFEST if any entry breaks the grammar (module docstring).

    :param fmt: the manifest's format (which encodings its entries may use).
    :raises RemoteIntegrityError: naming ``manifest_key`` and the first bad entry.
    """
    keys = StoreKeys(store_id)
    for e in entries:
        why = local_name_problem(e.kind, e.name)
        if why is None and any(getattr(e, f) < 0 for f in _NUMBERS):
            why = f"{e.key!r} has a negative size, generation, LSN or crc"
        if why is None:
            make = keys.segment if e.kind == "wal" else keys.snapshot
            if e.key != make(e.generation, e.name):
                why = f"key {e.key!r} is not the key of {e.kind} {e.name}"
        if why is None and not _SHA256.fullmatch(e.sha256):
            why = f"{e.key!r} has no SHA-256 of 64 lower-case hex digits"
        if why is None:
            why = chain_problem(e) or encoding_problem(e, fmt)
        if why is not None:
            raise RemoteIntegrityError(manifest_key, why, hint=_REFUSED)


def encoding_problem(e: Entry, fmt: int) -> str | None:
    """Why ``e``'s encoding fields are not ones a shipper writes in a manifest of format
    ``fmt``; None if they are.

    Unencoded: no ``file_size`` or ``file_sha256``. Encoded (``zstd``, a
    segment only, from :data:`ENCODED_FORMAT` on): the file's SHA-256 in hex
    (from :data:`BOUND_FORMAT` on, that or nothing), and a file size of at
    most :data:`MAX_DECODE_RATIO` times the
    object's and at most :data:`MAX_ENCODED_FILE`, so a small object cannot
    claim to decode to a disk's worth. The shipper checks its own entries
    against the same rule and ships a segment that breaks it as it is.
    """
    if not e.encoding:
        if e.file_size or e.file_sha256:
            return f"{e.key!r} is not encoded but names a decoded size or hash"
        return None
    if fmt < ENCODED_FORMAT:
        return f"{e.key!r} is encoded in a manifest of a format without encodings"
    if e.encoding != "zstd" or e.kind != "wal":
        return f"{e.key!r}: {e.kind} objects are not encoded as {e.encoding[:16]!r}"
    if (e.file_sha256 or fmt < BOUND_FORMAT) and not _SHA256.fullmatch(e.file_sha256):
        return f"{e.key!r} has no decoded SHA-256 of 64 lower-case hex digits"
    if not 0 < e.file_size <= min(MAX_DECODE_RATIO * e.size, MAX_ENCODED_FILE):
        return f"{e.key!r} claims to decode to {e.file_size} bytes from {e.size}"
    return None


def check_garbage(manifest_key: str, store_id: uuid.UUID, keys: Iterable[str]) -> None:
    """Refuse the MANIFEST if a ``garbage`` key (deleted by retention) is not a data object
    of this store: ``<store-id>/wal/...`` or ``<store-id>/snapshots/...``, no empty, ``.``
    or ``..`` part.

    :raises RemoteIntegrityError: naming ``manifest_key`` and the first bad key.
    """
    root = str(store_id)
    for key in keys:
        parts = key.split("/")
        if (
            len(parts) != 4
            or parts[0] != root
            or parts[1] not in ("wal", "snapshots")
            or any(p in ("", ".", "..") or "\0" in p for p in parts)
        ):
            raise RemoteIntegrityError(
                manifest_key, f"garbage key {key!r} is not a data object of this store",
                hint=_REFUSED,
            )  # fmt: skip


def store_id_of(name: str) -> uuid.UUID | None:
    """The store id a directory of an object listing names, or None if it names none."""
    try:
        sid = uuid.UUID(name)
    except ValueError:
        return None
    return sid if str(sid) == name else None


class Confined:
    """Paths under one directory, resolved once, that no symlink can lead out of.

    :meth:`path` is asked for every file a restore writes or removes: each
    part must be one plain name, the directory it lands in must still
    resolve to where it was built (no component replaced by a symlink
    meanwhile), and the file itself must not be a symlink.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.realpath(root))

    def path(self, *parts: str) -> Path:
        """``root/parts...``, checked (class docstring).

        :raises RemoteIntegrityError: a part is not a plain name.
        :raises NotAStoreError: a symlink on the way would lead the write elsewhere.
        """
        for part in parts:
            if part in ("", ".", "..") or "/" in part or "\0" in part:
                raise RemoteIntegrityError(part, "not a plain file name", hint=_REFUSED)
        p = self.root.joinpath(*parts)
        if Path(os.path.realpath(p.parent)) != p.parent:
            raise _symlinked(p.parent)
        try:
            mode = os.lstat(p).st_mode
        except FileNotFoundError:
            return p
        if stat.S_ISLNK(mode):
            raise _symlinked(p)
        return p


def _symlinked(p: Path) -> NotAStoreError:
    return NotAStoreError(
        f"{p} is, or lies under, a symbolic link planted in the restore's directory",
        hint="something else writes to the restore's directory: remove the link and find "
        "who made it; the destination was not created",
    )
