"""Truncation of the last record at every byte offset.

A writer killed mid-append leaves any prefix of its last record on disk.
For every such prefix, recovery must give exactly the previous commit's
state, save the torn bytes to ``<segment>.broken`` byte for byte, cut the
segment back, and accept new commits afterwards. The base store is built
once per scenario and copied per offset, so the sweep stays fast; the
copies live on tmpfs when there is one, since this test is about what
recovery decides, not about fsync (which other tests cover).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog import Outcome
from statelog.format.wal import FrameType
from tests.helpers import (
    Commit,
    build_store,
    frames,
    model_at,
    segments,
    simple_commits,
    snapshot_of,
    truncate,
)

N = 6  # commits in each base store; the last one is the record being torn

Models = list[dict[str, Any]]


@dataclass(frozen=True)
class Base:
    """A closed one-segment store and where its last record lies."""

    root: Path
    models: Models
    options: dict[str, Any]
    segment: str  # file name of the segment
    original: bytes  # the segment's bytes
    start: int  # first byte of the last record's first frame
    end: int  # first byte after the last record's last frame
    fragments: int


SCENARIOS: dict[str, tuple[dict[str, Any], list[Commit]]] = {
    "one-frame": ({}, [*simple_commits(N - 1), Commit(put={"last": "L" * 90})]),
    "fragmented": (
        {"fragment_bytes": 64},
        [*simple_commits(N - 1), Commit(put={"last": "F" * 300}, delete=("k1-1",))],
    ),
}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory for the sweep: on tmpfs (/dev/shm) if available, else under tmp_path."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        d = Path(tempfile.mkdtemp(prefix="statelog-torn-", dir=shm))
        yield d
        shutil.rmtree(d, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp("torn")


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def base(request: pytest.FixtureRequest, scratch: Path) -> Base:
    options, commits = SCENARIOS[request.param]
    root = scratch / f"base-{request.param}" / "store"
    models = build_store(root, commits, **options)
    (seg,) = segments(root)
    fr = frames(seg)
    assert fr[-1].ftype == FrameType.SEAL
    first = max(i for i, f in enumerate(fr) if f.ftype in (FrameType.FULL, FrameType.FIRST))
    record = fr[first:-1]
    assert len(record) == 1 if request.param == "one-frame" else len(record) >= 4
    return Base(
        root,
        models,
        options,
        seg.name,
        seg.read_bytes(),
        record[0].offset,
        record[-1].end,
        len(record),
    )


def extend(models: Models, epoch: int, put: dict[str | bytes, Any]) -> Models:
    """``models[:epoch + 1]`` plus one commit of ``put`` at ``epoch + 1`` (offsets, watermark)."""
    prev = models[epoch]
    tables = {t: dict(kv) for t, kv in prev["tables"].items()}
    tables.setdefault("default", {}).update(put)
    i = epoch + 1
    nxt = {"offsets": {**prev["offsets"], "p0": i}, "low_watermark_ms": i * 10, "tables": tables}
    return [*models[: epoch + 1], nxt]


def check_cut(base: Base, work: Path, cut: int) -> None:
    """Cut the segment at ``cut``, recover, commit, reopen: the previous commit, then ours."""
    root = work / f"cut-{cut}"
    shutil.copytree(base.root, root)
    seg = root / "wal" / base.segment
    truncate(seg, cut)
    prev = N - 1
    with statelog.open(root, **base.options) as store:
        r = store.recovery
        assert store.epoch == prev
        assert store.offsets == base.models[prev]["offsets"]
        assert store.low_watermark_ms == base.models[prev]["low_watermark_ms"]
        assert snapshot_of(store) == model_at(base.models, prev)
        broken = seg.with_name(seg.name + ".broken")
        if cut == base.start:  # a frame boundary: the log simply ends before the record
            assert r.outcome is Outcome.CLEAN
            assert (r.truncated_bytes, r.rejected, r.saved_aside) == (0, (), ())
            assert not broken.exists()
        else:
            assert r.outcome is Outcome.TORN_TAIL
            assert r.truncated_bytes == cut - base.start
            assert [(x.path, x.offset) for x in r.rejected] == [(seg, base.start)]
            assert r.saved_aside == (broken,)
            assert broken.read_bytes() == base.original[base.start : cut]
        assert r.lost_epochs == range(0)
        assert seg.read_bytes()[: base.start] == base.original[: base.start]
        put: dict[str | bytes, Any] = {"after": cut}
        assert store.commit(offsets={"p0": N}, low_watermark_ms=N * 10, put=put) == N
    models = extend(base.models, prev, put)
    with statelog.open(root, **base.options) as store:
        assert store.recovery.outcome is Outcome.CLEAN
        assert store.epoch == N
        assert snapshot_of(store) == model_at(models, N)
    shutil.rmtree(root)


def test_truncating_last_record_at_every_offset_gives_previous_commit(
    base: Base, scratch: Path
) -> None:
    """Torn last record, every prefix length: previous commit, torn bytes saved, writer goes on."""
    assert base.end - base.start > 64
    for cut in range(base.start, base.end):
        try:
            check_cut(base, scratch, cut)
        except AssertionError as exc:
            raise AssertionError(
                f"cut at byte {cut} (record {base.start}..{base.end}, "
                f"{base.fragments} frame(s)): {exc}"
            ) from exc
