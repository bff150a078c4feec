"""``verify_store`` as a table of failure modes, on real stores built with the public API.

| store                                  | verdict       | named                             |
|----------------------------------------|---------------|-----------------------------------|
| clean: two snapshots, a tail after     | clean         | nothing                           |
| torn tail (last record cut, no seal)   | recoverable   | last segment, torn record offset  |
| bit flipped in a record mid-log        | recoverable   | segment + frame, later ones, lost |
| newest snapshot damaged (walk back)    | recoverable   | the snapshot and its offset       |
| every snapshot damaged, early log gone | unrecoverable | every snapshot, the first segment |
| a middle segment deleted               | recoverable   | the segment after the gap         |
| IDENTITY damaged                       | unrecoverable | IDENTITY                          |
| zombie's segments after a takeover     | recoverable   | each, at its header, rule H5      |
| zombie's segment a snapshot folded     | recoverable   | the segment, at its header        |
| not a store                            | StoreNotFoundError, nothing created               |

Each store is built once per module (:func:`build_stores`, shared with
``tests/test_cli.py``); a test that changes a store copies it first.
Every verify must leave every byte of the store as it was.
"""

from __future__ import annotations

import hashlib
import shutil
import struct
from pathlib import Path

import crc32c
import pytest

import statelog
from compactor import compact
from statelog.format.wal import mask
from statelog.ops.verify import Verdict, verify_store
from tests.helpers import flip_bit, frames, segments, truncate

SEG = 4096  # the smallest segment: a few dozen commits each


def _commits(store: Path, first: int, last: int) -> None:
    with statelog.open(store, segment_bytes=SEG, durability="none") as s:
        for i in range(first, last + 1):
            put: dict[str | bytes, object] = {f"k{i}": {"i": i, "pad": "x" * 40}, b"b%d" % i: i}
            s.commit(
                offsets={"p0": i},
                low_watermark_ms=i * 10,
                put=put,
                delete=[f"k{i - 5}"] if i > 5 else [],
            )


def snapshot_files(store: Path) -> list[Path]:
    """Snapshots of ``store``, oldest first."""
    return sorted((store / "snapshots").glob("*.snap"))


def build_stores(root: Path) -> dict[str, Path]:
    """The stores of the table above: ``clean`` and one damaged copy per failure mode.

    ``clean`` holds snapshots at epochs 80 and 160 (retention removed the
    segments before 81) and a log tail 161..260 in three sealed segments.
    """
    clean = root / "clean"
    _commits(clean, 1, 80)
    assert compact(clean, retain=5).snapshot is not None
    _commits(clean, 81, 160)
    assert compact(clean, retain=5).snapshot is not None
    _commits(clean, 161, 260)
    assert len(snapshot_files(clean)) == 2
    assert int(segments(clean)[0].name.split("-")[1][:16], 16) > 1, "the early log is gone"
    out = {"clean": clean}

    def variant(name: str) -> Path:
        out[name] = root / name
        shutil.copytree(clean, out[name])
        return out[name]

    truncate(segments(variant("torn"))[-1], -(24 + 5))  # the seal and 5 bytes of the last record
    flip_bit(mid_frame_target(variant("bitflip")), mid_frame_offset(out["bitflip"]) + 20)
    newest = snapshot_files(variant("snapshot"))[-1]
    flip_bit(newest, newest.stat().st_size // 2)
    for snap in snapshot_files(variant("exhausted")):
        flip_bit(snap, snap.stat().st_size // 2)
    return out


def mid_frame_target(store: Path) -> Path:
    """The segment a mid-log bit flip damages: the first one after the newest snapshot."""
    return segments(store)[3]


def mid_frame_offset(store: Path) -> int:
    """Where the damaged record begins: the third frame of :func:`mid_frame_target`."""
    return frames(mid_frame_target(store))[2].offset


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative name -> sha256), directories as ``dir``."""
    out = {}
    for p in sorted(root.rglob("*")):
        name = str(p.relative_to(root))
        out[name] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_stores(tmp_path_factory.mktemp("verify"))


def verified(store: Path) -> tuple[Verdict, list[tuple[str, int | None, str]]]:
    """Verify ``store``, check that nothing changed, return the verdict and (file, offset, kind)."""
    before = tree_digest(store)
    report = verify_store(store)
    assert tree_digest(store) == before, "verify changed the store"
    return report.verdict, [(f.path.name, f.offset, f.kind) for f in report.findings]


def test_clean_store_is_clean_and_every_file_checked(stores: dict[str, Path]) -> None:
    report = verify_store(stores["clean"])
    assert report.verdict is Verdict.CLEAN and report.findings == ()
    assert [s.verified and s.links for s in report.snapshots] == [True, True]
    assert all(s.status == "ok" and s.sealed for s in report.segments)
    assert sum(s.records for s in report.segments) == 260 - 80
    assert report.recovery is not None and report.recovery.epoch == 260


def test_torn_tail_is_recoverable_and_names_the_torn_record(stores: dict[str, Path]) -> None:
    store = stores["torn"]
    last = segments(store)[-1]
    torn_at = frames(last)[-1].offset  # the frame that runs past the end
    verdict, found = verified(store)
    assert verdict is Verdict.RECOVERABLE
    assert found == [(last.name, torn_at, "torn-tail")]


def test_bit_flip_mid_log_names_segment_offset_and_every_later_segment(
    stores: dict[str, Path],
) -> None:
    store = stores["bitflip"]
    damaged, later = mid_frame_target(store), segments(store)[4:]
    report = verify_store(store)
    assert report.verdict is Verdict.RECOVERABLE
    assert (damaged.name, mid_frame_offset(store), "segment") in [
        (f.path.name, f.offset, f.kind) for f in report.findings
    ]
    assert {p.name for p in later} <= {f.path.name for f in report.findings}
    assert report.recovery is not None
    assert report.recovery.epoch == 162 and report.recovery.lost_epochs == range(163, 261)


def test_damaged_newest_snapshot_is_named_and_recovery_walks_back(
    stores: dict[str, Path],
) -> None:
    store = stores["snapshot"]
    older, newest = snapshot_files(store)
    report = verify_store(store)
    assert report.verdict is Verdict.RECOVERABLE
    assert [(f.path, f.kind) for f in report.findings] == [(newest, "snapshot")]
    assert report.findings[0].offset is not None
    assert report.recovery is not None and report.recovery.snapshot == older
    assert report.recovery.epoch == 260


def test_every_snapshot_damaged_and_early_log_gone_is_unrecoverable(
    stores: dict[str, Path],
) -> None:
    store = stores["exhausted"]
    verdict, found = verified(store)
    assert verdict is Verdict.UNRECOVERABLE
    names = {name for name, _, _ in found}
    assert {p.name for p in snapshot_files(store)} | {segments(store)[0].name} <= names
    assert all(off is not None for name, off, kind in found if kind == "snapshot")


def test_missing_middle_segment_is_named_at_the_segment_after_the_gap(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    store = tmp_path / "s"
    shutil.copytree(stores["clean"], store)
    segs = segments(store)
    segs[4].unlink()
    verdict, found = verified(store)
    assert verdict is Verdict.RECOVERABLE
    assert (segs[5].name, 0, "log") in found


def test_damaged_identity_is_unrecoverable(stores: dict[str, Path], tmp_path: Path) -> None:
    store = tmp_path / "s"
    shutil.copytree(stores["clean"], store)
    (store / "IDENTITY").write_text("{not json")
    verdict, found = verified(store)
    assert verdict is Verdict.UNRECOVERABLE
    assert ("IDENTITY", 0, "identity") in found


def test_not_a_store_raises_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(statelog.StoreNotFoundError):
        verify_store(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


def test_progress_reports_every_byte_in_order(stores: dict[str, Path]) -> None:
    calls: list[tuple[str, int, int]] = []
    report = verify_store(stores["clean"], progress=lambda *a: calls.append(a))
    files = 2 + len(segments(stores["clean"]))
    assert len(calls) == files
    assert [c[1] for c in calls] == sorted(c[1] for c in calls)
    assert calls[-1][1] == calls[-1][2] == report.bytes_read > 0


def test_to_dict_names_files_and_verdict(stores: dict[str, Path]) -> None:
    doc = verify_store(stores["snapshot"]).to_dict()
    assert doc["verdict"] == "recoverable"
    assert doc["findings"][0]["file"].endswith(".snap")
    assert doc["recovery"]["snapshot"].endswith(snapshot_files(stores["snapshot"])[0].name)


def stamp(seg: Path, generation: int) -> None:
    """Write the writer generation into header bytes 52..59 (docs/format.md) and fix its crc."""
    data = bytearray(seg.read_bytes())
    struct.pack_into("<Q", data, 52, generation)
    struct.pack_into("<I", data, 60, mask(crc32c.crc32c(bytes(data[:60]))))
    seg.write_bytes(bytes(data))


def first_lsn(seg: Path) -> int:
    return int(seg.name[17:33], 16)


def test_zombie_segments_after_a_takeover_are_named_at_their_headers(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _commits(store, 1, 200)
    segs = segments(store)
    stamp(segs[1], 2)
    stamp(segs[2], 1)  # a fenced writer's segments, after the takeover
    stamp(segs[3], 1)
    verdict, found = verified(store)
    assert verdict is Verdict.RECOVERABLE
    assert (segs[2].name, 0, "segment") in found and (segs[3].name, 0, "segment") in found
    report = verify_store(store)
    assert [s.status for s in report.segments[1:4]] == ["ok", "corrupt", "corrupt"]
    assert "generation 1 after 2" in (report.segments[2].reason or "")
    assert report.recovery is not None and report.recovery.epoch == first_lsn(segs[2]) - 1


def test_zombie_segment_folded_into_a_snapshot_is_named(tmp_path: Path) -> None:
    """Recovery starts after the snapshot and does not cut it: verify still must not say clean."""
    store = tmp_path / "s"
    _commits(store, 1, 200)
    kept = {p.name: p.read_bytes() for p in segments(store)}
    assert compact(store, retain=5).snapshot is not None  # as a compactor before rule H5 did
    for name, data in kept.items():  # retention deleted what the snapshot covers: back
        (store / "wal" / name).write_bytes(data)
    segs = segments(store)
    stamp(segs[1], 2)
    stamp(segs[2], 1)
    verdict, found = verified(store)
    assert verdict is Verdict.RECOVERABLE
    assert found == [(segs[2].name, 0, "segment")]
    report = verify_store(store)
    assert report.recovery is not None and report.recovery.epoch == 200  # the snapshot's
