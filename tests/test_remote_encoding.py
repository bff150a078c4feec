"""Sealed segments travel zstd-compressed (``statelog.remote.encoding``), and nothing
about the compressed form can be used against a restore.

| what the bucket holds                                 | expected                              |
|-------------------------------------------------------|---------------------------------------|
| what the shipper wrote: each segment one zstd frame,  | restores exactly; fewer bytes shipped |
|   its entry naming the file's size (format 3)         |                                       |
| an object that decodes past the file size it names    | that segment refused at the first     |
|   (a bomb, the manifest re-hashed by someone)         |   byte past it; the restore stops     |
|                                                       |   before it                           |
| an object whose decoded segment does not verify       | refused the same way                  |
| a bucket a format-2 shipper wrote (each entry naming  | restores exactly; an object decoding  |
|   the decoded file's SHA-256)                         |   to other bytes than named refused   |
| a bucket an older shipper wrote (format 1, raw)       | restores exactly                      |
| a segment compressing past the ratio readers accept   | shipped as it is; restores exactly    |
| an older shipper's raw upload whose manifest commit   | adopted, listed as the raw object it  |
|   never landed, at the key a compressed one would use |   is; restores exactly                |
| the same, compressed at another level (another        | adopted, listed as the object it is;  |
|   zstandard version)                                  |   restores exactly                    |
| a store that lost its ship record, its segments       | not shipped again, whatever level     |
|   listed as objects compressed at another level       |   compressed them; a listed file of   |
|                                                       |   other bytes stops the ship          |
| manifest grammar: unknown encoding, an encoded        | refused before any download           |
|   snapshot, a file size over 1024 times the object,   |   (``tests/test_remote_hostile.py``)  |
|   an encoded entry in a format-1 manifest             |                                       |
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import pytest
import zstandard

import statelog
from statelog.remote import read_manifest, restore, ship
from statelog.remote.client import RemoteClient
from statelog.remote.entry import Entry
from statelog.remote.manifest import BOUND_FORMAT, ENCODED_FORMAT, FORMAT
from statelog.remote.publish import with_entries
from statelog.remote.record import RECORD
from statelog.remote.url import StoreKeys
from tests.s3server import Remote, remote, s3  # noqa: F401
from tests.test_remote import commit_range, res_id, state_of
from tests.test_remote_hostile import forge_manifest, put_object, small_store


def _wal(remote: Remote, sid: uuid.UUID) -> list[Entry]:  # noqa: F811
    cur = read_manifest(remote.client(), sid)
    assert cur is not None
    return sorted(cur.manifest.segments, key=lambda e: e.first_lsn)


def test_segments_ship_compressed_and_restore_exactly(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    src = small_store(tmp_path, remote)
    cur = read_manifest(remote.client(), res_id(src))
    assert cur is not None and cur.manifest.format == BOUND_FORMAT
    segments = cur.manifest.segments
    assert segments and all(e.encoding == "zstd" for e in segments)
    for e in segments:
        raw = (src / "wal" / e.name).read_bytes()
        obj = remote.client().get(e.key).data
        assert (e.file_size, e.file_sha256, e.size) == (len(raw), "", len(obj))
        assert e.sha256 == _sha(obj) and zstandard.decompress(obj) == raw
        assert e.size < e.file_size
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert res.epoch == 250 and state_of(tmp_path / "dst") == state_of(src)
    for e in segments:
        assert (tmp_path / "dst" / "wal" / e.name).read_bytes() == (
            src / "wal" / e.name
        ).read_bytes()


def _replace_newest(remote: Remote, sid: uuid.UUID, body: bytes) -> Entry:  # noqa: F811
    """Put ``body`` at the newest segment's key and re-hash its entry, as someone
    without a shipping key could; the entry's file size and hash are left as they were."""
    return _replace_like(remote, sid, _wal(remote, sid)[-1], body)


def _replace_like(remote: Remote, sid: uuid.UUID, victim: Entry, body: bytes) -> Entry:  # noqa: F811
    """:func:`_replace_newest` for the segment of ``victim``."""
    sha = hashlib.sha256(body).hexdigest()
    put_object(remote, victim.key, body, sha=sha)

    def change(doc: dict[str, Any]) -> None:
        e = next(e for e in doc["objects"] if e["key"] == victim.key)
        e["sha256"], e["size"] = sha, len(body)

    forge_manifest(remote, sid, change)
    return victim


def test_an_object_decoding_past_its_file_size_is_refused(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    src = small_store(tmp_path, remote)
    sid = res_id(src)
    raw = (src / "wal" / _wal(remote, sid)[-1].name).read_bytes()
    bomb = zstandard.ZstdCompressor(level=19).compress(raw + b"\0" * (64 << 20))
    assert len(bomb) * 1024 > len(raw)  # within the ratio the grammar allows
    victim = _replace_newest(remote, sid, bomb)
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    [(key, why)] = res.rejected
    assert key == victim.key and f"past the {victim.file_size} bytes" in why
    assert res.epoch == victim.first_lsn - 1
    assert state_of(tmp_path / "dst")["epoch"] == victim.first_lsn - 1
    assert sorted(p.name for p in (tmp_path / "dst" / "wal").iterdir() if "tmp" in p.name) == []


def _flipped_newest(src: Path, remote: Remote, sid: uuid.UUID) -> Entry:  # noqa: F811
    raw = bytearray((src / "wal" / _wal(remote, sid)[-1].name).read_bytes())
    raw[len(raw) // 2] ^= 1  # same size, other bytes
    return _replace_newest(remote, sid, zstandard.ZstdCompressor().compress(bytes(raw)))


def test_an_object_whose_decoded_segment_does_not_verify_is_refused(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    src = small_store(tmp_path, remote)
    victim = _flipped_newest(src, remote, res_id(src))
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert [k for k, _ in res.rejected] == [victim.key]
    assert "checksum mismatch" in res.rejected[0][1] and res.epoch == victim.first_lsn - 1
    assert state_of(tmp_path / "dst")["epoch"] == victim.first_lsn - 1


def _named_decoded_hashes(src: Path, remote: Remote, sid: uuid.UUID) -> None:  # noqa: F811
    """The manifest as a format-2 shipper wrote it: each encoded entry names the file's
    SHA-256."""
    files = {e.key: (src / "wal" / e.name).read_bytes() for e in _wal(remote, sid)}

    def format_2(doc: dict[str, Any]) -> None:
        doc["format"] = ENCODED_FORMAT
        for e in doc["objects"]:
            if e["key"] in files:
                e["file_sha256"] = _sha(files[e["key"]])

    forge_manifest(remote, sid, format_2)


def test_a_bucket_a_format_2_shipper_wrote_restores_and_its_hashes_are_checked(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    src = small_store(tmp_path, remote)
    sid = res_id(src)
    _named_decoded_hashes(src, remote, sid)
    cur = read_manifest(remote.client(), sid)
    assert cur is not None and cur.manifest.format == ENCODED_FORMAT
    assert all(e.file_sha256 for e in cur.manifest.segments)
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert res.epoch == 250 and not res.rejected and state_of(tmp_path / "dst") == state_of(src)
    commit_range(src, 250, 300)  # the next ship raises the format, never lowers it
    ship(src, remote.url, client=remote.client())
    cur = read_manifest(remote.client(), sid)
    assert cur is not None and cur.manifest.format == BOUND_FORMAT
    assert with_entries(cur.manifest, [], "").format == BOUND_FORMAT
    hashed = [e for e in cur.manifest.segments if e.file_sha256]
    assert hashed and len(hashed) < len(cur.manifest.segments)  # the old entries kept
    res = restore(remote.url, tmp_path / "later", client=remote.client())
    assert res.epoch == 300 and state_of(tmp_path / "later") == state_of(src)
    victim = _flipped_newest(src, remote, sid)
    res = restore(remote.url, tmp_path / "again", client=remote.client())
    assert [k for k, _ in res.rejected] == [victim.key]
    assert "checksum mismatch" in res.rejected[0][1] and res.epoch == victim.first_lsn - 1
    older = next(e for e in reversed(hashed) if e.first_lsn > 1)  # one that names its hash
    raw = bytearray((src / "wal" / older.name).read_bytes())
    raw[len(raw) // 2] ^= 1
    _replace_like(remote, sid, older, zstandard.ZstdCompressor().compress(bytes(raw)))
    res = restore(remote.url, tmp_path / "third", client=remote.client())
    assert older.key in [k for k, _ in res.rejected]
    why = dict(res.rejected)[older.key]
    assert "other bytes" in why and res.epoch == older.first_lsn - 1


def test_a_bucket_an_older_shipper_wrote_still_restores(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    src = tmp_path / "src"
    commit_range(src, 0, 120)
    ship(src, remote.url, client=remote.client())
    sid = res_id(src)
    raw = {e.key: (src / "wal" / e.name).read_bytes() for e in _wal(remote, sid)}
    for key, body in raw.items():  # each object the file itself, as before encodings
        put_object(remote, key, body, sha=hashlib.sha256(body).hexdigest())

    def older(doc: dict[str, Any]) -> None:
        doc["format"] = FORMAT
        for e in doc["objects"]:
            if e["key"] in raw:
                e["sha256"], e["size"] = (
                    hashlib.sha256(raw[e["key"]]).hexdigest(),
                    len(raw[e["key"]]),
                )
                for field in ("encoding", "file_size", "file_sha256"):
                    e.pop(field, None)

    forge_manifest(remote, sid, older)
    cur = read_manifest(remote.client(), sid)
    assert cur is not None and cur.manifest.format == FORMAT
    assert not any(e.encoding for e in cur.manifest.objects)
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert res.epoch == 120 and not res.rejected
    assert state_of(tmp_path / "dst") == state_of(src)


def test_a_segment_compressing_past_the_readers_ratio_ships_as_it_is(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    src = tmp_path / "src"
    with statelog.open(src) as st:
        st.commit(offsets={"p": 1}, put={"zeros": b"\0" * (16 << 20)})
        st.commit(offsets={"p": 2}, put={"k": 1})
    ship(src, remote.url, client=remote.client())
    [e] = _wal(remote, res_id(src))
    assert e.encoding == "" and e.size == (src / "wal" / e.name).stat().st_size
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert res.epoch == 2 and state_of(tmp_path / "dst") == state_of(src)


def _sealed_unshipped(tmp_path: Path, remote: Remote) -> tuple[Path, uuid.UUID, int, list[Path]]:  # noqa: F811
    """A shipped store with sealed segments committed since: the store, its id, the
    shipping generation and those segments."""
    src = tmp_path / "src"
    commit_range(src, 0, 60)
    ship(src, remote.url, client=remote.client())
    sid = res_id(src)
    shipped = {e.name for e in _wal(remote, sid)}
    commit_range(src, 60, 120)
    fresh = [p for p in sorted((src / "wal").glob("*.wal")) if p.name not in shipped][:-1]
    assert fresh  # sealed segments not shipped yet (the last one is the active segment)
    return src, sid, _wal(remote, sid)[0].generation, fresh


UPLOADED_AS = {  # how an earlier upload holds the file: its object, and the entry's encoding
    "raw": lambda file: file,  # by an older statelog
    "compressed-otherwise": zstandard.ZstdCompressor(level=7).compress,  # another version
}


@pytest.mark.parametrize("uploaded_as", sorted(UPLOADED_AS))
def test_an_upload_whose_commit_never_landed_is_adopted(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    uploaded_as: str,
) -> None:
    src, sid, gen, fresh = _sealed_unshipped(tmp_path, remote)
    theirs = {p.name: UPLOADED_AS[uploaded_as](p.read_bytes()) for p in fresh}
    for p in fresh:  # uploaded by a shipper that died before its manifest commit
        put_object(
            remote, StoreKeys(sid).segment(gen, p.name), theirs[p.name], sha=_sha(theirs[p.name])
        )
    result = ship(src, remote.url, client=remote.client())
    assert sorted(result.adopted) == sorted(StoreKeys(sid).segment(gen, p.name) for p in fresh)
    by_name = {e.name: e for e in _wal(remote, sid)}
    for p in fresh:
        e, body = by_name[p.name], theirs[p.name]
        assert (e.sha256, e.size, e.local_size) == (_sha(body), len(body), p.stat().st_size)
        assert e.encoding == ("" if uploaded_as == "raw" else "zstd")
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert not res.rejected and state_of(tmp_path / "dst") == state_of(src)


def _sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def test_an_upload_of_another_file_at_our_key_is_not_adopted(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    src, sid, gen, fresh = _sealed_unshipped(tmp_path, remote)
    p = fresh[0]
    other = bytearray(p.read_bytes())
    other[len(other) // 2] ^= 1
    body = zstandard.ZstdCompressor(level=7).compress(bytes(other))
    key = StoreKeys(sid).segment(gen, p.name)
    put_object(remote, key, body, sha=_sha(body))
    with pytest.raises(statelog.errors.RemoteError) as err:
        ship(src, remote.url, client=remote.client())
    assert key in str(err.value) and err.value.hint
    assert remote.client().get(key).data == body  # never overwritten


LISTED_AS = {  # how the manifest lists a file: same file?, read its object?
    "same-file": (True, True),
    "other-file": (False, True),
    "same-file-hash-named": (True, False),
    "other-file-hash-named": (False, False),
    "size-past-the-file": (False, False),  # a hostile size never sizes a read
}


@pytest.mark.parametrize("listed_as", sorted(LISTED_AS))
def test_a_store_without_its_ship_record_recognises_what_is_listed(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    listed_as: str,
) -> None:
    same, read = LISTED_AS[listed_as]
    src = tmp_path / "src"
    commit_range(src, 0, 120)
    ship(src, remote.url, client=remote.client())
    sid = res_id(src)
    victim = _wal(remote, sid)[0]
    file = bytearray((src / "wal" / victim.name).read_bytes())
    if not same and listed_as != "size-past-the-file":
        file[len(file) // 2] ^= 1
    body = zstandard.ZstdCompressor(level=7).compress(bytes(file))
    _replace_like(remote, sid, victim, body)

    def relisted(doc: dict[str, Any]) -> None:
        e = next(e for e in doc["objects"] if e["key"] == victim.key)
        if listed_as.endswith("hash-named"):
            e["file_sha256"] = _sha(bytes(file))
        if listed_as == "size-past-the-file":
            e["size"] = 1 << 40

    forge_manifest(remote, sid, relisted)
    (src / RECORD).unlink()
    before = read_manifest(remote.client(), sid)
    gets: list[str] = []
    real_get = RemoteClient.get

    def get(self: RemoteClient, key: str, **kw: Any) -> Any:
        gets.append(key)
        return real_get(self, key, **kw)

    monkeypatch.setattr(RemoteClient, "get", get)
    if not same:
        with pytest.raises(statelog.errors.RemoteError) as err:
            ship(src, remote.url, client=remote.client())
        assert victim.name in str(err.value) and err.value.hint
    else:
        result = ship(src, remote.url, client=remote.client())
        assert not result.uploaded and not result.adopted
    assert (victim.key in gets) == read
    after = read_manifest(remote.client(), sid)
    assert before is not None and after is not None
    assert after.manifest.objects == before.manifest.objects
