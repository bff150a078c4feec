"""The store directory: its fixed names and its identity file.

::

    STORE/
      IDENTITY            store id and format version (JSON, written once, durably)
      LOCK                the single writer's flock; holds its pid
      wal/                log segments: <sequence:016x>-<first_lsn:016x>.wal
                          evidence kept aside: *.wal.broken (torn tails),
                          *.wal.corrupt (damage moved aside by recovery)
      snapshots/          full snapshots: *.snap

Operators and external checks rely on ``wal/``, ``snapshots/`` and the two
suffixes; ``docs/format.md`` specifies every file.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from statelog.errors import (
    CorruptionError,
    FormatVersionError,
    NotAStoreError,
    StorageError,
    StoreNotFoundError,
)
from statelog.format.wal import HEADER_SIZE, SegmentHeader, parse_segment_name, segment_name
from statelog.storage.fileio import FileLayer
from statelog.storage.listing import regular_files

__all__ = [
    "IDENTITY",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "PROMOTED",
    "REMOTE_RECORD",
    "REWIND",
    "SNAPSHOT_DIR",
    "STANDBY",
    "WAL_DIR",
    "StoreLayout",
    "parse_json_doc",
]

IDENTITY = "IDENTITY"
WAL_DIR = "wal"
SNAPSHOT_DIR = "snapshots"
BASE_DIR = "base"
PROMOTED = "PROMOTED"
STANDBY = "STANDBY"  # a standby's copy, not promoted (statelog.storage.marks)
REWIND = "REWIND"  # a rewind in place, to be finished (statelog.recovery.rewind)
REMOTE_RECORD = "remote.json"  # the remote tier's record (statelog.remote.record)
_KNOWN = {
    IDENTITY,
    IDENTITY + ".tmp",
    "LOCK",
    WAL_DIR,
    SNAPSHOT_DIR,
    BASE_DIR,
    "pins",
    "COMPACTOR.LOCK",
    "compactor.tmp",
    # The audit trail (statelog.ops.audit); AUDIT.log.broken[.N] is matched by prefix.
    "AUDIT.log",
    "AUDIT.log.tmp",
    "AUDIT.head",
    "AUDIT.head.tmp",
    "AUDIT.lock",
    # The remote tier's shipping record (statelog.remote.record), and its temp file.
    REMOTE_RECORD,
    REMOTE_RECORD + ".tmp",
    # Left by the promotion of a standby that followed this store (statelog.replica.promoted).
    PROMOTED,
    # A standby's copy that was not promoted (statelog.storage.marks), and its temp file.
    STANDBY,
    STANDBY + ".tmp",
    # A rewind in place under way (statelog.recovery.rewind), and its temp file.
    REWIND,
    REWIND + ".tmp",
}
_KNOWN_PREFIXES = ("AUDIT.log.broken",)
_KIND = "statelog-store"
STORE_VERSION = 1
"""Version of the directory layout and IDENTITY; segments carry their own format version."""


def _identity_hint(repair: str = "") -> str:
    """What to do about a damaged ``IDENTITY``; ``repair``: one more way, for this damage."""
    return (
        "IDENTITY holds the store's id, which every segment and snapshot repeats, and never "
        "changes after creation: restore it from a backup of this store, or restore the "
        "store from its remote copy into a new directory (`statelog restore SOURCE NEW_DIR`)"
        f"{repair}; `statelog verify STORE` checks the result; nothing was changed"
    )


MAX_JSON_BYTES = 1 << 20
"""The largest small JSON file statelog parses (``IDENTITY``, ``SHARDS``, a pin)."""
MAX_JSON_DEPTH = 16
"""The deepest nesting of such a file; statelog's own nest at most 3 deep."""

# A JSON string (escapes included), and the brackets left outside strings.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKET = re.compile(rb"[\[\]{}]")


def parse_json_doc(raw: bytes, *, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The JSON object in ``raw``: one of statelog's small files, written by anyone.

    Its size and nesting are checked before it is parsed, so a crafted file
    never drives the parser's recursion (``RecursionError``) or memory.

    :param max_bytes: the largest file accepted (``SHARDS`` lists up to 9,998
        boundary keys, so it allows more than the default).
    :raises ValueError: more than ``max_bytes``, nested deeper than
        :data:`MAX_JSON_DEPTH`, not UTF-8 JSON, or not an object.
    """
    if len(raw) > max_bytes:
        raise ValueError(f"{len(raw)} bytes, more than the {max_bytes} allowed")
    depth = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub(b"", raw)):
        depth += 1 if m.group() in (b"[", b"{") else -1
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nested more than {MAX_JSON_DEPTH} deep")
    try:
        doc = json.loads(raw)
    except RecursionError as exc:  # a second guard: the scan above bounds the depth
        raise ValueError("nested too deep") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"a JSON {type(doc).__name__}, not an object")
    return doc


@dataclass(frozen=True)
class StoreLayout:
    """Paths of one store directory."""

    root: Path

    @property
    def wal(self) -> Path:
        return self.root / WAL_DIR

    @property
    def snapshots(self) -> Path:
        return self.root / SNAPSHOT_DIR

    @property
    def base(self) -> Path:
        """Extracted LMDB image of the snapshot in use (a cache, rebuilt on open)."""
        return self.root / BASE_DIR

    @property
    def identity(self) -> Path:
        return self.root / IDENTITY

    def check_can_host(self) -> None:
        """Refuse a directory that holds anything but a statelog store, before touching it.

        :raises NotAStoreError: a file, or a directory with foreign entries and no identity.
        """
        self.check_is_directory()
        if self.root.is_dir() and not self.identity.exists():
            foreign = sorted(
                p.name
                for p in self.root.iterdir()
                if p.name not in _KNOWN and not p.name.startswith(_KNOWN_PREFIXES)
            )
            if foreign:
                raise NotAStoreError(
                    f"{self.root} is not a statelog store (it holds {', '.join(foreign[:5])})"
                )

    def check_is_directory(self) -> None:
        """:raises NotAStoreError: the root, or the nearest existing parent, is not a directory."""
        for p in (self.root, *self.root.parents):
            if p.exists():
                if not p.is_dir():
                    raise NotAStoreError(f"{p} is not a directory")
                return

    def read_identity(self, files: FileLayer) -> uuid.UUID:
        """The store id from ``IDENTITY``, checked against the log's segment headers.

        :raises StoreNotFoundError: no identity file.
        :raises FormatVersionError: a store format newer than this code reads.
        :raises CorruptionError: the identity file is unreadable, or it names
            another store than every segment header that verifies (no open
            could use the log); the hint names the id the log holds, if one.
        :raises StorageError: an I/O error reading it (never taken for damage).
        :raises NotAStoreError: the path is a file.
        """
        self.check_is_directory()
        try:
            raw = files.read(self.identity)
        except FileNotFoundError:
            raise StoreNotFoundError(f"{self.root} holds no statelog store") from None
        except OSError as exc:
            raise StorageError(f"reading {self.identity} failed: {exc}", errno=exc.errno) from exc
        try:
            doc = parse_json_doc(raw)
            kind, version, sid = doc["kind"], doc["version"], uuid.UUID(doc["store_id"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self._damaged(f"unreadable identity file: {exc}") from exc
        if kind != _KIND or not isinstance(version, int) or isinstance(version, bool):
            raise self._damaged(f"not a statelog identity: {doc!r:.200}")
        if version != STORE_VERSION:
            raise FormatVersionError(self.identity, version, STORE_VERSION)
        theirs = self._log_store_ids(sid)
        if len(theirs) == 1:
            raise self._damaged(
                f"names store {sid}, but every segment in wal/ belongs to store {theirs.pop()}"
            )
        return sid

    def _damaged(self, reason: str) -> CorruptionError:
        """The error for a damaged ``IDENTITY``; the hint offers the log's id, if it has one."""
        ids = self._log_store_ids(None)
        repair = ""
        if len(ids) == 1:
            doc = json.dumps({"kind": _KIND, "version": STORE_VERSION, "store_id": str(ids.pop())})
            repair = f"; or, if only IDENTITY was lost or damaged, write the log's id back: {doc}"
        return CorruptionError(self.identity, 0, reason, hint=_identity_hint(repair))

    def _log_store_ids(self, sid: uuid.UUID | None) -> set[uuid.UUID]:
        """The store ids the verified segment headers of ``wal/`` name, or none at all
        as soon as one names ``sid`` (usually the first looked at)."""
        ids: set[uuid.UUID] = set()
        try:
            # Never opens a FIFO or a directory so named, and says nothing of one here:
            # the log's own listing refuses it.
            entries = regular_files(self.wal, parse_segment_name, lambda path: None)
        except OSError:
            return ids  # no log to disagree with; recovery reports a missing one
        for entry in entries:
            try:
                with open(entry, "rb") as fh:
                    raw = fh.read(HEADER_SIZE)
            except OSError:
                continue
            if SegmentHeader.peek_version(raw) is None or not SegmentHeader.crc_ok(raw):
                continue
            header = SegmentHeader.unpack(raw)
            if header.store_id == sid:
                return set()
            ids.add(header.store_id)
        return ids

    def create(self, files: FileLayer) -> uuid.UUID:
        """Create the directories, the first segment and the identity of a new store.

        Durable order: ``wal/`` and ``snapshots/`` (each fsynced into the
        root), segment 1 holding only its header (temp, fsync, rename, fsync
        ``wal/``), then ``IDENTITY`` (temp, fsync, rename, fsync root). So an
        identity without any segment is damage, never a crash artefact; and a
        crash before the identity lands leaves only empty segments, which the
        next open removes before creating the store again.

        :raises CorruptionError: segments holding records but no identity.
        :returns: the new store id.
        """
        files.makedirs(self.wal)
        files.makedirs(self.snapshots)
        leftovers = [p for p in self.wal.iterdir() if parse_segment_name(p) is not None]
        for p in leftovers:
            if p.stat().st_size > HEADER_SIZE:
                # Never adopted silently: only a person may write the log's id back.
                raise self._damaged("segments hold records but the identity file is missing")
        for p in leftovers:
            files.remove(p)  # empty segments of a creation that did not finish
        sid = uuid.uuid4()
        first = SegmentHeader(sid, sequence=1, first_lsn=1, prev_crc=0)
        files.create_durable(self.wal / segment_name(1, 1), first.pack())
        doc = {
            "kind": _KIND,
            "version": STORE_VERSION,
            "store_id": str(sid),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        files.create_durable(self.identity, (json.dumps(doc, indent=1) + "\n").encode())
        return sid

    def remove_temp_files(self, files: FileLayer) -> list[Path]:
        """Delete ``*.tmp`` left by a writer that died mid-create (in wal/, and IDENTITY's)."""
        gone: list[Path] = []
        # snapshots/*.tmp belong to the compactor, which cleans up after itself.
        if self.wal.is_dir():  # only files: anything else so named was not a writer's
            gone.extend(p for p in self.wal.glob("*.tmp") if p.is_file())
        stray = self.root / (IDENTITY + ".tmp")
        if stray.is_file():
            gone.append(stray)
        for p in gone:
            files.remove(p)
        return gone
