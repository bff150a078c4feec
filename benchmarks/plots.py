"""The report's plots, drawn with matplotlib when it is installed (it is in the dev extra)."""

from __future__ import annotations

from pathlib import Path

from .conftest import size_id

__all__ = ["PLOTS", "plots"]

PLOTS = {"commit": "bench-commit-latency.png", "bytes": "bench-bytes-written.png"}
PLOTS["recovery"] = "bench-recovery.png"
TITLES = {"commit": ("Durable checkpoint p50 by state size", "ms")}
TITLES["bytes"] = ("Bytes written per checkpoint, 1% dirty", "bytes")
TITLES["recovery"] = ("Recovery after SIGKILL", "seconds")


def plots(series: dict[str, list[tuple[str, int, float]]], out_dir: Path) -> list[str]:
    """Bar charts of ``series`` (plot -> [(strategy, keys, value)]) in ``out_dir``, log scale.

    Returns the report's lines linking them, or one saying why there are none.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
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
