"""A seeded workload shaped like a streaming reconciler's state.

A reconciler keeps an in-flight comparison buffer keyed by transaction id:
one small record per key (ids, an amount, timestamps, a short status
string). Each checkpoint advances the consumer offsets of a few partitions
and the low watermark, and dirties some keys of the buffer.

Everything is a pure function of ``(seed, index)``: checkpoint ``i`` is the
same for every strategy and every run, whichever order they ask for it in,
so strategies can be interleaved (they then share the machine's noise) and
still see identical data. The same seed gives the same bytes in every
release, so benchmark results stay comparable across them.

Part of statelog's testing kit (:mod:`statelog.kit`): the benchmarks load
and checkpoint it, and a reconciler's author can size a store with it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_SEED", "Checkpoint", "Value", "Workload", "make_value"]

DEFAULT_SEED = 20240601

Value = dict[str, Any]

EPOCH_MS = 1_700_000_000_000
"""Event times start here (November 2023), in milliseconds."""

_STATUSES = ("pending", "matched", "late", "mismatch", "retry", "orphan")
_SIDES = ("ledger", "bank")
_CURRENCIES = ("EUR", "USD", "GBP", "CHF", "JPY")


def make_value(rng: random.Random, txn: int, now_ms: int) -> Value:
    """One buffer record: about 150 bytes as JSON, about 110 as msgpack."""
    bits = rng.getrandbits(64)
    return {
        "txn_id": txn,
        "account_id": 10_000_000 + (bits & 0xFFFFF),
        "amount_cents": (bits >> 20) & 0xFFFFFF,
        "currency": _CURRENCIES[(bits >> 44) % 5],
        "event_ts_ms": now_ms - ((bits >> 47) & 0xFFFF),
        "seen_ts_ms": now_ms,
        "side": _SIDES[(bits >> 63) & 1],
        "status": _STATUSES[(bits >> 50) % 6],
    }


@dataclass(frozen=True)
class Checkpoint:
    """One durable checkpoint: offset advances, a watermark and the dirty keys."""

    index: int
    offsets: dict[str, int]
    low_watermark_ms: int
    put: dict[str, Value]
    delete: tuple[str, ...] = field(default=())

    @property
    def updates(self) -> int:
        """Keys the checkpoint writes (puts and deletes)."""
        return len(self.put) + len(self.delete)


@dataclass(frozen=True)
class Workload:
    """``state_keys`` keys of state; each checkpoint rewrites ``updates`` of them.

    :param partitions: consumer partitions whose offsets advance each checkpoint.
    """

    state_keys: int
    updates: int
    seed: int = DEFAULT_SEED
    partitions: int = 8

    def __post_init__(self) -> None:
        if self.state_keys < 1 or self.updates < 1:
            raise ValueError("state_keys and updates must be positive")
        if self.updates > self.state_keys:
            raise ValueError(
                f"updates={self.updates} is larger than state_keys={self.state_keys}: "
                "a checkpoint dirties distinct existing keys"
            )

    @staticmethod
    def key(i: int) -> str:
        """The key of buffer record ``i``."""
        return f"txn:{i:010d}"

    def initial_chunks(self, chunk: int = 50_000) -> Iterator[dict[str, Value]]:
        """The starting state, ``chunk`` keys at a time (key order)."""
        rng = random.Random(self.seed)
        key = self.key
        for start in range(0, self.state_keys, chunk):
            stop = min(start + chunk, self.state_keys)
            yield {key(i): make_value(rng, i, EPOCH_MS + i) for i in range(start, stop)}

    def checkpoint(self, index: int) -> Checkpoint:
        """Checkpoint ``index`` (0-based): ``updates`` distinct existing keys rewritten."""
        rng = random.Random(self.seed * 1_000_003 + index + 1)
        now_ms = EPOCH_MS + self.state_keys + (index + 1) * 1_000
        chosen = rng.sample(range(self.state_keys), self.updates)
        key = self.key
        put = {key(i): make_value(rng, i, now_ms) for i in chosen}
        per_part = -(-self.updates // self.partitions)
        offsets = {f"orders-{p}": (index + 1) * per_part for p in range(self.partitions)}
        return Checkpoint(index, offsets, now_ms - 5_000, put)
