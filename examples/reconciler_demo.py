"""statelog's main job: a streaming reconciler that is killed again and again and loses nothing.

Two synthetic CDC streams (a source database's changes and a target's,
three partitions each, out of order within a tolerated lateness) are
reconciled twice from the same seed:

* the **reference run**, in this process, never interrupted;
* the **crash run**, a reconciler subprocess with the compaction daemon
  (``statelog-compactor``) running beside it, SIGKILLed at random moments
  (at least once while a compaction pass is running) and restarted each
  time from what statelog recovered.

Both write parity verdicts (match, mismatch, missing on either side)
through the idempotent SQLite sink. At the end the two verdict tables must
be identical, row for row: no verdict lost, none written twice, none
different. A summary table shows events, checkpoints, kills, recovery
times, commits replayed, walk-backs and the verdict counts; the exit
status is non-zero if the runs differ in any verdict.

Run with ``make demo`` (``--entities`` and ``--kills`` make it smaller or
harsher; ``tests/test_demo.py`` runs a small one).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.reconciler.reconciler import reconcile  # noqa: E402
from examples.reconciler.streams import generate  # noqa: E402

SEGMENT_BYTES = 64 * 1024  # small segments: the daemon has sealed ones to fold all along


def verdicts(sink: Path) -> list[tuple[str, int, str]]:
    """The verdict table, ordered: (id, version, payload)."""
    with sqlite3.connect(sink) as db:
        rows = db.execute("SELECT id, version, payload FROM verdicts ORDER BY id").fetchall()
    return [(str(i), int(v), str(p)) for i, v, p in rows]


def start_reconciler(a: argparse.Namespace, store: Path, sink: Path, stats: Path) -> Any:
    cmd = [
        sys.executable, "-m", "examples.reconciler.reconciler", str(store), str(sink),
        "--seed", str(a.seed), "--entities", str(a.entities), "--batch", str(a.batch),
        "--pause", str(a.pause), "--stats", str(stats), "--segment-bytes", str(SEGMENT_BYTES),
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT)


def start_daemon(store: Path) -> Any:
    cmd = [
        sys.executable, "-m", "compactor", "--interval", "0.05", "--min-tail-bytes", "1",
        "--retain", "2", "--log-level", "WARNING", str(store),
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT)


def crash_run(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The reconciler under SIGKILL, with the daemon compacting beside it."""
    store, sink, stats = work / "crash-store", work / "crash.sqlite", work / "starts.jsonl"
    rng = random.Random(a.seed * 31 + 1)
    kills: list[str] = []
    damaged: str | None = None
    import statelog

    statelog.open(store).close()  # the daemon serves an existing store
    daemon = start_daemon(store)
    child = start_reconciler(a, store, sink, stats)
    try:
        while len(kills) < a.kills:
            if not _wait_for_start(stats, len(kills) + 1, child):
                break  # finished before every kill was spent
            # The second kill, and a third of the later ones, hit a compaction pass.
            during_compaction = len(kills) == 1 or (len(kills) >= 2 and rng.random() < 0.3)
            moment = _wait_for_compaction(store, child) if during_compaction else None
            if moment is None:
                time.sleep(rng.uniform(0.05, 0.5))
                moment = "commit"
            if child.poll() is not None:
                break
            child.send_signal(signal.SIGKILL)
            child.wait()
            kills.append(moment)
            paused = len(kills) == 3
            if paused:
                # Bit rot in the newest snapshot: the restart must walk back past it.
                # The daemon stops first (SIGTERM ends its pass cleanly), so no new
                # snapshot hides the damaged one; a fresh daemon starts afterwards.
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=60)
                damaged = _damage_newest_snapshot(store)
            child = start_reconciler(a, store, sink, stats)
            if paused:
                try:
                    _wait_for_start(stats, len(kills) + 1, child)
                finally:
                    daemon = start_daemon(store)
        if child.wait(timeout=600) != 0:
            raise SystemExit(f"the reconciler failed with exit status {child.returncode}")
    finally:
        if child.poll() is None:
            child.kill()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    starts = [json.loads(line) for line in stats.read_text().splitlines()]
    return {
        "kills": kills,
        "starts": starts,
        "verdicts": verdicts(sink),
        "epoch": epoch_of(store),
        "damaged": damaged,
    }


def _damage_newest_snapshot(store: Path) -> str | None:
    """Flip one byte in the middle of the newest snapshot, if an older one remains to use."""
    snaps = sorted((store / "snapshots").glob("*.snap"))
    if len(snaps) < 2:
        return None
    newest = snaps[-1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x40
    newest.write_bytes(bytes(data))
    return newest.name


def epoch_of(store: Path) -> int:
    import statelog

    with statelog.open(store, readonly=True) as s:
        return s.epoch


def _wait_for_start(stats: Path, starts: int, child: Any) -> bool:
    """Wait until the reconciler has recovered and recorded start number ``starts``."""
    while child.poll() is None:
        if stats.exists() and len(stats.read_text().splitlines()) >= starts:
            return True
        time.sleep(0.005)
    return False


def _wait_for_compaction(store: Path, child: Any, timeout: float = 5.0) -> str | None:
    """Wait until a compaction pass is running (its scratch directory exists)."""
    deadline = time.monotonic() + timeout
    scratch = store / "compactor.tmp"
    while time.monotonic() < deadline and child.poll() is None:
        if scratch.exists():
            return "compaction"
        time.sleep(0.0005)
    return None


def report(
    ref: list[tuple[str, int, str]], ref_epoch: int, crash: dict[str, Any], events: int, secs: float
) -> int:
    """Print the summary table; 0 when the verdict tables are identical."""
    from rich.console import Console
    from rich.table import Table

    counts = Counter(json.loads(p)["verdict"] for _i, _v, p in ref)
    crash_counts = Counter(json.loads(p)["verdict"] for _i, _v, p in crash["verdicts"])
    starts = crash["starts"]
    restarts = starts[1:]
    same = ref == crash["verdicts"]
    t = Table(title="statelog reconciler demo: crash run vs crash-free reference")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("events (both streams)", f"{events:,}")
    t.add_row("checkpoints (ref / crash)", f"{ref_epoch:,} / {crash['epoch']:,}")
    t.add_row("kills (SIGKILL)", f"{len(crash['kills'])} ({', '.join(crash['kills'])})")
    rec = [s["seconds"] * 1000 for s in restarts]
    t.add_row(
        "recovery time per restart (ms)",
        f"{min(rec):.1f} .. {max(rec):.1f}" if rec else "-",
    )
    t.add_row("commits replayed after restarts", f"{sum(s['replayed'] for s in restarts):,}")
    t.add_row("restarts from a snapshot", str(sum(1 for s in restarts if s["snapshot"])))
    walked = sum(s["walk_backs"] for s in starts)
    t.add_row(
        "walk-backs (past a snapshot damaged on purpose)",
        f"{walked} ({crash['damaged']})" if crash.get("damaged") else str(walked),
    )
    for v in ("match", "mismatch", "missing_in_target", "missing_in_source"):
        t.add_row(f"verdicts: {v} (ref / crash)", f"{counts[v]:,} / {crash_counts[v]:,}")
    t.add_row("verdict tables identical", "yes" if same else "NO")
    t.add_row("wall time (s)", f"{secs:.1f}")
    Console().print(t)
    if not same:
        only_ref = set(ref) - set(crash["verdicts"])
        only_crash = set(crash["verdicts"]) - set(ref)
        print(f"FAIL: {len(only_ref)} verdicts only in the reference run, "
              f"{len(only_crash)} only in the crash run", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--entities", type=int, default=30_000)
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--batch", type=int, default=10, help="events per partition per checkpoint")
    ap.add_argument("--pause", type=float, default=0.002, help="seconds between checkpoints")
    ap.add_argument("--keep", type=Path, help="keep the stores and sinks in this directory")
    a = ap.parse_args(argv)
    started = time.perf_counter()
    work = a.keep or Path(tempfile.mkdtemp(prefix="statelog-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        streams = generate(a.seed, a.entities)
        reconcile(work / "ref-store", work / "ref.sqlite", streams, batch=a.batch)
        ref = verdicts(work / "ref.sqlite")
        crash = crash_run(a, work)
        ref_epoch = epoch_of(work / "ref-store")
        return report(ref, ref_epoch, crash, streams.events, time.perf_counter() - started)
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    sys.exit(main())
