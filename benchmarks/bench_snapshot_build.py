"""Building the base image from a snapshot: format 1 (the image itself) vs format 2 (a stream).

Set-up, once per size of ``build_keys`` (not timed): the workload's starting
state (its reconciler records, msgpack-encoded as a commit carries them) is
built into a finished LMDB image with ``ImageBuilder``, then written as a
format-1 snapshot (body: the zstd-compressed image) and as a format-2 one
(body: the zstd-compressed record stream), both at zstd level 3. Each kind
then runs ``repeats`` rounds in this process, the snapshot in the page cache:

* ``format1``: ``extract_snapshot`` of the format-1 snapshot (hash and
  decompress the image into a file), then ``BaseLevel`` open and one read;
* ``format2``: ``extract_snapshot`` of the format-2 snapshot (hash,
  decompress, parse, check every key, build the image with LMDB's append
  mode), then ``BaseLevel`` open and one read;
* ``verify``: ``verify_snapshot(parse=True)`` of the format-2 snapshot: hash,
  decompress, parse and check, nothing built.

``extra_info`` holds each round's wall and CPU seconds (``time.process_time``:
every thread of this process), both snapshots' sizes, the set-up's image and
the image each kind produced.

``test_restore``, at the sizes of ``build_keys`` up to 1M only: a store of that
many keys (the starting state committed, then compacted into one snapshot) is
shipped once to moto's S3 server on loopback, as ``bench_remote.py`` does; each
round restores it into an empty directory (the base image is built while the
snapshot is verified) and opens the writer there, which maps that image, and
reads one key. moto runs in this process, so only wall seconds are reported.
"""

from __future__ import annotations

import gc
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.format.records import encode_value
from statelog.remote import RemoteClient, restore, ship
from statelog.storage.builder import ImageBuilder
from statelog.storage.fileio import FileLayer
from statelog.storage.image import BaseLevel
from statelog.storage.snapshots import (
    SnapshotMeta,
    extract_snapshot,
    verify_snapshot,
    write_snapshot,
)
from tests.s3server import S3Server

from .conftest import SIZES, Sizes, size_id
from .probe import timed
from .workload import Workload

KINDS = ("format1", "format2", "verify")
TABLE = "default"
RESTORE_MAX_KEYS = 1_000_000
_STORE_ID = uuid.UUID("5e0b6c1d-2f4a-4c8e-9b7d-3a1f0e6d8c42")
_FILES = FileLayer()


@dataclass(frozen=True)
class Built:
    """One state, its finished image, and the two snapshots of it."""

    keys: int
    root: Path
    image: Path
    snapshots: dict[int, Path]
    """Format version -> snapshot file."""
    info: dict[str, Any]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    keys = SIZES[str(metafunc.config.getoption("--bench-size"))].build_keys
    if "built" in metafunc.fixturenames:
        ids = [size_id(k) for k in keys]
        metafunc.parametrize("built", keys, ids=ids, indirect=True, scope="module")
    if "restore_keys" in metafunc.fixturenames:
        small = [k for k in keys if k <= RESTORE_MAX_KEYS]
        metafunc.parametrize("restore_keys", small, ids=[size_id(k) for k in small])


def _middle_key(keys: int) -> str:
    return Workload.key(keys // 2)


def _build_image(keys: int, root: Path) -> tuple[Path, int]:
    """The starting state of ``keys`` keys as a finished image; it and its value bytes."""
    value_bytes = 0
    work = root / "work.mdb"
    with ImageBuilder.create(work) as builder:
        for chunk in Workload(keys, 1).initial_chunks():
            values = [encode_value(v) for v in chunk.values()]
            value_bytes += sum(map(len, values))
            builder.apply(TABLE, list(chunk), values, [])
        builder.finish(root / "image.mdb")
    work.unlink()
    return root / "image.mdb", value_bytes


def _meta(keys: int) -> SnapshotMeta:
    """What a compactor would say of the state (format 2 counts the tables itself)."""
    return SnapshotMeta(
        store_id=_STORE_ID, epoch=1, lsn=1, chain=0, offsets={"orders-0": 1},
        low_watermark_ms=0, tables={TABLE: keys}, body_bytes=0, created_ms=1_700_000_000_000,
    )  # fmt: skip


@pytest.fixture(scope="module")
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Built]:
    keys: int = request.param
    root = tmp_path_factory.mktemp(f"build-{size_id(keys)}")
    t0 = time.perf_counter()
    image, value_bytes = _build_image(keys, root)
    image_seconds = time.perf_counter() - t0
    snapshots: dict[int, Path] = {}
    info: dict[str, Any] = {}
    for version in (1, 2):
        (root / f"v{version}").mkdir()
        gc.collect()
        write = partial(write_snapshot, _FILES, root / f"v{version}", _meta(keys), image)
        (path, meta), seconds, _ = timed(partial(write, version=version))
        snapshots[version] = path
        info[f"snapshot_bytes_v{version}"] = path.stat().st_size
        info[f"body_bytes_v{version}"] = meta.body_bytes
        info[f"write_seconds_v{version}"] = seconds
        assert meta.tables == {TABLE: keys}
    info |= {"image_bytes": image.stat().st_size, "value_bytes": value_bytes}
    info |= {"image_seconds": image_seconds}
    yield Built(keys, root, image, snapshots, info)
    shutil.rmtree(root, ignore_errors=True)  # the next size needs the room


def _extract_and_read(snapshot: Path, dest: Path, key: str) -> bytes | None:
    """The image of ``snapshot`` at ``dest``, opened, and the value of ``key`` read."""
    extract_snapshot(_FILES, snapshot, dest, store_id=_STORE_ID)
    with BaseLevel(dest) as base:
        return base.get(TABLE, key)


def _fresh(path: Path) -> Callable[[], tuple[tuple[Path], dict[str, Any]]]:
    """A pedantic ``setup``: ``path`` removed (the last round's output), then handed over."""

    def setup() -> tuple[tuple[Path], dict[str, Any]]:
        if path.is_dir():
            shutil.rmtree(path)
        path.unlink(missing_ok=True)
        gc.collect()
        return (path,), {}

    return setup


@pytest.mark.parametrize("kind", KINDS)
def test_build(benchmark: Any, kind: str, built: Built, sizes: Sizes) -> None:
    snapshot = built.snapshots[1 if kind == "format1" else 2]
    dest, key = built.root / f"{kind}.mdb", _middle_key(built.keys)
    runs: list[tuple[Any, float, float]] = []
    images: list[int] = []

    def one(dest: Path) -> None:
        if kind == "verify":
            runs.append(timed(lambda: verify_snapshot(_FILES, snapshot, store_id=_STORE_ID)))
            return
        runs.append(timed(lambda: _extract_and_read(snapshot, dest, key)))
        images.append(dest.stat().st_size)  # after the clock stopped
        with BaseLevel(dest) as base:
            assert base.count(TABLE) == built.keys

    benchmark.pedantic(one, setup=_fresh(dest), rounds=sizes.repeats)
    _fresh(dest)()
    outs = [out for out, _, _ in runs]
    benchmark.extra_info.update(
        suite="snapshot-build",
        kind=kind,
        keys=built.keys,
        seconds=[s for _, s, _ in runs],
        cpu_seconds=[c for _, _, c in runs],
        snapshot_read_bytes=snapshot.stat().st_size,
        built_image_bytes=images[-1] if images else None,
        **built.info,
    )
    if kind == "verify":
        assert all(m.tables == {TABLE: built.keys} for m in outs)
    else:
        assert all(value is not None for value in outs)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server()
    yield server
    server.stop()


def _store(path: Path, keys: int) -> Path:
    """A store of the starting state of ``keys`` keys, compacted into one snapshot."""
    with statelog.open(path, durability="none") as st:  # set-up: the close syncs it
        for i, chunk in enumerate(Workload(keys, 1).initial_chunks()):
            st.commit(offsets={"orders-0": i + 1}, low_watermark_ms=i, put=chunk)
    result = compact(path, retain=2)
    assert result.snapshot is not None, result
    return result.snapshot


def test_restore(
    benchmark: Any, restore_keys: int, s3: S3Server, sizes: Sizes, tmp_path: Path
) -> None:
    keys, url = restore_keys, f"s3://{s3.new_bucket()}/build"
    client = RemoteClient.from_url(url, env=s3.env())
    snapshot = _store(tmp_path / "store", keys)
    shipped = ship(tmp_path / "store", url, client=client)
    key, walls = _middle_key(keys), list[tuple[float, float]]()

    def one(dest: Path) -> None:
        t0 = time.perf_counter()
        restore(url, dest, client=client)
        t1 = time.perf_counter()
        st = statelog.open(dest)
        try:
            found = st.get(key)
            walls.append((t1 - t0, time.perf_counter() - t1))
            assert found is not None and st.count() == keys
        finally:
            st.close()

    dest = tmp_path / "restored"
    benchmark.pedantic(one, setup=_fresh(dest), rounds=sizes.repeats)
    _fresh(dest)()
    benchmark.extra_info.update(
        suite="snapshot-restore",
        keys=keys,
        seconds=[r + o for r, o in walls],
        restore_seconds=[r for r, _ in walls],
        open_seconds=[o for _, o in walls],
        snapshot_bytes=snapshot.stat().st_size,
        bytes_shipped=shipped.bytes_uploaded,
    )
