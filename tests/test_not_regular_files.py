"""Entries named like a store's files that are not regular files are walked past.

A directory opened as a snapshot fails, a FIFO opened as one blocks forever:
each row plants one under a snapshot's or a segment's name and runs every entry
point (open, verify, inspect, recover --dry-run, a compaction pass) in a
subprocess with a deadline. Each must finish as it does without the entry,
change nothing, and `verify` must name it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import statelog
from statelog.compaction.fold import compact

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "statelog.cli"]

PLANT: list[tuple[str, str, Callable[[Path], None]]] = [
    ("a directory as the newest snapshot", "snapshots/00000000000000ff-00000000000000ff.snap",
     os.mkdir),
    ("a FIFO as the newest snapshot", "snapshots/00000000000000ff-00000000000000ff.snap",
     os.mkfifo),
    ("a FIFO as a later segment", "wal/00000000000000ff-00000000000000ff.wal", os.mkfifo),
    ("a directory as a later segment", "wal/00000000000000ff-00000000000000ff.wal", os.mkdir),
]  # fmt: skip


def _store(root: Path) -> dict[str, str]:
    model = {}
    with statelog.open(root, segment_bytes=4096) as s:
        for i in range(40):
            s.commit({f"k{i}": "x" * 200})
            model[f"k{i}"] = "x" * 200
    compact(root, min_tail_bytes=0)
    with statelog.open(root, segment_bytes=4096) as s:
        s.commit({"after": 1})
        model["after"] = 1
    return model


def _listing(root: Path) -> list[tuple[str, int]]:
    return sorted(
        (str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1)
        for p in root.rglob("*")
        if "pins" not in p.parts and "AUDIT" not in p.name and p.name != "base"
        and p.parent.name != "base"
    )  # fmt: skip


@pytest.mark.parametrize(("why", "name", "plant"), PLANT, ids=[w for w, _, _ in PLANT])
def test_every_entry_point_walks_past_it(
    tmp_path: Path, why: str, name: str, plant: Callable[[Path], None]
) -> None:
    root = tmp_path / "s"
    model = _store(root)
    plant(root / name)
    before = _listing(root)
    for args in (["verify", root], ["inspect", root], ["recover", "--dry-run", root]):
        done = subprocess.run(
            [*CLI, *map(str, args)], capture_output=True, text=True, timeout=60, cwd=REPO
        )
        assert done.returncode == 0, (why, args[0], done.stdout, done.stderr)
        if args[0] == "verify":
            assert f"evidence   {name}" in done.stdout, why
            assert "verdict    clean" in done.stdout, why
    assert _listing(root) == before, why
    script = (
        "import sys, statelog\n"
        "from statelog.compaction.fold import compact\n"
        "with statelog.open(sys.argv[1], readonly=True) as s: print(sorted(s.items()))\n"
        "compact(sys.argv[1], min_tail_bytes=0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(root)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (why, done.stderr)
    assert done.stdout.strip() == repr(sorted(model.items())), why
    assert (root / name).exists() and not (root / name).is_file(), why
