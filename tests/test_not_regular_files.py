"""Entries named like a store's files that are not regular files are never opened.

A directory opened as a snapshot fails, a FIFO opened as one blocks forever.
Each row plants one and runs every entry point (open, verify, inspect,
recover --dry-run, a compaction pass) in a subprocess with a deadline. Under a
snapshot's name it is walked past: each finishes as it does without it, changes
nothing, and `verify` names it. Under a segment's name, among the segments or in
place of one, it is refused with a StorageError naming it: leaving it out would
make the log look shorter and lose acknowledged epochs without a word.
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
]  # fmt: skip

# (why, make, replace): ``replace`` puts it in place of the newest real segment.
SEGMENTS: list[tuple[str, Callable[[Path], None], bool]] = [
    ("a FIFO as a later segment", os.mkfifo, False),
    ("a directory as a later segment", os.mkdir, False),
    ("a FIFO in place of the newest segment", os.mkfifo, True),
    ("a dangling symlink in place of the newest segment",
     lambda p: p.symlink_to(p.with_name("gone")), True),
]  # fmt: skip


def _store(root: Path) -> dict[str, object]:
    model: dict[str, object] = {}
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


READERS = (("verify",), ("inspect",), ("recover", "--dry-run"))
"""The commands that read a store, each run on it as its last argument."""


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``statelog ARGS`` in a fresh interpreter with a deadline (a FIFO must not hang it)."""
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def _open_then_pass(root: Path, model: dict[str, object], why: str, *, readonly: bool) -> None:
    """In a fresh interpreter with a deadline: an open finds ``model``, then a pass runs."""
    script = (
        "import sys, statelog\n"
        "from statelog.compaction.fold import compact\n"
        f"with statelog.open(sys.argv[1], readonly={readonly}) as s: print(sorted(s.items()))\n"
        "compact(sys.argv[1], min_tail_bytes=0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(root)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (why, done.stderr)
    assert done.stdout.strip() == repr(sorted(model.items())), why


@pytest.mark.parametrize(("why", "name", "plant"), PLANT, ids=[w for w, _, _ in PLANT])
def test_every_entry_point_walks_past_it(
    tmp_path: Path, why: str, name: str, plant: Callable[[Path], None]
) -> None:
    root = tmp_path / "s"
    model = _store(root)
    plant(root / name)
    before = _listing(root)
    for args in READERS:
        done = _cli(*args, root)
        assert done.returncode == 0, (why, args[0], done.stdout, done.stderr)
        if args[0] == "verify":
            assert f"evidence   {name}" in done.stdout, why
            assert "verdict    clean" in done.stdout, why
    assert _listing(root) == before, why
    _open_then_pass(root, model, why, readonly=True)
    assert (root / name).exists() and not (root / name).is_file(), why


@pytest.mark.parametrize(("why", "make", "replace"), SEGMENTS, ids=[w for w, _, _ in SEGMENTS])
def test_one_named_like_a_segment_is_refused_by_every_entry_point(
    tmp_path: Path, why: str, make: Callable[[Path], None], replace: bool
) -> None:
    root = tmp_path / "s"
    _store(root)
    if replace:
        newest = sorted((root / "wal").glob("*.wal"))[-1]
        newest.rename(tmp_path / newest.name)  # kept outside the store
        target = newest
    else:
        target = root / "wal" / "00000000000000ff-00000000000000ff.wal"
    make(target)
    before = _listing(root)
    for args in READERS:
        done = _cli(*args, root)
        assert done.returncode != 0, (why, args[0], done.stdout)
        assert "not a regular file" in done.stdout + done.stderr, (why, args[0], done.stderr)
    script = (
        "import sys, statelog\n"
        "from statelog.compaction.fold import compact\n"
        "for run in (lambda: statelog.open(sys.argv[1], readonly=True),\n"
        "            lambda: statelog.open(sys.argv[1]),\n"
        "            lambda: compact(sys.argv[1], min_tail_bytes=0)):\n"
        "    try:\n"
        "        run()\n"
        "    except statelog.StorageError as exc:\n"
        "        assert 'not a regular file' in str(exc), exc\n"
        "    else:\n"
        "        raise SystemExit('not refused')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(root)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (why, done.stdout, done.stderr)
    assert _listing(root) == before, why


# (why, where, make): entries under names a store cleans up or reads besides its files.
CLEANED: list[tuple[str, str, Callable[[Path], None]]] = [
    ("a directory named like a writer's temp file", "wal/x.tmp", os.mkdir),
    ("a directory named like a compactor's temp file", "snapshots/x.snap.tmp", os.mkdir),
    ("a FIFO named like a pin", "pins/planted.pin", os.mkfifo),
]


@pytest.mark.parametrize(("why", "name", "make"), CLEANED, ids=[w for w, _, _ in CLEANED])
def test_an_open_and_a_pass_go_on_past_one_named_like_a_temp_file_or_a_pin(
    tmp_path: Path, why: str, name: str, make: Callable[[Path], None]
) -> None:
    root = tmp_path / "s"
    model = _store(root)
    (root / "pins").mkdir(exist_ok=True)
    make(root / name)
    _open_then_pass(root, model, why, readonly=False)
    assert (root / name).exists(), why  # not the store's to remove
