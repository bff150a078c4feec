"""The remote tier on a shared directory (``file:///path``) instead of a bucket.

| case                                                  | what must hold                          |
|-------------------------------------------------------|-----------------------------------------|
| ship, then restore into an empty directory            | the same state, epoch for epoch         |
| the restore's check of its copy                       | decodes no value a second time, builds  |
|                                                       | no overlay, refuses a copy cut short    |
| a writer committing every 100 ms, daemon shipping,    | every commit acknowledged 2 s before    |
| host lost                                             | the loss is restored, state exact       |
| a takeover, then the old host ships again             | FencedError; nothing of it is written   |
| create twice; replace with a stale ETag               | ObjectExistsError; ConditionFailedError |
| a key leaving the root; a symlink or a FIFO planted   | refused with a typed error at once,     |
| as a file; an oversized or empty object               | nothing read outside the directory      |
| file:// URLs with a host, a relative or `..` path     | RemoteConfigError                       |
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import statelog
import statelog.storage.snapshots as snapshots_mod
from statelog.errors import FencedError, RemoteError, ResnapshotRequired
from statelog.remote import (
    ConditionFailedError,
    DirectoryClient,
    ObjectExistsError,
    RemoteClient,
    RemoteConfigError,
    RemoteIntegrityError,
    parse_remote_url,
    read_manifest,
    restore,
    ship,
)
from tests.helpers import flip_bit, truncate
from tests.test_remote import commit_range, state_of
from tests.test_remote_fencing import sid_of
from tests.test_ship_lag import _acks, _process, _wait, _writer

pytestmark = pytest.mark.timeout(120)


def _url(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'replica' / 'shard'}"


def test_ship_and_restore_through_a_directory(tmp_path: Path) -> None:
    url, src = _url(tmp_path), tmp_path / "src"
    commit_range(src, 0, 150)
    ship(src, url)
    commit_range(src, 150, 260)
    res = ship(src, url)
    assert res.last_epoch == 260
    got = restore(url, tmp_path / "dst")
    assert got.epoch == 260
    assert state_of(tmp_path / "dst") == state_of(src)
    assert isinstance(RemoteClient.from_url(url), DirectoryClient)


def test_a_restore_decodes_each_shipped_value_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each downloaded segment is checked record by record, values decoded; the recovery
    of the staging copy that follows reads only each record's head (epoch, offsets,
    watermark), never a whole record or a value again."""
    from statelog.format import records

    url, src = _url(tmp_path), tmp_path / "src"
    commit_range(src, 0, 40)
    ship(src, url)
    decoded: list[int] = []
    whole: list[int] = []
    real, real_whole = records.check_values, records._decode

    def counted(values: list[bytes]) -> None:
        decoded.append(len(values))
        real(values)

    def counted_whole(payload: Any, *a: Any, **kw: Any) -> Any:
        whole.append(1)
        return real_whole(payload, *a, **kw)

    monkeypatch.setattr(records, "check_values", counted)
    monkeypatch.setattr(records, "_decode", counted_whole)
    restore(url, tmp_path / "unchecked", check=False)
    once, records_once = sum(decoded), len(whole)
    assert once > 0 and records_once >= 40
    decoded.clear()
    whole.clear()
    got = restore(url, tmp_path / "dst")
    assert (sum(decoded), len(whole), got.epoch) == (once, records_once, 40)
    assert state_of(tmp_path / "dst") == state_of(src)


def test_the_restore_check_builds_no_overlay_and_still_finds_a_copy_that_stops_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recovery of the staging copy learns only the epoch it reaches (no table is
    built for it); a copy whose log stops before the plan's epoch is refused whole."""
    from statelog.state.live import LiveState

    restore_mod = sys.modules["statelog.remote.restore"]  # the package exports the function

    url, src = _url(tmp_path), tmp_path / "src"
    commit_range(src, 0, 150)
    ship(src, url)
    applied: list[int] = []
    real_apply = LiveState.apply

    def counted(self: LiveState, epoch: int, *a: Any, **kw: Any) -> None:
        applied.append(epoch)
        real_apply(self, epoch, *a, **kw)

    monkeypatch.setattr(LiveState, "apply", counted)
    assert restore(url, tmp_path / "dst").epoch == 150
    assert applied == []
    assert state_of(tmp_path / "dst") == state_of(src)  # the open replays the tail: built
    assert applied

    real_save = restore_mod.save_record

    def and_lose_a_segment(root: Path, *a: Any, **kw: Any) -> None:
        real_save(root, *a, **kw)
        wal = sorted((root / "wal").glob("*.wal"))
        assert len(wal) >= 3, wal
        wal[len(wal) // 2].unlink()  # a restore bug: the copy's log has a hole

    monkeypatch.setattr(restore_mod, "save_record", and_lose_a_segment)
    with pytest.raises(RemoteError, match="recovers to epoch"):
        restore(url, tmp_path / "short")
    assert not (tmp_path / "short").exists()


@pytest.mark.parametrize(
    ("case", "parsed", "shipped"),
    [
        pytest.param("built-here", False, True, id="built-by-this-process"),
        # Its image in base/ is intact: trusted as retention and the writer's open trust it.
        pytest.param("another-process", False, True, id="built-by-another-process-image-kept"),
        pytest.param("no-image", True, True, id="built-by-another-process-no-image"),
        pytest.param("damaged-since", True, False, id="built-here-then-rewritten-damaged"),
        pytest.param("truncated", True, False, id="built-here-then-cut-shorter-than-a-footer"),
    ],
)
def test_shipping_parses_a_snapshot_only_if_this_process_did_not_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, parsed: bool, shipped: bool
) -> None:
    """The daemon ships the snapshot its own pass wrote: hashed, not parsed again (a
    second of CPU at 1M keys); so is one whose stamped image is intact. Any other, or
    one changed since, is parsed."""
    from statelog.compaction.fold import compact
    from statelog.storage.whole_checks import forget_all

    url, src = _url(tmp_path), tmp_path / "src"
    commit_range(src, 0, 60)
    forget_all()
    snap = compact(src, retain=5).snapshot
    assert snap is not None
    if case in ("another-process", "no-image"):
        forget_all()
    if case == "no-image":
        shutil.rmtree(src / "base")
    if case == "damaged-since":
        flip_bit(snap, snap.stat().st_size // 2)
        os.utime(snap, ns=(0, snap.stat().st_mtime_ns + 10**9))  # coarse clocks: a new mtime
    if case == "truncated":
        truncate(snap, 10)
    calls: list[tuple[str, bool]] = []
    real = snapshots_mod.read_snapshot  # every snapshot check goes through it

    def spied(path: Path, store_id: Any, **kw: Any) -> Any:
        calls.append((path.name, kw.get("parse", True)))
        return real(path, store_id, **kw)

    monkeypatch.setattr(snapshots_mod, "read_snapshot", spied)
    ship(src, url)
    forget_all()
    assert calls == [(snap.name, parsed)]
    if not shipped:  # the log it covers is gone locally: nothing restorable was shipped
        with pytest.raises(ResnapshotRequired):
            restore(url, tmp_path / "dst")
        return
    got = restore(url, tmp_path / "dst")
    assert got.epoch == 60 and got.snapshot is not None and got.snapshot.endswith(snap.name)
    assert state_of(tmp_path / "dst") == state_of(src)


def test_host_loss_with_a_directory_replica(tmp_path: Path) -> None:
    url, store, acks = _url(tmp_path), tmp_path / "store", tmp_path / "acks"
    daemon = [
        sys.executable, "-m", "compactor", "--remote", url, "--interval", "1",
        "--max-ship-lag", "1s", str(store),
    ]  # fmt: skip
    with _process(_writer(store, acks, "--every", "0.1")) as writer:
        _wait("the first commit", lambda: acks.exists() and acks.read_text())
        with _process(daemon):
            time.sleep(6.0)
            lost_at = time.time()
            writer.send_signal(signal.SIGKILL)
    acked = _acks(acks)
    got = restore(url, tmp_path / "restored")
    with statelog.open(tmp_path / "restored", readonly=True) as st:
        e = st.epoch
        assert e == got.epoch
        assert dict(st.items()) == {f"k{i}": i for i in range(1, e + 1)}
    before = [ep for ep, when in acked if when <= lost_at - 2.0]
    assert before and e >= max(before), (e, max(before))


def test_a_zombie_on_a_directory_replica_is_fenced(tmp_path: Path) -> None:
    url, a, b = _url(tmp_path), tmp_path / "a", tmp_path / "b"
    commit_range(a, 0, 200)
    ship(a, url)
    assert restore(url, b, take_over=True).generation == 2
    client = RemoteClient.from_url(url)
    before = read_manifest(client, sid_of(a))
    listed = sorted(client.list_objects(""))
    commit_range(a, 200, 300)
    with pytest.raises(FencedError) as err:
        ship(a, url)
    assert (err.value.ours, err.value.current) == (1, 2)
    after = read_manifest(client, sid_of(a))
    assert before is not None and after is not None and after.etag == before.etag
    assert sorted(client.list_objects("")) == listed
    commit_range(b, 200, 260)
    assert ship(b, url).last_epoch == 260


def test_an_idle_ship_writes_nothing_and_still_finds_a_takeover(tmp_path: Path) -> None:
    """The daemon ships four times a second: with nothing new, neither the MANIFEST
    (a PUT on a bucket) nor remote.json (an fsync) is written, but the generation is
    still checked, so an idle zombie learns of a takeover at its next ship."""
    url, a, b = _url(tmp_path), tmp_path / "a", tmp_path / "b"
    commit_range(a, 0, 50)
    ship(a, url)
    client = RemoteClient.from_url(url)
    before = read_manifest(client, sid_of(a))
    record = (a / "remote.json").stat()
    for _ in range(3):
        assert ship(a, url).uploaded == ()
    after = read_manifest(client, sid_of(a))
    assert before is not None and after is not None and after.etag == before.etag
    now = (a / "remote.json").stat()
    assert (now.st_ino, now.st_mtime_ns) == (record.st_ino, record.st_mtime_ns)
    commit_range(a, 50, 60)  # something new: both written again
    assert ship(a, url).last_epoch == 60
    moved = read_manifest(client, sid_of(a))
    assert moved is not None and moved.etag != before.etag
    assert (a / "remote.json").stat().st_ino != record.st_ino
    assert restore(url, b, take_over=True).generation == 2
    with pytest.raises(FencedError):
        ship(a, url)  # idle, and fenced all the same


def test_conditional_writes(tmp_path: Path) -> None:
    c = DirectoryClient(tmp_path, where="file://test")
    first = c.put_new("s/MANIFEST", b"one")
    with pytest.raises(ObjectExistsError):
        c.put_new("s/MANIFEST", b"two")
    assert c.get("s/MANIFEST").data == b"one"
    second = c.put_if_match("s/MANIFEST", b"two", first)
    with pytest.raises(ConditionFailedError):
        c.put_if_match("s/MANIFEST", b"three", first)  # stale: another writer moved on
    assert c.get("s/MANIFEST").etag == second
    assert [k for k, _ in c.list_objects("s/")] == ["s/MANIFEST"]  # no temp or lock files
    c.delete("s/MANIFEST")
    c.delete("s/MANIFEST")  # absent: fine
    assert list(c.list_objects("")) == []


@pytest.mark.parametrize("key", ["../escape", "s/../../x", "/abs", "s//x", "s/.hidden", ""])
def test_a_key_leaving_the_root_is_refused(tmp_path: Path, key: str) -> None:
    c = DirectoryClient(tmp_path / "root", where="file://test")
    with pytest.raises(RemoteIntegrityError):
        c.put_new(key, b"x")
    assert not (tmp_path / "escape").exists() and not (tmp_path / "x").exists()


def test_hostile_files_in_the_directory(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    root = tmp_path / "root"
    (root / "s").mkdir(parents=True)
    (root / "s" / "MANIFEST").symlink_to(secret)
    (root / "s" / "big").write_bytes(b"x" * 100)
    (root / "s" / "empty").write_bytes(b"")
    c = DirectoryClient(root, where="file://test")
    with pytest.raises(RemoteError):
        c.get("s/MANIFEST")
    with pytest.raises(RemoteIntegrityError, match="over the limit"):
        c.get("s/big", limit=10)
    with pytest.raises(RemoteIntegrityError, match="empty"):
        c.get("s/empty")
    # A FIFO in place of an object: an open that waited for its writer would hang the
    # restore; it is refused at once instead, for a read and for a hash alike.
    os.mkfifo(root / "s" / "fifo")
    started = time.monotonic()
    with pytest.raises(RemoteIntegrityError, match="not a regular file"):
        c.get("s/fifo")
    with pytest.raises(RemoteIntegrityError, match="not a regular file"):
        c.head_sha256("s/fifo")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "url", ["file://host/x", "file://relative", "file:///a/../b", "file:///a//b", "file:///a?x=1"]
)
def test_bad_directory_urls_are_refused(url: str) -> None:
    with pytest.raises(RemoteConfigError):
        parse_remote_url(url)
    assert parse_remote_url("file:///mnt/replica/x").directory == "/mnt/replica/x"
