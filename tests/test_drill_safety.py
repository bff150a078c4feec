"""``statelog drill STORE`` changes STORE only when told to, and then says what it changed.

By default an existing store is drilled on a copy: the store's files keep
their bytes and mtimes, a writer may hold it meanwhile, and the copy is
removed after a pass and kept (and named) after a failure. With
``--in-place`` (or ``--force``) the drill tells what it changed, and the
byte ``--damage`` flipped is put back so that ``verify`` and ``recover``
exit 0 afterwards. The common options may follow the command's name.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import statelog
from compactor import compact
from statelog.cli import build_parser
from statelog.cli.drill import run as run_drill
from statelog.cli.drill_writer import APPLIED, BUFFER, PARTITIONS
from statelog.storage.snapshots import list_snapshots

REPO = Path(__file__).resolve().parent.parent
LIAR = Path(__file__).with_name("drill_liar.py")


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statelog.cli", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def files(root: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every path under ``root``: a file's bytes and mtime (ns), None for a directory.

    Directories' own mtimes are left out: the copy pins the files it reads
    (a pin file under ``pins/``, removed at once, as ``statelog verify`` does),
    which leaves ``pins/``'s mtime behind.
    """
    return {
        str(p.relative_to(root)): None if p.is_dir() else (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A store with two snapshots, a log after them, and state of its own."""
    path = tmp_path / "prod"
    for n in range(2):
        with statelog.open(path, segment_bytes=4096) as s:
            for i in range(30):
                s.commit(
                    offsets={"orders-0": 30 * n + i}, low_watermark_ms=200_000 + 30 * n + i,
                    put={f"k{i}": "v" * 200},
                )  # fmt: skip
        assert compact(path, min_tail_bytes=0).snapshot is not None
    with statelog.open(path, segment_bytes=4096) as s:
        s.commit(offsets={"orders-0": 99}, low_watermark_ms=300_000, put={"last": 1})
    return path


def test_an_existing_store_is_drilled_on_a_copy_and_left_unchanged(store: Path) -> None:
    before = files(store)
    got = cli("drill", store, "--kills", "2", "--seed", "3", "--json")
    assert got.returncode == 0, got.stdout + got.stderr
    doc = json.loads(got.stdout)
    assert doc["mode"] == "copy" and doc["source"] == str(store) and doc["changes"] is None
    copy = Path(doc["store"])
    assert store not in (copy, *copy.parents)
    assert not copy.exists()  # a passed drill removes its copy
    assert files(store) == before
    with statelog.open(store, readonly=True) as s:
        assert s.epoch == 61 and s.low_watermark_ms == 300_000
        assert not set(PARTITIONS) & set(s.offsets)
        assert not {APPLIED, BUFFER} & set(s.tables())


def test_a_store_a_live_writer_holds_is_copied_consistently(store: Path) -> None:
    with statelog.open(store, segment_bytes=4096) as writer:
        writer.commit(offsets={"orders-0": 100}, low_watermark_ms=300_001, put={"live": 1})
        before = files(store)
        got = cli("drill", store, "--kills", "1", "--seed", "4", "--json")
        assert got.returncode == 0, got.stdout + got.stderr
        assert files(store) == before
        writer.commit(offsets={"orders-0": 101}, low_watermark_ms=300_002, put={"after": 1})
        assert writer.epoch == 63


def test_a_failed_drill_keeps_and_names_the_copy(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = files(store)
    ns = build_parser().parse_args(["drill", str(store), "--kills", "2", "--seed", "5"])
    code = run_drill(ns, writer=[sys.executable, str(LIAR), "double-apply"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    kept = Path(err.split("the copy is kept for inspection: ")[1].split()[0])
    try:
        assert (kept / "IDENTITY").is_file()
        assert f"({store} was not changed)" in err
        assert files(store) == before
    finally:
        shutil.rmtree(kept.parent)


@pytest.mark.parametrize(
    ("flag", "as_json"),
    [("--in-place", True), ("--force", True), ("--in-place", False)],
)
def test_a_drill_in_place_tells_what_it_changed(store: Path, flag: str, as_json: bool) -> None:
    got = cli("drill", store, flag, "--kills", "2", "--seed", "6", *(["--json"] * as_json))
    assert got.returncode == 0, got.stdout + got.stderr
    with statelog.open(store, readonly=True) as s:
        epoch, watermark = s.epoch, s.low_watermark_ms
    assert epoch > 61 and watermark > 300_000
    if as_json:
        doc = json.loads(got.stdout)
        assert doc["mode"] == "in-place" and doc["store"] == str(store)
        c = doc["changes"]
        assert c["epoch"] == [61, epoch]
        assert c["low_watermark_ms"] == [300_000, watermark]
        assert c["partitions_added"] == list(PARTITIONS)
        assert c["tables_added"] == [APPLIED, BUFFER]
        assert c["damaged"] == []
        assert c["snapshots_added"] == [
            f"snapshots/{p.name}" for _e, _l, p in reversed(list_snapshots(store / "snapshots"))
            if p.name not in {"000000000000001e-000000000000001e.snap",
                              "000000000000003c-000000000000003c.snap"}
        ]  # fmt: skip
    else:
        lines = got.stdout.splitlines()
        at = lines.index(f"changed in place: {store}")
        assert lines[at + 1].split() == ["epoch", "61", "->", str(epoch)]
        assert lines[at + 2].split()[:5] == ["low", "watermark", "300000", "->", str(watermark)]
        assert lines[at + 3].split() == ["partitions", "added", "drill-0,", "drill-1,", "drill-2"]
        assert lines[at + 4].split() == ["tables", "added", "drill.applied,", "drill.buffer"]
        assert lines[-1] == "result: PASS"


@pytest.mark.parametrize("kills", ["5", "20"])
def test_damage_in_place_is_undone_so_verify_and_recover_exit_0(store: Path, kills: str) -> None:
    got = cli("drill", store, "--in-place", "--damage", "--kills", kills, "--seed", "11", "--json")
    assert got.returncode == 0, got.stdout + got.stderr
    doc = json.loads(got.stdout)
    (flipped,) = doc["changes"]["damaged"]
    assert [r["damaged"] for r in doc["rounds"] if r["damaged"]] == [
        flipped["file"].removeprefix("snapshots/")
    ]
    assert flipped["restored"] and doc["changes"]["verify"] == "clean"
    if flipped["moved_to"]:  # it no longer linked to the log retention kept
        assert (store / flipped["moved_to"]).is_file() and not (store / flipped["file"]).exists()
    for command in ("verify", "recover"):
        after = cli(command, "-q", store)
        assert after.returncode == 0, (command, after.stdout + after.stderr)


@pytest.mark.parametrize("options", [["-q"], ["-v"], ["--traceback"], ["-q", "-v", "--traceback"]])
def test_the_common_options_may_follow_the_drill_command(options: list[str]) -> None:
    got = cli("drill", "temp", *options, "--kills", "1", "--seed", "2")
    assert got.returncode == 0, got.stdout + got.stderr
    assert got.stdout.splitlines()[-1] == "result: PASS"
