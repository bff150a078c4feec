"""The report's plots, drawn with matplotlib when it is installed (it is in the dev extra)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .conftest import size_id

__all__ = ["ANCHORS_PLOT", "PLOTS", "anchors_plot", "plots"]

PLOTS = {"commit": "bench-commit-latency.png", "bytes": "bench-bytes-written.png"}
PLOTS["recovery"] = "bench-recovery.png"
TITLES = {"commit": ("Durable checkpoint p50 by state size", "ms")}
TITLES["bytes"] = ("Bytes written per checkpoint, 1% dirty", "bytes")
TITLES["recovery"] = ("Recovery after SIGKILL", "seconds")
ANCHORS_PLOT = "bench-anchors.png"
_ANCHOR_SIDES = {"statelog": "statelog", "litestream": "Litestream", "slatedb": "SlateDB"}
_ANCHOR_PANELS = (  # result key, title, lower is better
    ("updates_per_s", "durable updates/s", False),
    ("lag_p99", "lag p99, s", True),
    ("bucket_bytes_per_checkpoint", "bucket bytes / checkpoint", True),
    ("restore_seconds", "restore 1M keys, s", True),
)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plots(series: dict[str, list[tuple[str, int, float]]], out_dir: Path) -> list[str]:
    """Bar charts of ``series`` (plot -> [(strategy, keys, value)]) in ``out_dir``, log scale.

    Returns the report's lines linking them, or one saying why there are none.
    """
    plt = _pyplot()
    if plt is None:
        return ["matplotlib is not installed: no plots were drawn."]
    drawn = []
    for key, points in series.items():
        if not points:
            continue
        groups = sorted({k for _, k, _ in points})
        names = list(dict.fromkeys(n for n, _, _ in points))
        width = 0.8 / len(names)
        fig, ax = plt.subplots(figsize=(9, 4))
        for i, name in enumerate(names):
            mine = {k: max(v, 1e-6) for n, k, v in points if n == name}
            xs = [j + i * width for j, k in enumerate(groups) if k in mine]
            ax.bar(xs, [mine[k] for k in groups if k in mine], width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], map(size_id, groups))
        ax.set_yscale("log")
        ax.set_title(TITLES[key][0])
        ax.set_ylabel(TITLES[key][1])
        ax.legend(fontsize=7, ncol=4)
        fig.tight_layout()
        fig.savefig(out_dir / PLOTS[key], dpi=90)
        plt.close(fig)
        drawn.append(f"![{PLOTS[key]}]({PLOTS[key]})")
    return drawn


def anchors_plot(runs: list[dict[str, Any]], out_dir: Path) -> list[str]:
    """The anchors on S3 side by side, one panel per metric (log scale; the value over
    each bar, ``0`` drawn at the axis floor). Returns the report's line linking it."""
    sides = {r["system"]: r for r in runs if r["system"] in _ANCHOR_SIDES}
    plt = _pyplot()
    if len(sides) < 2 or plt is None:
        return []
    names = [s for s in _ANCHOR_SIDES if s in sides]
    fig, axes = plt.subplots(1, len(_ANCHOR_PANELS), figsize=(12, 3.4))
    for ax, (key, title, lower) in zip(axes, _ANCHOR_PANELS, strict=True):
        values = [_anchor_value(sides[s], key) for s in names]
        bars = ax.bar([_ANCHOR_SIDES[s] for s in names], [max(v, 1e-3) for v in values])
        for bar, v in zip(bars, values, strict=True):
            ax.annotate(f"{v:,.3g}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)  # fmt: skip
        ax.set_yscale("log")
        ax.set_title(f"{title} ({'lower' if lower else 'higher'} is better)", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle("The anchors on S3, 1M keys, 1% per checkpoint", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / ANCHORS_PLOT, dpi=90)
    plt.close(fig)
    return [f"![{ANCHORS_PLOT}]({ANCHORS_PLOT})"]


def _anchor_value(run: dict[str, Any], key: str) -> float:
    if key == "bucket_bytes_per_checkpoint":
        return float(run["bucket_bytes"]) / max(1, int(run["checkpoints"]))
    v = float(run[key])
    return 0.0 if math.isnan(v) else v
