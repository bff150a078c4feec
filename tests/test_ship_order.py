"""A ship lists the sealed log before it uploads a snapshot, and a fence keeps what landed.

| moment                                   | expected                                        |
|------------------------------------------|-------------------------------------------------|
| the first snapshot upload of a ship      | the manifest already lists every new segment    |
| a takeover during that snapshot upload   | FencedError; the segments listed stay in the    |
|                                          | bucket, the fenced snapshot uploads are deleted;|
|                                          | the new owner's store restores                  |
| a ship with segments and no snapshot     | one manifest write, as before                   |
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compactor import compact
from statelog.errors import FencedError
from statelog.log.segments import list_segments
from statelog.remote import read_manifest, restore, ship
from statelog.remote.client import RemoteClient
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import WAL_DIR, StoreLayout
from tests.s3server import Remote, remote, s3  # noqa: F401
from tests.test_remote import commit_range


def _store_with_a_snapshot(root: Path) -> Path:
    """Sealed segments and a snapshot, none shipped yet."""
    commit_range(root, 0, 200)
    compact(root, retain=5)
    commit_range(root, 200, 260)
    return root


def _on_first_snapshot_put(client: RemoteClient, then: Callable[[str], None]) -> list[str]:
    """Call ``then(key)`` just before the client's first upload of a snapshot; returns
    the keys of the snapshots it uploaded."""
    put_new, seen = client.put_new, []

    def spy(key: str, data: bytes, **kw: Any) -> str:
        if "/snapshots/" in key:
            if not seen:
                then(key)
            seen.append(key)
        return put_new(key, data, **kw)

    client.put_new = spy  # type: ignore[method-assign]
    return seen


def _listed_segments(remote: Remote, store: Path) -> set[str]:  # noqa: F811
    sid = StoreLayout(store).read_identity(FileLayer())
    m = read_manifest(remote.client(), sid).manifest
    return {e.name for e in m.objects if e.kind == "wal"}


def test_every_new_segment_is_listed_before_a_snapshot_is_uploaded(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    a = _store_with_a_snapshot(tmp_path / "a")
    sealed = {p.name for _, _, p in list_segments(a / WAL_DIR)[:-1]}  # never the active one
    listed_then: set[str] = set()
    client = remote.client()
    uploaded = _on_first_snapshot_put(
        client, lambda key: listed_then.update(_listed_segments(remote, a))
    )
    result = ship(a, remote.url, client=client)
    assert uploaded, "the ship uploaded no snapshot: nothing was tested"
    assert sealed and sealed <= listed_then
    assert set(result.uploaded) >= set(uploaded)


def test_a_takeover_during_the_snapshot_upload_keeps_the_listed_segments(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    a = _store_with_a_snapshot(tmp_path / "a")
    ship(a, remote.url, client=remote.client())
    commit_range(a, 260, 330)
    compact(a, retain=5)  # a second snapshot, which the next ship uploads last
    commit_range(a, 330, 360)
    b = tmp_path / "b"
    client = remote.client()
    taken: list[Any] = []

    def take_over(key: str) -> None:
        taken.append(restore(remote.url, b, client=remote.client(), take_over=True))

    uploaded = _on_first_snapshot_put(client, take_over)
    with pytest.raises(FencedError):
        ship(a, remote.url, client=client)
    assert uploaded
    bucket = set(remote.object_keys())
    assert not {f"shard/{k}" for k in uploaded} & bucket, "a fenced snapshot upload was left"
    sid = StoreLayout(b).read_identity(FileLayer())
    m = read_manifest(remote.client(), sid).manifest
    assert m.generation == 2
    assert all(f"shard/{e.key}" in bucket for e in m.objects), "the new owner lost a listed file"
    # The takeover found the whole sealed log listed (through the first snapshot and
    # the log after it), though the second snapshot was not listed yet.
    assert taken[0].epoch == 360
    got = restore(remote.url, tmp_path / "c", client=remote.client())
    assert got.epoch == 360


def test_a_ship_of_segments_alone_writes_the_manifest_once(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    a = tmp_path / "a"
    commit_range(a, 0, 120)
    client = remote.client()
    put_if_match, writes = client.put_if_match, []

    def count(key: str, data: bytes, etag: str) -> str:
        writes.append(key)
        return put_if_match(key, data, etag)

    client.put_if_match = count  # type: ignore[method-assign]
    ship(a, remote.url, client=client)
    ship(a, remote.url, client=client)  # the first ship created the manifest; this one adds
    commit_range(a, 120, 180)
    writes.clear()
    result = ship(a, remote.url, client=client)
    assert result.uploaded and len(writes) == 1
