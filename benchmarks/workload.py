"""The benchmarks' workload: the reconciler-shaped generator of statelog's testing kit.

Kept as a module of its own so benchmark code imports its workload from one
place; the generator itself, bit-identical for a seed, is
:mod:`statelog.kit.reconciler`.
"""

from __future__ import annotations

from statelog.kit.reconciler import DEFAULT_SEED, EPOCH_MS, Checkpoint, Value, Workload, make_value

__all__ = ["DEFAULT_SEED", "EPOCH_MS", "Checkpoint", "Value", "Workload", "make_value"]
