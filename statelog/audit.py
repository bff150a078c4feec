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
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePath
from typing import Any, Final, Literal

import msgspec

from . import events
from .errors import AuditError, StatelogError
from .fileio import FileLayer
from .layout import IDENTITY, StoreLayout

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

log = logging.getLogger("statelog.audit")

LOG_NAME: Final = "AUDIT.log"
ANCHOR_NAME: Final = "AUDIT.head"
LOCK_NAME: Final = "AUDIT.lock"
_GENESIS_TAG: Final = b"statelog-audit-genesis\x00"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_RESERVED = "audit_"
"""Field-name prefix the trail keeps for its own notes (torn-tail repairs, anchor mismatches)."""

ProblemKind = Literal[
    "edited", "deleted", "reordered", "inserted", "truncated", "torn", "unreadable"
]


class AuditInputError(AuditError, ValueError):
    """An append was refused before anything was written: bad kind or fields."""

    hint = (
        "pass a lower-case kind and JSON-serialisable fields (str keys; str, int, float, "
        "bool, None, lists, dicts, paths); nothing was written"
    )


class AuditEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One entry of the trail, in its canonical field order.

    :ivar seq: 1, 2, ... in append order.
    :ivar ts: UTC time of the append, RFC 3339 with microseconds and ``Z``.
    :ivar kind: what happened (an event kind, or another lower-case word).
    :ivar pid: the appending process.
    :ivar fields: the event's ``key=value`` fields, as plain JSON values.
    :ivar prev: hex SHA-256 of the previous entry (the genesis value for entry 1).
    :ivar hash: hex SHA-256 of this entry's canonical bytes without ``hash``.
    """

    # gc=False: entries hold no cycles; tracking 100k of them doubled the time to read them.

    seq: int
    ts: str
    kind: str
    pid: int
    fields: dict[str, Any]
    prev: str
    hash: str


class _Body(msgspec.Struct, frozen=True):
    """An entry without its ``hash``: the bytes that are hashed."""

    seq: int
    ts: str
    kind: str
    pid: int
    fields: dict[str, Any]
    prev: str


class _Link(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """An entry as verify reads it: ``fields`` left as raw bytes, which the hash covers."""

    seq: int
    ts: str
    kind: str
    pid: int
    fields: msgspec.Raw
    prev: str
    hash: str


class _Anchor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    seq: int
    hash: str


@dataclass(frozen=True)
class AuditProblem:
    """One thing :meth:`AuditTrail.verify` found wrong.

    :ivar line: 1-based line of ``AUDIT.log`` at fault, or None when the fault
        is in ``AUDIT.head`` or concerns entries that are gone.
    :ivar seq: the entry's sequence number, when known.
    :ivar kind: edited, deleted, reordered, inserted, truncated, torn or unreadable.
    :ivar reason: one human sentence.
    :ivar file: ``AUDIT.log`` or ``AUDIT.head``.
    """

    line: int | None
    seq: int | None
    kind: ProblemKind
    reason: str
    file: str = LOG_NAME


@dataclass(frozen=True)
class AuditVerdict:
    """The result of :meth:`AuditTrail.verify`.

    :ivar ok: no problem other than a torn tail (a crash mid-append, never
        acknowledged, cut off by the next append).
    :ivar entries: readable entries in the log.
    :ivar problems: every problem, torn tail included, in file order.
    """

    ok: bool
    entries: int
    problems: list[AuditProblem] = field(default_factory=list)


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, PurePath):
        return str(obj)
    raise TypeError(f"type {type(obj).__name__} is not JSON-serialisable")


# order="deterministic" sorts dict keys and keeps struct fields in declared order.
_ENC = msgspec.json.Encoder(order="deterministic", enc_hook=_enc_hook)
_DEC = msgspec.json.Decoder(AuditEntry)
_LINK_DEC = msgspec.json.Decoder(_Link)
_ANCHOR_DEC = msgspec.json.Decoder(_Anchor)


def genesis_hash(store_id: bytes) -> str:
    """The ``prev`` of entry 1: SHA-256 of a fixed tag and the 16-byte store id, in hex.

    Tying entry 1 to the store id means a trail copied from another store
    does not verify here.
    """
    return hashlib.sha256(_GENESIS_TAG + store_id).hexdigest()


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
        plain = msgspec.json.decode(_ENC.encode(dict(fields)))
    except (TypeError, ValueError, OverflowError, msgspec.MsgspecError) as exc:
        raise AuditInputError(f"fields are not JSON-serialisable: {exc}") from exc
    assert isinstance(plain, dict)
    return plain


def _seal(body: _Body) -> tuple[AuditEntry, bytes]:
    """The entry with its hash, and its line (canonical bytes and a newline)."""
    raw = _ENC.encode(body)
    digest = hashlib.sha256(raw).hexdigest()
    line = raw[:-1] + b',"hash":"' + digest.encode() + b'"}\n'
    entry = AuditEntry(body.seq, body.ts, body.kind, body.pid, body.fields, body.prev, digest)
    return entry, line


def _parse_anchor(raw: bytes) -> _Anchor:
    """:raises ValueError: not an anchor (also for a bad seq or hash)."""
    try:
        anchor = _ANCHOR_DEC.decode(raw)
    except msgspec.MsgspecError as exc:
        raise ValueError(str(exc)) from exc
    if anchor.seq < 1 or not _HEX64.fullmatch(anchor.hash):
        raise ValueError(f"seq {anchor.seq} or hash {anchor.hash!r:.80} out of range")
    return anchor


def _anchor_problem(
    anchor: _Anchor | ValueError | None, last_seq: int, hash_of: Callable[[int], str | None]
) -> tuple[ProblemKind, str] | None:
    """Whether the anchor agrees with a log whose last entry is ``last_seq``.

    Accepted exactly: anchor == last entry; anchor one behind (a crash after
    the entry was durable, before the anchor moved); no anchor and at most
    one entry (a crash during the very first append).
    """
    if isinstance(anchor, ValueError):
        return "unreadable", f"{ANCHOR_NAME} is not an anchor: {anchor}"
    if anchor is None:
        if last_seq <= 1:
            return None
        return "deleted", (
            f"{ANCHOR_NAME} is missing while the log holds {last_seq} entries, "
            "so a cut-off tail could go unnoticed"
        )
    if anchor.seq > last_seq:
        return "truncated", (
            f"{ANCHOR_NAME} names entry {anchor.seq} but the log ends at entry {last_seq}: "
            f"{anchor.seq - last_seq} entries were cut off the end"
        )
    if anchor.seq < last_seq - 1:
        return "inserted", (
            f"{last_seq - anchor.seq} entries follow the anchored entry {anchor.seq}; "
            "a crash leaves at most one"
        )
    if hash_of(anchor.seq) != anchor.hash:
        return "edited", (
            f"entry {anchor.seq} does not have the hash {ANCHOR_NAME} names: "
            "the entry or the anchor was changed"
        )
    return None


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


_NOTED: Final[dict[str, ProblemKind]] = {
    k: k for k in ("edited", "deleted", "inserted", "truncated", "unreadable")
}
"""Problem kinds an ``audit_anchor_mismatch`` note may name."""


def _looks_torn(tail: bytes) -> bool:
    """A cut-short entry starts like one; a size that landed before its data reads as zeros."""
    return tail.startswith(b'{"seq":'[: len(tail)]) or not tail.strip(b"\0")


def _read_lines(data: bytes, path: Path) -> tuple[list[tuple[int, _Link]], list[AuditProblem]]:
    """Parse every complete line; problems for lines that are unreadable or do not hash."""
    parts = data.split(b"\n")
    torn = parts.pop()  # the bytes after the last newline: empty when the file ends cleanly
    parsed: list[tuple[int, _Link]] = []
    problems: list[AuditProblem] = []
    for number, raw in enumerate(parts, 1):
        try:
            entry = _LINK_DEC.decode(raw)
        except msgspec.MsgspecError as exc:
            problems.append(AuditProblem(number, None, "unreadable", f"not an audit entry: {exc}"))
            continue
        if entry.seq < 1:
            problems.append(AuditProblem(number, entry.seq, "unreadable", "seq is not positive"))
            continue
        parsed.append((number, entry))
        # The hashed bytes are the line itself up to its hash field, so any
        # byte changed (even one that keeps the JSON value) breaks the hash.
        suffix = b',"hash":"' + entry.hash.encode() + b'"}'
        body = raw[: -len(suffix)] + b"}"
        if not raw.endswith(suffix) or hashlib.sha256(body).hexdigest() != entry.hash:
            why = "the entry's bytes do not match its own hash: it was changed"
            problems.append(AuditProblem(number, entry.seq, "edited", why))
    if not parsed and (parts or not _looks_torn(torn)):
        raise AuditError(
            f"{path} is not an audit trail: no line is an audit entry",
            hint="check the path; nothing was changed",
        )
    if torn:
        why = (
            f"{len(torn)} bytes after the last newline: an append cut short by a crash, "
            "never acknowledged; the next append saves them aside and cuts them off"
        )
        problems.append(AuditProblem(len(parts) + 1, None, "torn", why))
    return parsed, problems


def _pick_authentic(
    parsed: list[tuple[int, _Link]], anchor: _Anchor | ValueError | None
) -> tuple[dict[int, tuple[int, _Link]], list[AuditProblem]]:
    """One entry per seq: of several, the one its successor (or the anchor) chains to."""
    by_seq: dict[int, list[tuple[int, _Link]]] = {}
    for item in parsed:
        by_seq.setdefault(item[1].seq, []).append(item)
    chosen: dict[int, tuple[int, _Link]] = {}
    problems: list[AuditProblem] = []
    for seq, candidates in by_seq.items():
        keep = candidates[0]
        if len(candidates) > 1:
            linked_to = {e.prev for _, e in by_seq.get(seq + 1, [])}
            if isinstance(anchor, _Anchor) and anchor.seq == seq:
                linked_to.add(anchor.hash)
            keep = next((c for c in candidates if c[1].hash in linked_to), keep)
            for number, _ in candidates:
                if number != keep[0]:
                    why = f"a second entry {seq}; the chain goes through line {keep[0]}"
                    problems.append(AuditProblem(number, seq, "inserted", why))
        chosen[seq] = keep
    return chosen, problems


def _anchor_note(entry: _Link) -> dict[str, Any] | None:
    """The ``audit_anchor_mismatch`` note an append left in ``entry``, if any."""
    if b'"audit_anchor_mismatch"' not in bytes(entry.fields):  # skips decoding most entries
        return None
    try:
        note = msgspec.json.decode(entry.fields).get("audit_anchor_mismatch")
    except (msgspec.MsgspecError, AttributeError):
        return None  # the hash check reports such an entry already
    return note if isinstance(note, dict) else None


def _check(
    data: bytes, anchor: _Anchor | ValueError | None, genesis: str, path: Path
) -> AuditVerdict:
    """The verdict on a log's bytes and its anchor (see ``docs/format.md``)."""
    parsed, problems = _read_lines(data, path)
    chosen, inserted = _pick_authentic(parsed, anchor)
    problems += inserted
    last_seq = max(chosen, default=0)
    highest = 0
    for number, entry in sorted(chosen.values(), key=lambda c: c[0]):
        if entry.seq < highest:
            why = f"entry {entry.seq} comes after entry {highest}"
            problems.append(AuditProblem(number, entry.seq, "reordered", why))
        highest = max(highest, entry.seq)
    gap_start: int | None = None
    for seq in range(1, last_seq + 2):
        if seq not in chosen and seq <= last_seq:
            gap_start = seq if gap_start is None else gap_start
        elif gap_start is not None:
            why = f"entries {gap_start}..{seq - 1} are missing"
            problems.append(AuditProblem(chosen[seq][0], gap_start, "deleted", why))
            gap_start = None
    for seq, (number, entry) in chosen.items():
        if seq == 1 and entry.prev != genesis:
            why = "entry 1 does not chain from this store's genesis (changed, or another store's)"
            problems.append(AuditProblem(number, 1, "edited", why))
        elif seq - 1 in chosen and entry.prev != chosen[seq - 1][1].hash:
            why = (
                f"entry {seq} names another predecessor: entry {seq - 1} was changed "
                f"and its hash recomputed (or entry {seq} was forged)"
            )
            problems.append(AuditProblem(chosen[seq - 1][0], seq - 1, "edited", why))
        note = _anchor_note(entry)
        if note is not None:
            why = f"when entry {seq} was appended: {note.get('reason')}"
            kind = _NOTED.get(str(note.get("problem")), "edited")
            problems.append(AuditProblem(number, seq, kind, why))
    found = _anchor_problem(anchor, last_seq, lambda s: chosen[s][1].hash if s in chosen else None)
    if found is not None:
        where = ANCHOR_NAME if found[0] in ("unreadable", "deleted") else LOG_NAME
        seq_named = anchor.seq if isinstance(anchor, _Anchor) else None
        problems.append(AuditProblem(None, seq_named, *found, file=where))
    problems.sort(key=lambda p: (p.line is None, p.line or 0, p.seq or 0))
    ok = all(p.kind == "torn" for p in problems)
    return AuditVerdict(ok, len(parsed), problems)


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
                last = _DEC.decode(last_raw)
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

        mismatch = _anchor_problem(anchor, last_seq, hash_of)
        if mismatch is not None:
            plain["audit_anchor_mismatch"] = {"problem": mismatch[0], "reason": mismatch[1]}
            log.error(
                "event=audit_anchor_mismatch store=%s problem=%s reason=%r",
                self.root,
                *mismatch,
            )
        ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = _Body(last_seq + 1, ts, kind, os.getpid(), plain, last.hash if last else genesis)
        entry, line = _seal(body)
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
        anchor_doc = _ENC.encode(_Anchor(entry.seq, entry.hash)) + b"\n"
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

    def _read_anchor(self) -> _Anchor | ValueError | None:
        """The anchor, None when absent, or the ValueError that says why it is garbled."""
        try:
            raw = self._files.read(self.anchor_path)
        except FileNotFoundError:
            return None
        try:
            return _parse_anchor(raw)
        except ValueError as exc:
            return exc

    def _snapshot(self) -> tuple[bytes, _Anchor | ValueError | None]:
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
                yield _DEC.decode(raw)
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
        return _check(data, anchor, genesis, self.log_path)


_unsubscribe: Callable[[], None] | None = None
_install_guard = threading.Lock()


def _on_event(event: events.Event) -> None:
    """Append ``event`` to its store's trail; never for a read-only emitter."""
    if not event.writable or not (event.store / IDENTITY).is_file():
        return
    try:
        AuditTrail(event.store).append(event.kind, event.fields)
    except Exception as exc:
        # Losing an audit entry must never fail a recovery or a compaction.
        log.error("event=audit_failed store=%s kind=%s error=%r", event.store, event.kind, exc)


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
