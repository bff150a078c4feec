"""WAL failure modes, one test per row, in the manner of LevelDB's ``log_test``.

Every row damages a store the way a crash, bit rot or an operator mistake
would, reopens it, and asserts both halves of the outcome:

* what survives: the epoch, the state equal to the model at that epoch, the
  offsets and the watermark; a second reopen is CLEAN (repair is idempotent);
  the writer continues (after corruption: in a new segment) and its commits
  survive a reopen;
* what was dropped: the :class:`~statelog.RecoveryReport` (outcome,
  ``truncated_bytes``, ``lost_epochs``, rejected entries with path, offset
  and reason) and the evidence kept aside as ``.broken`` or ``.corrupt``.

``truncated_bytes`` counts the torn tail only; damage before the tail is
accounted for by ``lost_epochs`` and the ``.corrupt`` files instead.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import pytest

import statelog
from statelog import Outcome, RecoveryReport
from statelog.format.wal import FRAME_HEADER_SIZE, HEADER_SIZE, FrameType, mask, segment_name
from tests.helpers import (
    Commit,
    FrameInfo,
    build_store,
    fix_crc,
    flip_bit,
    frames,
    model_at,
    poke,
    segments,
    simple_commits,
    snapshot_of,
    truncate,
    zero_fill,
)

Models = list[dict[str, Any]]

N = 8  # commits in the single-segment base store
MULTI = {"segment_bytes": 4096}  # 60 commits of simple_commits(60, value_size=40): 4 segments
FRAGMENTED = {"fragment_bytes": 64}


# -- helpers ----------------------------------------------------------------


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def drop_seal(seg: Path) -> None:
    """Cut the SEAL frame off: the segment as a writer killed before ``close()`` leaves it."""
    last = frames(seg)[-1]
    assert last.ftype == FrameType.SEAL
    truncate(seg, last.offset)


def record_frames(seg: Path) -> list[list[FrameInfo]]:
    """The frames of each record of ``seg`` in order (the SEAL frame excluded)."""
    out: list[list[FrameInfo]] = []
    for f in frames(seg):
        if f.ftype in (FrameType.FULL, FrameType.FIRST):
            out.append([f])
        elif f.ftype in (FrameType.MIDDLE, FrameType.LAST):
            out[-1].append(f)
    return out


def fix_header_crc(seg: Path) -> None:
    """Recompute a segment header's crc after a deliberate edit of its fields."""
    body = seg.read_bytes()[: HEADER_SIZE - 4]
    poke(seg, HEADER_SIZE - 4, "<I", mask(crc32c.crc32c(body)))


def aside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def sector_after(offset: int) -> int:
    """The first 512-byte sector boundary at or after ``offset``."""
    return -(-offset // 512) * 512


def first_lsn(seg: Path) -> int:
    return int(seg.name.split("-")[1].split(".")[0], 16)


def assert_state(store: statelog.StateStore, models: Models, epoch: int) -> None:
    """What survives: epoch, offsets, watermark and every table equal the model at ``epoch``."""
    assert store.epoch == epoch
    assert store.offsets == models[epoch]["offsets"]
    assert store.low_watermark_ms == models[epoch]["low_watermark_ms"]
    assert snapshot_of(store) == model_at(models, epoch)


def assert_clean(report: RecoveryReport) -> None:
    assert report.outcome is Outcome.CLEAN
    assert report.truncated_bytes == 0
    assert report.rejected == ()
    assert report.lost_epochs == range(0)
    assert report.saved_aside == ()


def dropped(report: RecoveryReport) -> dict[str, Any]:
    """What was dropped, as one comparable row (reasons are checked separately)."""
    return {
        "outcome": report.outcome,
        "truncated_bytes": report.truncated_bytes,
        "rejected": [(r.path.name, r.offset) for r in report.rejected],
        "saved_aside": sorted(p.name for p in report.saved_aside),
    }


def recover(path: Path, models: Models, epoch: int, **options: Any) -> RecoveryReport:
    """Open (repairing), check the surviving state is the model at ``epoch``, close."""
    with statelog.open(path, **options) as store:
        assert_state(store, models, epoch)
        return store.recovery


def commit_more(store: statelog.StateStore, models: Models, count: int) -> Models:
    """Commit ``count`` more checkpoints after ``models[-1]``; return the extended models."""
    out = list(models)
    for _ in range(count):
        i = store.epoch + 1
        put: dict[str | bytes, Any] = {f"after-{i}": {"i": i}}
        assert store.commit(offsets={"p0": i}, low_watermark_ms=i * 10, put=put) == i
        prev = out[-1]
        tables = {t: dict(kv) for t, kv in prev["tables"].items()}
        tables.setdefault("default", {}).update(put)
        out.append(
            {"offsets": {**prev["offsets"], "p0": i}, "low_watermark_ms": i * 10, "tables": tables}
        )
    return out


def assert_repair_settles(path: Path, models: Models, epoch: int, **options: Any) -> None:
    """After a repair: reopening is CLEAN, the writer continues, and its commits survive."""
    with statelog.open(path, **options) as store:
        assert_clean(store.recovery)
        assert_state(store, models, epoch)
        more = commit_more(store, models[: epoch + 1], 2)
    with statelog.open(path, **options) as store:
        assert_clean(store.recovery)
        assert_state(store, more, epoch + 2)


def critical_logged(caplog: pytest.LogCaptureFixture) -> bool:
    return any(r.levelno >= logging.CRITICAL for r in caplog.records)


@pytest.fixture
def base(store_path: Path) -> tuple[Path, Models]:
    """A closed single-segment store of N commits."""
    return store_path, build_store(store_path, simple_commits(N))


@pytest.fixture
def multi(store_path: Path) -> tuple[Path, Models]:
    """A closed store of 60 commits over 4 segments (3 sealed older ones)."""
    models = build_store(store_path, simple_commits(60, value_size=40), **MULTI)
    assert len(segments(store_path)) == 4
    return store_path, models


# -- checksum mismatch --------------------------------------------------------


def test_checksum_mismatch_in_middle_record(
    base: tuple[Path, Models], caplog: pytest.LogCaptureFixture
) -> None:
    """Checksum mismatch before the tail: stop at the last good commit, move the rest aside."""
    path, models = base
    seg = segments(path)[0]
    victim = frames(seg)[3]  # epoch 4
    flip_bit(seg, victim.offset + FRAME_HEADER_SIZE + 5)
    damaged = seg.read_bytes()

    with caplog.at_level(logging.WARNING, logger="statelog"):
        report = recover(path, models, 3)
    assert critical_logged(caplog)
    # The damaged segment keeps its good prefix and is sealed; the writer moved on.
    assert seg.read_bytes()[: victim.offset] == damaged[: victim.offset]
    assert [f.ftype for f in frames(seg)] == [FrameType.FULL] * 3 + [FrameType.SEAL]
    assert [p.name for p in segments(path)] == [seg.name, segment_name(2, 4)]
    assert aside(seg, ".corrupt").read_bytes() == damaged[victim.offset :]
    assert_repair_settles(path, models, 3)

    assert dropped(report) == {
        "outcome": Outcome.CORRUPTION,
        "truncated_bytes": 0,
        "rejected": [(seg.name, victim.offset)],
        "saved_aside": [seg.name + ".corrupt"],
    }
    assert "checksum mismatch" in report.rejected[0].reason
    assert report.lost_epochs == range(4, N + 1)


def test_checksum_mismatch_in_last_record_is_corruption_not_torn(base: tuple[Path, Models]) -> None:
    """Bit rot in the last record (no zeroed sector, nothing after it) is corruption, not torn."""
    path, models = base
    seg = segments(path)[0]
    drop_seal(seg)
    victim = frames(seg)[-1]  # epoch N, the last frame of the file
    flip_bit(seg, victim.offset + FRAME_HEADER_SIZE + 3, bit=6)
    damaged = seg.read_bytes()

    report = recover(path, models, N - 1)
    assert aside(seg, ".corrupt").read_bytes() == damaged[victim.offset :]
    assert_repair_settles(path, models, N - 1)

    assert dropped(report) == {
        "outcome": Outcome.CORRUPTION,
        "truncated_bytes": 0,
        "rejected": [(seg.name, victim.offset)],
        "saved_aside": [seg.name + ".corrupt"],
    }
    assert "checksum mismatch" in report.rejected[0].reason
    assert report.lost_epochs == range(N, N + 1)


# -- strict mode: corruption raises, nothing changes ---------------------------


def _flip_middle(path: Path) -> tuple[Path, int]:
    seg = segments(path)[0]
    victim = frames(seg)[3]
    flip_bit(seg, victim.offset + FRAME_HEADER_SIZE + 5)
    return seg, victim.offset


def _swap_records(path: Path) -> tuple[Path, int]:
    seg = segments(path)[0]
    fr = frames(seg)
    data = seg.read_bytes()
    a, b = fr[3], fr[4]
    seg.write_bytes(
        data[: a.offset] + data[b.offset : b.end] + data[a.offset : a.end] + data[b.end :]
    )
    return seg, a.offset


def _foreign_segment(path: Path) -> tuple[Path, int]:
    other = path.with_name("other")
    build_store(other, simple_commits(2 * N))
    dst = path / "wal" / segment_name(2, N + 1)
    shutil.copyfile(segments(other)[0], dst)
    return dst, 0


def _bad_last_header(path: Path) -> tuple[Path, int]:
    seg = segments(path)[0]
    flip_bit(seg, 20)  # inside the store id
    return seg, 0


@pytest.mark.parametrize(
    "damage",
    [_flip_middle, _swap_records, _foreign_segment, _bad_last_header],
    ids=["checksum-mismatch", "chain-break", "foreign-segment", "bad-header"],
)
def test_corruption_with_strict_raises_and_changes_no_byte(
    base: tuple[Path, Models], damage: Callable[[Path], tuple[Path, int]]
) -> None:
    """strict=True: damage before the tail raises CorruptionError before any file changes."""
    path, _ = base
    where, offset = damage(path)
    before = tree(path)
    with pytest.raises(statelog.CorruptionError) as info:
        statelog.open(path, strict=True)
    assert (info.value.path, info.value.offset) == (where, offset)
    assert info.value.reason
    assert tree(path) == before
    # The lock was released: a later non-strict open proceeds.
    with statelog.open(path, readonly=True) as store:
        assert store.recovery.outcome is Outcome.CORRUPTION


def test_torn_tail_with_strict_is_repaired_not_raised(base: tuple[Path, Models]) -> None:
    """strict=True refuses corruption only: a torn tail is still cut, saved aside, no error."""
    path, models = base
    seg = segments(path)[0]
    drop_seal(seg)
    last = frames(seg)[-1]
    truncate(seg, last.offset + 40)
    report = recover(path, models, N - 1, strict=True)
    assert report.outcome is Outcome.TORN_TAIL
    assert report.truncated_bytes == 40
    assert_repair_settles(path, models, N - 1, strict=True)


# -- torn tails ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["just-past-end", "huge"])
def test_bad_length_at_end_is_torn_tail(
    base: tuple[Path, Models], how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A last frame whose length runs past the file is a torn tail: cut, saved, no error.

    The bumped length keeps the frame's pad field consistent (length + 8k),
    so the header reads exactly like one whose payload never reached the disk.
    """
    path, models = base
    seg = segments(path)[0]
    drop_seal(seg)
    last = frames(seg)[-1]
    step = 1 if how == "just-past-end" else (0xFFFFFFFF - last.length) // 8
    poke(seg, last.offset + 4, "<I", last.length + 8 * step)
    damaged = seg.read_bytes()

    with caplog.at_level(logging.WARNING, logger="statelog"):
        report = recover(path, models, N - 1)
    assert not critical_logged(caplog)
    assert aside(seg, ".broken").read_bytes() == damaged[last.offset :]
    assert seg.read_bytes()[: last.offset] == damaged[: last.offset]
    assert frames(seg)[-1].offset == last.offset  # cut there, then sealed
    assert_repair_settles(path, models, N - 1)

    assert dropped(report) == {
        "outcome": Outcome.TORN_TAIL,
        "truncated_bytes": len(damaged) - last.offset,
        "rejected": [(seg.name, last.offset)],
        "saved_aside": [seg.name + ".broken"],
    }
    assert "runs past the end" in report.rejected[0].reason
    assert report.lost_epochs == range(0)


@pytest.mark.parametrize("where", ["in-header", "in-payload", "in-padding"])
def test_partial_last_record_is_torn_tail(base: tuple[Path, Models], where: str) -> None:
    """A last record cut short (a crash mid-append) is a torn tail: the previous commit survives."""
    path, models = base
    seg = segments(path)[0]
    drop_seal(seg)
    last = frames(seg)[-1]
    payload_end = last.offset + FRAME_HEADER_SIZE + last.length
    assert last.end > payload_end, "the last frame needs padding for the in-padding row"
    cut = {
        "in-header": last.offset + 7,
        "in-payload": last.offset + FRAME_HEADER_SIZE + last.length // 2,
        "in-padding": payload_end,
    }[where]
    original = seg.read_bytes()
    truncate(seg, cut)

    report = recover(path, models, N - 1)
    assert aside(seg, ".broken").read_bytes() == original[last.offset : cut]
    assert seg.read_bytes()[: last.offset] == original[: last.offset]
    assert_repair_settles(path, models, N - 1)

    assert dropped(report) == {
        "outcome": Outcome.TORN_TAIL,
        "truncated_bytes": cut - last.offset,
        "rejected": [(seg.name, last.offset)],
        "saved_aside": [seg.name + ".broken"],
    }
    assert "torn write" in report.rejected[0].reason
    assert report.lost_epochs == range(0)


@pytest.mark.parametrize("sealed", [True, False], ids=["after-seal", "after-last-record"])
def test_zero_filled_tail_is_torn_tail(base: tuple[Path, Models], sealed: bool) -> None:
    """Zeros after the last frame (unwritten, preallocated space) are a torn tail; nothing lost."""
    path, models = base
    seg = segments(path)[0]
    if not sealed:
        drop_seal(seg)
    size = seg.stat().st_size
    zero_fill(seg, size, 4096)

    report = recover(path, models, N)
    assert aside(seg, ".broken").read_bytes() == bytes(4096)
    assert [f.ftype for f in frames(seg)] == [FrameType.FULL] * N + [FrameType.SEAL]
    assert_repair_settles(path, models, N)

    assert dropped(report) == {
        "outcome": Outcome.TORN_TAIL,
        "truncated_bytes": 4096,
        "rejected": [(seg.name, size)],
        "saved_aside": [seg.name + ".broken"],
    }
    assert "zero-filled" in report.rejected[0].reason
    assert report.lost_epochs == range(0)


def _big_last(path: Path) -> Models:
    commits = [*simple_commits(N - 1), Commit(put={"big": "b" * 1500})]
    return build_store(path, commits)


@pytest.mark.parametrize("what", ["one-sector", "whole-record"])
def test_zeroed_sectors_of_last_record_are_torn_tail(store_path: Path, what: str) -> None:
    """A last record whose sectors read back as zeros (unwritten pages) is a torn tail."""
    models = _big_last(store_path)
    seg = segments(store_path)[0]
    drop_seal(seg)
    last = frames(seg)[-1]
    assert last.length > 1024
    if what == "one-sector":
        start = sector_after(last.offset + FRAME_HEADER_SIZE)  # a whole sector of payload
        zero_fill(seg, start, 512)
    else:
        zero_fill(seg, last.offset, last.end - last.offset)
    damaged = seg.read_bytes()
    assert len(damaged) == last.end

    report = recover(store_path, models, N - 1)
    assert aside(seg, ".broken").read_bytes() == damaged[last.offset :]
    assert_repair_settles(store_path, models, N - 1)

    assert dropped(report) == {
        "outcome": Outcome.TORN_TAIL,
        "truncated_bytes": last.end - last.offset,
        "rejected": [(seg.name, last.offset)],
        "saved_aside": [seg.name + ".broken"],
    }
    assert report.lost_epochs == range(0)


def test_zeroed_sector_followed_by_a_valid_frame_is_corruption(store_path: Path) -> None:
    """A zeroed sector is not torn when a verified frame (here the seal) follows it."""
    models = _big_last(store_path)
    seg = segments(store_path)[0]
    last = frames(seg)[-2]  # the big record; the SEAL frame follows
    zero_fill(seg, sector_after(last.offset + FRAME_HEADER_SIZE), 512)
    damaged = seg.read_bytes()

    report = recover(store_path, models, N - 1)
    assert aside(seg, ".corrupt").read_bytes() == damaged[last.offset :]
    assert_repair_settles(store_path, models, N - 1)

    assert dropped(report) == {
        "outcome": Outcome.CORRUPTION,
        "truncated_bytes": 0,
        "rejected": [(seg.name, last.offset)],
        "saved_aside": [seg.name + ".corrupt"],
    }
    assert "valid frame follows" in report.rejected[0].reason
    assert report.lost_epochs == range(N, N + 1)


def test_torn_write_splitting_a_frame_header_is_torn_tail(store_path: Path) -> None:
    """A torn append whose first sector ends inside the frame header is still a torn tail.

    The last record starts 8 bytes before a sector boundary: crc and length
    reached the disk, the rest of the header and the payload read back as
    zeros. That is an unwritten sector (etcd's rule), not corruption.
    """
    build_store(store_path.with_name("probe"), _header_split_commits(0))
    seg = segments(store_path.with_name("probe"))[0]
    shift = (504 - frames(seg)[-2].offset) % 512  # move the last record to 512k - 8
    models = build_store(store_path, _header_split_commits(shift))
    seg = segments(store_path)[0]
    drop_seal(seg)
    last = frames(seg)[-1]
    assert (last.offset + 8) % 512 == 0 and last.end - last.offset > 512
    zero_fill(seg, last.offset + 8, last.end - last.offset - 8)
    damaged = seg.read_bytes()

    report = recover(store_path, models, N - 1, strict=True)
    assert aside(seg, ".broken").read_bytes() == damaged[last.offset :]
    assert_repair_settles(store_path, models, N - 1)

    assert dropped(report) == {
        "outcome": Outcome.TORN_TAIL,
        "truncated_bytes": last.end - last.offset,
        "rejected": [(seg.name, last.offset)],
        "saved_aside": [seg.name + ".broken"],
    }
    assert report.lost_epochs == range(0)


def _header_split_commits(shift: int) -> list[Commit]:
    """N commits; the first one's value grows by ``shift`` bytes (a str16 stays str16)."""
    return [
        Commit(put={"pad": "p" * (300 + shift)}),
        *simple_commits(N - 1)[1:],
        Commit(put={"last": "L" * 700}),
    ]


# -- chain breaks --------------------------------------------------------------


def _relink(path: Path) -> tuple[Path, int]:
    """Point record 5's prev field elsewhere and fix its crc: it verifies alone, not in chain."""
    seg = segments(path)[0]
    victim = frames(seg)[4]
    poke(seg, victim.offset + 12, "<I", 0x1234_5678)
    fix_crc(seg, victim.offset)
    return seg, victim.offset


def _drop_record(path: Path) -> tuple[Path, int]:
    seg = segments(path)[0]
    victim = frames(seg)[3]
    data = seg.read_bytes()
    seg.write_bytes(data[: victim.offset] + data[victim.end :])
    return seg, victim.offset


@pytest.mark.parametrize(
    ("damage", "epoch"),
    [(_swap_records, 3), (_drop_record, 3), (_relink, 4)],
    ids=["swapped-records", "dropped-record", "relinked-record"],
)
def test_chain_break_is_corruption(
    base: tuple[Path, Models], damage: Callable[[Path], tuple[Path, int]], epoch: int
) -> None:
    """Frames that verify on their own but link to the wrong predecessor are corruption."""
    path, models = base
    seg, offset = damage(path)
    damaged = seg.read_bytes()

    report = recover(path, models, epoch)
    assert aside(seg, ".corrupt").read_bytes() == damaged[offset:]
    assert_repair_settles(path, models, epoch)

    assert dropped(report) == {
        "outcome": Outcome.CORRUPTION,
        "truncated_bytes": 0,
        "rejected": [(seg.name, offset)],
        "saved_aside": [seg.name + ".corrupt"],
    }
    assert "chain break" in report.rejected[0].reason
    assert report.lost_epochs == range(epoch + 1, N + 1)


# -- foreign segments and unknown versions ---------------------------------------


@pytest.mark.parametrize("naming", ["renamed", "same-name"])
def test_segment_of_another_store_is_corruption(base: tuple[Path, Models], naming: str) -> None:
    """A segment copied in from another store is refused whole; its epochs are not ours.

    ``renamed``: the other store's first segment under our next segment name.
    ``same-name``: the other store's own segment 2, whose header matches that name
    exactly, so only the store id tells it apart.
    """
    path, models = base
    other = path.with_name("other")
    build_store(other, simple_commits(N))
    with statelog.open(other) as o:  # more epochs than ours: none of them may count
        for i in range(N + 1, 2 * N + 1):
            o.commit(offsets={"p0": i}, low_watermark_ms=i * 10, put={"b": i})
        other_id = o.store_id
    dst = path / "wal" / segment_name(2, N + 1)
    foreign = segments(other)[0] if naming == "renamed" else segments(other)[1]
    assert (foreign.name == dst.name) is (naming == "same-name")
    shutil.copyfile(foreign, dst)
    other_before = tree(other)

    report = recover(path, models, N)
    assert aside(dst, ".corrupt").read_bytes() == foreign.read_bytes()
    assert tree(other) == other_before
    assert_repair_settles(path, models, N)

    assert dropped(report) == {
        "outcome": Outcome.CORRUPTION,
        "truncated_bytes": 0,
        "rejected": [(dst.name, 0)],
        "saved_aside": [dst.name + ".corrupt"],
    }
    assert str(other_id) in report.rejected[0].reason
    # Only our own epochs are evidence; the report's floor is one epoch.
    assert report.lost_epochs == range(N + 1, N + 2)


@pytest.mark.parametrize("which", [0, -1], ids=["first-segment", "last-segment"])
def test_unknown_format_version_raises_and_changes_no_byte(store_path: Path, which: int) -> None:
    """A segment of a newer format version raises FormatVersionError; no file byte changes."""
    build_store(store_path, simple_commits(60, value_size=40), **MULTI)
    seg = segments(store_path)[which]
    poke(seg, 8, "<H", 2)
    fix_header_crc(seg)
    before = tree(store_path)
    for options in ({}, {"readonly": True}, {"strict": True}):
        with pytest.raises(statelog.FormatVersionError) as info:
            statelog.open(store_path, **options)
        assert (info.value.path, info.value.found, info.value.supported) == (seg, 2, 1)
        assert tree(store_path) == before


# -- multi-segment logs ------------------------------------------------------------


def _older_flip(seg: Path) -> int:
    victim = frames(seg)[4]  # epoch 5
    flip_bit(seg, victim.offset + FRAME_HEADER_SIZE + 9)
    return victim.offset


def _older_partial(seg: Path) -> int:
    last = frames(seg)[-2]  # the last record; the seal follows
    truncate(seg, last.offset + 30)
    return last.offset


def _older_zero_tail(seg: Path) -> int:
    last = frames(seg)[-2]
    zero_fill(seg, last.offset, seg.stat().st_size - last.offset)
    return last.offset


@pytest.mark.parametrize(
    "damage",
    [_older_flip, _older_partial, _older_zero_tail],
    ids=["checksum-mismatch", "partial-last-record", "zero-filled-tail"],
)
def test_damage_in_sealed_older_segment_is_corruption_not_torn(
    multi: tuple[Path, Models], damage: Callable[[Path], int]
) -> None:
    """Damage in a sealed older segment is never a torn tail: later segments go aside."""
    path, models = multi
    segs = segments(path)
    later = {p: p.read_bytes() for p in segs[1:]}
    seg = segs[0]
    offset = damage(seg)
    damaged = seg.read_bytes()
    epoch = len([r for r in record_frames(seg) if r[0].offset < offset])

    report = recover(path, models, epoch, **MULTI)
    assert aside(seg, ".corrupt").read_bytes() == damaged[offset:]
    for p, data in later.items():
        assert aside(p, ".corrupt").read_bytes() == data
    assert [p.name for p in segments(path)] == [seg.name, segment_name(2, epoch + 1)]
    assert_repair_settles(path, models, epoch, **MULTI)

    assert dropped(report) == {
        "outcome": Outcome.CORRUPTION,
        "truncated_bytes": 0,
        "rejected": [(seg.name, offset)] + [(p.name, None) for p in segs[1:]],
        "saved_aside": sorted(p.name + ".corrupt" for p in segs),
    }
    assert report.lost_epochs == range(epoch + 1, 61)


def test_missing_middle_segment_is_chain_break(multi: tuple[Path, Models]) -> None:
    """A deleted middle segment breaks the chain at the next segment's header."""
    path, models = multi
    segs = segments(path)
    segs[1].unlink()
    later = {p: p.read_bytes() for p in segs[2:]}
    epoch = first_lsn(segs[1]) - 1

    report = recover(path, models, epoch, **MULTI)
    for p, data in later.items():
        assert aside(p, ".corrupt").read_bytes() == data
    assert_repair_settles(path, models, epoch, **MULTI)

    assert dropped(report) == {
        "outcome": Outcome.CORRUPTION,
        "truncated_bytes": 0,
        "rejected": [(segs[2].name, 0), (segs[3].name, None)],
        "saved_aside": sorted(p.name + ".corrupt" for p in segs[2:]),
    }
    assert "chain break" in report.rejected[0].reason or "missing" in report.rejected[0].reason
    assert report.lost_epochs == range(epoch + 1, 61)


@pytest.mark.parametrize("how", ["bit-flip", "zeroed"])
def test_damaged_header_of_last_segment(multi: tuple[Path, Models], how: str) -> None:
    """A bad header on the newest segment drops that segment whole (zeroed: torn, else corrupt)."""
    path, models = multi
    segs = segments(path)
    last = segs[-1]
    size = last.stat().st_size
    if how == "bit-flip":
        flip_bit(last, 20)
    else:
        zero_fill(last, 0, size)
    damaged = last.read_bytes()
    epoch = first_lsn(last) - 1
    suffix = ".corrupt" if how == "bit-flip" else ".broken"

    report = recover(path, models, epoch, **MULTI)
    assert aside(last, suffix).read_bytes() == damaged
    assert_repair_settles(path, models, epoch, **MULTI)

    assert dropped(report) == {
        "outcome": Outcome.CORRUPTION if how == "bit-flip" else Outcome.TORN_TAIL,
        "truncated_bytes": 0 if how == "bit-flip" else size,
        "rejected": [(last.name, 0)],
        "saved_aside": [last.name + suffix],
    }
    assert "header" in report.rejected[0].reason
    # The segment's frames still verify and carry epochs epoch+1..60: all of them are lost.
    assert report.lost_epochs == (range(epoch + 1, 61) if how == "bit-flip" else range(0))


# -- fragmented records --------------------------------------------------------------


def _fragmented(path: Path) -> Models:
    commits = [*simple_commits(N - 1, value_size=60), Commit(put={"big": "f" * 400})]
    return build_store(path, commits, **FRAGMENTED)


@pytest.mark.parametrize("where", ["at-fragment-boundary", "mid-fragment"])
def test_fragmented_record_torn_mid_record(store_path: Path, where: str) -> None:
    """A fragmented last record cut after some of its fragments is torn as a whole record."""
    models = _fragmented(store_path)
    seg = segments(store_path)[0]
    rec = record_frames(seg)[-1]
    assert len(rec) > 4
    cut = rec[2].end if where == "at-fragment-boundary" else rec[2].offset + 21
    original = seg.read_bytes()
    truncate(seg, cut)
    start = rec[0].offset

    report = recover(store_path, models, N - 1, **FRAGMENTED)
    assert aside(seg, ".broken").read_bytes() == original[start:cut]
    assert_repair_settles(store_path, models, N - 1, **FRAGMENTED)

    assert dropped(report) == {
        "outcome": Outcome.TORN_TAIL,
        "truncated_bytes": cut - start,
        "rejected": [(seg.name, start)],
        "saved_aside": [seg.name + ".broken"],
    }
    assert report.lost_epochs == range(0)


def test_fragmented_checksum_mismatch_reports_record_start(store_path: Path) -> None:
    """A bad middle fragment of a middle record drops the whole record, from its first fragment."""
    models = _fragmented(store_path)
    seg = segments(store_path)[0]
    rec = record_frames(seg)[3]  # epoch 4
    assert len(rec) >= 3
    flip_bit(seg, rec[1].offset + FRAME_HEADER_SIZE + 2)
    damaged = seg.read_bytes()

    report = recover(store_path, models, 3, **FRAGMENTED)
    assert aside(seg, ".corrupt").read_bytes() == damaged[rec[0].offset :]
    assert_repair_settles(store_path, models, 3, **FRAGMENTED)

    assert dropped(report) == {
        "outcome": Outcome.CORRUPTION,
        "truncated_bytes": 0,
        "rejected": [(seg.name, rec[0].offset)],
        "saved_aside": [seg.name + ".corrupt"],
    }
    assert "checksum mismatch" in report.rejected[0].reason
    # Records 5..N still verify past the damage (as fragments): they count as lost.
    assert report.lost_epochs == range(4, N + 1)


# -- read-only opens ---------------------------------------------------------------


@pytest.mark.parametrize("damage", ["torn", "corrupt"])
def test_readonly_open_reports_damage_and_changes_no_byte(
    base: tuple[Path, Models], damage: str
) -> None:
    """A read-only open sees the good prefix and reports the damage, but repairs nothing."""
    path, models = base
    seg = segments(path)[0]
    if damage == "torn":
        drop_seal(seg)
        offset = frames(seg)[-1].offset
        truncate(seg, offset + 40)
    else:
        seg, offset = _flip_middle(path)
    before = tree(path)
    epoch = len([f for f in frames(seg) if f.offset < offset and f.ftype == FrameType.FULL])

    with statelog.open(path, readonly=True) as store:
        assert_state(store, models, epoch)
        report = store.recovery
    assert tree(path) == before
    assert report.outcome is (Outcome.TORN_TAIL if damage == "torn" else Outcome.CORRUPTION)
    assert [(r.path, r.offset) for r in report.rejected] == [(seg, offset)]
    assert report.saved_aside == ()
