"""One seeded workload and its model, for tests, stress loops and benchmarks.

Commit ``i`` of a :class:`Stream` is a pure function of ``(seed, i)``
(:meth:`Stream.commit`): its form (``store.commit`` or a transaction), its
tables, its str and bytes keys side by side (``"or:004"`` and
``b"or:003"`` are different keys), puts, deletes of keys of the same small
key space (so later commits overwrite and delete earlier ones), offset
advances and a non-decreasing watermark. A process that makes the commits
and another that checks them only share the seed: the checker recomputes
the model (:meth:`Stream.model`, the plain-dict fold of commits
``1..E``) at whatever epoch recovery reports, and compares digests
(:func:`store_digest`, :meth:`Model.digest`) or whole states.

The reconciler-shaped generator of the benchmarks (:class:`Workload`,
:class:`Checkpoint`, :func:`make_value`) lives in
:mod:`statelog.kit.reconciler` and is re-exported here.

Part of statelog's testing kit: nothing on the commit path imports it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from statelog.kit.reconciler import DEFAULT_SEED, Checkpoint, Value, Workload, make_value

if TYPE_CHECKING:
    from statelog.store.store import StateStore

__all__ = [
    "BLOB_TABLE",
    "DEFAULT_SEED",
    "Checkpoint",
    "CommitSpec",
    "Key",
    "Model",
    "Op",
    "Stream",
    "Value",
    "Workload",
    "make_value",
    "run_commit",
    "state_digest",
    "store_digest",
]

BLOB_TABLE = "blobs"
BASE_WATERMARK = 1_700_000_000_000
_BLOB_POOL = 3  # blob keys: bounds the state while the log keeps growing

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
    """Everything commit ``epoch`` does, as a plain description.

    ``watermark`` None (transaction form only) keeps the committed watermark.
    """

    epoch: int
    form: Literal["commit", "transaction"]
    ops: tuple[Op, ...]
    offsets: Mapping[str, int]
    watermark: int | None


@dataclass
class Model:
    """The state a store must hold after commits ``1..epoch``, in plain dicts."""

    epoch: int = 0
    offsets: dict[str, int] = field(default_factory=dict)
    low_watermark_ms: int = 0
    tables: dict[str, dict[Key, Any]] = field(default_factory=dict)

    def apply(self, spec: CommitSpec) -> None:
        """Fold the next commit in (operations in order: the last one on a key wins).

        :raises ValueError: ``spec`` is not commit ``epoch + 1``.
        """
        if spec.epoch != self.epoch + 1:
            raise ValueError(f"commit {spec.epoch} does not follow epoch {self.epoch}")
        for op in spec.ops:
            table = self.tables.setdefault(op.table, {})
            if op.delete:
                table.pop(op.key, None)
            else:
                table[op.key] = op.value
        self.offsets.update(spec.offsets)
        if spec.watermark is not None:
            self.low_watermark_ms = spec.watermark
        self.epoch = spec.epoch

    def state(self) -> dict[str, Any]:
        """``{"offsets", "low_watermark_ms", "tables"}`` with empty tables dropped."""
        return {
            "offsets": dict(self.offsets),
            "low_watermark_ms": self.low_watermark_ms,
            "tables": {t: dict(kv) for t, kv in self.tables.items() if kv},
        }

    def digest(self) -> str:
        """:func:`state_digest` of the model: equal to :func:`store_digest` of a store in it."""
        return state_digest(self.offsets, self.low_watermark_ms, self.tables)


@dataclass(frozen=True)
class Stream:
    """A seeded commit stream; every parameter changes the commits, none their determinism.

    :param tables: tables of the small commits and transactions.
    :param partitions: each commit advances about 60% of them.
    :param key_space: keys per table; commits pick from it, transactions
        from its first quarter (so transactions repeat keys).
    :param max_ops: most keys one commit-form commit touches.
    :param delete_ratio: share of touched keys that are deleted.
    :param value_size: most bytes of a small value.
    :param medium_ratio: share of commits whose values are 1 KB to ``medium_size``.
    :param blob_ratio: share of commits that put one 40-140 KB blob
        (table :data:`BLOB_TABLE`, larger than a small segment).
    :param transaction_ratio: share of commits made with ``store.transaction()``.
    """

    seed: int = 0
    tables: tuple[str, ...] = ("default", "orders", "payments")
    partitions: tuple[str, ...] = ("orders-0", "orders-1", "payments-0", "payments-1")
    key_space: int = 48
    max_ops: int = 8
    delete_ratio: float = 0.3
    value_size: int = 200
    medium_ratio: float = 0.22
    medium_size: int = 12_000
    blob_ratio: float = 0.03
    transaction_ratio: float = 0.35

    def key(self, table: str, n: int) -> Key:
        """Key ``n`` of ``table``: a third are bytes keys, the rest str keys."""
        if n % 3 == 0:
            return f"{table[:2]}:{n:03d}".encode()
        return f"{table[:2]}:{n:03d}"

    def commit(self, i: int) -> CommitSpec:
        """Commit ``i`` (1-based): a pure function of the parameters and ``i``."""
        rng = random.Random(f"statelog-kit:{self.seed}:{i}")
        # Strictly increasing in i for every partition it names.
        offsets = {p: i * 5 + n for n, p in enumerate(self.partitions) if rng.random() < 0.6}
        watermark: int | None = BASE_WATERMARK + (i // 3) * 250  # non-decreasing, often equal
        roll = rng.random()
        size_kind = (
            "large"
            if roll < self.blob_ratio
            else "medium"
            if roll < self.blob_ratio + self.medium_ratio
            else "small"
        )

        def size() -> int:
            if size_kind == "medium":
                return rng.randrange(1_000, max(1_001, self.medium_size))
            return rng.randrange(0, self.value_size + 1)

        ops: list[Op] = []
        if size_kind == "large":
            # One big blob, and sometimes a delete of another so the state stays bounded.
            n = rng.randrange(_BLOB_POOL)
            blob = rng.randbytes(64) * (rng.randrange(40_000, 140_000) // 64)
            ops.append(Op(BLOB_TABLE, f"blob:{n}", blob))
            if rng.random() < 0.5:
                ops.append(Op(BLOB_TABLE, f"blob:{(n + 1) % _BLOB_POOL}", delete=True))
        if rng.random() >= self.transaction_ratio:
            table = BLOB_TABLE if ops else rng.choice(self.tables)
            if not ops:
                n_ops = min(rng.randrange(0, self.max_ops + 1), self.key_space)
                picked = rng.sample(range(self.key_space), n_ops)
                for n in picked:
                    if rng.random() < self.delete_ratio:
                        ops.append(Op(table, self.key(table, n), delete=True))
                    else:
                        ops.append(Op(table, self.key(table, n), _value(rng, i, size())))
            return CommitSpec(i, "commit", tuple(ops), offsets, watermark)
        if rng.random() < 0.2:
            watermark = None
        for table in rng.sample(self.tables, rng.randrange(1, len(self.tables) + 1)):
            for _ in range(rng.randrange(1, 7)):
                # Repeated keys on purpose: within a transaction the last operation wins.
                k = self.key(table, rng.randrange(max(1, self.key_space // 4)))
                if rng.random() < self.delete_ratio:
                    ops.append(Op(table, k, delete=True))
                else:
                    ops.append(Op(table, k, _value(rng, i, size())))
        return CommitSpec(i, "transaction", tuple(ops), offsets, watermark)

    def advance(self, model: Model, epoch: int) -> Model:
        """Fold commits ``model.epoch + 1 .. epoch`` into ``model``; return it."""
        for i in range(model.epoch + 1, epoch + 1):
            model.apply(self.commit(i))
        return model

    def model(self, epoch: int) -> Model:
        """The fold of commits ``1..epoch``."""
        return self.advance(Model(), epoch)


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


def run_commit(store: StateStore, spec: CommitSpec) -> int:
    """Make commit ``spec`` on ``store`` in its form; the epoch the store returned.

    :raises StatelogError: what ``store.commit`` or the transaction raises.
    """
    if spec.form == "commit":
        assert spec.watermark is not None
        tables = {op.table for op in spec.ops}
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


def store_digest(store: StateStore) -> str:
    """:func:`state_digest` of everything ``store`` shows."""
    tables = {t: dict(store.items(t)) for t in store.tables()}
    return state_digest(store.offsets, store.low_watermark_ms, tables)
