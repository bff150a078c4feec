"""One buffer that whole files are read into in turn (``ReadBuffer``), and the shipper
and restore that keep one: what each read returns is exactly that file, whatever
size the files before it had."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import statelog
from compactor import compact
from statelog.compaction import base as compaction_base
from statelog.recovery import replay
from statelog.remote import read_manifest, restore, ship
from statelog.storage.fileio import ReadBuffer
from tests.helpers import build_store, model_at, simple_commits, snapshot_of
from tests.s3server import Remote, remote, s3  # noqa: F401
from tests.test_remote import res_id, state_of

# Sizes in the order they are read: growing, shrinking, empty, growing again.
SIZES = [0, 10, 1 << 20, 5, 3 << 20, 0, 4096, (3 << 20) + 1]


def test_each_read_is_exactly_its_file(tmp_path: Path) -> None:
    reads = ReadBuffer()
    for i, size in enumerate(SIZES):
        path = tmp_path / f"f{i}"
        data = os.urandom(size)
        path.write_bytes(data)
        assert bytes(reads.read(path)) == data, size


def test_a_view_held_across_growth_stays_valid(tmp_path: Path) -> None:
    """A caller that broke the contract keeps an old view: growing allocates a new
    buffer instead of resizing one that is exported, which would raise."""
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_bytes(b"a" * 100)
    large.write_bytes(b"b" * 100_000)
    reads = ReadBuffer()
    held = reads.read(small)
    assert bytes(reads.read(large)) == b"b" * 100_000
    assert bytes(held) == b"a" * 100


def test_a_missing_file_raises_and_the_buffer_still_works(tmp_path: Path) -> None:
    reads = ReadBuffer()
    with pytest.raises(FileNotFoundError):
        reads.read(tmp_path / "gone")
    (tmp_path / "here").write_bytes(b"xyz")
    assert bytes(reads.read(tmp_path / "here")) == b"xyz"


def test_ships_sharing_one_buffer_upload_each_segment_exactly(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    """Segments shipped by calls sharing one buffer, largest first, then smaller ones,
    then one that ships as it is (it compresses past a reader's ratio) after a larger
    one: a restore gets every file byte for byte."""
    src = tmp_path / "src"
    reads = ReadBuffer()
    batches = [{f"big{i}": os.urandom(1000) for i in range(3000)}]
    batches += [{f"k{n}": os.urandom(50 * n)} for n in range(4, 0, -1)]
    batches += [{"zeros": b"\0" * (16 << 20)}]
    for n, batch in enumerate(batches, 1):
        with statelog.open(src) as st:  # its close seals the segment
            st.commit(offsets={"p": n}, put=batch)
        ship(src, remote.url, client=remote.client(), reads=reads)
    cur = read_manifest(remote.client(), res_id(src))
    assert cur is not None
    assert sorted(e.encoding for e in cur.manifest.segments) == [""] + ["zstd"] * 5
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert res.epoch == len(batches) and state_of(tmp_path / "dst") == state_of(src)
    for seg in sorted((src / "wal").iterdir()):
        assert (tmp_path / "dst" / "wal" / seg.name).read_bytes() == seg.read_bytes(), seg.name


class _Poisoning(ReadBuffer):
    """A buffer that overwrites everything it held with 0xFF before each read, and never
    moves to a new one: a view into an earlier file that a reader kept past the next
    read would see 0xFF, where a ReadBuffer that grew would have left it intact."""

    def __init__(self) -> None:
        super().__init__()
        self._held = bytearray(1 << 20)

    def read(self, path: Path) -> memoryview:
        view = memoryview(self._held)
        view[:] = b"\xff" * len(self._held)
        data = path.read_bytes()
        assert len(data) <= len(self._held)
        view[: len(data)] = data
        return view[: len(data)]


@pytest.mark.parametrize("module", [replay, compaction_base], ids=["replay", "fold"])
def test_nothing_read_from_a_segment_is_used_after_the_next_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: object
) -> None:
    """Recovery's replay and a pass's fold read every segment into one buffer: what they
    applied, kept or set aside must be copies, or the poisoned buffer shows through."""
    (tmp_path / "long").write_bytes(b"a" * 10)
    (tmp_path / "short").write_bytes(b"b")
    poisoning = _Poisoning()
    held = poisoning.read(tmp_path / "long")
    poisoning.read(tmp_path / "short")
    assert bytes(held) == b"b" + b"\xff" * 9  # a kept view shows the poison
    path = tmp_path / "store"
    models = build_store(path, simple_commits(120, value_size=40), segment_bytes=4096)
    monkeypatch.setattr(module, "ReadBuffer", _Poisoning)
    if module is compaction_base:
        assert compact(path).skipped is None
    with statelog.open(path) as store:
        assert store.epoch == 120
        assert snapshot_of(store) == model_at(models, 120)
