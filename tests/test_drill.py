"""``statelog drill`` through the real command line, and the checks behind it.

The drill passes on a fresh store; each of its checks fails when the writer
it kills misbehaves on purpose (a test-side writer, ``tests/drill_liar.py``,
passed to the drill's library entry point); bad arguments and a path that
is not a store are refused before anything is written. That an existing
store is drilled on a copy unless ``--in-place`` is in ``test_drill_safety.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import statelog
from compactor import compact
from statelog.cli import build_parser
from statelog.cli.drill import run as run_drill
from statelog.cli.drill_writer import (
    APPLIED,
    BUFFER,
    PARTITIONS,
    TOTAL_KEY,
    Model,
    Origin,
    check_state,
    drill_commit,
    event_id,
    origin_of,
)
from statelog.cli.exits import EXIT_USAGE
from statelog.storage.snapshots import list_snapshots

REPO = Path(__file__).resolve().parent.parent
LIAR = Path(__file__).with_name("drill_liar.py")


def drill(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statelog.cli", "drill", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def drill_with_liar(
    lie: str, *args: str | Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """Run the drill in this process, killing the test-side writer that tells ``lie``."""
    ns = build_parser().parse_args(["drill", *map(str, args)])
    code = run_drill(ns, writer=[sys.executable, str(LIAR), lie])
    out, err = capsys.readouterr()
    return code, out, err


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory)."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def test_drill_passes_on_a_temp_store() -> None:
    got = drill("temp", "--kills", "5", "--seed", "11", "--damage", "--json")
    assert got.returncode == 0, got.stdout + got.stderr
    doc = json.loads(got.stdout)
    rounds = doc["rounds"]
    assert doc["passed"] and len(rounds) == 5
    assert all(r["verdict"] == "pass" and not r["problems"] for r in rounds)
    assert all(r["recovered"] >= r["acked"] > 0 for r in rounds)
    moments = [r["moment"] for r in rounds]
    assert "commit" in moments and "compaction" in moments and "compactor killed" in moments
    assert all(r["step"] for r in rounds if r["moment"] in ("compaction", "compactor killed"))
    assert [r["recovered"] for r in rounds] == sorted(r["recovered"] for r in rounds)
    # --damage: one recovery walked past the damaged newest snapshot and reported it.
    damaged = [r for r in rounds if r["damaged"]]
    assert len(damaged) == 1
    r = damaged[0]
    assert r["damaged"] in [x["file"] for x in r["rejected"]]
    assert r["snapshot"] != r["damaged"]
    # No other rejection than the damaged snapshot, but for a torn tail: a SIGKILL
    # that lands inside a multi-page write leaves a short write behind.
    for q in rounds:
        for x in q["rejected"]:
            torn = q["outcome"] == "torn-tail" and x["file"].endswith(".wal")
            assert x["file"] == r["damaged"] or torn, (q, x)
    assert all(q["outcome"] in ("clean", "torn-tail") for q in rounds)
    assert not Path(doc["store"]).exists()  # a passed drill removes its temporary store


def test_drill_prints_a_plain_table_when_not_on_a_terminal(tmp_path: Path) -> None:
    store = tmp_path / "new-store"
    got = drill(store, "--kills", "1", "--seed", "3")
    assert got.returncode == 0, got.stdout + got.stderr
    lines = got.stdout.splitlines()
    assert lines[1].split() == [
        "round", "kill", "moment", "acked", "recovered", "snapshot", "rejected", "replayed",
        "seconds", "verdict",
    ]  # fmt: skip
    assert lines[2].split()[0] == "1" and lines[2].split()[-1] == "pass"
    assert lines[-1] == "result: PASS"
    assert "\x1b[" not in got.stdout + got.stderr  # no colour, no progress bar off a terminal
    assert not store.exists()  # a path that did not exist is removed after a pass


def test_double_apply_on_replay_fails_the_round_after_the_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    code, out, err = drill_with_liar(
        "double-apply", store, "--kills", "2", "--seed", "5", capsys=capsys
    )
    assert code == 1, out + err
    assert "round 2 FAIL: double count: running total" in out
    assert "round 1 FAIL" not in out  # a fresh store redelivers nothing: round 1 is clean
    assert out.splitlines()[-1] == "result: FAIL (round 2)"
    assert f"kept for inspection: {store}" in err
    assert (store / "IDENTITY").is_file()  # a failed drill keeps its store


def test_an_ack_before_durability_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = drill_with_liar(
        "lie-ack", tmp_path / "store", "--kills", "1", "--seed", "2", "--json", capsys=capsys
    )
    assert code == 1, out + err
    (r,) = json.loads(out)["rounds"]
    assert r["verdict"] == "FAIL"
    assert any(p.startswith("lost acknowledged epochs") for p in r["problems"]), r


def test_the_drill_passes_with_an_honest_writer_given_the_same_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The liar tests above fail because of the lie, not because of the writer= path.
    ns = build_parser().parse_args(["drill", str(tmp_path / "s"), "--kills", "2", "--seed", "5"])
    code = run_drill(ns, writer=[sys.executable, "-m", "statelog.cli.drill_writer"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert out.splitlines()[-1] == "result: PASS"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["temp", "--kills", "0"], "--kills 0"),
        (["temp", "--kills", "many"], "invalid int value"),
        (["temp", "--damage", "--kills", "3"], "--damage needs --kills 4"),
        (["temp", "--segment-bytes", "100"], "--segment-bytes 100"),
        ([], "required"),
    ],
)
def test_bad_arguments_are_usage_errors(args: list[str], needle: str) -> None:
    got = drill(*args)
    assert got.returncode == EXIT_USAGE, got.stderr
    assert needle in got.stderr
    assert got.stdout == ""


def test_bad_drill_arguments_carry_a_hint() -> None:
    got = drill("temp", "--kills", "-2")
    assert got.returncode == EXIT_USAGE
    assert "(hint: " in got.stderr


def test_a_path_that_is_not_a_store_is_refused_even_with_force(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    before = tree(tmp_path)
    for target in (tmp_path, tmp_path / "notes.txt"):
        got = drill(target, "--kills", "1", "--force")
        assert got.returncode == EXIT_USAGE, got.stderr
        assert "is not a statelog store" in got.stderr
    assert tree(tmp_path) == before


def test_force_drills_an_existing_store_without_touching_its_own_state(tmp_path: Path) -> None:
    store = tmp_path / "staging"
    with statelog.open(store) as s:
        s.commit(offsets={"orders-0": 7}, low_watermark_ms=5_000, put={"k": "v", "j": [1, 2]})
    for seed in ("1", "2"):  # the second run starts from the first one's leftovers
        got = drill(store, "--kills", "1", "--seed", seed, "--force")
        assert got.returncode == 0, got.stdout + got.stderr
    with statelog.open(store) as s:
        assert dict(s.items()) == {"k": "v", "j": [1, 2]}
        assert s.offsets["orders-0"] == 7
        assert s.low_watermark_ms >= 5_000
        assert s.count(APPLIED) > 0  # the drill's tables stay, in their own namespace


def test_damage_already_in_a_store_is_told_and_not_blamed_on_recovery(tmp_path: Path) -> None:
    store = tmp_path / "staging"
    for n in range(2):  # two snapshots, so that recovery can walk back from the newer one
        with statelog.open(store, segment_bytes=4096) as s:
            for i in range(30):
                s.commit(offsets={"p": 30 * n + i}, low_watermark_ms=0, put={f"k{i}": "v" * 200})
        assert compact(store, min_tail_bytes=0).snapshot is not None
    newest = list_snapshots(store / "snapshots")[0][2]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    got = drill(store, "--kills", "1", "--seed", "4", "--force", "--json")
    assert got.returncode == 0, got.stdout + got.stderr
    doc = json.loads(got.stdout)
    assert doc["damaged_before"] == [newest.name]
    assert newest.read_bytes() == bytes(data)  # evidence stays as it was


def test_check_state_names_each_kind_of_divergence(tmp_path: Path) -> None:
    with statelog.open(tmp_path / "s", tables=(APPLIED, BUFFER)) as store:
        origin, _ = origin_of(store)
        for _ in range(12):
            drill_commit(store, 9, origin, 0)
        model = Model.start(9, origin)
        model.advance_to(store.epoch)
        assert check_state(store, model) == []
        assert model.applied and model.buffer  # the workload exercises both tables
        # Resuming with redelivery changes nothing: every redelivered event is skipped.
        drill_commit(store, 9, origin, 30)
        model.advance_to(store.epoch)
        assert check_state(store, model) == []

        applied_eid = next(iter(model.applied))
        total = store.get(TOTAL_KEY, table=APPLIED)
        store.commit(
            offsets={}, low_watermark_ms=store.low_watermark_ms, table=APPLIED,
            put={TOTAL_KEY: {**total, "sum": total["sum"] + model.applied[applied_eid]}},
        )  # fmt: skip
        assert any(p.startswith("double count") for p in check_state(store, model))

        beyond = event_id(PARTITIONS[0], store.offsets[PARTITIONS[0]] + 3)
        put: dict[str | bytes, Any] = {
            beyond: 1, TOTAL_KEY: {"sum": total["sum"] + 1, "count": total["count"] + 1}
        }  # fmt: skip
        store.commit(offsets={}, low_watermark_ms=store.low_watermark_ms, table=APPLIED, put=put)
        problems = check_state(store, model)
        assert any("would deliver them again" in p for p in problems), problems
        assert any(p.startswith("applied set differs") for p in problems), problems

        gone = next(iter(model.buffer))
        store.commit(
            offsets={}, low_watermark_ms=store.low_watermark_ms, table=BUFFER, delete=[gone]
        )
        problems = check_state(store, model)
        assert any("neither buffered nor applied" in p for p in problems), problems


def test_the_model_is_a_function_of_seed_and_commit_number() -> None:
    a, b = Model.start(4, Origin()), Model.start(4, Origin())
    a.advance_to(40)
    for j in (10, 25, 40):
        b.advance_to(j)
    assert a == b
    c = Model.start(5, Origin())
    c.advance_to(40)
    assert c.applied != a.applied
    assert a.total == sum(a.applied.values())
