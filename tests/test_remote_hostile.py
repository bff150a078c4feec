"""The bucket is untrusted: what whoever can write it may try, and what restore does about it.

| attack on the bucket                             | expected                                     |
|--------------------------------------------------|----------------------------------------------|
| entry named ``../x``, ``/abs``, with NUL, or not | RemoteIntegrityError before any download;    |
|   spelled as the store spells it; a bad kind or  |   nothing written, no destination            |
|   key; an unknown encoding, an encoded snapshot, |                                              |
|   a decoded size over 1024 times the object's or |                                              |
|   over 256 MiB,                                  |                                              |
|   an encoded entry in a format-1 manifest, one   |                                              |
|   naming no decoded hash in a format-2 manifest, |                                              |
|   a decoded hash that is not hex                 |                                              |
| the same through ``statelog.open(remote=URL)``   | the same                                     |
| a symlink where the staging directory goes       | NotAStoreError; the link's target untouched  |
| a symlink planted inside staging mid-restore     | NotAStoreError; nothing written through it   |
| a store id spelled another way in the listing    | not taken for a store                        |
| a segment far larger than the manifest says      | at most N + 1 bytes read, at most N written  |
| a huge ``IDENTITY`` (its hash re-computed)       | refused before it is read whole              |
| 80,000 manifest entries; walking back past       | planned in well under a second (linear)      |
|   40,000 rejected snapshots                      |                                              |
| signed bucket, an object altered and the         | RemoteIntegrityError, nothing downloaded     |
|   manifest re-hashed by someone without the key  |                                              |
| signed bucket, the right key                     | restores                                     |
| a ``garbage`` key outside the store              | retention refuses; the object stays          |
| a key configured, the manifest unsigned or       | RemoteIntegrityError                         |
|   signed with another key                        |                                              |
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest

import statelog
import statelog.cli
from statelog.compaction.fold import compact
from statelog.errors import NotAStoreError, StatelogError
from statelog.remote import (
    RemoteClient,
    RemoteConfigError,
    RemoteIntegrityError,
    apply_remote_retention,
    read_manifest,
    restore,
    ship,
)
from statelog.remote.checks import IDENTITY_LIMIT, MAX_ENCODED_FILE
from statelog.remote.entry import Entry
from statelog.remote.manifest import ENCODED_FORMAT, FORMAT, Manifest
from statelog.remote.plan import Planner, plan_restore
from tests.s3server import Remote, remote, s3  # noqa: F401
from tests.test_remote import commit_range, res_id, state_of

KEY = "9f" * 32
OTHER_KEY = "a0" * 32


def keyed(remote: Remote, key: str | None = KEY) -> RemoteClient:  # noqa: F811
    env = remote.server.env()
    if key is not None:
        env["STATELOG_REMOTE_KEY"] = key
    return RemoteClient.from_url(remote.url, env=env, retry=remote.client().retry)


def small_store(tmp_path: Path, remote: Remote, client: RemoteClient | None = None) -> Path:  # noqa: F811
    """A shipped store: one snapshot at 150, segments after it up to 250."""
    src = tmp_path / "src"
    client = client or remote.client()
    commit_range(src, 0, 150)
    compact(src, retain=5)
    commit_range(src, 150, 250)
    ship(src, remote.url, client=client)
    return src


def raw_manifest(remote: Remote, sid: uuid.UUID) -> dict[str, Any]:  # noqa: F811
    b = remote.server.boto()
    obj = b.get_object(Bucket=remote.bucket, Key=f"shard/{sid}/MANIFEST")  # type: ignore[attr-defined]
    body = obj["Body"].read().rstrip(b"\n").rpartition(b"\nsha256:")[0]
    doc: dict[str, Any] = json.loads(body)
    return doc


def forge_manifest(
    remote: Remote,  # noqa: F811
    sid: uuid.UUID,
    change: Callable[[dict[str, Any]], None],
) -> None:
    """Rewrite the MANIFEST as someone without the key would: edit, re-hash, put back."""
    doc = raw_manifest(remote, sid)
    change(doc)
    body = json.dumps(doc, separators=(",", ":")).encode()
    data = body + b"\nsha256:" + hashlib.sha256(body).hexdigest().encode() + b"\n"
    remote.server.boto().put_object(  # type: ignore[attr-defined]
        Bucket=remote.bucket, Key=f"shard/{sid}/MANIFEST", Body=data
    )


def put_object(remote: Remote, key: str, data: bytes, sha: str | None = None) -> None:  # noqa: F811
    meta = {"sha256": sha} if sha else {}
    remote.server.boto().put_object(  # type: ignore[attr-defined]
        Bucket=remote.bucket, Key=f"shard/{key}", Body=data, Metadata=meta
    )


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (links not followed), with the bytes of each file."""
    out: set[str] = set()
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            body = p.read_bytes().hex() if p.is_file() and not p.is_symlink() else ""
            out.add(f"{p.relative_to(root)}:{body[:64]}")
    return out


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Body bytes read per object key, counted at obstore's answers (``<key>``: bytes)."""
    counts: dict[str, int] = {}
    real = obstore.get

    class Counted:
        def __init__(self, res: Any, key: str) -> None:
            self.res, self.key = res, key
            self.meta, self.attributes = res.meta, res.attributes
            counts.setdefault(key, 0)

        def bytes(self) -> Any:
            data = self.res.bytes()
            counts[self.key] += len(data)
            return data

        def stream(self, **kw: Any) -> Iterator[Any]:
            for chunk in self.res.stream(**kw):
                counts[self.key] += len(memoryview(chunk))
                yield chunk

    def get(store: Any, key: str, **kw: Any) -> Any:
        return Counted(real(store, key, **kw), key)

    monkeypatch.setattr(obstore, "get", get)
    yield counts


# -- names from the manifest -------------------------------------------------------------


def _first_wal(doc: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = next(e for e in doc["objects"] if e["kind"] == "wal")
    return entry


def _set(field: str, value: Callable[[dict[str, Any], Path], str], kind: str = "wal") -> Any:
    def change(doc: dict[str, Any], outside: Path) -> None:
        e = next(e for e in doc["objects"] if e["kind"] == kind)
        e[field] = value(e, outside)

    return change


def _encoded_snapshot(doc: dict[str, Any], outside: Path) -> None:
    e = next(e for e in doc["objects"] if e["kind"] == "snapshot")
    e["encoding"], e["file_size"], e["file_sha256"] = "zstd", e["size"], e["sha256"]


def _format_1(doc: dict[str, Any], outside: Path) -> None:
    doc["format"] = FORMAT


def _hashless_in_format_2(doc: dict[str, Any], outside: Path) -> None:
    doc["format"] = ENCODED_FORMAT  # which requires each encoded entry's decoded hash
    _first_wal(doc).pop("file_sha256", None)


def _past_the_cap(doc: dict[str, Any], outside: Path) -> None:
    e = _first_wal(doc)  # within the ratio, one byte past the largest encoded file
    e["size"], e["file_size"] = 1 << 20, MAX_ENCODED_FILE + 1


HOSTILE = {
    "dotdot": _set("name", lambda e, o: "../x"),
    "absolute": _set("name", lambda e, o: str(o / "planted.wal")),
    "wal-dotdot": _set("name", lambda e, o: "wal/../../x"),
    "nul": _set("name", lambda e, o: e["name"][:-4] + "\0.wal"),
    "upper-case": _set("name", lambda e, o: "A" + e["name"][1:]),  # hex digits are lower-case
    "trailing-newline": _set("name", lambda e, o: e["name"] + "\n"),
    "snapshot-dotdot": _set("name", lambda e, o: "../../" + e["name"], kind="snapshot"),
    "segment-named-as-snapshot": _set("name", lambda e, o: e["name"][:-4] + ".snap"),
    "kind": _set("kind", lambda e, o: "../wal"),
    "key-dotdot": _set("key", lambda e, o: e["key"].replace("/wal/", "/wal/../../")),
    "encoding-unknown": _set("encoding", lambda e, o: "gzip"),
    "encoded-snapshot": _encoded_snapshot,
    "decodes-to-a-disk": _set("file_size", lambda e, o: 1025 * e["size"]),
    "encoded-in-format-1": _format_1,
    "no-decoded-hash-in-format-2": _hashless_in_format_2,
    "decoded-hash-not-hex": _set("file_sha256", lambda e, o: "z" * 64),
    "decodes-past-the-cap": _past_the_cap,
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_manifest_names_outside_the_grammar_are_refused_before_any_download(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    downloads: dict[str, int],
    attack: str,
) -> None:
    src = small_store(tmp_path, remote)
    sid = res_id(src)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_bytes(b"keep me")
    forge_manifest(remote, sid, lambda doc: HOSTILE[attack](doc, outside))
    before = tree(tmp_path / "outside"), sorted(p.name for p in tmp_path.iterdir())
    downloads.clear()
    with pytest.raises(RemoteIntegrityError) as err:
        restore(remote.url, tmp_path / "dst", client=remote.client())
    assert err.value.hint and "grammar" in err.value.hint
    assert [k for k in downloads if not k.endswith("/MANIFEST")] == []  # no object requested
    assert (tree(tmp_path / "outside"), sorted(p.name for p in tmp_path.iterdir())) == before
    assert not (tmp_path / "dst").exists()
    assert not (tmp_path / "planted.wal").exists()


def test_open_with_remote_refuses_the_same_names(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = small_store(tmp_path, remote)
    forge_manifest(remote, res_id(src), lambda doc: _first_wal(doc).update(name="../../x.wal"))
    for k, v in remote.server.env().items():
        monkeypatch.setenv(k, v)
    with pytest.raises(RemoteIntegrityError):
        statelog.open(tmp_path / "dst", remote=remote.url)
    assert not list((tmp_path / "dst").iterdir()) if (tmp_path / "dst").exists() else True
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "dst") == ["src"]


def test_a_store_id_spelled_another_way_is_not_a_store(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    src = small_store(tmp_path, remote)
    sid = res_id(src)
    put_object(remote, f"{str(sid).upper()}/MANIFEST", b"not ours")
    put_object(remote, f"{{{sid}}}/MANIFEST", b"not ours")
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert res.store_id == sid and res.epoch == 250


# -- symlinks ----------------------------------------------------------------------------


def test_a_symlink_where_staging_goes_is_refused(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    src = small_store(tmp_path, remote)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_bytes(b"keep me")
    (tmp_path / ".dst.restoring").symlink_to(victim)
    gen = raw_manifest(remote, res_id(src))["generation"]
    with pytest.raises(NotAStoreError):
        restore(remote.url, tmp_path / "dst", client=remote.client())
    with pytest.raises(NotAStoreError):  # refused before the takeover, too
        restore(remote.url, tmp_path / "dst", client=remote.client(), take_over=True)
    assert raw_manifest(remote, res_id(src))["generation"] == gen
    assert tree(victim) == {f"precious:{b'keep me'.hex()}"}
    assert (tmp_path / ".dst.restoring").is_symlink()
    assert not (tmp_path / "dst").exists()


def test_a_dangling_symlink_as_destination_is_refused(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    small_store(tmp_path, remote)
    (tmp_path / "dst").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(NotAStoreError):
        restore(remote.url, tmp_path / "dst", client=remote.client())
    assert not (tmp_path / "elsewhere").exists()


def test_a_symlinked_parent_is_resolved_once(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    small_store(tmp_path, remote)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    res = restore(remote.url, tmp_path / "link" / "dst", client=remote.client())
    assert res.dest == tmp_path.resolve() / "real" / "dst"
    assert state_of(tmp_path / "real" / "dst")["epoch"] == 250


def test_a_symlink_planted_inside_staging_redirects_nothing(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    small_store(tmp_path, remote)
    victim = tmp_path / "victim"
    victim.mkdir()
    client = remote.client()
    real_get = client.get

    def get(key: str, **kw: Any) -> Any:
        if key.endswith("/IDENTITY"):  # mid-restore: replace staging/wal by a link
            wal = tmp_path / ".dst.restoring" / "wal"
            wal.rmdir()
            wal.symlink_to(victim)
        return real_get(key, **kw)

    client.get = get  # type: ignore[method-assign]
    with pytest.raises(NotAStoreError):
        restore(remote.url, tmp_path / "dst", client=client)
    assert list(victim.iterdir()) == []
    assert not (tmp_path / "dst").exists() and not (tmp_path / ".dst.restoring").exists()


# -- sizes -------------------------------------------------------------------------------


def test_an_oversized_segment_is_read_to_at_most_one_byte_past_its_size(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    downloads: dict[str, int],
) -> None:
    src = small_store(tmp_path, remote)
    cur = read_manifest(remote.client(), res_id(src))
    assert cur is not None
    victim = max(cur.manifest.segments, key=lambda e: e.first_lsn)
    body = (src / "wal" / victim.name).read_bytes()
    put_object(remote, victim.key, body + b"\0" * (8 << 20), sha=victim.sha256)
    downloads.clear()
    with pytest.raises(RemoteIntegrityError):
        restore(remote.url, tmp_path / "strict", client=remote.client(), strict=True)
    assert downloads[victim.key] <= victim.size + 1
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert [k for k, _ in res.rejected] == [victim.key]
    assert (
        res.epoch == victim.first_lsn - 1 and not (tmp_path / "dst" / "wal" / victim.name).exists()
    )
    out = io.BytesIO()
    with pytest.raises(RemoteIntegrityError):
        remote.client().get_into(victim.key, out, size=victim.size)
    assert len(out.getvalue()) <= victim.size


def test_a_huge_identity_is_refused_before_it_is_read_whole(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    downloads: dict[str, int],
) -> None:
    src = small_store(tmp_path, remote)
    sid = res_id(src)
    huge = b'{"store_id": "' + b" " * (16 << 20) + b'"}'
    sha = hashlib.sha256(huge).hexdigest()
    put_object(remote, f"{sid}/IDENTITY", huge, sha=sha)
    forge_manifest(remote, sid, lambda doc: doc.update(identity_sha256=sha))
    downloads.clear()
    with pytest.raises(RemoteIntegrityError) as err:
        restore(remote.url, tmp_path / "dst", client=remote.client())
    assert "IDENTITY" in str(err.value)
    assert downloads[f"{sid}/IDENTITY"] <= IDENTITY_LIMIT + 1
    assert not (tmp_path / "dst").exists()


# -- planning ----------------------------------------------------------------------------


def _entries(segments: int, snapshots: int) -> Manifest:
    sid = str(uuid.UUID(int=7))
    objs: list[Entry] = []
    for i in range(segments):  # one chain: segment i holds LSNs 2i+1, 2i+2
        objs.append(
            Entry(f"{sid}/wal/00000001/{i:016x}", "wal", f"{i:016x}", "0" * 64, 1, 1,
                  sequence=i + 1, first_lsn=2 * i + 1, prev_crc=i, last_lsn=2 * i + 2,
                  end_crc=i + 1)
        )  # fmt: skip
    for j in range(snapshots):  # each at the end of segment j: it links to segment j + 1
        objs.append(
            Entry(f"{sid}/snapshots/00000001/{j:016x}", "snapshot", f"{j:016x}", "0" * 64, 1,
                  1, last_lsn=2 * j + 2, end_crc=j + 1, epoch=2 * j + 2)
        )  # fmt: skip
    return Manifest(FORMAT, sid, 1, "w", "w", 0, objects=tuple(objs))


@pytest.fixture
def deadline() -> Iterator[Callable[[float], None]]:
    """``deadline(s)``: fail the test if it is still running ``s`` seconds later."""

    def expired(signum: int, frame: object) -> None:
        raise AssertionError("planning took longer than its bound: not linear")

    old = signal.signal(signal.SIGALRM, expired)
    yield lambda s: signal.setitimer(signal.ITIMER_REAL, s)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def test_80000_entries_are_planned_in_linear_time(deadline: Callable[[float], None]) -> None:
    m = _entries(79_000, 1_000)
    deadline(10.0)
    started = time.perf_counter()
    plan = plan_restore(m)
    took = time.perf_counter() - started
    assert plan is not None and plan.snapshot is not None
    assert plan.snapshot.last_lsn == 2_000 and plan.epoch == 158_000
    assert len(plan.segments) == 79_000 - 1_000
    assert took < 2.0


def test_walking_back_past_40000_rejected_snapshots_is_linear(
    deadline: Callable[[float], None],
) -> None:
    m = _entries(40_000, 40_000)
    deadline(10.0)
    started = time.perf_counter()
    asked: list[str] = []
    plan = Planner(m).walk(lambda snap: asked.append(snap.key) is not None)
    took = time.perf_counter() - started
    assert len(asked) == 40_000 and len(set(asked)) == 40_000  # each asked once, newest first
    assert plan is not None and plan.snapshot is None and plan.epoch == 80_000
    assert took < 2.0


# -- authenticated shipping --------------------------------------------------------------


def test_a_signed_bucket_restores_with_the_key(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    src = small_store(tmp_path, remote, keyed(remote))
    sig = raw_manifest(remote, res_id(src))["signature"]
    assert len(sig) == 64
    res = restore(remote.url, tmp_path / "dst", client=keyed(remote))
    assert res.epoch == 250 and not res.rejected
    assert state_of(tmp_path / "dst") == state_of(src)


def test_an_altered_object_in_a_signed_bucket_is_refused(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    downloads: dict[str, int],
) -> None:
    src = small_store(tmp_path, remote, keyed(remote))
    sid = res_id(src)
    cur = read_manifest(keyed(remote), sid)
    assert cur is not None
    victim = max(cur.manifest.segments, key=lambda e: e.first_lsn)
    forged = (src / "wal" / victim.name).read_bytes() + b"\0" * 8
    sha = hashlib.sha256(forged).hexdigest()
    put_object(remote, victim.key, forged, sha=sha)

    def rehash(doc: dict[str, Any]) -> None:
        e = next(e for e in doc["objects"] if e["key"] == victim.key)
        e.update(sha256=sha, size=len(forged))

    forge_manifest(remote, sid, rehash)
    downloads.clear()
    with pytest.raises(RemoteIntegrityError) as err:
        restore(remote.url, tmp_path / "dst", client=keyed(remote))
    assert "signature" in str(err.value) and err.value.hint and "key" in err.value.hint
    assert [k for k in downloads if not k.endswith("/MANIFEST")] == []
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("shipped_with", [None, OTHER_KEY])
def test_a_key_refuses_an_unsigned_or_foreign_signed_manifest(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    shipped_with: str | None,
) -> None:
    small_store(tmp_path, remote, keyed(remote, shipped_with))
    with pytest.raises(RemoteIntegrityError) as err:
        restore(remote.url, tmp_path / "dst", client=keyed(remote))
    assert ("not signed" if shipped_with is None else "does not verify") in str(err.value)
    assert not (tmp_path / "dst").exists()
    # without a key, integrity by hashes only: as before
    assert restore(remote.url, tmp_path / "plain", client=remote.client()).epoch == 250


@pytest.mark.parametrize("bad", ["not hex", "abcd"])
def test_a_malformed_key_is_a_config_error(remote: Remote, bad: str) -> None:  # noqa: F811
    with pytest.raises(RemoteConfigError) as err:
        keyed(remote, bad)
    assert isinstance(err.value, StatelogError) and err.value.hint


def test_cli_restore_of_a_hostile_manifest_exits_2_with_a_hint(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = small_store(tmp_path, remote)
    forge_manifest(
        remote, res_id(src), lambda doc: _first_wal(doc).update(name=str(tmp_path / "planted.wal"))
    )
    for k, v in remote.server.env().items():
        monkeypatch.setenv(k, v)
    assert statelog.cli.main(["restore", remote.url, str(tmp_path / "dst")]) == 2
    assert "grammar" in capsys.readouterr().err
    assert not (tmp_path / "dst").exists()
    monkeypatch.setenv("STATELOG_REMOTE_KEY", "abc")
    assert statelog.cli.main(["restore", remote.url, str(tmp_path / "dst")]) == 3


def test_retention_deletes_no_garbage_key_outside_the_store(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    src = small_store(tmp_path, remote)
    sid = res_id(src)
    put_object(remote, "elsewhere/precious", b"keep me")
    forge_manifest(remote, sid, lambda doc: doc.update(garbage=["elsewhere/precious"]))
    gen = raw_manifest(remote, sid)["generation"]
    with pytest.raises(RemoteIntegrityError):
        apply_remote_retention(remote.client(), sid, gen, retain=1)
    assert "shard/elsewhere/precious" in remote.object_keys()


def test_open_with_remote_and_a_key_restores_only_a_signed_bucket(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = small_store(tmp_path, remote)  # shipped without a key
    for k, v in remote.server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("STATELOG_REMOTE_KEY", KEY)
    with pytest.raises(RemoteIntegrityError, match="not signed"):
        statelog.open(tmp_path / "dst", remote=remote.url)
    assert not (tmp_path / "dst").exists() or not list((tmp_path / "dst").iterdir())
    forge_manifest(remote, res_id(src), lambda doc: doc.update(signature="0" * 64))
    with pytest.raises(RemoteIntegrityError, match="does not verify"):
        statelog.open(tmp_path / "dst", remote=remote.url)
