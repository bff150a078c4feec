"""A process does not re-read an unchanged file it read whole within the hour; any change
to the file, or the hour passing, makes it read the file whole again.

| case                                             | read whole again at the next use? |
|--------------------------------------------------|-----------------------------------|
| unchanged, checked a moment ago                  | no                                |
| the same bytes written to a new file (new inode) | yes                               |
| appended to (new size)                           | yes                               |
| rewritten in place (new mtime)                   | yes                               |
| metadata changed (new ctime: chmod, a link)      | yes                               |
| unchanged, but :data:`RECHECK_AFTER` has passed  | yes                               |
| checked against another checksum                 | yes                               |

Retention is where it matters: a compactor daemon's pass must not hash a full
snapshot of hundreds of MB that it hashed a pass ago, must still find one
damaged since, and reads the full snapshots it keeps whole again before it
deletes an older full snapshot on their strength.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.storage import image_cache, snapshot_read, whole_checks
from statelog.storage.whole_checks import (
    RECHECK_AFTER,
    check_once,
    forget_all,
    note_intact,
    seen_intact,
)
from tests.delta_stores import Model, commit_round, contents, passed
from tests.helpers import flip_bit


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    forget_all()
    yield
    forget_all()


def _later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    clock = whole_checks.now
    monkeypatch.setattr(whole_checks, "now", lambda: clock() + seconds)


def _new_inode(p: Path, _: pytest.MonkeyPatch) -> None:
    data = p.read_bytes()
    p.unlink()
    p.write_bytes(data)


def _append(p: Path, _: pytest.MonkeyPatch) -> None:
    with open(p, "ab") as fh:
        fh.write(b"x")


def _new_mtime(p: Path, _: pytest.MonkeyPatch) -> None:
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def _new_ctime(p: Path, _: pytest.MonkeyPatch) -> None:
    os.chmod(p, p.stat().st_mode ^ 0o040)


def _an_hour_later(_: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _later(monkeypatch, RECHECK_AFTER.total_seconds() + 1)


def _nothing(_: Path, __: pytest.MonkeyPatch) -> None:
    pass


@pytest.mark.parametrize(
    ("change", "what", "again"),
    [
        pytest.param(_nothing, "sum", False, id="unchanged"),
        pytest.param(_new_inode, "sum", True, id="same-bytes-new-inode"),
        pytest.param(_append, "sum", True, id="appended"),
        pytest.param(_new_mtime, "sum", True, id="new-mtime"),
        pytest.param(_new_ctime, "sum", True, id="new-ctime"),
        pytest.param(_an_hour_later, "sum", True, id="an-hour-later"),
        pytest.param(_nothing, "another-sum", True, id="another-checksum"),
    ],
)
def test_a_verdict_holds_only_for_the_same_file_unchanged_within_the_hour(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[Path, pytest.MonkeyPatch], None],
    what: str,
    again: bool,
) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"snapshot bytes")
    calls: list[int] = []
    assert check_once(f, "sum", lambda: calls.append(1) is None)
    change(f, monkeypatch)
    assert seen_intact(f, what) is not again
    assert check_once(f, what, lambda: calls.append(1) is None)
    assert len(calls) == 1 + again


def test_a_failed_check_is_not_remembered(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"damaged")
    calls: list[int] = []
    for _ in range(3):
        assert not check_once(f, "sum", lambda: bool(calls.append(1)))
    assert len(calls) == 3 and not seen_intact(f, "sum")
    note_intact(f, "sum")
    assert seen_intact(f, "sum")


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Whole reads of snapshot bodies by name: the reader's hash and the image cache's."""
    reads: Counter[str] = Counter()
    body, footer = snapshot_read._check_body, image_cache._hashes_to_footer

    def counted_body(path: Path, *a: Any) -> Any:
        reads[path.name] += 1
        return body(path, *a)

    def counted_footer(path: Path, *a: Any) -> Any:
        reads[path.name] += 1
        return footer(path, *a)

    monkeypatch.setattr(snapshot_read, "_check_body", counted_body)
    monkeypatch.setattr(image_cache, "_hashes_to_footer", counted_footer)
    return reads


DELTAS = {"max_chain": 8, "full_ratio": 10.0, "retain": 1}


def _chain(root: Path, model: Model, rounds: range) -> Path:
    """A full snapshot, then a delta on it per later round; the full snapshot's path."""
    made = []
    for r in rounds:
        commit_round(root, model, r)
        if r < rounds[-1]:  # the last round's commits are left in the log
            result = passed(root, **(DELTAS if r else {"max_chain": 0, "retain": 1}))
            assert result.full == (r == 0) and result.snapshot is not None
            made.append(result.snapshot)
    return made[0]


def test_a_daemon_reads_a_full_snapshot_once_across_many_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsed once by the process; while only deltas and segments after it go, no
    later pass reads it again."""
    root, model = tmp_path / "store", Model()
    full = _chain(root, model, range(2))
    forget_all()  # as a daemon started on an existing store: it has read nothing yet
    reads = _count_reads(monkeypatch)
    deleted = 0
    for r in range(2, 7):
        commit_round(root, model, r)
        deleted += len(passed(root, **DELTAS).deleted)
    assert deleted, "retention never ran: the count below would prove nothing"
    assert full.exists() and reads[full.name] == 1, reads


@pytest.mark.parametrize(
    ("change", "found"),
    [
        # Its settled stamp no longer matches: read whole, the damage found.
        pytest.param(_new_mtime, True, id="rewritten-in-place"),
        pytest.param(_new_inode, True, id="replaced"),
        # Bit rot under an unchanged inode, size and mtime: not read by a pass that
        # deletes nothing resting on it alone (the next test: one that would, reads it);
        # `statelog verify` and every extraction read it whole regardless.
        pytest.param(_nothing, False, id="bit-rot-mtime-set-back"),
    ],
)
def test_a_full_snapshot_damaged_since_its_last_check_stops_retention(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[Path, pytest.MonkeyPatch], None],
    found: bool,
) -> None:
    root, model = tmp_path / "store", Model()
    full = _chain(root, model, range(4))
    st = full.stat()
    flip_bit(full, st.st_size // 2)
    os.utime(full, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot: the inode looks untouched
    change(full, monkeypatch)
    before = {p.name for p in (root / "snapshots").iterdir()}
    result = compact(root, **DELTAS)
    assert (full in result.damaged) is found, result
    if found:  # kept as evidence, and nothing that leaned on it deleted
        assert full.exists()
        assert before <= {p.name for p in (root / "snapshots").iterdir()}


def test_bit_rot_in_the_newest_full_snapshot_stops_the_deletion_of_the_older_one(
    tmp_path: Path,
) -> None:
    """A delta pass that would delete the older full snapshot reads the newer one, which
    every restore point kept rests on, whole first, however recently it was noted as
    intact: damaged, it is kept as evidence, and so is the older one with its log."""
    root, model = tmp_path / "store", Model()
    commit_round(root, model, 0)
    older = passed(root, max_chain=0, retain=5).snapshot
    commit_round(root, model, 1)
    newer = passed(root, max_chain=0, retain=5).snapshot
    assert older is not None and newer is not None
    st = newer.stat()
    flip_bit(newer, st.st_size // 2)
    os.utime(newer, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot: the inode looks untouched
    commit_round(root, model, 2)
    result = compact(root, **DELTAS)  # a delta on the newer one; retain 1: older would go
    assert not result.full and newer in result.damaged, result
    assert newer.exists() and older.exists()
    with statelog.open(root, readonly=True) as ro:
        assert contents(ro) == model.state()


def test_before_a_full_snapshot_goes_the_full_snapshots_kept_are_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within the hour a kept full snapshot is not read; but when a pass would delete
    an older full snapshot, the newer ones every kept restore point rests on are."""
    root, model = tmp_path / "store", Model()
    old_full = _chain(root, model, range(3))  # a full snapshot and a delta on it
    reads = _count_reads(monkeypatch)
    commit_round(root, model, 3)
    new_full = passed(root, max_chain=0, retain=1).snapshot  # written here, noted as read
    assert new_full is not None and not old_full.exists()
    assert reads[new_full.name] == 1, reads  # read again before the old full one went
    commit_round(root, model, 4)
    passed(root, **DELTAS)  # deletes the segment that ends where it begins: read again
    assert reads[new_full.name] == 2, reads
    for r in (5, 6):  # only deltas and segments after it go: not read
        commit_round(root, model, r)
        assert passed(root, **DELTAS).deleted
    assert reads[new_full.name] == 2, reads
