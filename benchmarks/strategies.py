"""The durability strategies a reconciler could pick: statelog's own, and the baselines.

The registry of the benchmarks: :data:`STRATEGIES` in the order of the report,
:data:`DESCRIPTIONS` (row label, consistency guarantee), :data:`SKIPPED` (not
installed here, and why).
"""

import json
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import statelog

from .workload import Checkpoint, Value

try:
    import rocksdict
except ImportError:  # an optional extra: the comparison runs without it
    rocksdict = None  # type: ignore[assignment]
from .baselines import INTERVAL, JsonSnapshot, Lmdb, NoCheckpoint, Rocks, Sqlite, ZstdInterval
from .strategy import Recovered, SourceLog, Strategy

__all__ = ["DESCRIPTIONS", "INTERVAL", "SKIPPED", "STRATEGIES", "JsonSnapshot", "SourceLog"]
__all__ += ["Statelog", "StatelogGroup", "Strategy", "ZstdInterval", "commit_checkpoint"]


def commit_checkpoint(store: statelog.StateStore, cp: Checkpoint) -> int:
    """``store.commit`` of one checkpoint; returns the new epoch."""
    return store.commit(
        offsets=cp.offsets, low_watermark_ms=cp.low_watermark_ms, put=cp.put, delete=cp.delete
    )


# A 10%-dirty checkpoint of 10M keys is one record of about 140 MiB: over the
# default max_record_bytes (64 MiB), which a reconciler with checkpoints that
# large raises as well.
_SMALL: dict[str, Any] = {"segment_bytes": 8 << 20, "min_tail_bytes": 8 << 20}
_SMALL["max_record_bytes"] = 512 << 20
_SMALL["compactor_interval"] = timedelta(seconds=1)  # the state here would not fill 64 MiB


class Statelog(Strategy):
    """statelog ``durability="commit"``: one checksummed record per checkpoint, fdatasync'd."""

    name = "statelog"
    label = '(3) statelog `durability="commit"` + compactor'
    guarantee = "every acknowledged commit (fsync before return); prefix-exact, verified"
    durability: ClassVar[statelog.Durability] = "commit"

    def __init__(self, directory: Path, *, compactor: bool = False) -> None:
        super().__init__(directory)
        mode = "process" if compactor else "none"
        self.store = statelog.open(
            directory / "store", durability=self.durability, compactor=mode, **_SMALL
        )
        self.schedule: list[int] = []  # updates per epoch: recovery counts what it replayed

    def load(self, chunks: Iterable[dict[str, Value]]) -> None:
        for chunk in chunks:
            self.store.commit(offsets={}, low_watermark_ms=0, put=chunk)
            self.schedule.append(len(chunk))

    def checkpoint(self, cp: Checkpoint, source_pos: int = 0) -> None:
        commit_checkpoint(self.store, cp)
        self.schedule.append(cp.updates)

    def finish(self) -> None:
        self.store.flush()
        (self.dir / "schedule.json").write_text(json.dumps(self.schedule))

    def close(self) -> None:
        self.store.close()

    @classmethod
    def recover(cls, directory: Path) -> Recovered:
        store = statelog.open(directory / "store")
        rec, epoch = store.recovery, store.epoch
        schedule = json.loads((directory / "schedule.json").read_text())
        replayed = sum(schedule[epoch - rec.replayed : epoch])
        snap = rec.snapshot.name if rec.snapshot else "-"
        detail = f"snapshot {snap}, {rec.replayed} commits"
        return Recovered(dict(store.offsets), store.low_watermark_ms, store.count, replayed, detail)


class StatelogGroup(Statelog):
    """statelog ``durability="group"``: ``commit`` returns before the fsync; flushed at the end."""

    name = "statelog-group"
    label = '(3) statelog `durability="group"` + compactor'
    guarantee = "every commit that `wait_durable` confirmed (a few ms after return); prefix-exact"
    durability = "group"


_ALL = (JsonSnapshot, ZstdInterval, Statelog, StatelogGroup, NoCheckpoint, Sqlite, Lmdb, Rocks)
SKIPPED: dict[str, str] = (
    {} if rocksdict is not None else {"rocksdb": "rocksdict is not installed (dev extra)"}
)
"""Strategies left out of this run, and why."""
DESCRIPTIONS = {s.name: (s.label, s.guarantee) for s in _ALL}
"""Strategy name -> (row label, consistency guarantee), installed or not."""
STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in _ALL if s.name not in SKIPPED}
"""Strategy name -> class, in the order of the report."""
