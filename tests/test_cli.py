"""The ``statelog`` command through subprocesses, on real stores, as a table of failure modes.

| store      | verify | recover --dry-run                         | named                         |
|------------|--------|-------------------------------------------|-------------------------------|
| clean      | 0      | 0, newest snapshot, replay 161..260       | nothing                       |
| torn       | 1      | 1, cut last segment, save .broken         | last segment + torn offset    |
| bitflip    | 1      | 1, cut + move aside, lost 163..260        | segment + frame offset        |
| snapshot   | 1      | 1, reject newest, use older, replay 81..  | snapshot + offset             |
| exhausted  | 2      | 2, every snapshot and the log refused     | every snapshot                |
| not a store| 3      | 3                                         | one stderr line, no traceback |

``recover --dry-run``, ``verify``, ``inspect`` and ``dump`` must leave every
byte of every store as it was (the tree is hashed before and after).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import segments
from tests.test_verify import (
    build_stores,
    mid_frame_offset,
    mid_frame_target,
    snapshot_files,
    tree_digest,
)

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv" / "bin" / "python"
PY = str(VENV_PY if VENV_PY.exists() else Path(sys.executable))


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run ``python -m statelog.cli ARGS``; stdout and stderr captured (never a terminal)."""
    return subprocess.run(
        [PY, "-m", "statelog.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def cli_json(*args: str | Path, code: int) -> Any:
    """Run with ``--json``; check the exit status; return the parsed document."""
    done = cli(*args, "--json")
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_stores(tmp_path_factory.mktemp("cli"))


# -- verify -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "code", "verdict"),
    [
        ("clean", 0, "clean"),
        ("torn", 1, "recoverable"),
        ("bitflip", 1, "recoverable"),
        ("snapshot", 1, "recoverable"),
        ("exhausted", 2, "unrecoverable"),
    ],
)
def test_verify_exit_code_and_verdict(
    stores: dict[str, Path], name: str, code: int, verdict: str
) -> None:
    store = stores[name]
    before = tree_digest(store)
    doc = cli_json("verify", store, code=code)
    assert doc["verdict"] == verdict
    assert tree_digest(store) == before, "verify changed the store"
    assert (doc["findings"] == []) == (name == "clean")


def test_verify_names_torn_segment_and_offset(stores: dict[str, Path]) -> None:
    store = stores["torn"]
    done = cli("verify", store)
    assert done.returncode == 1
    last = segments(store)[-1]
    assert f"wal/{last.name} at offset " in done.stdout
    assert "recoverable" in done.stdout


def test_verify_names_bit_flipped_segment_offset_and_lost_epochs(stores: dict[str, Path]) -> None:
    store = stores["bitflip"]
    done = cli("verify", store)
    assert done.returncode == 1
    damaged = mid_frame_target(store)
    assert f"wal/{damaged.name} at offset {mid_frame_offset(store)}:" in done.stdout
    assert "epochs 163..260" in done.stdout


def test_verify_names_damaged_snapshot_with_offset(stores: dict[str, Path]) -> None:
    store = stores["snapshot"]
    doc = cli_json("verify", store, code=1)
    newest = snapshot_files(store)[-1]
    assert [(Path(f["file"]).name, f["kind"]) for f in doc["findings"]] == [
        (newest.name, "snapshot")
    ]
    assert isinstance(doc["findings"][0]["offset"], int)


def test_verify_exhausted_names_every_snapshot(stores: dict[str, Path]) -> None:
    store = stores["exhausted"]
    done = cli("verify", store)
    assert done.returncode == 2
    for snap in snapshot_files(store):
        assert f"snapshots/{snap.name} at offset " in done.stdout
    assert "NOT RECOVERABLE" in done.stdout


def test_verify_plain_progress_lines_go_to_stderr_and_quiet_silences_them(
    stores: dict[str, Path],
) -> None:
    loud = cli("verify", stores["clean"])
    assert loud.returncode == 0 and "verify:" in loud.stderr and "done" in loud.stderr
    quiet = cli("verify", "--quiet", stores["clean"])
    assert quiet.returncode == 0 and quiet.stderr == ""


# -- recover --dry-run ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["clean", "torn", "bitflip", "snapshot", "exhausted"])
def test_recover_dry_run_changes_no_byte(stores: dict[str, Path], name: str) -> None:
    store = stores[name]
    before = tree_digest(store)
    done = cli("recover", "--dry-run", store)
    assert done.returncode == {"clean": 0, "exhausted": 2}.get(name, 1), done.stderr
    assert tree_digest(store) == before


def test_recover_dry_run_plans_for_each_failure_mode(stores: dict[str, Path]) -> None:
    clean = cli_json("recover", "--dry-run", stores["clean"], code=0)
    assert Path(clean["snapshot"]).name == snapshot_files(stores["clean"])[-1].name
    assert clean["replay"] == {"from": 161, "to": 260, "records": 100}
    assert clean["actions"] == [] and clean["lost_epochs"] == []

    torn = cli_json("recover", "--dry-run", stores["torn"], code=1)
    last = segments(stores["torn"])[-1]
    assert [(a["action"], Path(a["file"]).name, a["saved_as"]) for a in torn["actions"]] == [
        ("cut", last.name, last.name + ".broken")
    ]
    assert torn["replay"]["to"] == 259

    flip = cli_json("recover", "--dry-run", stores["bitflip"], code=1)
    damaged = mid_frame_target(stores["bitflip"])
    cut = flip["actions"][0]
    assert (cut["action"], Path(cut["file"]).name) == ("cut", damaged.name)
    assert cut["offset"] == mid_frame_offset(stores["bitflip"])
    later = [p for p in segments(stores["bitflip"]) if p.name > damaged.name]
    assert later and [a["action"] for a in flip["actions"][1:]] == ["move aside"] * len(later)
    assert flip["lost_epochs"] == [163, 260]

    snap = cli_json("recover", "--dry-run", stores["snapshot"], code=1)
    older, newest = snapshot_files(stores["snapshot"])
    assert [Path(r["file"]).name for r in snap["rejected_snapshots"]] == [newest.name]
    assert Path(snap["snapshot"]).name == older.name
    assert snap["replay"] == {"from": 81, "to": 260, "records": 180}

    gone = cli_json("recover", "--dry-run", stores["exhausted"], code=2)
    refused = {Path(t["file"]).name for t in gone["tried"]}
    assert {p.name for p in snapshot_files(stores["exhausted"])} <= refused


def test_real_recover_repairs_what_the_dry_run_announced(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    store = tmp_path / "s"
    shutil.copytree(stores["bitflip"], store)
    planned = cli_json("recover", "--dry-run", store, code=1)
    done = cli_json("recover", store, code=1)
    assert done["epoch"] == planned["epoch"] == 162
    assert [a["saved_as"] for a in done["actions"]] == [a["saved_as"] for a in planned["actions"]]
    for a in planned["actions"]:
        assert (store / "wal" / a["saved_as"]).exists()
    cli_json("verify", store, code=0)  # the repaired store verifies clean


# -- inspect, dump, compact, audit ---------------------------------------------------------


def test_inspect_shows_state_snapshots_segments_and_changes_nothing(
    stores: dict[str, Path],
) -> None:
    store = stores["clean"]
    before = tree_digest(store)
    doc = cli_json("inspect", store, code=0)
    assert tree_digest(store) == before
    assert (doc["epoch"], doc["offsets"], doc["low_watermark_ms"]) == (260, {"p0": 260}, 2600)
    assert [s["verified"] for s in doc["snapshots"]] == [True, True]
    assert [g["file"] for g in doc["segments"]] == [p.name for p in segments(store)]
    assert all(g["sealed"] for g in doc["segments"])
    after_newest = [g["bytes"] for g in doc["segments"] if g["first_lsn"] > 160]
    assert doc["tail_bytes"] == sum(after_newest) > 0
    assert doc["writer_lock"] == {"pid": None, "held": False}


def test_inspect_no_verify_reads_only_what_recovery_reads(stores: dict[str, Path]) -> None:
    # Recovery read the newest (and refused it) and used the older one.
    doc = cli_json("inspect", "--no-verify", stores["snapshot"], code=1)
    assert [s["verified"] for s in doc["snapshots"]] == [False, True]
    assert "zstd" in doc["snapshots"][0]["reason"]
    # On the clean store recovery read only the newest: the older one is not verified.
    clean = cli_json("inspect", "--no-verify", stores["clean"], code=0)
    assert [s["verified"] for s in clean["snapshots"]] == [True, None]


def test_inspect_names_the_live_writer(stores: dict[str, Path], tmp_path: Path) -> None:
    store = tmp_path / "s"
    shutil.copytree(stores["clean"], store)
    code = (
        "import statelog, sys; s = statelog.open(sys.argv[1]); print('ready', flush=True); "
        "sys.stdin.read(); s.close()"
    )
    with subprocess.Popen(
        [PY, "-c", code, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as writer:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        try:
            doc = cli_json("inspect", "--no-verify", store, code=0)
        finally:
            assert writer.stdin is not None
            writer.stdin.close()
    assert doc["writer_lock"] == {"pid": writer.pid, "held": True}


def test_dump_filters_by_table_and_prefix(stores: dict[str, Path]) -> None:
    done = cli("dump", stores["clean"], "--prefix", "k25", "--json")
    assert done.returncode == 0
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["key"] for r in rows] == ["k256", "k257", "k258", "k259"]
    assert rows[0]["value"] == {"i": 256, "pad": "x" * 40}
    raw = cli("dump", stores["clean"], "--bytes-prefix", b"b260".hex(), "--json")
    assert [json.loads(x)["value"] for x in raw.stdout.splitlines()] == [260]
    bad = cli("dump", stores["clean"], "--table", "nope")
    assert bad.returncode == 3 and "no such table" in bad.stderr


def test_compact_writes_a_snapshot_that_verifies(stores: dict[str, Path], tmp_path: Path) -> None:
    store = tmp_path / "s"
    shutil.copytree(stores["clean"], store)
    doc = cli_json("compact", store, "--retain", "5", code=0)
    assert doc["skipped"] is None and doc["epochs"] == [161, 260]
    assert Path(doc["snapshot"]).exists()
    again = cli_json("compact", store, code=0)
    assert again["skipped"] == "nothing_new"
    cli_json("verify", store, code=0)


def test_compact_walks_past_a_damaged_snapshot_and_says_so(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    store = tmp_path / "s"
    shutil.copytree(stores["snapshot"], store)
    doc = cli_json("compact", store, "--retain", "5", code=1)
    assert [Path(p).name for p in doc["damaged"]] == [snapshot_files(stores["snapshot"])[-1].name]
    assert doc["snapshot"] is not None


def test_audit_verify_exits_non_zero_on_a_tampered_trail(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    from statelog.ops.audit import AuditTrail

    store = tmp_path / "s"
    shutil.copytree(stores["clean"], store)
    trail = AuditTrail(store)
    before = len(list(trail.entries()))  # building the store recorded its recoveries
    assert before > 0
    for i in range(3):
        trail.append("compaction", {"epoch": i})
    listed = cli_json("audit", store, code=0)
    assert [e["seq"] for e in listed] == list(range(1, before + 4))
    assert [e["fields"]["epoch"] for e in listed[-3:]] == [0, 1, 2]
    assert cli_json("audit", store, "--verify", code=0)["ok"] is True
    log = trail.log_path
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-2]) + lines[-1] + lines[-2])  # reorder two entries
    doc = cli_json("audit", store, "--verify", code=1)
    assert doc["ok"] is False and doc["problems"]


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "verify", "recover", "dump", "compact", "audit"])
def test_not_a_store_is_one_line_with_a_hint_and_exit_3(tmp_path: Path, command: str) -> None:
    extra = ["--dry-run"] if command == "recover" else []
    done = cli(command, tmp_path / "absent", *extra)
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statelog: ") and "hint:" in lines[0]
    assert not (tmp_path / "absent").exists()


def test_usage_error_exits_3_and_help_documents_exit_codes() -> None:
    bad = cli("verify")
    assert bad.returncode == 3 and "required" in bad.stderr
    helped = cli("--help")
    assert helped.returncode == 0
    for line in ("0 ", "1 ", "2 ", "3 ", "4 ", "5 "):
        assert f"\n  {line}" in helped.stdout
    for sub in ("inspect", "verify", "recover", "compact", "dump", "audit", "drill"):
        assert sub in helped.stdout


def test_recover_of_a_locked_store_exits_4(stores: dict[str, Path], tmp_path: Path) -> None:
    store = tmp_path / "s"
    shutil.copytree(stores["clean"], store)
    code = (
        "import statelog, sys; s = statelog.open(sys.argv[1]); print('ready', flush=True); "
        "sys.stdin.read(); s.close()"
    )
    with subprocess.Popen(
        [PY, "-c", code, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as writer:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        try:
            done = cli("recover", store)
        finally:
            assert writer.stdin is not None
            writer.stdin.close()
    assert done.returncode == 4 and f"process {writer.pid}" in done.stderr
