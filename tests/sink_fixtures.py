"""Targets, a deterministic reconciler and a crashing child for the sink tests.

* :func:`open_target` opens a sink on SQLite (a file under the test's temp
  directory) or PostgreSQL (``STATELOG_PG_DSN``; absent, the test is skipped
  with the reason "STATELOG_PG_DSN not set"), each test on its own table.
* :func:`hooked` wraps either sink class so a test can fail at each step of
  a write: ``before-sink``, ``target-begun``, ``target-upserted`` (rows sent,
  target not committed), ``target-committed``, ``sink-written`` (the write
  returned; the statelog commit not yet made). The reconciler adds
  ``computed`` and ``store-committed``.
* :func:`run_batches` is a small reconciler over a seeded stream: batch ``b``
  is a pure function of ``(seed, b)``; the running totals per account live in
  the store; each batch emits one output per account it touched, versioned
  by the global index of the account's last event. Odd batches commit with
  ``SinkedStore.commit``, even ones with ``SinkedStore.transaction``.
* Run as a program, it is the child the SIGKILL tests kill::

      python -m tests.sink_fixtures STORE KIND TARGET TABLE --batches N --die STEP:K
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import statelog
from statelog.sinks import Output, PostgresSink, SinkCommit, SinkedStore, SQLiteSink
from statelog.sinks.base import EncodedOutput, TransactionalSink

__all__ = [
    "BATCHES",
    "KINDS",
    "PG_DSN",
    "Crash",
    "Hook",
    "drop_pg_table",
    "hooked",
    "open_target",
    "run_batches",
    "store_state",
]

PG_DSN = os.environ.get("STATELOG_PG_DSN")
KINDS = ("sqlite", "postgres")
BATCHES = 8
SEED = 2_024
PER_BATCH = 6
ACCOUNTS = 5
CLOSE_AT = 260  # an account whose total passes this is closed: final output, state deleted

Hook = Callable[[str, int], None]
"""Called with (step, epoch or batch) at each step of a sinked commit."""


class Crash(BaseException):
    """An injected crash: a BaseException, so no ``except Exception`` swallows it."""


def _no_hook(step: str, n: int) -> None:
    pass


def hooked(cls: type[TransactionalSink]) -> type[TransactionalSink]:
    """A subclass of ``cls`` that calls ``self.hook(step, epoch)`` at each step of a write."""

    class Hooked(cls):  # type: ignore[valid-type, misc]
        hook: Hook = staticmethod(_no_hook)
        _epoch = 0

        def write(self, outputs: Sequence[Output], epoch: int) -> int:
            self._epoch = epoch
            self.hook("before-sink", epoch)
            n = int(super().write(outputs, epoch))
            self.hook("sink-written", epoch)
            return n

        def _begin(self) -> None:
            super()._begin()
            self.hook("target-begun", self._epoch)

        def _upsert(self, outputs: list[EncodedOutput], epoch: int) -> int:
            n = int(super()._upsert(outputs, epoch))
            self.hook("target-upserted", epoch)
            return n

        def _commit(self) -> None:
            super()._commit()
            self.hook("target-committed", self._epoch)

    Hooked.__name__ = f"Hooked{cls.__name__}"
    return Hooked


def open_target(
    kind: str, where: Path | str, table: str, *, hook: Hook | None = None
) -> TransactionalSink:
    """A sink of ``kind`` on ``where`` (SQLite file path, or PostgreSQL DSN)."""
    cls: type[TransactionalSink] = SQLiteSink if kind == "sqlite" else PostgresSink
    if hook is not None:
        cls = hooked(cls)
    sink = cls(where, table)  # type: ignore[arg-type]
    if hook is not None:
        sink.hook = hook  # type: ignore[attr-defined]
    return sink


def new_table() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def drop_pg_table(table: str) -> None:
    import psycopg

    assert PG_DSN is not None
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'DROP TABLE IF EXISTS "{table}"')


# -- the reconciler ------------------------------------------------------------


def batch_events(seed: int, b: int) -> list[tuple[int, str, int]]:
    """Events of batch ``b`` (1-based): (global index, account, amount)."""
    rng = random.Random(f"sink-stream:{seed}:{b}")
    first = (b - 1) * PER_BATCH
    return [
        (first + i, f"acct-{rng.randrange(ACCOUNTS)}", rng.randrange(-40, 120))
        for i in range(PER_BATCH)
    ]


def step(sinked: SinkedStore, b: int, hook: Hook = _no_hook, seed: int = SEED) -> SinkCommit:
    """Fold batch ``b`` into the store and emit its outputs; one sinked commit."""
    store = sinked.store
    has_totals = store.has_table("totals")  # not before the first batch
    touched: dict[str, dict[str, Any]] = {}
    for idx, acct, amount in batch_events(seed, b):
        stored = store.get(acct, table="totals") if has_totals else None
        cur = touched.get(acct) or stored or {"total": 0, "n": 0}
        touched[acct] = {"total": cur["total"] + amount, "n": cur["n"] + 1, "last": idx}
    outputs, put, delete = [], {}, []
    for acct, t in sorted(touched.items()):
        closed = t["total"] > CLOSE_AT
        payload = {"account": acct, "total": t["total"], "events": t["n"], "closed": closed}
        outputs.append(Output(f"total:{acct}", t["last"], payload))
        if closed:
            delete.append(acct)
        else:
            put[acct] = t
    hook("computed", b)
    if b % 2:
        result = sinked.commit(
            outputs=outputs,
            offsets={"in-0": b},
            low_watermark_ms=b * 1000,
            put=put,
            delete=delete,
            table="totals",
        )
    else:
        with sinked.transaction() as tx:
            for k, v in put.items():
                tx.put(k, v, table="totals")
            for k in delete:
                tx.delete(k, table="totals")
            tx.set_offset("in-0", b)
            tx.low_watermark_ms = b * 1000
            tx.emit(*outputs)
        assert tx.result is not None
        result = tx.result
    hook("store-committed", b)
    return result


def run_batches(
    sinked: SinkedStore, last: int = BATCHES, hook: Hook = _no_hook
) -> dict[int, SinkCommit]:
    """Resume from the store's offset and run batches up to ``last``; results by batch."""
    first = sinked.store.offsets.get("in-0", 0) + 1
    return {b: step(sinked, b, hook) for b in range(first, last + 1)}


def store_state(store: statelog.StateStore) -> dict[str, Any]:
    """Everything a sinked store holds: epoch, offsets, watermark, every table.

    The marks table is named after the sink's table, which differs per run:
    it is listed under the name ``marks``.
    """
    return {
        "epoch": store.epoch,
        "offsets": store.offsets,
        "wm": store.low_watermark_ms,
        "tables": {
            "marks" if t.startswith("__sink__:") else t: list(store.items(t))
            for t in store.tables()
            if store.count(t)
        },
    }


# -- the child the SIGKILL tests kill ----------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("store", type=Path)
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("target")
    ap.add_argument("table")
    ap.add_argument("--batches", type=int, default=BATCHES)
    ap.add_argument("--die", required=True, help="STEP:K, SIGKILL at STEP of batch/epoch K")
    args = ap.parse_args(argv)
    die_step, die_n = args.die.split(":")

    def hook(step_name: str, n: int) -> None:
        if step_name == die_step and n == int(die_n):
            os.kill(os.getpid(), signal.SIGKILL)

    with (
        statelog.open(args.store) as store,
        open_target(args.kind, args.target, args.table, hook=hook) as sink,
    ):
        run_batches(SinkedStore(store, sink), args.batches, hook)
    return 0


if __name__ == "__main__":
    sys.exit(main())
