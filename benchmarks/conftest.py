"""pytest set-up of the benchmark suites: the size option, collection, the run's context.

``--bench-size`` (or ``STATELOG_BENCH_SIZE``) picks every size from :data:`SIZES`:
``quick`` runs in minutes on two cores, ``full`` adds 1M keys (10M for memory), ``tiny``
only checks that the code runs. The command, the machine (load average and CPU pressure
before and after) and the duration go into the ``--benchmark-json`` file, key ``statelog``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

__all__ = ["LARGE", "SIZES", "Sizes", "machine_now", "parametrize_keys", "size_id"]


@dataclass(frozen=True)
class Sizes:
    """Every size of one mode. ``*_keys``: state sizes; ``rounds``: timed checkpoints."""

    commit_keys: tuple[int, ...]
    commit_updates: int
    rounds: int
    json_rounds: int
    tradeoff_keys: tuple[int, ...]
    """State sizes of the trade-off suite; above ``json_keys`` only :data:`LARGE` runs."""
    json_keys: int
    """The largest state the slow full-rewrite strategies (JSON, SQLite, ...) are run at."""
    fractions: tuple[float, ...]
    budget: float
    """Seconds of back-to-back checkpoints per dirty fraction, roughly."""
    max_checkpoints: int
    settle: float
    """Seconds of one 1%-dirty checkpoint every 250 ms before the SIGKILL."""
    restart_keys: tuple[int, ...]
    """State sizes of the restart suite; its JSON restore runs only up to ``json_keys``."""
    restart_history: int
    restart_tail: int
    repeats: int
    memory_keys: tuple[int, ...]
    daemon_keys: int
    daemon_checkpoints: int
    remote_keys: int
    remote_seconds: float
    build_keys: tuple[int, ...]
    """State sizes of the base image built from a snapshot (``bench_snapshot_build.py``)."""
    pass_keys: tuple[int, ...]
    """State sizes of the pass-cost suite (``bench_pass_scale.py``)."""
    pass_tail: int
    """Updates in the tail each of those passes folds (in 10 checkpoints)."""
    standby_keys: tuple[int, ...]
    """State sizes of the failover suite (``bench_standby.py``)."""
    changes_commits: int
    """Checkpoints of 10,000 updates the changes-feed probe reads back."""
    standby_seconds: float
    """Seconds of sustained commits the standby-lag probe samples (at ``standby_keys[0]``)."""
    pit_keys: int
    """State size of the point-in-time suite (``bench_point_in_time.py``)."""
    pit_checkpoints: int
    """1%-dirty checkpoints of the retained history its views open."""
    pit_window: tuple[float, float, float]
    """(seconds of sustained commits, retention window, the daemon's ``--interval``) of its
    window runs."""
    engine_events: int
    """Events through the stream processors' stateful pipeline (``bench_engines.py``)."""
    engine_entities: int
    """Distinct keys (entities) among them: the state's size."""
    sustained: tuple[tuple[int, float, int | None, float], ...]
    """(keys, seconds, the writer's overlay bound in MiB or None, the compactor's interval
    in seconds) of the sustained-load suite (``bench_sustained.py``)."""
    overlay: tuple[int, int, tuple[int, ...]]
    """(keys, entries per generation, generation counts) of the overlay suite
    (``bench_overlay.py``)."""


LARGE = ("statelog", "statelog-group", "lmdb", "rocksdb")
"""The strategies the trade-off suite runs above ``json_keys``: the rest rewrite or
replay the whole state per checkpoint or recovery, hours at 10M keys."""

# fmt: off
SIZES = {
    "tiny": Sizes(
        commit_keys=(200,), commit_updates=50, rounds=2, json_rounds=2,
        tradeoff_keys=(1000,), json_keys=1000, fractions=(0.01,), budget=0.01,
        max_checkpoints=2, settle=0.1,
        restart_keys=(300,), restart_history=100, restart_tail=50, repeats=1, memory_keys=(300,),
        daemon_keys=300, daemon_checkpoints=3, remote_keys=2000, remote_seconds=1.0,
        build_keys=(2_000,), pass_keys=(2_000,), pass_tail=100, standby_keys=(2_000,),
        changes_commits=3, standby_seconds=2.0,
        pit_keys=2_000, pit_checkpoints=20, pit_window=(4.0, 1.0, 0.5),
        engine_events=2_000, engine_entities=500,
        sustained=((2_000, 1.0, None, 1.0), (2_000, 1.0, 16, 1.0), (2_000, 1.0, 16, 30.0)),
        overlay=(2_000, 100, (2, 8)),
    ),
    "quick": Sizes(
        commit_keys=(10_000, 100_000), commit_updates=10_000, rounds=20, json_rounds=5,
        tradeoff_keys=(10_000, 100_000), json_keys=100_000,
        fractions=(0.001, 0.01, 0.1), budget=0.6,
        max_checkpoints=20, settle=1.0, restart_keys=(100_000,), restart_history=500_000,
        restart_tail=10_000, repeats=3, memory_keys=(100_000,), daemon_keys=100_000,
        daemon_checkpoints=40, remote_keys=100_000, remote_seconds=5.0,
        build_keys=(100_000, 1_000_000), pass_keys=(100_000, 1_000_000), pass_tail=10_000,
        standby_keys=(100_000,), changes_commits=50, standby_seconds=8.0,
        pit_keys=100_000, pit_checkpoints=60, pit_window=(40.0, 15.0, 1.0),
        engine_events=60_000, engine_entities=20_000,
        sustained=((100_000, 20.0, None, 1.0), (100_000, 20.0, 32, 1.0)),
        overlay=(100_000, 6_000, (8, 32, 64)),
    ),
    "full": Sizes(
        commit_keys=(10_000, 100_000, 1_000_000), commit_updates=10_000, rounds=50,
        json_rounds=3, tradeoff_keys=(10_000, 100_000, 1_000_000, 10_000_000),
        json_keys=1_000_000, fractions=(0.001, 0.01, 0.1), budget=8.0, max_checkpoints=100,
        settle=15.0,
        restart_keys=(1_000_000, 10_000_000),
        restart_history=5_000_000, restart_tail=100_000, repeats=3,
        memory_keys=(1_000_000, 10_000_000), daemon_keys=1_000_000, daemon_checkpoints=60,
        remote_keys=1_000_000, remote_seconds=10.0, build_keys=(1_000_000, 10_000_000),
        pass_keys=(1_000_000, 10_000_000), pass_tail=100_000,
        standby_keys=(1_000_000, 10_000_000), changes_commits=200, standby_seconds=60.0,
        pit_keys=1_000_000, pit_checkpoints=100, pit_window=(180.0, 60.0, 1.0),
        engine_events=300_000, engine_entities=100_000,
        sustained=(
            (1_000_000, 120.0, None, 1.0), (1_000_000, 120.0, 32, 1.0),
            (1_000_000, 60.0, 32, 30.0), (10_000_000, 600.0, 24, 1.0),
        ),
        overlay=(1_000_000, 60_000, (16, 32, 64, 128)),
    ),
}
# fmt: on


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-size",
        choices=sorted(SIZES),
        default=os.environ.get("STATELOG_BENCH_SIZE", "quick"),
        help="sizes of every benchmark suite (default: $STATELOG_BENCH_SIZE or quick)",
    )


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect ``bench_*.py`` from a directory too (a file named on the command line already is)."""
    named = file_path.name.startswith("bench_") and file_path.suffix == ".py"
    if named and not parent.session.isinitpath(file_path):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # a full-size cell runs for many minutes
        item.add_marker(pytest.mark.timeout(4 * 3600))


def size_id(keys: int) -> str:
    """``10k``, ``1M``, ``300``: a state size as test ids and the report write it."""
    for unit, name in ((1_000_000, "M"), (1_000, "k")):
        if keys >= unit and keys % unit == 0:
            return f"{keys // unit}{name}"
    return f"{keys:,}"


def parametrize_keys(metafunc: pytest.Metafunc, argname: str, field: str) -> None:
    """Parametrize ``argname`` (if the test takes it) with the sizes ``field`` of this run."""
    if argname in metafunc.fixturenames:
        keys = getattr(SIZES[str(metafunc.config.getoption("--bench-size"))], field)
        metafunc.parametrize(argname, keys, ids=[size_id(k) for k in keys])


@pytest.fixture(scope="session")
def sizes(request: pytest.FixtureRequest) -> Sizes:
    return SIZES[str(request.config.getoption("--bench-size"))]


def _first_line(path: str, prefix: str) -> str:
    try:
        with open(path) as fh:
            return next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith(prefix)), "")
    except OSError:
        return ""


def machine_now() -> dict[str, Any]:
    """Load average and CPU pressure (``some`` avg60/avg300, where the kernel has it), now."""
    out: dict[str, Any] = {"loadavg": list(os.getloadavg())}
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0].split()
        fields = dict(f.split("=") for f in some[1:])
        out["cpu_pressure"] = [float(fields["avg60"]), float(fields["avg300"])]
    except (OSError, IndexError, KeyError, ValueError):
        out["cpu_pressure"] = None
    return out


def _versions() -> dict[str, str]:
    out = {"sqlite": __import__("sqlite3").sqlite_version}
    for dist in ("statelog", "msgspec", "lmdb", "zstandard", "rocksdict", "pytest-benchmark"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _shown(args: list[str]) -> list[str]:
    """The command line without where its temporary files went (not part of the result)."""
    return [a for a in args if not a.startswith("--basetemp")]


_START: dict[str, Any] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _START.update(time=time.time(), **machine_now())


def pytest_benchmark_update_json(
    config: pytest.Config, benchmarks: list[Any], output_json: dict[str, Any]
) -> None:
    """Record what the renderer reports besides the timings (module docstring)."""
    mem = _first_line("/proc/meminfo", "MemTotal")
    output_json["statelog"] = {
        "command": " ".join(["python", "-m", "pytest", *_shown(sys.argv[1:])]),
        "started": datetime.fromtimestamp(_START["time"], UTC).isoformat(timespec="seconds"),
        "seconds": time.time() - _START["time"],
        "size": config.getoption("--bench-size"),
        "sizes": asdict(SIZES[str(config.getoption("--bench-size"))]),
        "cpu": _first_line("/proc/cpuinfo", "model name") or platform.processor(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_bytes": int(mem.split()[0]) * 1024 if mem else 0,
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": _versions(),
        "before": {k: _START[k] for k in ("loadavg", "cpu_pressure")},
        "after": machine_now(),
    }
