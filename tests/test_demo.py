"""The demo behind ``make demo``, small: a reconciler killed under a compaction daemon.

| case                                         | expected                                   |
|----------------------------------------------|--------------------------------------------|
| small seed, 3 kills (one during compaction)  | exit 0, verdict tables identical           |
| a verdict differs between the two runs       | exit 1, the difference counted on stderr   |
| a verdict missing from the crash run         | exit 1                                     |
| streams from one seed                        | identical; another seed gives other events |
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples import reconciler_demo  # noqa: E402
from examples.reconciler.streams import generate  # noqa: E402


def test_small_demo_survives_its_kills_with_identical_verdicts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "examples/reconciler_demo.py", "--entities", "4000", "--kills", "3",
         "--seed", "11", "--keep", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict tables identical" in done.stdout and "yes" in done.stdout
    starts = [json.loads(x) for x in (tmp_path / "starts.jsonl").read_text().splitlines()]
    assert len(starts) == 4  # the first start and one per kill
    assert reconciler_demo.verdicts(tmp_path / "crash.sqlite") == reconciler_demo.verdicts(
        tmp_path / "ref.sqlite"
    )


def _crash(verdicts: list[tuple[str, int, str]]) -> dict[str, object]:
    start = {"epoch": 0, "seconds": 0.001, "replayed": 0, "snapshot": None, "walk_backs": 0}
    return {"kills": ["commit"], "starts": [start, start], "verdicts": verdicts, "epoch": 5}


REF = [
    ("order:000001", 1, json.dumps({"verdict": "match", "src": 5, "tgt": 5})),
    ("order:000002", 1, json.dumps({"verdict": "missing_in_target", "src": 7, "tgt": None})),
]


def test_a_differing_verdict_fails_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    other = [REF[0], ("order:000002", 1, json.dumps({"verdict": "match", "src": 7, "tgt": 7}))]
    assert reconciler_demo.report(REF, 5, _crash(other), 10, 1.0) == 1
    assert "1 verdicts only in the reference run" in capsys.readouterr().err


def test_a_lost_verdict_fails_the_demo() -> None:
    assert reconciler_demo.report(REF, 5, _crash(REF[:1]), 10, 1.0) == 1
    assert reconciler_demo.report(REF, 5, _crash(list(REF)), 10, 1.0) == 0


def test_streams_are_a_pure_function_of_the_seed() -> None:
    a, b, c = generate(3, 500), generate(3, 500), generate(4, 500)
    assert a == b and a != c
    assert a.events > 500  # most entities appear on both sides


def test_small_failover_demo_promotes_the_standby_with_identical_verdicts(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "examples/failover_demo.py", "--entities", "3000", "--seed", "5",
         "--keep", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict tables identical" in done.stdout and "yes" in done.stdout
    assert reconciler_demo.verdicts(tmp_path / "failover.sqlite") == reconciler_demo.verdicts(
        tmp_path / "ref.sqlite"
    )
    starts = (tmp_path / "starts.jsonl").read_text().splitlines()
    assert len(starts) == 2  # the primary's reconciler, then the one on the promoted standby
