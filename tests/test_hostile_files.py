"""Files someone else wrote, damaged or crafted: a typed error or a bounded loss, never a crash.

Each test builds a store with the public API and the kit's seeded workload,
damages or crafts one file, and checks what every entry point does with it:
the writer's open, the read-only open, ``verify`` (and its exit status),
compaction, a sharded root. The rules are those of ``docs/runbook.md``,
"Damage right after a snapshot" and "A damaged IDENTITY or SHARDS".
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import lmdb
import pytest

import statelog
from statelog.compaction.fold import SCRATCH_DIR, compact
from statelog.compaction.logfmt import LOGGER
from statelog.errors import (
    CorruptionError,
    InvalidOptionError,
    NotAStoreError,
    ResnapshotRequired,
    StorageError,
)
from statelog.format.wal import FRAME_HEADER_SIZE, HEADER_SIZE, SegmentHeader
from statelog.kit import Stream, run_commit, store_digest
from statelog.log.segments import list_segments
from statelog.ops.verify import Verdict, verify_store
from statelog.recovery.ladder import check_link
from statelog.recovery.report import Outcome
from statelog.remote import RemoteIntegrityError, load_record, restore, ship
from statelog.sharding.partition import MANIFEST, expand_stores
from statelog.sharding.sharded import ShardedStore
from statelog.storage.builder import ImageBuilder
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.pins import ALL, PIN_DIR, pinned_names
from statelog.storage.snapshots import SnapshotMeta, list_snapshots, verify_snapshot
from tests.helpers import fix_crc, flip_bit, poke
from tests.s3server import Remote, remote, s3  # noqa: F401

STREAM = Stream(seed=13, blob_ratio=0.0)
LAST = 80  # commits made; the snapshot covers about half of them
REPO = Path(__file__).resolve().parent.parent


def cli_verify(store: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statelog.cli", "verify", str(store)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def build_after_one_snapshot(root: Path) -> tuple[SnapshotMeta, Path]:
    """A store whose only snapshot covers the early log, which retention deleted.

    Returns the snapshot's meta and the segment the log continues in after it.
    """
    with statelog.open(root, segment_bytes=8192) as store:
        for i in range(1, LAST // 2 + 1):
            run_commit(store, STREAM.commit(i))
        assert compact(root).snapshot is not None  # default retention
        for i in range(LAST // 2 + 1, LAST + 1):
            run_commit(store, STREAM.commit(i))
    snaps = list_snapshots(root / "snapshots")
    assert len(snaps) == 1
    meta = verify_snapshot(FileLayer(), snaps[0][2], store_id=None)
    segs = list_segments(root / "wal")
    assert segs[0][1] == meta.lsn + 1, "retention left the log the snapshot covers"
    return meta, segs[0][2]


def files_of(root: Path) -> dict[str, bytes]:
    """Every byte of the store's log, snapshots and identity, by relative name."""
    out = {"IDENTITY": (root / "IDENTITY").read_bytes()}
    for d in ("wal", "snapshots"):
        for p in sorted((root / d).iterdir()):
            out[f"{d}/{p.name}"] = p.read_bytes()
    return out


DAMAGE = {
    # a bit of the store id inside the 64-byte header: its checksum fails
    "header": HEADER_SIZE // 3,
    # a payload byte of the first frame after the header
    "first-frame": HEADER_SIZE + FRAME_HEADER_SIZE + 2,
}


@pytest.mark.parametrize("where", sorted(DAMAGE))
def test_damage_right_after_the_only_snapshot_loses_only_what_follows_it(
    store_path: Path, where: str
) -> None:
    meta, damaged = build_after_one_snapshot(store_path)
    flip_bit(damaged, DAMAGE[where], 3)
    lost = range(meta.epoch + 1, LAST + 1)
    expected = STREAM.model(meta.epoch).digest()
    before = files_of(store_path)

    report = verify_store(store_path)
    assert report.verdict is Verdict.RECOVERABLE, report.why
    assert report.recovery is not None and report.recovery.lost_epochs == lost
    done = cli_verify(store_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"epochs {lost.start}..{lost.stop - 1}" in done.stdout

    with statelog.open(store_path, readonly=True) as ro:
        assert ro.epoch == meta.epoch
        assert ro.recovery.lost_epochs == lost
        assert store_digest(ro) == expected
    assert files_of(store_path) == before, "a read-only open changed the store"

    with statelog.open(store_path) as store:
        r = store.recovery
        assert (store.epoch, r.outcome, r.lost_epochs) == (meta.epoch, Outcome.CORRUPTION, lost)
        assert (
            r.snapshot is not None and r.snapshot.name == f"{meta.epoch:016x}-{meta.lsn:016x}.snap"
        )
        assert store_digest(store) == expected
        # The damaged segment's bytes are kept aside, whole or from the damage on.
        aside = damaged.with_name(damaged.name + ".corrupt")
        assert aside.is_file() and aside.read_bytes() in before[f"wal/{damaged.name}"]
        assert check_link(store_path / "wal", meta) is None
        for i in range(meta.epoch + 1, meta.epoch + 11):
            assert run_commit(store, STREAM.commit(i)) == i
    with statelog.open(store_path) as store:
        assert store.recovery.outcome is Outcome.CLEAN
        assert store.epoch == meta.epoch + 10
        assert store_digest(store) == STREAM.model(meta.epoch + 10).digest()
    assert verify_store(store_path).verdict is Verdict.CLEAN


def test_header_damage_after_a_snapshot_continues_the_log_from_the_snapshot(
    store_path: Path,
) -> None:
    meta, damaged = build_after_one_snapshot(store_path)
    seq = SegmentHeader.unpack(damaged.read_bytes()).sequence
    flip_bit(damaged, DAMAGE["header"], 3)
    with statelog.open(store_path):
        pass
    first = list_segments(store_path / "wal")[0]
    header = SegmentHeader.unpack(first[2].read_bytes())
    # Sequence numbers go on where the damaged segment stood; LSN and chain
    # continue the snapshot's.
    assert (first[0], first[1]) == (seq, meta.lsn + 1)
    assert (header.first_lsn, header.prev_crc) == (meta.lsn + 1, meta.chain)


def test_no_verified_restore_point_still_requires_a_resnapshot(store_path: Path) -> None:
    _meta, damaged = build_after_one_snapshot(store_path)
    flip_bit(damaged, DAMAGE["header"], 3)
    snap = list_snapshots(store_path / "snapshots")[0][2]
    flip_bit(snap, snap.stat().st_size // 2)
    before = files_of(store_path)
    for readonly in (True, False):
        with pytest.raises(ResnapshotRequired):
            statelog.open(store_path, readonly=readonly)
    assert files_of(store_path) == before
    assert verify_store(store_path).verdict is Verdict.UNRECOVERABLE
    assert cli_verify(store_path).returncode == 2


def test_a_damaged_header_whose_first_frame_chains_elsewhere_does_not_link(
    store_path: Path,
) -> None:
    meta, damaged = build_after_one_snapshot(store_path)
    flip_bit(damaged, DAMAGE["header"], 3)
    # The first frame verifies on its own and links to another chain value.
    poke(damaged, HEADER_SIZE + 12, "<I", meta.chain ^ 0x5A5A5A5A)
    fix_crc(damaged, HEADER_SIZE)
    why = check_link(store_path / "wal", meta)
    assert why is not None and "first frame links to" in why
    with pytest.raises(ResnapshotRequired):
        statelog.open(store_path, readonly=True)


# -- paths that cannot name a store ------------------------------------------------------


@pytest.mark.parametrize("path", ["x\0y", Path("dir\0"), 5, None, b"store", ""], ids=repr)
@pytest.mark.parametrize("readonly", [False, True])
def test_a_path_that_cannot_name_a_directory_is_an_invalid_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Any, readonly: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidOptionError) as caught:
        statelog.open(path, readonly=readonly)
    assert caught.value.hint and "nothing was changed" in caught.value.hint
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", ["x\0y", 5, b"root", ""], ids=repr)
def test_a_sharded_root_path_that_cannot_name_a_directory_is_an_invalid_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidOptionError):
        ShardedStore(path, 2)
    assert list(tmp_path.iterdir()) == []


def test_a_path_through_a_file_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "afile").write_bytes(b"x")
    for readonly in (False, True):
        with pytest.raises(NotAStoreError):
            statelog.open(tmp_path / "afile" / "store", readonly=readonly)
    assert (tmp_path / "afile").read_bytes() == b"x"


# -- small JSON files nested too deep ----------------------------------------------------

DEEP = b'{"a":' * 5000 + b"1" + b"}" * 5000


def test_deeply_nested_identity_is_corruption(store_path: Path) -> None:
    with statelog.open(store_path) as store:
        run_commit(store, STREAM.commit(1))
    (store_path / "IDENTITY").write_bytes(DEEP)
    for readonly in (False, True):
        with pytest.raises(CorruptionError) as caught:
            statelog.open(store_path, readonly=readonly)
        assert "IDENTITY" in caught.value.hint
    report = verify_store(store_path)
    assert report.verdict is Verdict.UNRECOVERABLE
    assert [f.kind for f in report.findings] == ["identity"]


def test_deeply_nested_shards_manifest_is_corruption(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with ShardedStore(root, 2) as sharded:
        sharded.commit(put={"k": 1}, offsets={}, low_watermark_ms=0)
    (root / MANIFEST).write_bytes(DEEP)
    for readonly in (False, True):
        with pytest.raises(CorruptionError) as caught:
            ShardedStore(root, readonly=readonly)
        assert "SHARDS" in caught.value.hint
    with pytest.raises(CorruptionError):
        expand_stores([root])


def test_a_live_pin_nested_too_deep_pins_everything(store_path: Path) -> None:
    with statelog.open(store_path):
        pass
    (store_path / PIN_DIR).mkdir(exist_ok=True)
    pin = store_path / PIN_DIR / "1-deadbeef.pin"
    pin.write_bytes(b'{"files": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    fd = os.open(pin, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a live pin: its holder is running
        assert pinned_names(store_path) == {ALL}
    finally:
        os.close(fd)


def test_a_base_image_stamp_nested_too_deep_is_extracted_again(store_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=8192) as store:
        for i in range(1, 31):
            run_commit(store, STREAM.commit(i))
    assert compact(store_path).snapshot is not None
    with statelog.open(store_path):
        pass  # extracts the snapshot's image to base/ and stamps it
    stamps = [p for p in (store_path / "base").iterdir() if not p.name.endswith(".mdb")]
    assert stamps
    for stamp in stamps:
        stamp.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with statelog.open(store_path) as store:
        assert store.epoch == 30
        assert store_digest(store) == STREAM.model(30).digest()


# -- a full disk under the compactor's image ----------------------------------------------


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (lmdb.DiskError("mdb_txn_commit: No space left on device"), errno.ENOSPC),
        (lmdb.MemoryError("mdb_env_set_mapsize: Cannot allocate memory"), errno.ENOMEM),
    ],
    ids=["disk-full", "map-cannot-grow"],
)
def test_lmdb_out_of_space_during_compaction_is_a_storage_error(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, exc: lmdb.Error, code: int
) -> None:
    with statelog.open(store_path, segment_bytes=8192) as store:
        for i in range(1, 31):
            run_commit(store, STREAM.commit(i))
    before = files_of(store_path)

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(ImageBuilder, "_write", refuse)
    with pytest.raises(StorageError) as caught:
        compact(store_path)
    err = caught.value
    assert err.errno == code
    assert err.hint and "free disk space" in err.hint
    assert files_of(store_path) == before
    assert not (store_path / SCRATCH_DIR).exists()
    monkeypatch.undo()
    assert compact(store_path).snapshot is not None


# -- a SHARDS manifest that shrank ---------------------------------------------------------


def test_shards_manifest_naming_fewer_shards_than_directories_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with ShardedStore(root, 4) as sharded:
        for i in range(20):
            sharded.commit(put={f"k{i}": i}, offsets={}, low_watermark_ms=0)
    doc = json.loads((root / MANIFEST).read_bytes())
    doc["shards"] = 2
    (root / MANIFEST).write_text(json.dumps(doc))
    before = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for readonly in (False, True):
        with pytest.raises(CorruptionError) as caught:
            ShardedStore(root, readonly=readonly)
        assert "shard-0002" in caught.value.reason and "SHARDS" in caught.value.hint
    with pytest.raises(CorruptionError):
        expand_stores([root])
    after = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert {k: v for k, v in after.items() if k.parts[-2:-1] != ("pins",)} == {
        k: v for k, v in before.items() if k.parts[-2:-1] != ("pins",)
    }


# -- nothing blocks while retention holds the pins guard -----------------------------------


class _Blocking(logging.Handler):
    """Blocks the thread logging ``event=deleted`` until released (a full pipe)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.entered = threading.Event()
        self.gate = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "event=deleted" in record.getMessage():
            self.entered.set()
            self.gate.wait(30)


def test_a_blocked_log_handler_during_retention_does_not_block_opens(store_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=8192) as store:
        for i in range(1, 31):
            run_commit(store, STREAM.commit(i))
        assert compact(store_path, retain=1).snapshot is not None
        for i in range(31, 61):
            run_commit(store, STREAM.commit(i))
    handler = _Blocking()
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    passes: list[Any] = []
    compactor = threading.Thread(target=lambda: passes.append(compact(store_path, retain=1)))
    opened: list[int] = []

    def open_readonly() -> None:
        with statelog.open(store_path, readonly=True) as ro:
            opened.append(ro.epoch)

    reader = threading.Thread(target=open_readonly, daemon=True)
    try:
        compactor.start()
        assert handler.entered.wait(30), "retention deleted nothing"
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), "a read-only open waited for a blocked log handler"
        assert opened == [60]
    finally:
        handler.gate.set()
        compactor.join(30)
        reader.join(30)
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert passes and passes[0].deleted


# -- the same files from the bucket --------------------------------------------------------


def _shipped(root: Path, remote: Remote) -> uuid.UUID:  # noqa: F811
    with statelog.open(root, segment_bytes=8192) as store:
        for i in range(1, 21):
            run_commit(store, STREAM.commit(i))
    ship(root, remote.url, client=remote.client())
    return StoreLayout(root).read_identity(FileLayer())


def _put(remote: Remote, key: str, body: bytes) -> None:  # noqa: F811
    remote.server.boto().put_object(Bucket=remote.bucket, Key=f"shard/{key}", Body=body)  # type: ignore[attr-defined]


def _manifest_doc(remote: Remote, sid: uuid.UUID) -> dict[str, Any]:  # noqa: F811
    obj = remote.server.boto().get_object(Bucket=remote.bucket, Key=f"shard/{sid}/MANIFEST")  # type: ignore[attr-defined]
    body = obj["Body"].read().rstrip(b"\n").rpartition(b"\nsha256:")[0]
    doc: dict[str, Any] = json.loads(body)
    return doc


def _signed(doc: dict[str, Any], extra: bytes = b"") -> bytes:
    body = json.dumps(doc).encode()
    if extra:
        body = body[:-1] + b', "x": ' + extra + b"}"
    return body + b"\nsha256:" + hashlib.sha256(body).hexdigest().encode() + b"\n"


def test_a_bucket_manifest_nested_too_deep_is_a_remote_integrity_error(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    sid = _shipped(tmp_path / "src", remote)
    _put(remote, f"{sid}/MANIFEST", _signed(_manifest_doc(remote, sid), b"[" * 5000 + b"]" * 5000))
    with pytest.raises(RemoteIntegrityError):
        restore(remote.url, tmp_path / "dst", client=remote.client())
    assert not (tmp_path / "dst").exists()


def test_a_bucket_identity_nested_too_deep_without_a_hash_is_corruption(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    sid = _shipped(tmp_path / "src", remote)
    doc = _manifest_doc(remote, sid)
    doc["identity_sha256"] = ""
    _put(remote, f"{sid}/MANIFEST", _signed(doc))
    _put(remote, f"{sid}/IDENTITY", DEEP)
    with pytest.raises(CorruptionError):
        restore(remote.url, tmp_path / "dst", client=remote.client())
    assert not (tmp_path / "dst").exists()


def test_a_shipping_record_nested_too_deep_is_corruption(store_path: Path) -> None:
    with statelog.open(store_path):
        pass
    (store_path / "remote.json").write_bytes(DEEP)
    with pytest.raises(CorruptionError):
        load_record(store_path)
