"""Checking an audit trail: its bytes and its anchor in, every problem and a verdict out.

:func:`check` is the work of :meth:`statelog.ops.audit.AuditTrail.verify`:
it reads every complete line of ``AUDIT.log`` (past unreadable ones),
re-hashes each entry from its own bytes, picks the authentic entry where
a sequence number appears twice, and names every entry edited, deleted,
reordered or inserted, a torn tail, and an anchor that disagrees with the
log. :func:`anchor_problem` is shared with the append, which records a
disagreeing anchor in the next entry. Pure functions of bytes already
read; the rules are in ``docs/format.md`` (section "Audit trail").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from statelog.errors import AuditError
from statelog.format.audit import ANCHOR_NAME, LINK_DECODER, LOG_NAME, Anchor, Link

__all__ = ["AuditProblem", "AuditVerdict", "ProblemKind", "anchor_problem", "check"]

ProblemKind = Literal[
    "edited", "deleted", "reordered", "inserted", "truncated", "torn", "unreadable"
]


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


def anchor_problem(
    anchor: Anchor | ValueError | None, last_seq: int, hash_of: Callable[[int], str | None]
) -> tuple[ProblemKind, str] | None:
    """Whether the anchor agrees with a log whose last entry is ``last_seq``.

    Accepted exactly: anchor == last entry; anchor one behind (a crash after
    the entry was durable, before the anchor moved); no anchor and at most
    one entry (a crash during the very first append).

    :param anchor: the parsed anchor, None when absent, or why it is garbled.
    :param hash_of: the hash of the entry with a given seq, None when unknown.
    :returns: ``(kind, reason)`` of the disagreement, or None when there is none.
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


_NOTED: Final[dict[str, ProblemKind]] = {
    k: k for k in ("edited", "deleted", "inserted", "truncated", "unreadable")
}
"""Problem kinds an ``audit_anchor_mismatch`` note may name."""


_ENTRY_START: Final = b'{"seq":'


def _looks_torn(tail: bytes) -> bool:
    """A cut-short entry starts like one; a size that landed before its data reads as zeros."""
    return tail.startswith(_ENTRY_START[: len(tail)]) or not tail.strip(b"\0")


def _read_lines(data: bytes, path: Path) -> tuple[list[tuple[int, Link]], list[AuditProblem]]:
    """Parse every complete line; problems for lines that are unreadable or do not hash."""
    parts = data.split(b"\n")
    torn = parts.pop()  # the bytes after the last newline: empty when the file ends cleanly
    parsed: list[tuple[int, Link]] = []
    problems: list[AuditProblem] = []
    for number, raw in enumerate(parts, 1):
        try:
            entry = LINK_DECODER.decode(raw)
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
    like_entries = any(raw.startswith(_ENTRY_START) for raw in parts)
    if not parsed and not like_entries and (parts or not _looks_torn(torn)):
        # Not one line even begins like an entry: another file, not a damaged trail.
        first = f"; line 1: {problems[0].reason}" if problems else ""
        raise AuditError(
            f"{path} is not an audit trail: no line begins like an audit entry{first}",
            hint="keep the file as evidence and move AUDIT.log and AUDIT.head aside: the "
            "next recovery or compaction starts a new trail; nothing was changed",
        )
    if torn:
        why = (
            f"{len(torn)} bytes after the last newline: an append cut short by a crash, "
            "never acknowledged; the next append saves them aside and cuts them off"
        )
        problems.append(AuditProblem(len(parts) + 1, None, "torn", why))
    return parsed, problems


def _pick_authentic(
    parsed: list[tuple[int, Link]], anchor: Anchor | ValueError | None
) -> tuple[dict[int, tuple[int, Link]], list[AuditProblem]]:
    """One entry per seq: of several, the one its successor (or the anchor) chains to."""
    by_seq: dict[int, list[tuple[int, Link]]] = {}
    for item in parsed:
        by_seq.setdefault(item[1].seq, []).append(item)
    chosen: dict[int, tuple[int, Link]] = {}
    problems: list[AuditProblem] = []
    for seq, candidates in by_seq.items():
        keep = candidates[0]
        if len(candidates) > 1:
            linked_to = {e.prev for _, e in by_seq.get(seq + 1, [])}
            if isinstance(anchor, Anchor) and anchor.seq == seq:
                linked_to.add(anchor.hash)
            keep = next((c for c in candidates if c[1].hash in linked_to), keep)
            for number, _ in candidates:
                if number != keep[0]:
                    why = f"a second entry {seq}; the chain goes through line {keep[0]}"
                    problems.append(AuditProblem(number, seq, "inserted", why))
        chosen[seq] = keep
    return chosen, problems


def _anchor_note(entry: Link) -> dict[str, Any] | None:
    """The ``audit_anchor_mismatch`` note an append left in ``entry``, if any."""
    if b'"audit_anchor_mismatch"' not in bytes(entry.fields):  # skips decoding most entries
        return None
    try:
        note = msgspec.json.decode(entry.fields).get("audit_anchor_mismatch")
    except (msgspec.MsgspecError, AttributeError):
        return None  # the hash check reports such an entry already
    return note if isinstance(note, dict) else None


def check(
    data: bytes, anchor: Anchor | ValueError | None, genesis: str, path: Path
) -> AuditVerdict:
    """The verdict on a log's bytes and its anchor (see ``docs/format.md``).

    :param data: the whole of ``AUDIT.log`` (empty when it does not exist).
    :param anchor: the parsed anchor, None when absent, or why it is garbled.
    :param genesis: the ``prev`` entry 1 must carry (:func:`~statelog.format.audit.genesis_hash`).
    :param path: the log's path, for the error message.
    :raises AuditError: ``data`` is not empty and no line of it is an audit entry.
    """
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
    found = anchor_problem(anchor, last_seq, lambda s: chosen[s][1].hash if s in chosen else None)
    unreadable = sum(1 for p in problems if p.kind == "unreadable")
    if found and found[0] == "truncated" and isinstance(anchor, Anchor):
        # Entries the anchor counts may be the unreadable lines already named, not cut off.
        found = None if unreadable >= anchor.seq - last_seq else found
    if found is not None:
        where = ANCHOR_NAME if found[0] in ("unreadable", "deleted") else LOG_NAME
        seq_named = anchor.seq if isinstance(anchor, Anchor) else None
        problems.append(AuditProblem(None, seq_named, *found, file=where))
    problems.sort(key=lambda p: (p.line is None, p.line or 0, p.seq or 0))
    ok = all(p.kind == "torn" for p in problems)
    return AuditVerdict(ok, len(parsed), problems)
