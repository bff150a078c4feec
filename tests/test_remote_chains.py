"""Delta snapshot chains through the remote tier, as a table of failure modes.

| failure mode                                  | expected                                     |
|-----------------------------------------------|----------------------------------------------|
| full + deltas shipped, host lost              | restore downloads the chain; state exact     |
| a middle delta's object bit-flipped           | walk back past it; state exact at the epoch  |
| a manifest entry names a parent not listed    | walk back past it (planned, nothing fetched) |
| a parent's digest in the manifest forged      | walk back past it                            |
| a child names a parent digest the parent lacks| walk back past it                            |
| an old manifest without the chain fields      | restores (a delta listed as full: refused)   |
| remote retention keeping 1 or 2 restore points| every kept chain complete; restore exact     |
| retention with an old chain pinned            | the pinned link deferred, never deleted      |
| chain fields outside the grammar              | MANIFEST refused before any object is read   |
| a signed MANIFEST's chain field rewritten     | signature fails: refused, nothing restored   |
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.remote import RemoteIntegrityError, read_manifest, restore, ship
from statelog.remote.checks import chain_problem
from statelog.remote.client import RemoteClient
from statelog.remote.entry import Entry
from statelog.remote.manifest import Manifest
from statelog.remote.pins import remote_pin
from statelog.remote.plan import Planner
from statelog.storage import image_cache
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from tests.s3server import Remote, S3Server, remote, s3  # noqa: F401

SEG = 4096
KEYS = 300


@dataclass
class Shipped:
    """A shipped store and the model of its state after every epoch."""

    src: Path
    sid: uuid.UUID
    states: dict[int, dict[str, Any]]

    @property
    def last(self) -> int:
        return max(self.states)


def _commit(st: Any, model: dict[str, Any], states: dict[int, dict[str, Any]], i: int) -> None:
    put = {f"k{(i * 7 + j) % KEYS}": {"v": i, "j": j} for j in range(3)}
    delete = [f"k{(i * 11) % KEYS}"] if i % 5 == 0 else []
    delete = [k for k in delete if k not in put]
    epoch = st.commit(offsets={"p0": i}, low_watermark_ms=i, put=put, delete=delete)
    model.update(put)
    for k in delete:
        model.pop(k, None)
    states[epoch] = dict(model)


def chained_store(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    *,
    rounds: int = 5,
    max_chain: int = 8,
    client: RemoteClient | None = None,
) -> Shipped:
    """A store of ``KEYS`` keys, then ``rounds`` small rounds each compacted into a delta
    (a full snapshot every ``max_chain + 1`` passes) and shipped."""
    src = tmp_path / "src"
    model: dict[str, Any] = {}
    states: dict[int, dict[str, Any]] = {}
    client = client or remote.client()
    with statelog.open(src, segment_bytes=SEG) as st:
        st.commit(offsets={"p0": 0}, low_watermark_ms=0, put={f"k{j}": j for j in range(KEYS)})
        model.update({f"k{j}": j for j in range(KEYS)})
        states[st.epoch] = dict(model)
    for r in range(rounds + 1):
        with statelog.open(src, segment_bytes=SEG) as st:
            for i in range(r * 40 + 1, r * 40 + 41):
                _commit(st, model, states, i)
        full = r % (max_chain + 1) == 0  # a chain at its length would be rebased instead
        compact(src, retain=50, max_chain=0 if full else max_chain, full_ratio=10.0)
        ship(src, remote.url, client=client)
    with statelog.open(src, segment_bytes=SEG) as st:  # a tail after the last snapshot
        for i in range(10_000, 10_030):
            _commit(st, model, states, i)
    ship(src, remote.url, client=client)
    sid = StoreLayout(src).read_identity(FileLayer())
    return Shipped(src, sid, states)


def state_of(path: Path) -> tuple[int, dict[str, Any]]:
    with statelog.open(path, readonly=True) as st:
        return st.epoch, dict(st.items())


def manifest_of(remote: Remote, sid: uuid.UUID) -> Manifest:  # noqa: F811
    cur = read_manifest(remote.client(), sid)
    assert cur is not None
    return cur.manifest


def newest_chain(m: Manifest) -> tuple[Entry, ...]:
    chain = Planner(m).chain_of(m.snapshots[0])
    assert not isinstance(chain, str), chain
    return chain


def forge(remote: Remote, sid: uuid.UUID, change: Callable[[dict[str, Any]], None]) -> None:  # noqa: F811
    """Rewrite the MANIFEST as a bucket writer would: edit its JSON, re-hash, put back."""
    b = remote.server.boto()
    key = f"shard/{sid}/MANIFEST"
    body = b.get_object(Bucket=remote.bucket, Key=key)["Body"].read()  # type: ignore[attr-defined]
    doc = json.loads(body.rstrip(b"\n").rpartition(b"\nsha256:")[0])
    change(doc)
    raw = json.dumps(doc, separators=(",", ":")).encode()
    data = raw + b"\nsha256:" + hashlib.sha256(raw).hexdigest().encode() + b"\n"
    b.put_object(Bucket=remote.bucket, Key=key, Body=data)  # type: ignore[attr-defined]


def _entry(doc: dict[str, Any], key: str) -> dict[str, Any]:
    (found,) = (o for o in doc["objects"] if o["key"] == key)
    return found


def test_full_and_deltas_ship_and_restore_exactly(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    shipped = chained_store(tmp_path, remote)
    m = manifest_of(remote, shipped.sid)
    chain = newest_chain(m)
    assert [e.depth for e in chain] == list(range(len(chain))) and len(chain) >= 4
    for parent, child in itertools.pairwise(chain):  # each link recorded whole
        assert (child.parent, child.parent_sha256) == (parent.name, parent.digest)
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert res.snapshot == chain[-1].key and not res.rejected and not res.lost_epochs
    assert res.epoch == shipped.last
    assert state_of(tmp_path / "dst") == (res.epoch, shipped.states[res.epoch])
    assert sorted(p.name for p in (tmp_path / "dst" / "snapshots").iterdir()) == sorted(
        e.name for e in chain
    )  # the chain and nothing else
    with statelog.open(tmp_path / "dst") as st:  # a writer opens on the chain and goes on
        assert st.recovery.snapshot is not None and st.recovery.snapshot.name == chain[-1].name
        assert st.commit(offsets={"p0": 20_000}, low_watermark_ms=20_000) == res.epoch + 1


def test_the_restore_check_maps_the_chain_images_where_they_are_built(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The images built while the chain was verified are the check's base, not copied
    (at 1M keys the copy was most of a restore), and the first open maps them too."""
    shipped = chained_store(tmp_path, remote, rounds=3)
    copies: list[str] = []
    real = image_cache.shutil.copyfile
    monkeypatch.setattr(
        image_cache.shutil, "copyfile", lambda a, b: copies.append(str(a)) or real(a, b)
    )
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert copies == [] and res.epoch == shipped.last
    images = sorted((tmp_path / "dst" / "base").glob("*.mdb"))
    assert len(images) == len(newest_chain(manifest_of(remote, shipped.sid)))
    caplog.clear()  # only what the first open logs
    with caplog.at_level(logging.INFO, logger="statelog"), statelog.open(tmp_path / "dst") as st:
        assert dict(st.items()) == shipped.states[res.epoch]
    assert sum("event=image_reused" in r.getMessage() for r in caplog.records) == len(images)
    assert sorted((tmp_path / "dst" / "base").glob("*.mdb")) == images  # none built again


def _flip(remote: Remote, sid: uuid.UUID, victim: Entry) -> None:  # noqa: F811
    remote.damage(victim.key)


def _unlist(remote: Remote, sid: uuid.UUID, victim: Entry) -> None:  # noqa: F811
    forge(
        remote, sid, lambda d: d.update(objects=[o for o in d["objects"] if o["key"] != victim.key])
    )


def _forge_digest(remote: Remote, sid: uuid.UUID, victim: Entry) -> None:  # noqa: F811
    """The victim's digest and its child's parent digest both forged, consistently: the
    manifest plans, the downloaded file's footer digest then disagrees."""

    def change(d: dict[str, Any]) -> None:
        _entry(d, victim.key)["digest"] = "ab" * 32
        for o in d["objects"]:
            if o.get("parent") == victim.name:
                o["parent_sha256"] = "ab" * 32

    forge(remote, sid, change)


def _forge_child_link(remote: Remote, sid: uuid.UUID, victim: Entry) -> None:  # noqa: F811
    """The victim names a parent digest its parent does not have."""
    forge(remote, sid, lambda d: _entry(d, victim.key).update(parent_sha256="cd" * 32))


@pytest.mark.parametrize(
    "breaks",
    [_flip, _unlist, _forge_digest, _forge_child_link],
    ids=["bit-flip", "parent-not-listed", "parent-digest-forged", "child-link-forged"],
)
def test_a_broken_middle_link_walks_back_to_an_older_restore_point(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    breaks: Callable[[Remote, uuid.UUID, Entry], None],
) -> None:
    shipped = chained_store(tmp_path, remote)
    chain = newest_chain(manifest_of(remote, shipped.sid))
    victim = chain[2]
    breaks(remote, shipped.sid, victim)
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert res.snapshot == chain[1].key  # the newest restore point whose chain holds
    rejected = dict(res.rejected)
    newer = [e.key for e in chain[3:]]
    assert set(newer) <= set(rejected)  # every restore point the broken link carried
    assert all(rejected[k].startswith("chain:") for k in newer)
    assert res.epoch == shipped.last  # the log from the older point replays the rest
    assert state_of(tmp_path / "dst") == (res.epoch, shipped.states[res.epoch])
    assert sorted(p.name for p in (tmp_path / "dst" / "snapshots").iterdir()) == sorted(
        e.name for e in chain[:2]
    )  # no snapshot is left without its chain


_CHAIN_FIELDS = ("digest", "parent", "parent_sha256", "depth")


@pytest.mark.parametrize("max_chain", [0, 8], ids=["full-only", "with-deltas"])
def test_an_old_manifest_without_chain_fields_restores(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    max_chain: int,
) -> None:
    shipped = chained_store(tmp_path, remote, max_chain=max_chain)
    m = manifest_of(remote, shipped.sid)
    fulls = [e for e in m.snapshots if e.depth == 0]

    def strip(d: dict[str, Any]) -> None:
        for o in d["objects"]:
            for f in _CHAIN_FIELDS:
                o.pop(f, None)

    forge(remote, shipped.sid, strip)
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    # An old manifest lists every snapshot as full: a delta is refused once downloaded
    # (its chain is unknown), and the restore walks back to the newest full snapshot.
    assert res.snapshot == fulls[0].key
    deltas = {e.key for e in m.snapshots if e.depth > 0 and e.last_lsn > fulls[0].last_lsn}
    assert {k for k, _ in res.rejected} == deltas
    assert res.epoch == shipped.last
    assert state_of(tmp_path / "dst") == (res.epoch, shipped.states[res.epoch])


def _kept_chains_complete(m: Manifest, keys: set[str]) -> list[tuple[Entry, ...]]:
    """Every snapshot listed has its whole chain listed and in the bucket; the chains."""
    planner = Planner(m)
    chains = []
    for snap in m.snapshots:
        chain = planner.chain_of(snap)
        assert not isinstance(chain, str), chain
        assert {e.key for e in chain} <= keys
        chains.append(chain)
    return chains


@pytest.mark.parametrize("retain", [1, 2])
def test_remote_retention_keeps_every_kept_chain_whole(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    retain: int,
) -> None:
    # Nine passes, chains of three: F D D F D D F D D. Keeping the newest 1 or 2
    # snapshots by themselves would drop the full snapshot they rest on.
    shipped = chained_store(tmp_path, remote, rounds=8, max_chain=2)
    before = manifest_of(remote, shipped.sid)
    points = before.snapshots[:retain]
    assert [e.depth for e in points] == [2, 1][:retain]
    want = {e.key for e in newest_chain(before)}
    res = ship(shipped.src, remote.url, client=remote.client(), retain=retain)
    assert res.retention is not None and res.retention.deleted
    after = manifest_of(remote, shipped.sid)
    in_bucket = {k.removeprefix("shard/") for k in remote.object_keys()}
    assert {e.key for e in after.snapshots} == want
    _kept_chains_complete(after, in_bucket)
    assert not set(res.retention.deleted) & in_bucket
    restored = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert restored.snapshot == points[0].key and not restored.rejected
    assert state_of(tmp_path / "dst") == (shipped.last, shipped.states[shipped.last])


def test_remote_retention_defers_a_pinned_link(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    shipped = chained_store(tmp_path, remote, rounds=7, max_chain=2)
    client = remote.client()
    old = manifest_of(remote, shipped.sid).snapshots[-1]  # the oldest full snapshot
    assert old.depth == 0
    with remote_pin(client, shipped.sid, [old.key], ttl=timedelta(minutes=5), purpose="test"):
        res = ship(shipped.src, remote.url, client=client, retain=1)
        assert res.retention is not None and old.key in res.retention.deferred
        assert f"shard/{old.key}" in remote.object_keys()
    after = manifest_of(remote, shipped.sid)
    _kept_chains_complete(after, {k.removeprefix("shard/") for k in remote.object_keys()})
    again = ship(shipped.src, remote.url, client=client, retain=1)
    assert again.retention is not None and old.key in again.retention.deleted


_SHA = "0" * 64
_SID = uuid.UUID(int=7)
_NAME = f"{3:016x}-{30:016x}.snap"
_PARENT = f"{2:016x}-{20:016x}.snap"


def _snap(**chain: Any) -> Entry:
    return Entry(f"{_SID}/snapshots/00000001/{_NAME}", "snapshot", _NAME, _SHA, 1, 1,
                 last_lsn=30, epoch=3, **chain)  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (_snap(), None),
        (_snap(digest=_SHA), None),
        (_snap(digest=_SHA, parent=_PARENT, parent_sha256=_SHA, depth=1), None),
        (_snap(digest="AB" * 32), "digest"),
        (_snap(parent=_PARENT, parent_sha256=_SHA), "depth 0"),
        (_snap(parent="../" + _PARENT, parent_sha256=_SHA, depth=1), "parent"),
        (_snap(parent=_NAME, parent_sha256=_SHA, depth=1), "does not sort before"),
        (_snap(parent=f"{4:016x}-{40:016x}.snap", parent_sha256=_SHA, depth=1), "sort"),
        (_snap(parent=_PARENT, parent_sha256="x", depth=1), "parent digest"),
        (_snap(parent=_PARENT, parent_sha256=_SHA, depth=10_000), "depth 10000"),
        (Entry(f"{_SID}/wal/00000001/a", "wal", "a", _SHA, 1, 1, depth=1), "segment"),
    ],
)
def test_chain_fields_follow_the_grammar(entry: Entry, problem: str | None) -> None:
    got = chain_problem(entry)
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got


def test_a_manifest_with_a_bad_chain_field_is_refused(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    shipped = chained_store(tmp_path, remote, rounds=1)
    victim = newest_chain(manifest_of(remote, shipped.sid))[-1]
    forge(remote, shipped.sid, lambda d: _entry(d, victim.key).update(parent="../../IDENTITY"))
    with pytest.raises(RemoteIntegrityError, match="parent"):
        restore(remote.url, tmp_path / "dst", client=remote.client())
    assert not (tmp_path / "dst").exists()


def test_the_signature_covers_the_chain_fields(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    env = {**remote.server.env(), "STATELOG_REMOTE_KEY": "5e" * 32}
    keyed = RemoteClient.from_url(remote.url, env=env, retry=remote.client().retry)
    shipped = chained_store(tmp_path, remote, rounds=2, client=keyed)
    victim = newest_chain(manifest_of(remote, shipped.sid))[-1]
    assert victim.depth == 2  # signed manifests carry the chain fields too
    forge(remote, shipped.sid, lambda d: _entry(d, victim.key).update(depth=1))
    with pytest.raises(RemoteIntegrityError, match="signature"):
        restore(remote.url, tmp_path / "dst", client=keyed)
    assert not (tmp_path / "dst").exists()


def _link(epoch: int, **chain: Any) -> Entry:
    name = f"{epoch:016x}-{epoch * 10:016x}.snap"
    return Entry(f"{_SID}/snapshots/00000001/{name}", "snapshot", name, _SHA, 1, 1,
                 last_lsn=epoch * 10, epoch=epoch, **chain)  # fmt: skip


_FULL = _link(1, digest="11" * 32)
_D1 = _link(2, digest="22" * 32, parent=_FULL.name, parent_sha256="11" * 32, depth=1)


@pytest.mark.parametrize(
    ("objects", "want"),
    [
        ((_FULL, _D1, _link(3, parent=_D1.name, parent_sha256="22" * 32, depth=2)), 3),
        ((_link(1), _link(2, parent=_FULL.name, parent_sha256="11" * 32, depth=1)), 2),
        ((_D1, _link(3, parent=_D1.name, parent_sha256="22" * 32, depth=2)), "not in the manifest"),
        ((_FULL, _D1, _link(3, parent=_D1.name, parent_sha256="33" * 32, depth=2)), "names"),
        ((_FULL, _D1, _link(3, parent=_D1.name, parent_sha256="22" * 32, depth=3)), "depth"),
    ],
    ids=["whole", "old-parent-without-digest", "parent-missing", "digest-differs", "depth-off"],
)
def test_the_planner_follows_a_chain_by_name_digest_and_depth(
    objects: tuple[Entry, ...], want: int | str
) -> None:
    m = Manifest(1, str(_SID), 1, "w", "w", 0, objects=objects)
    got = Planner(m).chain_of(m.snapshots[0])
    if isinstance(want, int):
        assert not isinstance(got, str) and [e.epoch for e in got] == list(range(1, want + 1))
    else:
        assert isinstance(got, str) and got.startswith("chain:") and want in got
