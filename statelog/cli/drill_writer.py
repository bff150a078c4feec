"""The drill's workload, its model, and the two processes the drill kills.

The workload models a reconciler over three source partitions. Drill commit
``j`` (the ``j``-th commit after the drill's origin) is a pure function of
``(seed, origin, j)``:

* each partition advances by 0-6 events; every new event goes into the
  in-flight buffer table (:data:`BUFFER`), stamped with the commit's time
  and carrying a record of the testing kit's reconciler workload
  (:func:`statelog.kit.make_value`);
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
        end; with --pause-at, prints "step <kind>:<file>" before its K-th
        durable step (the testing kit's fault layer, :mod:`statelog.kit`)
        and waits for a line on stdin before taking it

Every line is one ``write`` to stdout, so a SIGKILL never leaves half a line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statelog.compaction.fold import compact
from statelog.kit import DURABLE, FaultyFiles, Pause, Step, make_value
from statelog.storage.fileio import FileLayer
from statelog.store.store import StateStore
from statelog.store.store import open as open_store

__all__ = [
    "APPLIED",
    "BUFFER",
    "PARTITIONS",
    "PASS_STEPS",
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
PASS_STEPS = 9
"""A compaction pass that writes a snapshot takes at least this many durable steps."""


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
    # The event's record is the kit's reconciler record (its size makes segments
    # fill and roll, so the compactor has work); amount and time are the drill's.
    _, offset = parse_event_id(eid)
    record = make_value(random.Random(f"statelog-drill-event:{seed}:{eid}"), offset, j * STEP_MS)
    return {"amount": event_amount(seed, eid), "ts": j * STEP_MS, "record": record}


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


def _idempotent(eid: str, amount: int) -> int:
    return 0


def drill_commit(
    store: StateStore,
    seed: int,
    origin: Origin,
    redeliver: int,
    *,
    on_duplicate: Callable[[str, int], int] = _idempotent,
) -> int:
    """Make drill commit ``j = epoch - origin + 1`` from the live state, as a reconciler would.

    :param redeliver: events per partition the source delivers again from
        before the committed offsets (at-least-once delivery after a restart).
    :param on_duplicate: what applying a redelivered, already applied event
        adds to the running total, given its id and amount. The drill's
        downstream is idempotent (nothing); a test passes a sink that is not,
        to see the drill catch it.
    :raises RuntimeError: the state and the offsets disagree (an event before
        the committed offset is neither buffered nor applied).
    """
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
                total["sum"] += on_duplicate(eid, event_amount(seed, eid))
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
    store = open_store(
        store_path, durability="commit", segment_bytes=segment_bytes, tables=(APPLIED, BUFFER)
    )
    _emit(f"open {store.epoch}")
    redeliver = redelivery(seed, store.epoch)
    while True:  # until SIGKILL: the drill never lets the writer finish
        epoch = drill_commit(store, seed, origin, redeliver)
        redeliver = 0
        _emit(f"ack {epoch}")


def _hold(step: Step) -> None:
    _emit(f"step {step.label}")
    sys.stdin.buffer.readline()  # the drill kills the writer (or us) meanwhile


def _compact(store_path: Path, pause_at: int) -> int:
    files = FaultyFiles(None, [Pause(DURABLE, pause_at, wait=_hold)]) if pause_at else FileLayer()
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
