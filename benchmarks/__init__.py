"""Benchmarks: statelog against the durability strategies a reconciler could pick.

``make bench-quick`` (or ``make bench``) runs the pytest-benchmark suites ``bench_*.py``
with ``--benchmark-json`` and renders ``docs/benchmarks.md`` with ``benchmarks.render``.
"""
