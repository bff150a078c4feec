"""What recovery found and did: :class:`RecoveryReport`, available as ``store.recovery``."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Outcome", "RecoveryReport", "Rejection"]


class Outcome(enum.StrEnum):
    """The three outcomes recovery keeps apart (invariant 4 of docs/architecture.md)."""

    CLEAN = "clean"
    """The log ended after a complete commit."""
    TORN_TAIL = "torn-tail"
    """The last segment ended in an unfinished write; it was saved aside and cut."""
    CORRUPTION = "corruption"
    """Damage before the tail: recovery stopped at the last good commit; epochs were lost."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """A file, or a part of one, that recovery refused to use, and why."""

    path: Path
    offset: int | None
    reason: str

    def __str__(self) -> str:
        at = f" at offset {self.offset}" if self.offset is not None else ""
        return f"{self.path.name}{at}: {self.reason}"


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """How the store reached its state on open.

    ``epoch`` is the recovered epoch; the state is exactly the fold of commits
    1..epoch. ``lost_epochs`` is empty unless damage before the tail forced a
    point-in-time stop; it then runs from ``epoch + 1`` to the highest epoch
    still found intact past the damage (at least one epoch).
    """

    epoch: int
    snapshot: Path | None
    replayed: int
    truncated_bytes: int
    rejected: tuple[Rejection, ...]
    lost_epochs: range
    seconds: float
    outcome: Outcome = Outcome.CLEAN
    segments: int = 0
    saved_aside: tuple[Path, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (for logs, the CLI and the audit trail)."""
        lost = self.lost_epochs
        return {
            "epoch": self.epoch,
            "snapshot": str(self.snapshot) if self.snapshot else None,
            "replayed": self.replayed,
            "truncated_bytes": self.truncated_bytes,
            "rejected": [
                {"path": str(r.path), "offset": r.offset, "reason": r.reason} for r in self.rejected
            ],
            "lost_epochs": [lost.start, lost.stop - 1] if lost else [],
            "seconds": round(self.seconds, 6),
            "outcome": str(self.outcome),
            "segments": self.segments,
            "saved_aside": [str(p) for p in self.saved_aside],
        }
