"""Benchmarks: statelog against snapshot strategies on one seeded reconciler workload.

``python benchmarks/run.py --quick|--full`` runs every strategy side by side
and rewrites ``docs/benchmarks.md``; ``bench_commit.py`` holds the same
measurements as pytest-benchmark tests.
"""
