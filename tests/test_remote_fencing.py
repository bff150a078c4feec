"""Fencing zombie writers through the MANIFEST's conditional writes, as a table of failure modes.

| failure mode                         | expected                                      |
|--------------------------------------|-----------------------------------------------|
| old host ships after a takeover      | FencedError, manifest unchanged, uploads gone |
| old host's retention after it        | FencedError, nothing deleted                  |
| segment of a stale generation        | FencedError before any upload                 |
| two takeovers at the same moment     | distinct generations, the last owns it        |
| one ships while the other takes over | the zombie ends fenced; restore = winner      |
| copy of unknown provenance claims    | FencedError (ours=0)                          |
| local copy taken over, old-generation | adopted: shipped as the new generation,      |
|   segments sealed but unshipped      |   restore elsewhere reaches their last epoch  |
| old generation's segment created     | FencedError, nothing uploaded                 |
|   after the takeover (a zombie's)    |                                               |
| old generation after a higher one in | FencedError (rule H5), nothing uploaded       |
|   the adopted range                  |                                               |
| first claim and first ship race      | both hold generation 1, neither fenced        |
| remote.json deleted after the claim  | the same directory joins generation 1 again   |
"""

from __future__ import annotations

import logging
import shutil
import struct
import threading
import time
from pathlib import Path

import pytest

import statelog
from statelog.errors import FencedError
from statelog.remote import (
    acquire,
    apply_remote_retention,
    claim,
    read_manifest,
    restore,
    ship,
    take_over,
)
from statelog.remote.record import load_record
from statelog.remote.ship import header_generation
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from tests.s3server import Remote, remote, s3  # noqa: F401
from tests.test_remote import SEG, commit_range, state_of
from tests.test_remote_wiring import generation, stamp, wal


def sid_of(store: Path):  # type: ignore[no-untyped-def]
    return StoreLayout(store).read_identity(FileLayer())


def failover(tmp_path: Path, remote: Remote) -> tuple[Path, Path]:  # noqa: F811
    """Host A ships; host B restores and takes over. Returns (A, B)."""
    a = tmp_path / "a"
    commit_range(a, 0, 200)
    ship(a, remote.url, client=remote.client())
    b = tmp_path / "b"
    res = restore(remote.url, b, client=remote.client(), take_over=True)
    assert res.generation == 2
    return a, b


def test_zombie_ship_after_takeover_is_refused(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    a, b = failover(tmp_path, remote)
    client = remote.client()
    before = read_manifest(client, sid_of(a))
    keys_before = remote.object_keys()
    commit_range(a, 200, 300)  # the zombie keeps writing locally
    with pytest.raises(FencedError) as err:
        ship(a, remote.url, client=client)
    assert (err.value.ours, err.value.current) == (1, 2)
    after = read_manifest(client, sid_of(a))
    assert before is not None and after is not None and after.etag == before.etag
    assert remote.object_keys() == keys_before
    commit_range(b, 200, 260)
    assert ship(b, remote.url, client=client).last_epoch == 260


def test_zombie_retention_is_refused_and_deletes_nothing(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    a, _b = failover(tmp_path, remote)
    keys = remote.object_keys()
    with pytest.raises(FencedError):
        apply_remote_retention(remote.client(), sid_of(a), 1, retain=1)
    assert remote.object_keys() == keys


def test_segment_written_by_a_stale_generation_is_refused(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    """Forward check of the header field docs/remote.md specifies (bytes 52..59)."""
    _a, b = failover(tmp_path, remote)
    commit_range(b, 200, 260)
    seg = sorted((b / "wal").glob("*.wal"))[-1]
    data = bytearray(seg.read_bytes())
    from statelog.format.wal import SegmentHeader

    # As the writer will once it records generations: generation 1 in the
    # reserved bytes, header crc recomputed.
    struct.pack_into("<Q", data, 52, 1)
    head = SegmentHeader.unpack(bytes(data[:64]))
    packed = bytearray(head.pack())
    packed[52:60] = data[52:60]
    import crc32c

    from statelog.format.wal import mask

    struct.pack_into("<I", packed, 60, mask(crc32c.crc32c(bytes(packed[:60]))))
    data[:64] = packed
    seg.write_bytes(bytes(data))
    assert header_generation(bytes(data[:64])) == 1
    keys = remote.object_keys()
    with pytest.raises(FencedError):
        ship(b, remote.url, client=remote.client())
    assert remote.object_keys() == keys


def test_simultaneous_takeovers_get_distinct_generations(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    a = tmp_path / "a"
    commit_range(a, 0, 20)
    ship(a, remote.url, client=remote.client())
    sid = sid_of(a)
    got: list[int] = []
    barrier = threading.Barrier(6)

    def grab() -> None:
        client = remote.client()
        barrier.wait()
        got.append(acquire(remote.url, sid, client=client))

    threads = [threading.Thread(target=grab) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(2, 8))
    cur = read_manifest(remote.client(), sid)
    assert cur is not None and cur.manifest.generation == 7


def test_two_writers_racing_zombie_ends_fenced(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    a = tmp_path / "a"
    commit_range(a, 0, 150)
    ship(a, remote.url, client=remote.client())
    b = tmp_path / "b"
    outcome: dict[str, object] = {}

    def zombie() -> None:
        i = 150
        try:
            while i < 3000:
                commit_range(a, i, i + 20)
                i += 20
                ship(a, remote.url, client=remote.client())
        except FencedError as exc:
            outcome["zombie"] = exc

    def successor() -> None:
        # Fence first, then read: whatever the zombie committed before the
        # takeover is in the restored state, nothing after it is on the remote.
        res = restore(remote.url, b, client=remote.client(), take_over=True)
        outcome["gen"] = res.generation
        outcome["from"] = res.epoch
        commit_range(b, res.epoch, res.epoch + 80)
        outcome["ship"] = ship(b, remote.url, client=remote.client())

    tz = threading.Thread(target=zombie)
    ts = threading.Thread(target=successor)
    tz.start()
    ts.start()
    ts.join()
    tz.join()
    assert isinstance(outcome.get("zombie"), FencedError)
    assert outcome["gen"] == 2
    want = state_of(b)
    shutil.rmtree(a)
    shutil.rmtree(b)
    res = restore(remote.url, tmp_path / "c", client=remote.client())
    assert res.epoch == want["epoch"] == outcome["from"] + 80  # type: ignore[operator]
    assert state_of(tmp_path / "c") == want


def test_copy_of_unknown_provenance_cannot_claim(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    a = tmp_path / "a"
    commit_range(a, 0, 30)
    assert claim(a, remote.url, client=remote.client()) == 1
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    (copy / "remote.json").unlink()
    with pytest.raises(FencedError) as err:
        claim(copy, remote.url, client=remote.client())
    assert err.value.ours == 0
    # The owner restarts on its own host: still current.
    assert claim(a, remote.url, client=remote.client()) == 1
    with statelog.open(a) as st:
        assert st.epoch == 30
    # An explicit takeover of the copy fences the original owner.
    assert take_over(copy, remote.url, client=remote.client()) == 2
    with pytest.raises(FencedError):
        claim(a, remote.url, client=remote.client())


# -- a takeover adopts the local history its predecessor left unshipped --------


@pytest.fixture
def env(remote: Remote, monkeypatch: pytest.MonkeyPatch) -> Remote:  # noqa: F811
    """``remote`` with its connection in the environment, for ``statelog.open(remote=)``."""
    for k, v in remote.server.env().items():
        monkeypatch.setenv(k, v)
    return remote


def unshipped_old_generation(tmp_path: Path, remote: Remote) -> tuple[Path, list[Path]]:  # noqa: F811
    """Store A written as generation 1, partly shipped; returns A and its unshipped segments."""
    a = tmp_path / "a"
    with statelog.open(a, remote=remote.url, segment_bytes=SEG) as st:
        assert st.generation == 1
        for i in range(0, 250):
            st.commit(offsets={"orders-0": i}, low_watermark_ms=1_000 + i, put={f"k{i % 60}": i})
            if i == 100:
                ship(a, remote.url, client=remote.client())
    shipped = set(load_record(a).files)  # type: ignore[union-attr]
    left = [p for p in wal(a) if f"wal/{p.name}" not in shipped]
    assert len(left) >= 3 and all(generation(p) == 1 for p in left)
    return a, left


def test_takeover_adopts_unshipped_segments_of_the_old_generation(
    tmp_path: Path,
    env: Remote,
) -> None:
    a, left = unshipped_old_generation(tmp_path, env)
    assert take_over(a, env.url, client=env.client()) == 2
    res = ship(a, env.url, client=env.client())
    assert res.generation == 2 and res.last_epoch == 250
    assert {e.name for e in res.entries if e.kind == "wal"} == {p.name for p in left}
    assert all(e.key.split("/")[2] == "00000002" for e in res.entries)  # the new prefix
    with statelog.open(a, remote=env.url, segment_bytes=SEG) as st:  # goes on as 2
        assert st.generation == 2
        st.commit(offsets={"orders-0": 250}, low_watermark_ms=9_000, put={"x": 1})
    assert ship(a, env.url, client=env.client()).last_epoch == 251
    want = state_of(a)
    shutil.rmtree(a)
    got = restore(env.url, tmp_path / "c", client=env.client())
    assert got.epoch == got.shipped_epoch == 251
    assert state_of(tmp_path / "c") == want


@pytest.mark.parametrize("where", ["created after the takeover", "after a higher generation"])
def test_old_generation_segment_a_takeover_did_not_adopt_is_refused(
    tmp_path: Path, env: Remote, where: str
) -> None:
    a, left = unshipped_old_generation(tmp_path, env)
    if where == "after a higher generation":  # both in wal/ at the takeover: recovery cuts left[1]
        stamp(left[0], 2)
    assert take_over(a, env.url, client=env.client()) == 2
    if where == "created after the takeover":
        commit_range(a, 250, 330)  # as a writer of generation 1 still running would
        zombie = wal(a)[-1]
        stamp(zombie, 1)
    keys = env.object_keys()
    with pytest.raises(FencedError) as err:
        ship(a, env.url, client=env.client())
    assert err.value.ours == 1
    assert env.object_keys() == keys  # what the call uploaded was removed again
    assert not any("/wal/00000002/" in k for k in keys)


# -- the first manifest: the writer's claim and the daemon's first ship race --


def test_first_claim_and_first_ship_race_to_the_same_generation(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Repeated with the two sides started at staggered moments across the race window."""
    caplog.set_level(logging.INFO, logger="statelog.remote")
    for n in range(24):
        store = tmp_path / f"s{n}"
        commit_range(store, 0, 3)
        out: dict[str, object] = {}
        barrier = threading.Barrier(2)

        def side(
            name: str,
            delay: float,
            store: Path = store,
            out: dict[str, object] = out,
            barrier: threading.Barrier = barrier,
        ) -> None:
            client = remote.client()
            barrier.wait()
            time.sleep(delay)
            try:
                if name == "claim":
                    out[name] = claim(store, remote.url, client=client)
                else:
                    out[name] = ship(store, remote.url, client=client).generation
            except Exception as exc:  # the test reports whatever went wrong
                out[name] = exc

        lag = (n % 6) * 0.004
        ts = [
            threading.Thread(target=side, args=("claim", lag if n % 2 else 0.0)),
            threading.Thread(target=side, args=("ship", 0.0 if n % 2 else lag)),
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert out == {"claim": 1, "ship": 1}, f"round {n}: {out}"
        # Neither side was fenced: both go on as generation 1.
        assert claim(store, remote.url, client=remote.client()) == 1
        assert ship(store, remote.url, client=remote.client()).generation == 1
        rec = load_record(store)
        assert rec is not None and rec.generation == 1
    # The race was real: in some rounds both sides tried to create the manifest.
    assert any("event=generation_joined" in r.getMessage() for r in caplog.records)


def test_deleted_record_rejoins_generation_1_of_the_same_directory(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    a = tmp_path / "a"
    commit_range(a, 0, 30)
    assert claim(a, remote.url, client=remote.client()) == 1
    (a / "remote.json").unlink()  # docs/remote.md: costs only re-checking
    assert claim(a, remote.url, client=remote.client()) == 1
    (a / "remote.json").unlink()
    assert ship(a, remote.url, client=remote.client()).generation == 1
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    (copy / "remote.json").unlink()
    with pytest.raises(FencedError) as err:  # a copy is another directory
        ship(copy, remote.url, client=remote.client())
    assert err.value.ours == 0
