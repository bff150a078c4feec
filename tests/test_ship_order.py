"""A ship lists the sealed log before it uploads a snapshot, and a fence keeps what landed.

| moment                                   | expected                                        |
|------------------------------------------|-------------------------------------------------|
| the first snapshot upload of a ship      | the manifest already lists every new segment    |
| a takeover during that snapshot upload   | FencedError; the segments listed stay in the    |
|                                          | bucket, the fenced snapshot uploads are deleted;|
|                                          | the new owner's store restores                  |
| a ship with segments and no snapshot     | one manifest write, as before                   |
| a ship with snapshots and no segment     | one manifest write                              |
| segments after a gap local retention left| listed with the snapshot that covers the gap:   |
|                                          | no version restores to less than the one before |
| a write that landed, its answer lost,    | FencedError; what the takeover's version lists  |
|   then a takeover from that version      | stays, the store's IDENTITY too (first ship)    |
| a snapshot upload that fails after the   | RemoteError; ``remote.json`` records the listed |
|   segments' write landed                 | segments and their epoch, no snapshot           |
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compactor import compact
from statelog.errors import FencedError, RemoteError
from statelog.log.segments import list_segments
from statelog.remote import lag, read_manifest, restore, ship
from statelog.remote import publish as publish_module
from statelog.remote.client import RemoteClient
from statelog.remote.errors import ConditionFailedError
from statelog.remote.record import load_record
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


def _last_epoch(remote: Remote, sid: Any) -> int:  # noqa: F811
    got = read_manifest(remote.client(), sid)
    assert got is not None
    return got.manifest.last_epoch


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


def _count_writes(
    client: RemoteClient, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[str]]:
    """The manifest writes (PUTs) of ``client``, and the ships' calls to write one."""
    put_if_match, writes, calls = client.put_if_match, [], []

    def count(key: str, data: bytes, etag: str) -> str:
        writes.append(key)
        return put_if_match(key, data, etag)

    def counted_commit(*args: Any, **kw: Any) -> Any:
        calls.append("commit")
        return real_commit(*args, **kw)

    real_commit = publish_module.commit
    client.put_if_match = count  # type: ignore[method-assign]
    monkeypatch.setattr(publish_module, "commit", counted_commit)
    return writes, calls


@pytest.mark.parametrize(
    "new, kind",
    [
        pytest.param(lambda a: commit_range(a, 120, 180), "/wal/", id="segments-alone"),
        # a snapshot of log already shipped: nothing new but it
        pytest.param(lambda a: compact(a, retain=5), "/snapshots/", id="snapshots-alone"),
    ],
)
def test_a_ship_of_one_kind_of_file_writes_the_manifest_once(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    new: Callable[[Path], object],
    kind: str,
) -> None:
    a = tmp_path / "a"
    commit_range(a, 0, 120)
    client = remote.client()
    ship(a, remote.url, client=client)
    new(a)
    writes, calls = _count_writes(client, monkeypatch)
    result = ship(a, remote.url, client=client)
    assert result.uploaded and all(kind in k for k in result.uploaded)
    assert len(writes) == 1 and len(calls) == 1


def test_segments_after_a_gap_wait_for_the_snapshot_that_covers_it(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    """Local retention deleted log that was never shipped: the new segments alone would
    follow a gap, and the snapshot before it would stop being a restore point."""
    a = tmp_path / "a"
    commit_range(a, 0, 200)
    compact(a, retain=1)
    ship(a, remote.url, client=remote.client(), retain=1)
    sid = StoreLayout(a).read_identity(FileLayer())
    before = read_manifest(remote.client(), sid)
    assert before is not None and before.manifest.last_epoch == 200
    commit_range(a, 200, 300)
    compact(a, retain=1)  # deletes the log after 200, never shipped
    commit_range(a, 300, 360)
    seen: list[int] = []
    client = remote.client()
    _on_first_snapshot_put(client, lambda key: seen.append(_last_epoch(remote, sid)))
    ship(a, remote.url, client=client)
    assert seen and seen[0] >= 200, "a manifest restoring to less than before was written"
    assert restore(remote.url, tmp_path / "c", client=remote.client()).epoch == 360


def _answer_lost_then_taken_over(remote: Remote, b: Path) -> RemoteClient:  # noqa: F811
    """A client whose manifest write lands, after which the store is taken over into
    ``b`` from that version, and whose answer is then lost (the retry is refused)."""
    client = remote.client()
    put_if_match = client.put_if_match

    def lost(key: str, data: bytes, etag: str) -> str:
        put_if_match(key, data, etag)  # lands
        restore(remote.url, b, client=remote.client(), take_over=True)
        raise ConditionFailedError(key, "the answer was lost")

    client.put_if_match = lost  # type: ignore[method-assign]
    return client


def test_a_write_whose_answer_was_lost_before_a_takeover_keeps_what_it_listed(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    """The manifest write lands, the answer is lost, the store is taken over from that
    version, and the retry is refused: the objects that version lists are the new
    owner's and stay."""
    a = tmp_path / "a"
    commit_range(a, 0, 120)
    ship(a, remote.url, client=remote.client())
    commit_range(a, 120, 200)
    b = tmp_path / "b"
    with pytest.raises(FencedError):
        ship(a, remote.url, client=_answer_lost_then_taken_over(remote, b))
    m = read_manifest(remote.client(), StoreLayout(b).read_identity(FileLayer()))
    assert m is not None and m.manifest.generation == 2
    bucket = set(remote.object_keys())
    assert all(f"shard/{e.key}" in bucket for e in m.manifest.objects), "a listed file was lost"
    assert restore(remote.url, tmp_path / "c", client=remote.client()).epoch == 200


def test_a_first_ship_fenced_after_its_write_landed_keeps_the_identity(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    """The first ship uploads the store's IDENTITY, which no entry lists but the
    manifest's hash of it names: a takeover built on the version that landed needs it."""
    a = tmp_path / "a"
    commit_range(a, 0, 120)
    b = tmp_path / "b"
    with pytest.raises(FencedError):
        ship(a, remote.url, client=_answer_lost_then_taken_over(remote, b))
    commit_range(b, 120, 150)
    ship(b, remote.url, client=remote.client())
    assert restore(remote.url, tmp_path / "c", client=remote.client()).epoch == 150


def test_segments_listed_before_a_failed_snapshot_upload_are_recorded(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    """``remote.json``, and the lag it gives, count what a landed write lists, even when
    the ship then fails uploading a snapshot."""
    a = _store_with_a_snapshot(tmp_path / "a")
    ship(a, remote.url, client=remote.client())
    shipped = {p.name for _, _, p in list_segments(a / WAL_DIR)}
    commit_range(a, 260, 320)
    compact(a, retain=5)  # a snapshot to ship, after the segments that extend the bucket's
    commit_range(a, 320, 340)
    sealed = {p.name for _, _, p in list_segments(a / WAL_DIR)} - shipped  # closed: all sealed
    client = remote.client()

    seen: list[str] = []

    def refuse(key: str) -> None:
        seen.append(key)
        raise RemoteError(f"{key}: refused (test)")

    _on_first_snapshot_put(client, refuse)
    with pytest.raises(RemoteError, match="refused"):
        ship(a, remote.url, client=client)
    assert seen and sealed and sealed <= _listed_segments(remote, a)
    rec = load_record(a)
    assert rec is not None
    recorded = {name.split("/")[-1] for name in rec.files if name.startswith(WAL_DIR)}
    assert sealed <= recorded
    assert not any(seen[0].endswith(name.split("/")[-1]) for name in rec.files)
    assert rec.last_epoch == 340 == _last_epoch(remote, StoreLayout(a).read_identity(FileLayer()))
    assert lag(a).epochs == 0
