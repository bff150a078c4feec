"""The layers below the store import without it, and ``import statelog`` leaves the S3 tier out.

Importing any ``statelog.X`` first runs ``statelog/__init__.py``, which
imports the store on purpose (it exports ``open``). To see what a lower
package itself imports, each check runs in a fresh interpreter in which
``statelog`` is an empty namespace over the package directory, so only the
named module and what it imports get loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_ABOVE = ("statelog.store", "statelog.sinks", "statelog.sharding", "statelog.cli", "compactor")

_PROBE = """
import importlib, json, sys, types
pkg = types.ModuleType("statelog")
pkg.__path__ = [sys.argv[1]]
sys.modules["statelog"] = pkg
importlib.import_module(sys.argv[2])
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(module: str, *, bare: bool = True) -> list[str]:
    """The modules a fresh interpreter holds after importing ``module``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if bare:
        argv = [sys.executable, "-c", _PROBE, str(REPO / "statelog"), module]
    else:
        code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
        argv = [sys.executable, "-c", code]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=60)
    return list(json.loads(out.stdout))


@pytest.mark.parametrize(
    "module",
    [
        "statelog.remote",
        "statelog.remote.restore",
        "statelog.ops",
        "statelog.ops.verify",
        "statelog.ops.audit",
        "statelog.ops.metrics",
        "statelog.recovery",
        "statelog.recovery.readonly",
        "statelog.recovery.ladder",
        "statelog.compaction.fold",
    ],
)
def test_a_lower_layer_imports_without_the_store(module: str) -> None:
    loaded = _loaded(module)
    assert module in loaded, "the probe imported nothing"
    above = [m for m in loaded if any(m == a or m.startswith(f"{a}.") for a in _ABOVE)]
    assert above == [], f"{module} imports {above}"


def test_import_statelog_loads_neither_the_compaction_engine_nor_the_remote_tier() -> None:
    loaded = _loaded("statelog", bare=False)
    assert "statelog.store.store" in loaded
    # The engine is imported when a writer starts compactor="thread".
    assert [m for m in loaded if m.startswith("statelog.compaction.fold")] == []
    # The remote tier and its S3 client are imported when a store uses remote=.
    assert [m for m in loaded if m.startswith(("statelog.remote", "obstore"))] == []
