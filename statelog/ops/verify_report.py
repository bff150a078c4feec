"""What :func:`statelog.ops.verify.verify_store` found: per-file checks, damage, and the verdict.

Frozen dataclasses and an enum, with no logic beyond presenting
themselves: :class:`VerifyReport` holds a :class:`SnapshotCheck` per snapshot, a
:class:`SegmentCheck` per segment, a :class:`Finding` per damaged file,
the read-only recovery's report and the :class:`Verdict`;
:meth:`VerifyReport.to_dict` is the document ``statelog verify --json``
prints.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from statelog.recovery.report import RecoveryReport

__all__ = ["Finding", "SegmentCheck", "SnapshotCheck", "Verdict", "VerifyReport"]


class Verdict(enum.StrEnum):
    """What the store needs: nothing, a recovery, or a re-snapshot."""

    CLEAN = "clean"
    RECOVERABLE = "recoverable"
    UNRECOVERABLE = "unrecoverable"


@dataclass(frozen=True, slots=True)
class Finding:
    """One damaged file: where the damage begins (None: the whole file) and why."""

    path: Path
    offset: int | None
    kind: str  # identity, snapshot, chain, base, link, segment, torn-tail, log, recovery
    reason: str

    def __str__(self) -> str:
        at = f" at offset {self.offset}" if self.offset is not None else ""
        return f"{self.path.parent.name}/{self.path.name}{at}: {self.reason}"


@dataclass(frozen=True, slots=True)
class SnapshotCheck:
    """One snapshot: whether every byte verified and whether it links to the log.

    ``depth`` is 0 for a full snapshot and the deltas down to its full one
    for a delta, whose ``parent`` is the file it names (both None when it
    did not verify). ``chain`` says why a delta's chain is broken (a parent
    missing, damaged or not the one it names), None when it holds.
    """

    path: Path
    epoch: int
    lsn: int
    size: int
    verified: bool
    links: bool
    created_ms: int | None = None
    reason: str | None = None
    depth: int | None = None
    parent: str | None = None
    chain: str | None = None


@dataclass(frozen=True, slots=True)
class SegmentCheck:
    """One segment: how far it verified. ``status`` is ok, torn, corrupt or vanished."""

    path: Path
    sequence: int
    first_lsn: int
    size: int
    records: int
    last_lsn: int
    sealed: bool
    status: str
    offset: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class VerifyReport:
    """Everything :func:`verify_store` found, and the verdict."""

    store: Path
    store_id: uuid.UUID | None
    verdict: Verdict
    snapshots: tuple[SnapshotCheck, ...]
    segments: tuple[SegmentCheck, ...]
    findings: tuple[Finding, ...]
    recovery: RecoveryReport | None  # what a read-only open reached (None: it cannot)
    unrecoverable: str | None  # why a re-snapshot is required, if it is
    # *.broken, *.corrupt, *.tmp kept from earlier events; *.snap not regular files
    evidence: tuple[Path, ...] = ()
    bytes_read: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (``statelog verify --json``)."""
        return {
            "store": str(self.store),
            "store_id": str(self.store_id) if self.store_id else None,
            "verdict": str(self.verdict),
            "findings": [_row(f) for f in self.findings],
            "snapshots": [_row(s) for s in self.snapshots],
            "segments": [_row(s) for s in self.segments],
            "recovery": self.recovery.to_dict() if self.recovery else None,
            "unrecoverable": self.unrecoverable,
            "evidence": [str(p) for p in self.evidence],
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 6),
        }


def _row(obj: Finding | SnapshotCheck | SegmentCheck) -> dict[str, Any]:
    """A check as a JSON object: its fields, paths as strings (``path`` becomes ``file``)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        out["file" if f.name == "path" else f.name] = str(v) if isinstance(v, Path) else v
    return out
