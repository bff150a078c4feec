"""What a recovery lost, or an audit trail failed to record, is visible without logging set up.

A library that only logs is silent in a program that never configured
logging: these tests run such a program (a subprocess with no logging set
up) and look at its stderr, and check the warning categories, the way to
make them fatal, and the counters an operator alerts on.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

import statelog
from compactor import compact
from statelog.ops import metrics
from statelog.storage.snapshots import list_snapshots
from tests.helpers import flip_bit, frames, segments, truncate

SEG = 4096


def _build(path: Path, first: int = 1, last: int = 120) -> None:
    with statelog.open(path, segment_bytes=SEG) as s:
        for i in range(first, last + 1):
            s.commit({f"k{i % 17}": i}, offsets={"p0": i}, low_watermark_ms=i)


def flip_an_early_record(store: Path) -> str:
    first = segments(store)[0]
    flip_bit(first, frames(first)[3].offset + 20)
    return r"epochs \d+\.\.120 were lost"


def damage_the_newest_snapshot(store: Path) -> str:
    compact(store)
    _build(store, 121, 160)
    compact(store)
    newest = list_snapshots(store / "snapshots")[0][2]
    flip_bit(newest, newest.stat().st_size // 2)
    return "damaged snapshots refused: " + newest.name


def cut_the_seal(store: Path) -> str | None:
    truncate(segments(store)[-1], -3)
    return None  # a torn tail lost nothing acknowledged: no warning


def nothing(store: Path) -> str | None:
    return None


DAMAGE: list[Callable[[Path], str | None]] = [
    flip_an_early_record,
    damage_the_newest_snapshot,
    cut_the_seal,
    nothing,
]


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_lossy_recovery_warns_in_a_program_without_logging(
    tmp_path: Path, damage: Callable[[Path], str | None]
) -> None:
    store = tmp_path / "s"
    _build(store)
    expected = damage(store)
    script = f"import statelog\nstatelog.open({str(store)!r}).close()\nprint('opened')\n"
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout == "opened\n", run.stderr
    if expected is None:
        assert "Warning" not in run.stderr, run.stderr
    else:
        assert "DataLossWarning" in run.stderr
        assert str(store) in run.stderr
        assert re.search(expected, run.stderr), run.stderr


def test_a_lossy_recovery_can_be_made_fatal(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _build(store)
    flip_an_early_record(store)
    before = sorted(p.name for p in store.iterdir())
    with pytest.raises(statelog.CorruptionError):
        statelog.open(store, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", statelog.StatelogWarning)
        with pytest.raises(statelog.DataLossWarning, match="were lost"):
            statelog.open(store, readonly=True)
    assert sorted(p.name for p in store.iterdir()) == before  # neither changed a file


def test_the_lost_epochs_are_counted(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _build(store)
    flip_an_early_record(store)
    label = {"store": metrics.store_label(store)}
    with pytest.warns(statelog.DataLossWarning), statelog.open(store, readonly=True):
        pass  # a reader's recovery changes nothing: it is not counted as lost
    assert not metrics.REGISTRY.get_sample_value("statelog_lost_epochs_total", label)
    with pytest.warns(statelog.DataLossWarning) as seen, statelog.open(store) as s:
        lost = s.recovery.lost_epochs
    assert lost and f"epochs {lost.start}..{lost.stop - 1}" in str(seen[0].message)
    assert metrics.REGISTRY.get_sample_value("statelog_lost_epochs_total", label) == len(lost)


def test_an_audit_trail_that_fails_warns_and_is_counted(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _build(store, 1, 3)
    log = store / "AUDIT.log"
    data = log.read_bytes()
    log.write_bytes(data[:10] + b"\xff\xfe not an entry" + data[30:])
    label = {"store": metrics.store_label(store), "kind": "recovery"}
    before = metrics.REGISTRY.get_sample_value("statelog_audit_failures_total", label) or 0
    warned = pytest.warns(statelog.AuditWarning, match="did not record a recovery event")
    with warned, statelog.open(store) as s:
        s.commit({"after": 1})  # the writer carries on: an audit entry is not a commit
    assert metrics.REGISTRY.get_sample_value("statelog_audit_failures_total", label) == before + 1
    with statelog.open(store, readonly=True) as ro:
        assert ro.get("after") == 1


def test_the_cli_reports_loss_itself_without_a_python_warning(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _build(store)
    flip_an_early_record(store)
    run = subprocess.run(
        [sys.executable, "-m", "statelog.cli", "recover", str(store), "--dry-run"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "DataLossWarning" not in run.stderr + run.stdout
    assert "LOST    epochs 4..120" in run.stdout


def test_the_readme_says_how_to_route_and_raise_the_warnings() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = textwrap.dedent(readme.split("When recovery loses something", 1)[1][:3000])
    for needed in ("DataLossWarning", "AuditWarning", "strict=True", "captureWarnings"):
        assert needed in section, needed
