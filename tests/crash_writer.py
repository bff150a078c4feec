"""A committing writer for the SIGKILL test, run as a real subprocess.

Commit ``i`` of the stream is a pure function of ``(seed, i)``
(:func:`commit_spec`): its form (``store.commit`` or ``store.transaction``),
its tables, puts, deletes, offsets and watermark. The parent test imports the
same functions to recompute the model at whatever epoch recovery reports.

Protocol (one line per event on stdout, written with a single ``write`` so a
SIGKILL never leaves half a line)::

    opening                   about to open the store (recovery starts)
    open <epoch> <digest>     the store opened; recovered epoch and state digest
    begin <i> [roll]          commit i is about to be attempted ("roll": the log
                              rolls to a new segment first)
    ack <i>                   commit i returned (durable: durability="commit")
    done                      every requested commit was made; the store closed

``--die-at`` makes the writer SIGKILL itself at a precise step that a timed
kill from outside rarely hits: in the middle of writing a record (a torn
write), or inside a segment roll. It is injected through ``file_layer=``;
the store's code is not changed.

Usage::

    python tests/crash_writer.py STORE --seed 7 --count 50 [--die-at torn:3:0.4]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

import statelog
from statelog.storage.fileio import AppendFile, Buffer, FileLayer

__all__ = [
    "BLOB_TABLE",
    "PARTITIONS",
    "TABLES",
    "CommitSpec",
    "Model",
    "Op",
    "apply_spec",
    "commit_spec",
    "run_spec",
    "state_digest",
    "store_digest",
]

TABLES = ("default", "orders", "payments")
BLOB_TABLE = "blobs"
PARTITIONS = ("orders-0", "orders-1", "payments-0", "payments-1")
BASE_WATERMARK = 1_700_000_000_000
KEY_POOL = 48  # keys per table: small, so later commits overwrite and delete earlier ones
BLOB_POOL = 3  # blob keys: bounds the state while the log keeps growing

Key = str | bytes


@dataclass(frozen=True)
class Op:
    """One put (``value`` set) or delete (``delete=True``) of one key in one table."""

    table: str
    key: Key
    value: Any = None
    delete: bool = False


@dataclass(frozen=True)
class CommitSpec:
    """Everything commit ``epoch`` does, as a plain description."""

    epoch: int
    form: Literal["commit", "transaction"]
    ops: tuple[Op, ...]
    offsets: Mapping[str, int]
    watermark: int | None  # None: keep the committed watermark (transaction form only)


def _key(table: str, n: int) -> Key:
    """Key ``n`` of ``table``: a third are bytes keys, the rest str keys."""
    if n % 3 == 0:
        return f"{table[:2]}:{n:03d}".encode()
    return f"{table[:2]}:{n:03d}"


def _value(rng: random.Random, i: int, size: int) -> Any:
    """A msgpack-able value of roughly ``size`` bytes whose shape varies with ``rng``."""
    kind = rng.randrange(5)
    if kind == 0:
        return {"i": i, "amount": i * 7 + rng.randrange(1000), "note": "n" * size, "ok": True}
    if kind == 1:
        return [i, rng.randrange(-(1 << 40), 1 << 40), i / 8, None, "x" * size]
    if kind == 2:
        return rng.randbytes(min(size, 32)) * (size // 32 + 1)
    if kind == 3:
        return f"v{i}:" + "s" * size
    return {"nested": {"i": i, "list": [1, 2, {"deep": "y" * size}]}, "neg": -i}


def commit_spec(seed: int, i: int) -> CommitSpec:
    """Commit ``i`` (1-based) of the stream named by ``seed``: a pure function of both."""
    rng = random.Random(f"statelog-crash-writer:{seed}:{i}")
    offsets = {
        p: i * 5 + n for n, p in enumerate(PARTITIONS) if rng.random() < 0.6
    }  # strictly increasing in i for every partition
    watermark: int | None = BASE_WATERMARK + (i // 3) * 250  # non-decreasing, often equal
    roll = rng.random()
    if roll < 0.03:
        size_kind = "large"
    elif roll < 0.25:
        size_kind = "medium"
    else:
        size_kind = "small"

    def size() -> int:
        if size_kind == "medium":
            return rng.randrange(1_000, 12_000)  # several fragments at fragment_bytes=2048
        return rng.randrange(0, 200)

    ops: list[Op] = []
    if size_kind == "large":
        # One big blob (many fragments, one record larger than a segment),
        # and sometimes a delete of another blob so the state stays bounded.
        n = rng.randrange(BLOB_POOL)
        blob = rng.randbytes(64) * (rng.randrange(40_000, 140_000) // 64)
        ops.append(Op(BLOB_TABLE, f"blob:{n}", blob))
        if rng.random() < 0.5:
            ops.append(Op(BLOB_TABLE, f"blob:{(n + 1) % BLOB_POOL}", delete=True))
    form: Literal["commit", "transaction"] = "transaction" if rng.random() < 0.35 else "commit"
    if form == "commit":
        table = BLOB_TABLE if ops else rng.choice(TABLES)
        if not ops:
            picked = rng.sample(range(KEY_POOL), rng.randrange(0, 9))
            n_put = rng.randrange(0, len(picked) + 1)
            for n in picked[:n_put]:
                ops.append(Op(table, _key(table, n), _value(rng, i, size())))
            for n in picked[n_put:]:
                ops.append(Op(table, _key(table, n), delete=True))
    else:
        if rng.random() < 0.2:
            watermark = None
        for table in rng.sample(TABLES, rng.randrange(1, len(TABLES) + 1)):
            for _ in range(rng.randrange(1, 7)):
                # Repeated keys on purpose: within a transaction the last operation wins.
                k = _key(table, rng.randrange(KEY_POOL // 4))
                if rng.random() < 0.3:
                    ops.append(Op(table, k, delete=True))
                else:
                    ops.append(Op(table, k, _value(rng, i, size())))
    return CommitSpec(i, form, tuple(ops), offsets, watermark)


@dataclass
class Model:
    """The state the store must hold after folding commits ``1..epoch``."""

    epoch: int = 0
    offsets: dict[str, int] = field(default_factory=dict)
    low_watermark_ms: int = 0
    tables: dict[str, dict[Key, Any]] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        """The model in the shape of ``tests.helpers.snapshot_of`` (empty tables dropped)."""
        return {
            "offsets": dict(self.offsets),
            "low_watermark_ms": self.low_watermark_ms,
            "tables": {t: dict(kv) for t, kv in self.tables.items() if kv},
        }


def apply_spec(model: Model, spec: CommitSpec) -> None:
    """Fold one commit into ``model`` (operations in order: the last one on a key wins)."""
    assert spec.epoch == model.epoch + 1, (spec.epoch, model.epoch)
    for op in spec.ops:
        table = model.tables.setdefault(op.table, {})
        if op.delete:
            table.pop(op.key, None)
        else:
            table[op.key] = op.value
    model.offsets.update(spec.offsets)
    if spec.watermark is not None:
        model.low_watermark_ms = spec.watermark
    model.epoch = spec.epoch


def run_spec(store: statelog.StateStore, spec: CommitSpec) -> int:
    """Make commit ``spec`` on ``store`` in its form; return the epoch the store returned."""
    if spec.form == "commit":
        assert spec.watermark is not None
        tables = {op.table for op in spec.ops}
        assert len(tables) <= 1
        return store.commit(
            offsets=spec.offsets,
            low_watermark_ms=spec.watermark,
            put={op.key: op.value for op in spec.ops if not op.delete},
            delete=[op.key for op in spec.ops if op.delete],
            table=tables.pop() if tables else "default",
        )
    with store.transaction() as tx:
        for op in spec.ops:
            if op.delete:
                tx.delete(op.key, table=op.table)
            else:
                tx.put(op.key, op.value, table=op.table)
        for partition, offset in spec.offsets.items():
            tx.set_offset(partition, offset)
        if spec.watermark is not None:
            tx.low_watermark_ms = spec.watermark
    assert tx.epoch is not None
    return tx.epoch


def state_digest(
    offsets: Mapping[str, int], low_watermark_ms: int, tables: Mapping[str, Mapping[Key, Any]]
) -> str:
    """A canonical hash of a whole state (empty tables ignored), equal for equal states."""
    canon = [
        sorted(offsets.items()),
        low_watermark_ms,
        [
            [name, sorted(kv.items(), key=lambda item: (isinstance(item[0], str), item[0]))]
            for name, kv in sorted(tables.items())
            if kv
        ],
    ]
    return hashlib.sha256(msgspec.msgpack.encode(canon)).hexdigest()[:32]


def store_digest(store: statelog.StateStore) -> str:
    tables = {t: dict(store.items(t)) for t in store.tables()}
    return state_digest(store.offsets, store.low_watermark_ms, tables)


# -- self-kill at precise steps --------------------------------------------

_SEAL_TYPE = 5  # FrameType.SEAL: byte 8 of a frame header


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(99)  # not reached


@dataclass
class KillPlan:
    """Where to die, parsed from ``--die-at``.

    * ``torn:<n>:<frac>``: the n-th record append writes only ``frac`` of its bytes.
    * ``roll:<n>:<point>[:<frac>]``: inside the n-th segment roll, at ``point``:
      ``seal-torn`` (part of the SEAL frame written), ``sealed`` (SEAL written and
      synced), ``tmp`` (part of the new segment's temp file written), ``renamed``
      (new segment renamed into place, directory not yet synced), ``opened`` (new
      segment open, nothing appended), ``first-torn`` (part of the first record
      after the roll written).
    """

    kind: str = ""
    n: int = 0
    point: str = ""
    frac: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> KillPlan:
        if not text:
            return cls()
        parts = text.split(":")
        if parts[0] == "torn":
            return cls("torn", int(parts[1]), "", float(parts[2]))
        if parts[0] == "roll":
            frac = float(parts[3]) if len(parts) > 3 else 0.0
            return cls("roll", int(parts[1]), parts[2], frac)
        raise SystemExit(f"bad --die-at {text!r}")


class _KillFile(AppendFile):
    def __init__(self, path: Path, fd: int, size: int, layer: KillSwitch) -> None:
        super().__init__(path, fd, size)
        self._kill_fd = fd
        self._layer = layer

    def _partial(self, chunks: Sequence[Buffer], frac: float) -> None:
        data = b"".join(bytes(c) for c in chunks)
        cut = min(len(data) - 1, int(len(data) * frac))
        os.write(self._kill_fd, data[:cut])
        _die()

    def write(self, chunks: Sequence[Buffer]) -> None:
        layer = self._layer
        if layer.armed:
            plan = layer.plan
            if bytes(chunks[0])[8] == _SEAL_TYPE:
                layer.rolls += 1
                if plan.kind == "roll" and layer.rolls == plan.n and plan.point == "seal-torn":
                    self._partial(chunks, plan.frac)
            else:
                layer.records += 1
                if plan.kind == "torn" and layer.records == plan.n:
                    self._partial(chunks, plan.frac)
                if layer.in_plan_roll("first-torn") and layer.after_roll:
                    self._partial(chunks, plan.frac)
        super().write(chunks)

    def sync(self) -> None:
        super().sync()
        if self._layer.in_plan_roll("sealed") and not self._layer.after_roll:
            _die()


class KillSwitch(FileLayer):
    """A file layer that SIGKILLs its own process at the step named by a :class:`KillPlan`."""

    def __init__(self, plan: KillPlan) -> None:
        super().__init__()
        self.plan = plan
        self.armed = False  # only count steps once the store is open
        self.records = 0
        self.rolls = 0
        self.after_roll = False  # the planned roll's new segment exists
        self._creating = False

    def in_plan_roll(self, point: str) -> bool:
        p = self.plan
        return self.armed and p.kind == "roll" and p.point == point and self.rolls == p.n

    def open_append(self, path: Path) -> AppendFile:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        f = _KillFile(path, fd, os.fstat(fd).st_size, self)
        if self.in_plan_roll("opened"):
            _die()
        return f

    def create_durable(self, path: Path, data: Buffer) -> None:
        rolling = self.armed and path.name.endswith(".wal")
        if rolling and self.in_plan_roll("tmp"):
            tmp = path.with_name(path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            os.write(fd, bytes(data)[: max(1, int(len(data) * self.plan.frac))])
            _die()
        self._creating = rolling
        try:
            super().create_durable(path, data)
        finally:
            self._creating = False
        if rolling and self.rolls == self.plan.n:
            self.after_roll = True

    def fsync_dir(self, path: Path) -> None:
        if self._creating and self.in_plan_roll("renamed"):
            _die()
        super().fsync_dir(path)


# -- main --------------------------------------------------------------------


def _emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("store", type=Path)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, default=100, help="commits to make before closing")
    ap.add_argument("--segment-bytes", type=int, default=16 * 1024)
    ap.add_argument("--fragment-bytes", type=int, default=2048)
    ap.add_argument("--die-at", default=None, help="self-kill plan, see KillPlan")
    args = ap.parse_args(argv)
    layer = KillSwitch(KillPlan.parse(args.die_at))
    _emit("opening")
    store = statelog.open(
        args.store,
        durability="commit",
        segment_bytes=args.segment_bytes,
        fragment_bytes=args.fragment_bytes,
        file_layer=layer,
    )
    _emit(f"open {store.epoch} {store_digest(store)}")
    layer.armed = True
    start = store.epoch
    for i in range(start + 1, start + 1 + args.count):
        active = store._writer.wal.active_file if store._writer is not None else None
        rolls = active is None or active.size >= args.segment_bytes
        _emit(f"begin {i}{' roll' if rolls else ''}")
        got = run_spec(store, commit_spec(args.seed, i))
        if got != i:
            print(f"commit {i} returned epoch {got}", file=sys.stderr)
            return 3
        _emit(f"ack {i}")
    store.close()
    _emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
