"""The renderer's text helpers: one suite's results, units, markdown tables.

Shared by :mod:`benchmarks.render` and the section modules it imports
(:mod:`benchmarks.render_build`), so neither imports the other's helpers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["Doc", "ms", "rate", "ratio", "size", "suite", "table"]

Doc = dict[str, Any]


def suite(doc: Doc, name: str) -> list[Doc]:
    """The ``extra_info`` of every benchmark of suite ``name``, its ``stats`` added."""
    runs = [{**b["extra_info"], "stats": b["stats"]} for b in doc["benchmarks"]]
    return [r for r in runs if r.get("suite") == name]


def ms(seconds: float) -> str:
    v = seconds * 1000
    return "-" if math.isnan(v) else f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def size(n: float) -> str:
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit:
            return f"{n / unit:.1f} {name}"
    return f"{n:.0f} B"


def rate(n: float) -> str:
    return f"{n / 1e6:.2f} M/s" if n >= 1e6 else f"{n / 1e3:.1f} k/s" if n >= 1e3 else f"{n:.0f}/s"


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def table(head: str, rows: Iterable[str], align: str) -> str:
    """A markdown table from ``" | "``-separated cells; ``align``: ``l`` or ``r`` per column."""
    marks = "|".join("---:" if a == "r" else "---" for a in align)
    return "\n".join([f"| {head} |", f"|{marks}|", *(f"| {row} |" for row in rows)])
