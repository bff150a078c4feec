"""Pins (invariant 8): a live pin is honoured, a dead one is stale, the guard orders the race."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import statelog
from statelog.storage.pins import ALL, PIN_DIR, pin, pinned_names, retention_guard


def test_a_held_pin_names_its_files(tmp_path: Path) -> None:
    (tmp_path / "wal").mkdir()
    (tmp_path / "wal" / "a.wal").write_bytes(b"x")
    with pin(tmp_path, ["wal/a.wal", "snapshots/gone.snap"], purpose="restore") as p:
        assert p.missing == frozenset({"snapshots/gone.snap"})
        assert pinned_names(tmp_path) == {"wal/a.wal", "snapshots/gone.snap"}
        doc = json.loads(p.path.read_text())
        assert doc["pid"] == os.getpid() and doc["purpose"] == "restore"
        assert doc["files"] == ["snapshots/gone.snap", "wal/a.wal"] and "created" in doc
        with pin(tmp_path, ["wal/b.wal"], purpose="verify"):
            assert pinned_names(tmp_path) == {"wal/a.wal", "snapshots/gone.snap", "wal/b.wal"}
    assert pinned_names(tmp_path) == set()
    assert [q.name for q in (tmp_path / PIN_DIR).iterdir()] == [".guard"]


def test_pin_of_a_dead_process_is_stale_and_removed(tmp_path: Path) -> None:
    code = (
        "import os, signal, sys; from pathlib import Path; from statelog.storage.pins import pin\n"
        "with pin(Path(sys.argv[1]), ['wal/x.wal'], purpose='dies'):\n"
        "    print('pinned', flush=True); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=root, capture_output=True, text=True
    )
    assert out.stdout == "pinned\n" and out.returncode == -9
    left = list((tmp_path / PIN_DIR).glob("*.pin"))
    assert len(left) == 1  # the file stays, its lock went with the process
    assert pinned_names(tmp_path) == set()
    assert not left[0].exists()


def test_unreadable_live_pin_pins_everything(tmp_path: Path) -> None:
    with pin(tmp_path, ["wal/x.wal"], purpose="t") as p:
        p.path.write_text("{not json")
        assert pinned_names(tmp_path) == {ALL}


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "wal/../../x", "", "."])
def test_names_stay_inside_the_store(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError), pin(tmp_path, [bad], purpose="t"):
        pass


def test_a_pin_waits_for_a_retention_in_progress(tmp_path: Path) -> None:
    made = threading.Event()

    def pinner() -> None:
        with pin(tmp_path, ["wal/x.wal"], purpose="t"):
            made.set()

    with retention_guard(tmp_path):
        t = threading.Thread(target=pinner)
        t.start()
        time.sleep(0.2)
        assert not made.is_set()  # it cannot appear between listing pins and deleting
        assert pinned_names(tmp_path) == set()
    t.join(5)
    assert made.is_set()


def test_read_only_recovery_pins_what_it_reads_when_pins_exist(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statelog.recovery import ladder
    from tests.helpers import build_store, segments, simple_commits

    build_store(store_path, simple_commits(4))  # a writer open made pins/
    assert (store_path / PIN_DIR).is_dir()
    during: list[set[str]] = []
    climb = ladder._climb

    def spy(*args: object, **kwargs: object) -> object:
        during.append(pinned_names(store_path))
        return climb(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ladder, "_climb", spy)
    with statelog.open(store_path, readonly=True):
        pass
    assert during and {f"wal/{p.name}" for p in segments(store_path)} <= during[0]
    assert pinned_names(store_path) == set()  # and gone again


def test_read_only_recovery_creates_no_pins_dir(store_path: Path) -> None:
    import shutil

    from tests.helpers import build_store, simple_commits

    build_store(store_path, simple_commits(2))
    shutil.rmtree(store_path / PIN_DIR)
    before = sorted(p.relative_to(store_path) for p in store_path.rglob("*"))
    with statelog.open(store_path, readonly=True) as ro:
        assert ro.epoch == 2
    assert sorted(p.relative_to(store_path) for p in store_path.rglob("*")) == before
