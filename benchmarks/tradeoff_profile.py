"""Where a checkpoint's time goes, when a trade-off target is missed: pyinstrument.

:func:`profile_checkpoints` loads one engine in a fresh interpreter, takes a
few warm-up checkpoints, then samples ``n`` checkpoints with pyinstrument
(1 ms interval) and returns the call tree's heaviest frames. The runner
profiles statelog and the engine it was compared with, side by side, so the
report can say which steps make the difference.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from .engines import ENGINES
from .stores import spawn_call
from .tradeoff_probe import _checkpoint
from .workload import DEFAULT_SEED, Workload

__all__ = ["profile_checkpoints", "profile_isolated", "render_profile"]


def merged_tree(session: Any, floor: float) -> dict[str, Any]:
    """The call tree with same-named sibling frames merged: (depth, seconds, label) lines.

    pyinstrument keeps one node per call site and line; checkpoints repeat the
    same calls, so siblings with the same function and file are summed.
    """
    root = session.root_frame()
    lines: list[tuple[int, float, str]] = []
    if root is None:
        return {"lines": lines}
    total = root.time

    def label(frame: Any) -> str:
        return f"{frame.function} ({frame.file_path_short})"

    def walk(frames: list[Any], depth: int) -> None:
        groups: dict[str, list[Any]] = {}
        for f in frames:
            groups.setdefault(label(f), []).append(f)
        for name, group in sorted(groups.items(), key=lambda kv: -sum(f.time for f in kv[1])):
            seconds = sum(f.time for f in group)
            if seconds < floor * total or depth > 12:
                continue
            lines.append((depth, seconds, name))
            walk([c for f in group for c in f.children], depth + 1)

    walk([root], 0)
    return {"lines": lines}


def profile_checkpoints(
    name: str, keys: int, fraction: float, n: int, *, seed: int = DEFAULT_SEED
) -> dict[str, Any]:
    """pyinstrument over ``n`` checkpoints of engine ``name`` (no source log: not needed)."""
    from pyinstrument import Profiler

    updates = max(1, round(keys * fraction))
    workload = Workload(keys, updates, seed=seed)
    with tempfile.TemporaryDirectory(prefix=f"bench-profile-{name}-") as d:
        engine = ENGINES[name](Path(d))
        try:
            engine.load(Workload(keys, 1, seed=seed).initial_chunks())
            events = 0
            for g in range(2):
                events += updates
                engine.checkpoint(_checkpoint(workload, g, events, keys), 0)
            cps = []
            for g in range(2, 2 + n):
                events += updates
                cps.append(_checkpoint(workload, g, events, keys))
            profiler = Profiler(interval=0.001)
            c0 = time.process_time()
            t0 = time.perf_counter()
            profiler.start()
            for cp in cps:
                engine.checkpoint(cp, 0)
            engine.finish()
            session = profiler.stop()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            tree = merged_tree(session, floor=0.04)
        finally:
            for pid in engine.children():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                engine.close()
    return {"engine": name, "keys": keys, "updates": updates, "n": n, "wall": wall,
            "cpu": cpu, "tree": tree}  # fmt: skip


def profile_isolated(name: str, keys: int, fraction: float, n: int, seed: int) -> dict[str, Any]:
    """:func:`profile_checkpoints` in a freshly spawned interpreter."""
    doc: dict[str, Any] = spawn_call(profile_checkpoints, name, keys, fraction, n, seed=seed)
    return doc


def render_profile(docs: list[dict[str, Any]]) -> list[str]:
    """Markdown: one indented call tree per profiled engine."""
    out = [
        "## Where the checkpoint time goes (pyinstrument)",
        "",
        "A target above is missed, so each engine of the comparison was profiled in a fresh "
        "process: pyinstrument, 1 ms sampling, over consecutive checkpoints after two "
        "warm-ups; frames with at least 4% of the time, per checkpoint.",
        "",
    ]
    for doc in docs:
        n = int(doc["n"])
        out += [
            f"**{doc['engine']}**, {int(doc['keys']):,} keys, {int(doc['updates']):,} updates "
            f"per checkpoint: {n} checkpoints in {doc['wall']:.3f} s wall, {doc['cpu']:.3f} s "
            f"CPU ({doc['wall'] / n * 1e3:.2f} ms wall, {doc['cpu'] / n * 1e3:.2f} ms CPU "
            "per checkpoint); wall minus CPU is waiting, mostly in fsync.",
            "",
            "```",
        ]
        for depth, seconds, frame in doc["tree"]["lines"]:
            if depth == 0:
                continue
            out.append(f"{'  ' * (depth - 1)}{seconds / n * 1e3:8.2f} ms  {frame}")
        out += ["```", ""]
    return out
