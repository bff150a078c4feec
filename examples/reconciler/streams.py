"""Two synthetic CDC streams, a source database's changes and a target's, from a seed.

Each entity (``order:000123``) changes once in the source at its anchor
time ``a``; the target replicates it ``lag`` later (``0 <= lag < MAX_LAG``),
sometimes with a different amount (a mismatch), sometimes not at all
(missing in the target); a few entities exist only in the target (missing
in the source). Every event reaches its stream ``delay`` after its event
time (``0 <= delay < LATENESS``), so each partition delivers events out of
order, but never later than the tolerated lateness.

Everything here is a pure function of the seed: the crash-free reference
run and the run that is killed again and again read the same events at the
same offsets.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["LATENESS_MS", "MAX_LAG_MS", "Event", "Streams", "generate"]

LATENESS_MS = 2_000  # the most an event may arrive after its event time
MAX_LAG_MS = 1_500  # the most the target's copy may trail the source's change
_START_MS = 1_700_000_000_000
_SPACING_MS = 10  # anchor times of consecutive entities


@dataclass(frozen=True, slots=True)
class Event:
    """One change event: which side saw it, of which entity, when, and the amount."""

    side: str  # "src" or "tgt"
    key: str
    time_ms: int
    amount: int


@dataclass(frozen=True, slots=True)
class Streams:
    """Partitions of both streams, each a list of events in arrival order (offset = index)."""

    partitions: dict[str, list[Event]]

    @property
    def events(self) -> int:
        return sum(len(p) for p in self.partitions.values())


def generate(seed: int, entities: int, partitions: int = 3) -> Streams:
    """The two streams for ``seed``: ``partitions`` partitions per side.

    :raises ValueError: ``entities`` or ``partitions`` below 1.
    """
    if entities < 1 or partitions < 1:
        raise ValueError("entities and partitions must be at least 1")
    rng = random.Random(seed)
    pending: dict[str, list[tuple[int, Event]]] = {
        f"{side}-{i}": [] for side in ("src", "tgt") for i in range(partitions)
    }
    for n in range(entities):
        key = f"order:{n:06d}"
        anchor = _START_MS + n * _SPACING_MS
        amount = rng.randrange(1, 100_000)
        part = rng.randrange(partitions)
        roll = rng.random()
        src = roll >= 0.02  # 2%: only the target has it
        tgt = roll < 0.02 or roll >= 0.06  # 4%: the target never got it
        if src:
            ev = Event("src", key, anchor, amount)
            pending[f"src-{part}"].append((anchor + rng.randrange(LATENESS_MS), ev))
        if tgt:
            t = anchor + rng.randrange(MAX_LAG_MS)
            drift = rng.randrange(1, 50) if rng.random() < 0.03 else 0  # 3%: wrong amount
            ev = Event("tgt", key, t, amount + drift)
            pending[f"tgt-{part}"].append((t + rng.randrange(LATENESS_MS), ev))
    return Streams(
        {
            name: [ev for _arrival, ev in sorted(evs, key=_by_arrival)]
            for name, evs in pending.items()
        }
    )


def _by_arrival(item: tuple[int, Event]) -> tuple[int, str]:
    return item[0], item[1].key
