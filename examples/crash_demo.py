"""statelog end to end: commit, SIGKILL, reopen, and check what recovery found.

A child process plays a reconciler: every checkpoint advances four partition
offsets and the low watermark, and puts and deletes entries of its in-flight
buffer, as one ``store.commit``. It prints each epoch once ``commit`` has
returned (``durability="commit"``: the epoch is on disk). The parent kills it
with SIGKILL at a random moment, reopens the store, and checks that

* every acknowledged epoch survived, and
* the recovered state is exactly the fold of commits 1..E (the model),
  offsets and watermark included: never a mix of two checkpoints.

The last round also leaves a torn write at the end of the log, as a power
cut mid-append would, to show the torn tail being saved aside and cut while
no acknowledged epoch is lost. Run with ``make demo``.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import statelog

PARTITIONS = ("orders-0", "orders-1", "orders-2", "orders-3")
BATCH = 200  # buffer entries put per checkpoint
KEEP = 5  # checkpoints an entry stays buffered before it is sealed and deleted


def checkpoint(i: int) -> dict[str, Any]:
    """Checkpoint ``i`` of the deterministic stream: a pure function of ``i``."""
    put = {
        f"evt:{i:06d}:{j:03d}": {"src_amount": i * 7 + j, "tgt_amount": i * 7 + j, "seen_ms": i}
        for j in range(BATCH)
    }
    delete = [f"evt:{i - KEEP:06d}:{j:03d}" for j in range(BATCH)] if i > KEEP else []
    return {
        "offsets": {p: i * 100 + n for n, p in enumerate(PARTITIONS)},
        "low_watermark_ms": 1_700_000_000_000 + i * 1000,
        "put": put,
        "delete": delete,
    }


def model(epoch: int) -> tuple[dict[str, int], int, dict[str, Any]]:
    """Offsets, watermark and buffer the store must hold at ``epoch``."""
    if epoch == 0:
        return {}, 0, {}
    buffer: dict[str, Any] = {}
    for i in range(max(1, epoch - KEEP + 1), epoch + 1):
        buffer.update(checkpoint(i)["put"])
    cp = checkpoint(epoch)
    return cp["offsets"], cp["low_watermark_ms"], buffer


def writer(store_path: Path) -> None:
    """The child: commit checkpoints until killed, printing each acknowledged epoch."""
    with statelog.open(store_path, segment_bytes=256 * 1024) as store:
        i = store.epoch
        while True:
            i += 1
            epoch = store.commit(**checkpoint(i))
            print(epoch, flush=True)


def verify(store: statelog.StateStore) -> list[str]:
    """Differences between the store and the model at its epoch (empty: exact)."""
    offsets, wm, buffer = model(store.epoch)
    problems = []
    if store.offsets != offsets:
        problems.append(f"offsets {store.offsets} != {offsets}")
    if store.low_watermark_ms != wm:
        problems.append(f"watermark {store.low_watermark_ms} != {wm}")
    held = dict(store.items())
    if held != buffer:
        extra, missing = held.keys() - buffer.keys(), buffer.keys() - held.keys()
        problems.append(f"buffer differs: {len(extra)} extra, {len(missing)} missing entries")
    return problems


def tear_tail(store_path: Path) -> None:
    """Leave what a power cut mid-append leaves: the newest segment grew, its data never landed.

    The file gains 4 KiB of zeros after the last acknowledged record, and half
    of a frame header, as if the next checkpoint's write had been cut short.
    """
    last = sorted((store_path / "wal").glob("*.wal"))[-1]
    with last.open("ab") as fh:
        fh.write(bytes(4096) + b"\x17\x2a\x00\x00\x10\x00")


def run(kills: int, seed: int) -> int:
    logging.basicConfig(level=logging.WARNING, format="  log: %(levelname)s %(name)s %(message)s")
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="statelog-demo-"))
    store_path = root / "store"
    print(f"statelog {statelog.__version__} crash demo: store in a temp directory, seed {seed}\n")
    header = (
        f"{'round':>5}  {'acked':>6}  {'recovered':>9}  {'replayed':>8}  {'outcome':<10}  "
        f"{'cut bytes':>9}  {'recovery s':>10}  check"
    )
    print(header)
    print("-" * len(header))
    failures = 0
    last_acked = 0
    try:
        for rnd in range(1, kills + 1):
            child = subprocess.Popen(
                [sys.executable, __file__, "--writer", str(store_path)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert child.stdout is not None
            deadline = time.monotonic() + rng.uniform(0.3, 1.2)
            acked = 0
            while time.monotonic() < deadline:
                line = child.stdout.readline()
                if not line:
                    break
                acked = int(line)
            os.kill(child.pid, signal.SIGKILL)
            for line in child.stdout:  # epochs acknowledged before the kill landed
                acked = int(line)
            code = child.wait()
            if rnd == kills:  # last round: a torn write on top of the kill
                tear_tail(store_path)
            with statelog.open(store_path) as store:
                r = store.recovery
                problems = verify(store)
                if store.epoch < acked:
                    problems.append(f"lost acknowledged epoch {acked}")
            if code != -signal.SIGKILL:
                problems.append(f"writer exited with status {code} before it was killed")
            if acked <= last_acked:
                problems.append("the writer acknowledged no new checkpoint")
            last_acked = acked
            ok = not problems
            failures += not ok
            print(
                f"{rnd:>5}  {acked:>6}  {r.epoch:>9}  {r.replayed:>8}  {r.outcome:<10}  "
                f"{r.truncated_bytes:>9}  {r.seconds:>10.4f}  {'ok' if ok else 'FAIL'}"
            )
            for p in problems:
                print(f"       ! {p}")
        broken = sorted(p.name for p in (store_path / "wal").glob("*.broken"))
        print(f"\ntorn bytes saved aside as evidence: {', '.join(broken) or 'none'}")
        print(
            "result:",
            "PASS: every acknowledged epoch survived, state exact"
            if not failures
            else f"FAIL: {failures} round(s) differ from the model",
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5, help="SIGKILL rounds (default 5)")
    ap.add_argument("--seed", type=int, default=7, help="random seed for kill timing")
    ap.add_argument("--writer", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.writer:
        writer(args.writer)
        return 0
    return run(args.kills, args.seed)


if __name__ == "__main__":
    sys.exit(main())
