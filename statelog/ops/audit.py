"""The audit trail: an append-only, hash-chained record of what happened to a store.

Every recovery, integrity mismatch, truncation, compaction and retention
deletion (the :mod:`statelog.events` kinds) becomes one line of
``STORE/AUDIT.log``. Each entry carries the SHA-256 of the entry before it
(entry 1 carries a genesis value derived from the store id), so editing,
deleting, reordering or inserting an entry breaks the chain. The anchor
``STORE/AUDIT.head`` names the sequence number and hash of the last entry,
so cutting entries off the end is detected too. ``docs/format.md`` (section
"Audit trail") specifies both files to the byte.

Appends from several processes (the writer on recovery, the compactor, a
CLI) are serialised by ``flock`` on ``STORE/AUDIT.lock``; the previous
hash is read under that lock. Appends are rare, so each pays two fsyncs.

A hash chain without a secret key detects accidents and naive edits, not
an adversary who rewrites the log and the anchor consistently; see the
limits in ``docs/format.md``.

The bytes of entries and the anchor are :mod:`statelog.format.audit`;
checking a trail is :mod:`statelog.ops.audit_check`. Their public names are
re-exported here, so ``statelog.ops.audit`` stays the one import.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from statelog import events
from statelog.errors import AuditError, AuditWarning, StatelogError
from statelog.format.audit import (
    ANCHOR_NAME,
    ENCODER,
    ENTRY_DECODER,
    LOCK_NAME,
    LOG_NAME,
    Anchor,
    AuditEntry,
    Body,
    genesis_hash,
    parse_anchor,
    seal,
)
from statelog.ops import metrics
from statelog.ops.audit_check import AuditProblem, AuditVerdict, ProblemKind, anchor_problem, check
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import IDENTITY, StoreLayout

__all__ = [
    "ANCHOR_NAME",
    "LOCK_NAME",
    "LOG_NAME",
    "AuditEntry",
    "AuditInputError",
    "AuditProblem",
    "AuditTrail",
    "AuditVerdict",
    "ProblemKind",
    "genesis_hash",
    "install",
    "uninstall",
]

log = logging.getLogger("statelog.ops.audit")

_KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_RESERVED = "audit_"
"""Field-name prefix the trail keeps for its own notes (torn-tail repairs, anchor mismatches)."""


class AuditInputError(AuditError, ValueError):
    """An append was refused before anything was written: bad kind or fields."""

    hint = (
        "pass a lower-case kind and JSON-serialisable fields (str keys; str, int, float, "
        "bool, None, lists, dicts, paths); nothing was written"
    )


def _plain_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields as plain JSON values, so encoding them again gives the same bytes.

    :raises AuditInputError: not a mapping with str keys, a reserved name, or not serialisable.
    """
    if not isinstance(fields, Mapping):
        raise AuditInputError(f"fields must be a mapping, not {type(fields).__name__}")
    for key in fields:
        if not isinstance(key, str):
            raise AuditInputError(f"field name {key!r} is not a str")
        if key.startswith(_RESERVED):
            raise AuditInputError(f"field name {key!r}: the prefix {_RESERVED!r} is reserved")
    try:
        plain = msgspec.json.decode(ENCODER.encode(dict(fields)))
    except (TypeError, ValueError, OverflowError, msgspec.MsgspecError) as exc:
        raise AuditInputError(f"fields are not JSON-serialisable: {exc}") from exc
    assert isinstance(plain, dict)
    return plain


@contextlib.contextmanager
def _flock(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold ``flock`` on ``path``; shared readers never create the file."""
    try:
        if exclusive:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield  # no appender has ever run: nothing to wait for
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing the last descriptor drops the flock


def _read_tail(path: Path) -> tuple[int, bytes | None, bytes]:
    """``(size, last complete line or None, torn bytes after the last newline)``.

    Reads backwards from the end in growing windows, so an append costs
    the same on a long trail as on a short one.
    """
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        window = 4096
        while True:
            start = max(0, size - window)
            fh.seek(start)
            chunk = fh.read(size - start)
            last_nl = chunk.rfind(b"\n")
            prev_nl = chunk.rfind(b"\n", 0, last_nl) if last_nl >= 0 else -1
            if prev_nl >= 0 or start == 0:
                break
            window *= 4
    if last_nl < 0:
        return size, None, chunk
    return size, chunk[prev_nl + 1 : last_nl], chunk[last_nl + 1 :]


class AuditTrail:
    """The audit trail of the store at ``root`` (``AUDIT.log`` and ``AUDIT.head``).

    Constructing one touches nothing on disk. Safe to use from several
    threads and processes at once.
    """

    def __init__(self, root: Path, *, files: FileLayer | None = None) -> None:
        """:param files: the file layer for durable steps (fault-injecting tests pass theirs)."""
        self.root = Path(root)
        self.log_path = self.root / LOG_NAME
        self.anchor_path = self.root / ANCHOR_NAME
        self.lock_path = self.root / LOCK_NAME
        self._files = files if files is not None else FileLayer()

    def _genesis(self) -> str:
        """:raises AuditError: the root holds no readable store identity."""
        try:
            sid = StoreLayout(self.root).read_identity(self._files)
        except StatelogError as exc:
            raise AuditError(
                f"{self.root}: no audit trail without a store identity: {exc.message}",
                hint="name a statelog store directory (one that holds IDENTITY)",
            ) from exc
        return genesis_hash(sid.bytes)

    def append(self, kind: str, fields: Mapping[str, Any]) -> AuditEntry:
        """Append one entry; it is durable, and the anchor names it, when this returns.

        Under ``flock(AUDIT.lock)``: a torn tail left by a crash mid-append
        is saved aside (``AUDIT.log.broken[.N]``, temp, fsync, rename, fsync
        dir) and cut off (ftruncate, fsync), and the new entry's fields say
        so (``audit_torn_tail``). An anchor that disagrees with the log is
        recorded in the new entry too (``audit_anchor_mismatch``), so the
        evidence survives the anchor moving on. Durable steps, in order:
        create ``AUDIT.log`` if absent (temp, fsync, rename, fsync dir);
        append the line, fdatasync; write ``AUDIT.head`` (temp, fsync,
        rename, fsync dir). A crash before the log's fdatasync leaves at most
        a torn tail; a crash after it leaves the log one entry ahead of the
        anchor. Both verify.

        :raises AuditInputError: bad ``kind`` or ``fields``; nothing was written.
        :raises AuditError: no store at the root, the last entry is unreadable,
            or a write or sync failed (the entry may then be durable but
            unanchored, which verify accepts).
        """
        if not isinstance(kind, str) or not _KIND_RE.fullmatch(kind):
            raise AuditInputError(f"audit kind {kind!r} is not a lower-case word")
        plain = _plain_fields(fields)
        genesis = self._genesis()
        try:
            with _flock(self.lock_path, exclusive=True):
                return self._append_locked(kind, plain, genesis)
        except OSError as exc:
            raise AuditError(
                f"{self.log_path}: appending a {kind} entry failed: {exc}",
                hint="free disk space or fix the device; the entry was not acknowledged",
            ) from exc

    def _append_locked(self, kind: str, plain: dict[str, Any], genesis: str) -> AuditEntry:
        if not self.log_path.exists():
            self._files.create_durable(self.log_path, b"")
        size, last_raw, torn = _read_tail(self.log_path)
        if torn:
            plain["audit_torn_tail"] = self._cut_torn_tail(size, torn)
        last: AuditEntry | None = None
        if last_raw is not None:
            try:
                last = ENTRY_DECODER.decode(last_raw)
            except msgspec.MsgspecError as exc:
                raise AuditError(
                    f"{self.log_path}: the last entry is unreadable, so nothing can chain to it",
                    hint="run `statelog audit STORE --verify`, keep the trail as evidence and "
                    "move it aside to start a new one",
                ) from exc
        anchor = self._read_anchor()
        last_seq = last.seq if last is not None else 0

        def hash_of(seq: int) -> str | None:
            if last is not None and seq == last.seq:
                return last.hash
            if last is not None and seq == last.seq - 1:
                return last.prev
            return None

        mismatch = anchor_problem(anchor, last_seq, hash_of)
        if mismatch is not None:
            plain["audit_anchor_mismatch"] = {"problem": mismatch[0], "reason": mismatch[1]}
            log.error(
                "event=audit_anchor_mismatch store=%s problem=%s reason=%r",
                self.root,
                *mismatch,
            )
        ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = Body(last_seq + 1, ts, kind, os.getpid(), plain, last.hash if last else genesis)
        entry, line = seal(body)
        out = self._files.open_append(self.log_path)
        try:
            before = out.size
            try:
                out.write([line])
                out.sync()
            except OSError:
                # Cut back what this failed append may have left, so the next
                # one finds no torn bytes; if that fails too, it will cut them.
                with contextlib.suppress(OSError):
                    out.truncate(before)
                raise
        finally:
            out.close()
        anchor_doc = ENCODER.encode(Anchor(entry.seq, entry.hash)) + b"\n"
        self._files.create_durable(self.anchor_path, anchor_doc)
        log.info("event=audit_append store=%s seq=%d kind=%s", self.root, entry.seq, kind)
        return entry

    def _cut_torn_tail(self, size: int, torn: bytes) -> dict[str, Any]:
        """Save the torn bytes aside, then cut them off; the note for the next entry."""
        n = 0
        evidence = self.root / (LOG_NAME + ".broken")
        while evidence.exists():
            n += 1
            evidence = self.root / f"{LOG_NAME}.broken.{n}"
        self._files.create_durable(evidence, torn)
        offset = size - len(torn)
        self._files.truncate(self.log_path, offset)
        log.warning(
            "event=audit_torn_tail store=%s offset=%d bytes=%d saved_as=%s",
            self.root,
            offset,
            len(torn),
            evidence.name,
        )
        return {
            "offset": offset,
            "bytes": len(torn),
            "sha256": hashlib.sha256(torn).hexdigest(),
            "saved_as": evidence.name,
        }

    def _read_anchor(self) -> Anchor | ValueError | None:
        """The anchor, None when absent, or the ValueError that says why it is garbled."""
        try:
            raw = self._files.read(self.anchor_path)
        except FileNotFoundError:
            return None
        try:
            return parse_anchor(raw)
        except ValueError as exc:
            return exc

    def _snapshot(self) -> tuple[bytes, Anchor | ValueError | None]:
        """The log's bytes and the anchor, read together under a shared lock.

        :raises AuditError: a read failed, or the root is not a directory.
        """
        try:
            with _flock(self.lock_path, exclusive=False):
                try:
                    data = self._files.read(self.log_path)
                except FileNotFoundError:
                    data = b""
                return data, self._read_anchor()
        except OSError as exc:
            raise AuditError(f"{self.log_path}: cannot be read: {exc}") from exc

    def entries(self) -> Iterator[AuditEntry]:
        """Every complete entry, in file order, without checking hashes (see :meth:`verify`).

        A torn tail is not an entry and is skipped. Reads a consistent copy
        of the log first, so concurrent appends do not disturb the iteration.

        :raises AuditError: the log cannot be read, or a line is not an entry.
        """
        data, _ = self._snapshot()
        lines = data.split(b"\n")[:-1]  # the part after the last newline is torn or empty
        for number, raw in enumerate(lines, 1):
            try:
                yield ENTRY_DECODER.decode(raw)
            except msgspec.MsgspecError as exc:
                raise AuditError(
                    f"{self.log_path} line {number} is not an audit entry: {exc}"
                ) from exc

    def verify(self) -> AuditVerdict:
        """Check every entry, the chain from the store's genesis, and the anchor.

        Changes nothing on disk. See ``docs/format.md`` for the rules; a
        torn tail alone leaves ``ok`` True.

        :raises AuditError: no store identity, the log cannot be read, or no
            line of a non-empty log is an audit entry (not an audit trail).
        """
        genesis = self._genesis()
        data, anchor = self._snapshot()
        return check(data, anchor, genesis, self.log_path)


_unsubscribe: Callable[[], None] | None = None
_install_guard = threading.Lock()


def _on_event(event: events.Event) -> None:
    """Append ``event`` to its store's trail; never for a read-only emitter."""
    if not event.writable or not (event.store / IDENTITY).is_file():
        return
    try:
        AuditTrail(event.store).append(event.kind, event.fields)
    except Exception as exc:
        # Losing an audit entry must never fail a recovery or a compaction,
        # and must never go unnoticed: a warning shows without logging set up.
        log.error("event=audit_failed store=%s kind=%s error=%r", event.store, event.kind, exc)
        metrics.AUDIT_FAILURES.labels(metrics.store_label(event.store), event.kind).inc()
        warnings.warn(
            f"statelog: the audit trail of {event.store} did not record a {event.kind} "
            f"event: {exc} (run `statelog audit --verify` on the store)",
            AuditWarning,
            stacklevel=2,
        )


def install() -> None:
    """Record every writable event of every store in its audit trail. Idempotent."""
    global _unsubscribe
    with _install_guard:
        if _unsubscribe is None:
            _unsubscribe = events.subscribe(_on_event)


def uninstall() -> None:
    """Stop recording events (undoes :func:`install`). Idempotent."""
    global _unsubscribe
    with _install_guard:
        if _unsubscribe is not None:
            _unsubscribe()
            _unsubscribe = None
