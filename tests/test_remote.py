"""The remote tier against a real S3-protocol server on loopback, as a table of failure modes.

| failure mode                   | expected                                         |
|--------------------------------|--------------------------------------------------|
| host lost after shipping       | restore elsewhere reaches the last shipped epoch |
| active segment at ship time    | never shipped; restore stops at the last seal    |
| newest remote snapshot damaged | walked past; older snapshot, longer replay       |
| remote segment damaged         | stop at the last good epoch (strict: raise)      |
| nothing restorable             | ResnapshotRequired, no destination created       |
| retention vs a pinned restore  | the pinned object survives; deleted once freed   |
| a shipped key written again    | ObjectExistsError, the object unchanged          |
| server down for a moment       | retried with backoff, the ship completes         |
| server down for good           | RemoteUnavailableError after the retries         |
| destination not empty          | NotAStoreError before any request                |
| remote.json updated at once    | serialised: no update lost, never torn           |
|   by the writer and the daemon |                                                  |
"""

from __future__ import annotations

import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.errors import NotAStoreError, ResnapshotRequired
from statelog.remote import (
    ObjectExistsError,
    RemoteIntegrityError,
    RemoteUnavailableError,
    RetryPolicy,
    lag,
    read_manifest,
    restore,
    ship,
)
from statelog.remote.pins import remote_pin
from tests.s3server import Remote, S3Server, remote, s3  # noqa: F401

SEG = 4096


def commit_range(path: Path, start: int, stop: int, *, close: bool = True) -> Any:
    """Commits ``start..stop-1`` (puts, and a delete every 7th) into the store at ``path``."""
    st = statelog.open(path, segment_bytes=SEG)
    for i in range(start, stop):
        st.commit(
            offsets={"orders-0": i, "orders-1": i // 2},
            low_watermark_ms=1_000 + i,
            put={f"k{i % 60}": {"v": i, "pad": "x" * 20}},
            delete=[f"k{(i + 13) % 60}"] if i % 7 == 0 else [],
        )
    if close:
        st.close()
        return None
    return st


def state_of(path: Path) -> dict[str, Any]:
    with statelog.open(path, readonly=True) as st:
        return {
            "epoch": st.epoch,
            "offsets": st.offsets,
            "wm": st.low_watermark_ms,
            "items": list(st.items()),
        }


def shipped_store(tmp_path: Path, remote: Remote, rounds: int = 3) -> Path:  # noqa: F811
    """A store with ``rounds`` snapshots and segments between them, every step shipped."""
    src = tmp_path / "src"
    client = remote.client()
    for r in range(rounds):
        commit_range(src, r * 150, (r + 1) * 150)
        ship(src, remote.url, client=client)
        compact(src, retain=5)
        ship(src, remote.url, client=client)
    commit_range(src, rounds * 150, rounds * 150 + 100)
    ship(src, remote.url, client=client)
    return src


def test_host_lost_restore_elsewhere_reaches_last_shipped_epoch(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    src = shipped_store(tmp_path, remote)
    want = state_of(src)
    shutil.rmtree(src)  # the host is gone
    res = restore(remote.url, tmp_path / "elsewhere", client=remote.client())
    assert res.epoch == res.shipped_epoch == want["epoch"] == 550
    assert res.snapshot is not None and not res.rejected and len(res.lost_epochs) == 0
    assert state_of(tmp_path / "elsewhere") == want
    with statelog.open(tmp_path / "elsewhere") as st:  # a writer continues the log
        assert st.recovery.epoch == 550
        assert st.commit(offsets={"orders-0": 10_000}, low_watermark_ms=5_000) == 551


def test_active_segment_is_never_shipped(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    src = tmp_path / "src"
    commit_range(src, 0, 120)
    st = commit_range(src, 120, 125, close=False)  # 5 commits in the active segment
    try:
        active = sorted((src / "wal").glob("*.wal"))[-1].name
        res = ship(src, remote.url, client=remote.client())
        assert res.last_epoch == 120
        assert not [k for k in remote.object_keys() if k.endswith(active)]
        # The lag tells the truth: five acknowledged commits are only on this host.
        now = lag(src)
        assert now.epochs == 5 and now.bytes > 0 and now.seconds >= 0
    finally:
        st.close()
    assert lag(src).files == 1  # the seal on close made one more segment shippable
    restored = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert restored.epoch == 120
    assert state_of(tmp_path / "dst")["epoch"] == 120


def test_damaged_newest_remote_snapshot_is_walked_past(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    src = shipped_store(tmp_path, remote)
    want = state_of(src)
    client = remote.client()
    cur = read_manifest(client, res_id(src))
    assert cur is not None
    newest = cur.manifest.snapshots[0]
    remote.damage(newest.key)
    res = restore(remote.url, tmp_path / "dst", client=client)
    assert [k for k, _ in res.rejected] == [newest.key]
    assert res.snapshot == cur.manifest.snapshots[1].key
    assert res.epoch == want["epoch"]
    assert state_of(tmp_path / "dst") == want
    assert newest.key in [
        k.removeprefix("shard/") for k in remote.object_keys()
    ]  # kept as evidence


def res_id(store: Path) -> Any:
    from statelog.storage.fileio import FileLayer
    from statelog.storage.layout import StoreLayout

    return StoreLayout(store).read_identity(FileLayer())


def test_damaged_remote_segment_stops_at_last_good_epoch(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    src = shipped_store(tmp_path, remote)
    client = remote.client()
    cur = read_manifest(client, res_id(src))
    assert cur is not None
    snap = cur.manifest.snapshots[0]
    after = sorted(
        (e for e in cur.manifest.segments if e.first_lsn > snap.last_lsn), key=lambda e: e.first_lsn
    )
    assert len(after) >= 2
    victim = after[1]
    remote.damage(victim.key)
    # strict: refuse, and leave no destination behind
    with pytest.raises(RemoteIntegrityError):
        restore(remote.url, tmp_path / "strict", client=client, strict=True)
    assert not (tmp_path / "strict").exists()
    res = restore(remote.url, tmp_path / "dst", client=client)
    good = after[0].last_lsn
    assert res.epoch == good
    assert res.lost_epochs == range(good + 1, 551)
    assert state_of(tmp_path / "dst")["epoch"] == good


def test_nothing_restorable_raises_resnapshot_required(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    src = tmp_path / "src"
    commit_range(src, 0, 300)
    compact(src, retain=1)  # the early log is gone locally before it was ever shipped
    ship(src, remote.url, client=remote.client())
    cur = read_manifest(remote.client(), res_id(src))
    assert cur is not None
    remote.damage(cur.manifest.snapshots[0].key)
    with pytest.raises(ResnapshotRequired):
        restore(remote.url, tmp_path / "dst", client=remote.client())
    assert not (tmp_path / "dst").exists()
    assert not list(tmp_path.glob(".dst.restoring"))


def test_retention_never_deletes_a_pinned_object(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    src = tmp_path / "src"
    client = remote.client()
    for r in range(3):
        commit_range(src, r * 150, (r + 1) * 150)
        compact(src, retain=5)
        ship(src, remote.url, client=client)
    sid = res_id(src)
    cur = read_manifest(client, sid)
    assert cur is not None
    oldest = cur.manifest.snapshots[-1].key
    with remote_pin(client, sid, [oldest], ttl=timedelta(minutes=5), purpose="test restore"):
        commit_range(src, 450, 600)
        compact(src, retain=5)
        res = ship(src, remote.url, client=client, retain=1)
        assert res.retention is not None
        assert oldest in res.retention.deferred and oldest not in res.retention.deleted
        assert f"shard/{oldest}" in remote.object_keys()
        assert len(res.retention.deleted) >= 2  # unpinned old snapshots did go
    again = ship(src, remote.url, client=client, retain=1)
    assert again.retention is not None and oldest in again.retention.deleted
    assert f"shard/{oldest}" not in remote.object_keys()
    assert restore(remote.url, tmp_path / "dst", client=client).epoch == 600


def test_shipped_key_is_never_overwritten(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    client.put_new("x/immutable", b"first")
    with pytest.raises(ObjectExistsError):
        client.put_new("x/immutable", b"second")
    assert client.get("x/immutable").data == b"first"


def test_server_down_briefly_is_retried(tmp_path: Path, remote: Remote, s3: S3Server) -> None:  # noqa: F811
    src = tmp_path / "src"
    commit_range(src, 0, 200)
    client = remote.client()
    s3.stop()
    restarter = threading.Timer(0.7, s3.start)
    restarter.start()
    try:
        t0 = time.monotonic()
        res = ship(src, remote.url, client=client)
        assert time.monotonic() - t0 >= 0.5  # it really waited for the server
    finally:
        restarter.join()
    assert res.last_epoch == 200
    assert restore(remote.url, tmp_path / "dst", client=client).epoch == 200


def test_server_down_for_good_raises_unavailable(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    s3: S3Server,  # noqa: F811
) -> None:
    src = tmp_path / "src"
    commit_range(src, 0, 50)
    client = remote.client(RetryPolicy(attempts=3, initial=timedelta(milliseconds=10)))
    s3.stop()
    try:
        with pytest.raises(RemoteUnavailableError):
            ship(src, remote.url, client=client)
    finally:
        s3.start()
    assert not (src / "remote.json").exists()  # nothing recorded as shipped


def test_restore_into_non_empty_directory_is_refused(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "precious").write_text("keep")
    with pytest.raises(NotAStoreError):
        restore(remote.url, dst, client=remote.client())
    assert sorted(p.name for p in dst.iterdir()) == ["precious"]


def test_concurrent_record_updates_are_serialised(tmp_path: Path) -> None:
    from statelog.remote.record import Shipped, ShipRecord, load_record, update_record

    store = tmp_path / "s"
    commit_range(store, 0, 3)
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def add(who: int) -> None:
        barrier.wait()
        for i in range(25):
            entry = Shipped(f"k{who}-{i}", "0" * 64, i, i)

            def change(
                cur: ShipRecord | None, name: str = f"wal/{who}-{i}", entry: Shipped = entry
            ) -> ShipRecord:
                base = cur or ShipRecord(url="s3://b/p", store_id="x")
                return msgspec.structs.replace(base, files={**base.files, name: entry})

            try:
                update_record(store, change)
            except BaseException as exc:  # collected for the assertion
                errors.append(exc)

    threads = [threading.Thread(target=add, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rec = load_record(store)
    assert rec is not None and len(rec.files) == 6 * 25  # no read-modify-write lost another's
    assert not (store / "remote.json.tmp").exists()
