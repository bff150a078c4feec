"""The drill's workload, its model, and the two processes the drill kills.

The workload models a reconciler over three source partitions. Drill commit
``j`` (the ``j``-th commit after the drill's origin) is a pure function of
``(seed, origin, j)``:

* each partition advances by 0-6 events; every new event goes into the
  in-flight buffer table (:data:`BUFFER`), stamped with the commit's time;
* the low watermark advances; every buffered event older than it is removed
  from the buffer and applied to the idempotent downstream, the table
  :data:`APPLIED` (event id -> amount, each id applied once), and added to
  the running total (key :data:`TOTAL_KEY` of the same table);
* offsets, watermark, buffer and downstream move in one transaction.

After a restart the source redelivers events from before the committed
offsets (at-least-once delivery, as after a consumer rebalance). The writer
skips every redelivered event it has already buffered or applied; that skip
is what keeps a replay from double-counting, and the drill checks the total.

Run as ``python -m statelog.cli.drill_writer``::

    write STORE --seed S --origin JSON [--segment-bytes N]
        opens STORE (recovery), prints "open <epoch>", then commits the
        workload until killed, printing "ack <epoch>" after each commit
        returned (durability="commit": the epoch is on disk)
    compact STORE [--pause-at K]
        one compaction pass; prints "pass" as it starts, and "done" at its
        end; with --pause-at, prints "step K <op>" before its K-th durable
        file operation and waits for a line on stdin before doing it

Every line is one ``write`` to stdout, so a SIGKILL never leaves half a line.
``STATELOG_DRILL_SABOTAGE`` (``double-apply`` or ``lie-ack``) makes the
writer misbehave on purpose; the drill's own tests use it to show that the
drill's checks fail when they should.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statelog.compaction.fold import compact
from statelog.storage.fileio import AppendFile, Buffer, FileLayer
from statelog.store.store import StateStore
from statelog.store.store import open as open_store

__all__ = [
    "APPLIED",
    "BUFFER",
    "PARTITIONS",
    "SABOTAGE_ENV",
    "TOTAL_KEY",
    "Model",
    "Origin",
    "check_state",
    "drill_commit",
    "event_amount",
    "event_id",
    "main",
    "origin_of",
    "parse_event_id",
    "redelivery",
    "watermark_at",
]

PARTITIONS = ("drill-0", "drill-1", "drill-2")
BUFFER = "drill.buffer"
APPLIED = "drill.applied"
TOTAL_KEY = b"total"  # a bytes key: event ids are str keys, so the two never collide
LAG = 3  # commits an event stays buffered before the watermark passes it
STEP_MS = 1000
MAX_ADVANCE = 6
SABOTAGE_ENV = "STATELOG_DRILL_SABOTAGE"


@dataclass(frozen=True)
class Origin:
    """Where the drill started: the store's epoch, watermark and drill offsets then."""

    epoch: int = 0
    watermark_ms: int = 0
    offsets: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        """The origin as the writer's ``--origin`` argument."""
        return json.dumps({"epoch": self.epoch, "wm": self.watermark_ms, "offsets": self.offsets})

    @staticmethod
    def from_json(text: str) -> Origin:
        """Parse :meth:`to_json`'s output.

        :raises ValueError: not an origin.
        """
        raw = json.loads(text)
        return Origin(
            int(raw["epoch"]), int(raw["wm"]), {str(k): int(v) for k, v in raw["offsets"].items()}
        )


def event_id(partition: str, offset: int) -> str:
    """The id of the event at ``offset`` of ``partition`` (sorts in offset order)."""
    return f"{partition}:{offset:010d}"


def parse_event_id(eid: str) -> tuple[str, int]:
    """Invert :func:`event_id`.

    :raises ValueError: not an event id.
    """
    partition, _, offset = eid.rpartition(":")
    return partition, int(offset)


def event_amount(seed: int, eid: str) -> int:
    """The amount event ``eid`` carries: a pure function of the seed and the id."""
    return zlib.crc32(f"{seed}:{eid}".encode()) % 10_000 + 1


def _advances(seed: int, j: int) -> dict[str, int]:
    rng = random.Random(f"statelog-drill:{seed}:{j}")
    return {p: rng.randrange(MAX_ADVANCE + 1) for p in PARTITIONS}


def watermark_at(origin: Origin, j: int) -> int:
    """The watermark drill commit ``j`` sets: it passes the events of commit ``j - LAG``."""
    return origin.watermark_ms + (j - LAG) * STEP_MS + 1 if j > LAG else origin.watermark_ms


def _event_value(seed: int, eid: str, j: int) -> dict[str, Any]:
    amount = event_amount(seed, eid)
    # The padding makes segments fill and roll, so the compactor has work.
    return {"amount": amount, "ts": j * STEP_MS, "pad": "p" * (amount % 160)}


def redelivery(seed: int, epoch: int) -> int:
    """How many events per partition the source redelivers to a writer resuming at ``epoch``.

    Enough to reach back past the buffer into already applied events.
    """
    return random.Random(f"statelog-drill-resume:{seed}:{epoch}").randrange(16, 40)


@dataclass
class Model:
    """The drill's state after ``j`` commits, folded in plain dicts."""

    seed: int
    origin: Origin
    j: int = 0
    offsets: dict[str, int] = field(default_factory=dict)
    watermark_ms: int = 0
    buffer: dict[str, dict[str, Any]] = field(default_factory=dict)
    applied: dict[str, int] = field(default_factory=dict)
    total: int = 0

    @staticmethod
    def start(seed: int, origin: Origin) -> Model:
        """The model at the origin (no drill commit yet)."""
        offsets = {p: origin.offsets.get(p, 0) for p in PARTITIONS}
        return Model(seed, origin, 0, offsets, origin.watermark_ms)

    def advance_to(self, j: int) -> None:
        """Fold commits up to ``j``.

        :raises ValueError: ``j`` is behind the model (start a new one).
        """
        if j < self.j:
            raise ValueError(f"model at {self.j} cannot go back to {j}")
        while self.j < j:
            self.j += 1
            for p, k in _advances(self.seed, self.j).items():
                for off in range(self.offsets[p], self.offsets[p] + k):
                    eid = event_id(p, off)
                    self.buffer[eid] = _event_value(self.seed, eid, self.j)
                self.offsets[p] += k
            self.watermark_ms = watermark_at(self.origin, self.j)
            cut = (self.j - LAG) * STEP_MS + 1
            for eid in [e for e, v in self.buffer.items() if v["ts"] < cut]:
                self.applied[eid] = self.buffer.pop(eid)["amount"]
                self.total += self.applied[eid]


def origin_of(store: StateStore) -> tuple[Origin, dict[str, Any]]:
    """The drill's origin in ``store``, and a summary of the store's own (non-drill) state.

    The summary (other partitions' offsets, other tables' key counts) must not
    change while the drill runs.
    """
    offsets = store.offsets
    origin = Origin(
        store.epoch, store.low_watermark_ms, {p: o for p, o in offsets.items() if p in PARTITIONS}
    )
    others = {
        "offsets": {p: o for p, o in offsets.items() if p not in PARTITIONS},
        "tables": {t: store.count(t) for t in store.tables() if t not in (BUFFER, APPLIED)},
    }
    return origin, others


def _diff(what: str, got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    if got == want:
        return []
    extra, missing = got.keys() - want.keys(), want.keys() - got.keys()
    changed = sum(got[k] != want[k] for k in got.keys() & want.keys())
    return [f"{what} differs from the model: {len(extra)} extra, {len(missing)} missing, "
            f"{changed} different"]  # fmt: skip


def check_state(store: StateStore, model: Model) -> list[str]:
    """Every way ``store``'s drill state differs from ``model`` (empty: exact).

    Beyond equality with the model, the running total must equal the sum of
    the applied amounts (a replay that applied an event twice breaks that),
    and resuming from the offsets must neither redeliver a processed event
    as new nor skip one (processed means buffered or applied).
    """
    problems: list[str] = []
    offsets = {p: store.offsets.get(p, model.origin.offsets.get(p, 0)) for p in PARTITIONS}
    if offsets != model.offsets:
        problems.append(f"offsets {offsets} != model {model.offsets}")
    if store.low_watermark_ms != model.watermark_ms:
        problems.append(f"watermark {store.low_watermark_ms} != model {model.watermark_ms}")
    applied = {str(k): v for k, v in store.items(APPLIED) if isinstance(k, str)}
    total = store.get(TOTAL_KEY, {"sum": 0, "count": 0}, table=APPLIED)
    if total != {"sum": sum(applied.values()), "count": len(applied)}:
        problems.append(
            f"double count: running total {total} but {len(applied)} applied events "
            f"sum to {sum(applied.values())}"
        )
    elif total["sum"] != model.total:
        problems.append(f"running total {total['sum']} != model {model.total}")
    buffer = {str(k): v for k, v in store.items(BUFFER)}
    problems += _diff("applied set", applied, model.applied)
    problems += _diff("buffer", buffer, model.buffer)
    seen: dict[str, set[int]] = {p: set() for p in PARTITIONS}
    for eid in (*applied, *buffer):
        p, off = parse_event_id(eid)
        seen.setdefault(p, set()).add(off)
    for p, offs in seen.items():
        start, end = model.origin.offsets.get(p, 0), offsets.get(p, 0)
        if any(off >= end for off in offs):
            problems.append(f"{p}: events at or past offset {end} were processed (a resume "
                            "would deliver them again)")  # fmt: skip
        if len({o for o in offs if start <= o < end}) != end - start:
            problems.append(f"{p}: events before offset {end} are neither buffered nor applied")
    return problems


def _emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


def drill_commit(store: StateStore, seed: int, origin: Origin, redeliver: int) -> int:
    """Make drill commit ``j = epoch - origin + 1`` from the live state, as a reconciler would.

    :raises RuntimeError: the state and the offsets disagree (an event before
        the committed offset is neither buffered nor applied).
    """
    sabotage = os.environ.get(SABOTAGE_ENV, "")
    j = store.epoch - origin.epoch + 1
    offsets = {p: store.offsets.get(p, 0) for p in PARTITIONS}
    buffered: dict[str, dict[str, Any]] = {str(k): v for k, v in store.items(BUFFER)}
    total = store.get(TOTAL_KEY, {"sum": 0, "count": 0}, table=APPLIED)
    with store.transaction() as tx:
        for p in PARTITIONS if redeliver else ():
            for off in range(max(origin.offsets.get(p, 0), offsets[p] - redeliver), offsets[p]):
                eid = event_id(p, off)
                if eid in buffered:
                    continue
                if store.get(eid, None, table=APPLIED) is None:
                    raise RuntimeError(
                        f"{eid} is before the offset but neither buffered nor applied"
                    )
                if sabotage == "double-apply":  # apply it again, as a non-idempotent sink would
                    total["sum"] += event_amount(seed, eid)
        for p, k in _advances(seed, j).items():
            for off in range(offsets[p], offsets[p] + k):
                eid = event_id(p, off)
                buffered[eid] = _event_value(seed, eid, j)
                tx.put(eid, buffered[eid], table=BUFFER)
            if k:
                tx.offsets[p] = offsets[p] + k
        tx.low_watermark_ms = watermark_at(origin, j)
        cut = (j - LAG) * STEP_MS + 1
        for eid, value in buffered.items():
            if value["ts"] < cut:
                tx.delete(eid, table=BUFFER)
                tx.put(eid, value["amount"], table=APPLIED)
                total["sum"] += value["amount"]
                total["count"] += 1
        tx.put(TOTAL_KEY, total, table=APPLIED)
    assert tx.epoch is not None
    return tx.epoch


def _write(store_path: Path, seed: int, origin: Origin, segment_bytes: int) -> int:
    _emit("opening")
    store = open_store(store_path, durability="commit", segment_bytes=segment_bytes)
    _emit(f"open {store.epoch}")
    redeliver = redelivery(seed, store.epoch)
    lie = 2 if os.environ.get(SABOTAGE_ENV) == "lie-ack" else 0
    while True:  # until SIGKILL: the drill never lets the writer finish
        epoch = drill_commit(store, seed, origin, redeliver)
        redeliver = 0
        _emit(f"ack {epoch + lie}")


class _Pausing(FileLayer):
    """A file layer that stops before its ``k``-th durable step until the drill says go."""

    def __init__(self, k: int) -> None:
        self.left = k

    def step(self, op: str) -> None:
        self.left -= 1
        if self.left == 0:
            _emit(f"step {op}")
            sys.stdin.buffer.readline()  # the drill kills the writer (or us) meanwhile

    def create_durable(self, path: Path, data: Buffer) -> None:
        self.step(f"create:{path.name}")
        super().create_durable(path, data)

    def open_append(self, path: Path) -> AppendFile:
        layer = self
        f = super().open_append(path)

        class Pausing(AppendFile):
            def write(self, chunks: Sequence[Buffer]) -> None:
                layer.step(f"write:{path.name}")
                super().write(chunks)

            def sync(self) -> None:
                layer.step(f"sync:{path.name}")
                super().sync()

        paused = Pausing(f.path, os.dup(f._fd), f.size)
        f.close()
        return paused

    def rename(self, src: Path, dst: Path) -> None:
        self.step(f"rename:{dst.name}")
        super().rename(src, dst)

    def remove(self, path: Path) -> None:
        self.step(f"remove:{path.name}")
        super().remove(path)

    def fsync_dir(self, path: Path) -> None:
        self.step(f"fsync-dir:{path.name}")
        super().fsync_dir(path)


def _compact(store_path: Path, pause_at: int) -> int:
    files = _Pausing(pause_at) if pause_at > 0 else FileLayer()
    _emit("pass")
    result = compact(store_path, files=files, min_tail_bytes=0, retain=2)
    _emit(f"done {result.snapshot.name if result.snapshot else '-'} {result.skipped or '-'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the writer or one compaction pass (see the module docstring); the exit status."""
    ap = argparse.ArgumentParser(prog="python -m statelog.cli.drill_writer")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("store", type=Path)
    w.add_argument("--seed", type=int, required=True)
    w.add_argument("--origin", type=Origin.from_json, default=Origin())
    w.add_argument("--segment-bytes", type=int, default=16 * 1024)
    c = sub.add_parser("compact")
    c.add_argument("store", type=Path)
    c.add_argument("--pause-at", type=int, default=0)
    args = ap.parse_args(argv)
    if args.cmd == "write":
        return _write(args.store, args.seed, args.origin, args.segment_bytes)
    return _compact(args.store, args.pause_at)


if __name__ == "__main__":
    sys.exit(main())
