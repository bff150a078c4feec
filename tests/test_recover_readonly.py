"""Read-only recovery without the store: ``recover_readonly`` sees what a read-only open sees.

The read-only ``StateStore``, ``verify`` and a restore's final check share
:func:`statelog.recovery.readonly.recover_readonly`. These tests hold it to
the read-only store's state and report on a store with a snapshot, a log
after it, several tables, deletes and an unfinished tail; to changing no
byte of the store; and to leaving no private image directory behind, on
close or on failure.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.format.records import decode_value
from statelog.recovery.readonly import ReadOnlyRecovery, recover_readonly
from statelog.state.live import LiveState
from tests.helpers import segments

SEG = 4096


def tree_bytes(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def state_of(state: LiveState) -> dict[str, Any]:
    return {
        "epoch": state.epoch,
        "offsets": dict(state.offsets),
        "wm": state.low_watermark_ms,
        "tables": {
            t: [(k, decode_value(raw)) for k, raw in state.items(t, None)] for t in state.tables()
        },
    }


def store_state(store: statelog.StateStore) -> dict[str, Any]:
    return {
        "epoch": store.epoch,
        "offsets": store.offsets,
        "wm": store.low_watermark_ms,
        "tables": {t: list(store.items(t)) for t in store.tables()},
    }


def report_of(report: statelog.RecoveryReport) -> dict[str, Any]:
    fields = dataclasses.asdict(report)
    del fields["seconds"]
    return fields


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Where this test's private image directories go, to count them."""
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    yield where


def _build(path: Path) -> None:
    with statelog.open(path, segment_bytes=SEG) as store:
        for i in range(80):
            table = ("orders", "users")[i % 2]
            store.commit(
                offsets={f"p{i % 3}": i + 1},
                low_watermark_ms=i,
                put={f"k{i}": {"n": i, "pad": "x" * 100}, b"raw": i},
                delete=[f"k{i - 4}"] if i >= 4 else (),
                table=table,
            )
    assert compact(path).snapshot is not None
    with statelog.open(path, segment_bytes=SEG) as store:
        for i in range(80, 110):
            store.commit(offsets={"p0": 1000 + i}, low_watermark_ms=i, put={f"late{i}": i})
    # A writer that died mid-append: half a frame after the last commit.
    last = segments(path)[-1]
    with last.open("ab") as f:
        f.write(b"\x17" * 11)


def test_recover_readonly_equals_the_readonly_store(tmp_path: Path, private_tmp: Path) -> None:
    path = tmp_path / "store"
    _build(path)
    before = tree_bytes(path)
    with recover_readonly(path) as ro, statelog.open(path, readonly=True) as store:
        assert isinstance(ro, ReadOnlyRecovery)
        assert ro.report.snapshot is not None, "the snapshot is used"
        assert ro.report.truncated_bytes > 0, "the unfinished tail is ignored"
        assert ro.state.epoch == 110
        assert state_of(ro.state) == store_state(store)
        assert report_of(ro.report) == report_of(store.recovery)
        assert ro.store_id == store.store_id
        assert ro.image_dir is not None and ro.image_dir.is_dir()
        assert ro.image_dir.parent == private_tmp
    assert ro.closed and ro.image_dir is None
    ro.close()  # idempotent
    assert tree_bytes(path) == before, "read-only recovery changed the store"
    assert list(private_tmp.iterdir()) == []


def test_the_readonly_store_is_recover_readonly_underneath(
    tmp_path: Path, private_tmp: Path
) -> None:
    path = tmp_path / "store"
    _build(path)
    with statelog.open(path, readonly=True, strict=False) as store:
        assert store._ro is not None and store._state is store._ro.state
        assert store._writer is None
        image_dir = store._ro.image_dir
        assert image_dir is not None and image_dir.parent == private_tmp
    assert not image_dir.exists(), "close() removes the private image"


def test_strict_refuses_damage_and_leaves_no_image(tmp_path: Path, private_tmp: Path) -> None:
    path = tmp_path / "store"
    with statelog.open(path, segment_bytes=SEG) as store:
        for i in range(60):
            store.commit(offsets={"p": i + 1}, low_watermark_ms=i, put={f"k{i}": "v" * 200})
    first = segments(path)[0]
    data = bytearray(first.read_bytes())
    data[200] ^= 0x40  # inside the first record, before the log's tail
    first.write_bytes(bytes(data))
    before = tree_bytes(path)
    with pytest.raises(statelog.CorruptionError):
        recover_readonly(path, strict=True)
    with recover_readonly(path) as ro:
        assert ro.state.epoch < 60 and ro.report.outcome is not statelog.Outcome.CLEAN
    assert tree_bytes(path) == before
    assert list(private_tmp.iterdir()) == []


def test_no_store_is_refused_without_a_trace(tmp_path: Path, private_tmp: Path) -> None:
    with pytest.raises(statelog.StoreNotFoundError):
        recover_readonly(tmp_path / "absent")
    path = tmp_path / "store"
    with statelog.open(path, segment_bytes=SEG) as store:
        for i in range(40):
            store.commit(offsets={"p": i + 1}, low_watermark_ms=i, put={f"k{i}": "v" * 200})
    segments(path)[0].unlink()  # no snapshot, and the log no longer reaches epoch 1
    with pytest.raises(statelog.ResnapshotRequired):
        recover_readonly(path)
    assert list(private_tmp.iterdir()) == []


def test_a_read_only_store_never_closed_leaves_no_directory(tmp_path: Path) -> None:
    """Its private image directory goes when it is collected, or when the process exits."""
    import os
    import subprocess
    import sys

    store, scratch = tmp_path / "store", tmp_path / "tmp"
    scratch.mkdir()
    with statelog.open(store) as w:
        w.commit(offsets={}, low_watermark_ms=0, put={"a": 1})
    compact(store, min_tail_bytes=0)
    code = (
        "import sys, statelog\n"
        "ro = statelog.open(sys.argv[1], readonly=True)\n"
        "assert ro.get('a') == 1\n"
        "gone = statelog.open(sys.argv[1], readonly=True)\n"
        "del gone\n"  # collected
        "print(len(__import__('os').listdir(sys.argv[2])))\n"
    )
    env = {**os.environ, "TMPDIR": str(scratch)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(store), str(scratch)],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert out.stdout.strip() == "1"  # the one still open, not the one collected
    assert list(scratch.iterdir()) == []  # the process exited without closing it
