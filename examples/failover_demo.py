"""statelog failover: a reconciler's writer is killed and its standby takes over.

The same synthetic CDC streams as ``make demo`` are reconciled twice from one seed:

* the **reference run**, in this process, never interrupted;
* the **failover run**: a reconciler subprocess writes to the primary store,
  with the compaction daemon beside it, while this process keeps a standby
  of it (``statelog.open(standby, follow=primary)``) and reads from it. At a
  random moment the reconciler is SIGKILLed; the standby is promoted
  (``standby.promote()``), and the reconciler restarts on the promoted store
  from the offsets promotion returned.

Both write their verdicts through the idempotent SQLite sink. The verdict
tables must be identical row for row: nothing lost, nothing written twice.
A summary shows the standby's lag while it followed, the promotion time and
where the new writer resumed. Exit status 1 if the runs differ.

Run with ``make failover-demo`` (``tests/test_demo.py`` runs a small one).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import statelog  # noqa: E402
from examples.reconciler.reconciler import reconcile  # noqa: E402
from examples.reconciler.streams import generate  # noqa: E402
from examples.reconciler_demo import (  # noqa: E402
    start_daemon,
    start_reconciler,
    verdicts,
)


def failover_run(a: argparse.Namespace, work: Path, kill_at: int) -> dict[str, Any]:
    """The primary under a reconciler and a daemon; its standby here; a kill once the
    standby has seen epoch ``kill_at``; a promotion."""
    primary, copy, sink = work / "primary", work / "standby", work / "failover.sqlite"
    stats = work / "starts.jsonl"
    statelog.open(primary).close()  # the daemon and the standby serve an existing store
    daemon = start_daemon(primary)
    child = start_reconciler(a, primary, sink, stats)
    standby = statelog.open(copy, follow=primary, follow_poll=timedelta(milliseconds=50))
    lags: list[int] = []
    try:
        while standby.epoch < kill_at and child.poll() is None:
            time.sleep(0.02)
            lag = standby.lag
            assert lag is not None
            lags.append(lag.epochs)
        if child.poll() is not None:
            raise SystemExit("the reconciler ended before the kill: raise --pause")
        child.send_signal(signal.SIGKILL)
        child.wait()
        killed = time.perf_counter()
        before = standby.epoch
        daemon.send_signal(signal.SIGTERM)  # the primary's host is gone: its daemon too
        daemon.wait(timeout=60)
        promoted = standby.promote()
        took = time.perf_counter() - killed
    finally:
        if child.poll() is None:
            child.kill()
        if daemon.poll() is None:
            daemon.kill()
        standby.close()
    resumed = start_reconciler(a, copy, sink, stats)
    if resumed.wait(timeout=600) != 0:
        raise SystemExit(f"the reconciler failed on the promoted store ({resumed.returncode})")
    with statelog.open(copy, readonly=True) as s:
        final = s.epoch
    return {
        "standby_epoch": before,
        "promoted": promoted,
        "promote_seconds": took,
        "lag_max": max(lags, default=0),
        "lag_samples": len(lags),
        "final_epoch": final,
        "verdicts": verdicts(sink),
    }


def report(ref: list[tuple[str, int, str]], ref_epoch: int, run: dict[str, Any]) -> int:
    """Print the summary; 0 when the verdict tables are identical."""
    from rich.console import Console
    from rich.table import Table

    same = ref == run["verdicts"]
    p = run["promoted"]
    t = Table(title="statelog failover demo: standby promoted vs crash-free reference")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("checkpoints (reference / failover)", f"{ref_epoch:,} / {run['final_epoch']:,}")
    t.add_row(
        "standby lag while following, epochs (max)",
        f"{run['lag_max']} over {run['lag_samples']} samples",
    )
    t.add_row("standby epoch at the kill", f"{run['standby_epoch']:,}")
    t.add_row("promoted at epoch (after its last look)", f"{p.epoch:,}")
    t.add_row("kill to promoted writer (ms)", f"{run['promote_seconds'] * 1000:.1f}")
    t.add_row("resumed from offsets", ", ".join(f"{k}={v}" for k, v in sorted(p.offsets.items())))
    t.add_row("verdicts (reference / failover)", f"{len(ref):,} / {len(run['verdicts']):,}")
    t.add_row("verdict tables identical", "yes" if same else "NO")
    Console().print(t)
    if not same:
        print("FAIL: the failover run's verdicts differ from the reference", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--entities", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=10, help="events per partition per checkpoint")
    ap.add_argument("--pause", type=float, default=0.01, help="seconds between checkpoints")
    ap.add_argument("--keep", type=Path, help="keep the stores and sinks in this directory")
    a = ap.parse_args(argv)
    work = a.keep or Path(tempfile.mkdtemp(prefix="statelog-failover-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        streams = generate(a.seed, a.entities)
        reconcile(work / "ref-store", work / "ref.sqlite", streams, batch=a.batch)
        with statelog.open(work / "ref-store", readonly=True) as s:
            ref_epoch = s.epoch
        kill_at = random.Random(a.seed).randrange(ref_epoch // 4, ref_epoch * 3 // 4)
        run = failover_run(a, work, kill_at)
        return report(verdicts(work / "ref.sqlite"), ref_epoch, run)
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    sys.exit(main())
