"""The images in ``STORE/base``: who makes them, who may map them, and what verify says of them.

A table of what can happen to an image and its stamp, each checked against
what the writer serves, what a read-only open serves and what ``statelog
verify`` reports. The rules are those of ``docs/format.md``, "The base
image".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import crc32c
import lmdb
import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.format.records import Key
from statelog.kit import Stream, run_commit, store_digest
from statelog.ops.verify import Verdict, verify_store
from statelog.storage.image import encode_key
from statelog.storage.image_cache import PUBLISHED_TAG, image_crc
from statelog.storage.image_stamp import stamp_of
from statelog.storage.snapshots import list_snapshots

STREAM = Stream(seed=21, blob_ratio=0.0)
LAST = 40
REPO = Path(__file__).resolve().parent.parent


def build(root: Path) -> None:
    """A store whose newest snapshot covers every commit, its image published to base/."""
    with statelog.open(root, segment_bytes=8192) as store:
        for i in range(1, LAST + 1):
            run_commit(store, STREAM.commit(i))
    assert compact(root).snapshot is not None


def images(root: Path) -> list[Path]:
    return sorted(p for p in (root / "base").glob("*.mdb"))


def restamp(image: Path) -> None:
    """Make ``image``'s stamp agree with the image as it is now (CRC and size)."""
    stamp = stamp_of(image)
    outer = json.loads(stamp.read_text())
    body = json.loads(outer["body"])
    body["crc"], body["image_bytes"] = image_crc(image), image.stat().st_size
    raw = json.dumps(body, sort_keys=True, separators=(",", ":"))
    stamp.write_text(json.dumps({"body": raw, "crc": crc32c.crc32c(raw.encode())}) + "\n")


def forge(image: Path, where: tuple[str, Key], value: bytes) -> None:
    """Put ``value`` under the key ``where`` names, in place."""
    table, key = where
    env = lmdb.open(str(image), subdir=False, lock=False, max_dbs=64)
    try:
        db = env.open_db(table.encode())
        with env.begin(write=True, db=db) as txn:
            txn.put(encode_key(key), value)
    finally:
        env.close()


def first_key(root: Path) -> tuple[str, Key]:
    """A table and a key of the store's state."""
    with statelog.open(root, readonly=True) as store:
        table = sorted(store.tables())[0]
        return table, next(iter(store.items(table=table)))[0]


def test_the_compactor_publishes_its_image_and_the_writer_maps_it(tmp_path: Path) -> None:
    root = tmp_path / "s"
    build(root)
    published = images(root)
    assert len(published) == 1 and published[0].name.split(".")[1].startswith(PUBLISHED_TAG)
    snap = list_snapshots(root / "snapshots")[0][2]
    assert published[0].name.startswith(snap.name.removesuffix(".snap"))
    with statelog.open(root) as store:
        assert store_digest(store) == STREAM.model(LAST).digest()
        assert [p.name for p in images(root)] == [published[0].name]  # mapped, not rebuilt


def test_a_second_pass_replaces_the_image_it_published(tmp_path: Path) -> None:
    root = tmp_path / "s"
    build(root)
    first = images(root)
    with statelog.open(root, segment_bytes=8192) as store:
        for i in range(LAST + 1, LAST + 21):
            run_commit(store, STREAM.commit(i))
    assert compact(root).snapshot is not None
    now = [p for p in images(root) if p.name.split(".")[1].startswith(PUBLISHED_TAG)]
    assert len(now) == 1 and now != first
    with statelog.open(root) as store:
        assert store_digest(store) == STREAM.model(LAST + 20).digest()


Damage = Callable[[Path, tuple[str, Key]], None]


def _forged_and_restamped(image: Path, key: tuple[str, Key]) -> None:
    forge(image, key, b"\xa6forged")
    restamp(image)


def _forged_only(image: Path, key: tuple[str, Key]) -> None:
    forge(image, key, b"\xa6forged")


def _truncated(image: Path, key: tuple[str, Key]) -> None:
    with image.open("r+b") as fh:
        fh.truncate(image.stat().st_size // 2)


def _stamp_torn(image: Path, key: tuple[str, Key]) -> None:
    stamp = stamp_of(image)
    stamp.write_bytes(stamp.read_bytes()[:20])


# what was done to the published image -> (verify's verdict, does verify name the image)
CASES: dict[str, tuple[Damage, Verdict, bool]] = {
    "forged, stamp recomputed": (_forged_and_restamped, Verdict.RECOVERABLE, True),
    "forged, stamp left": (_forged_only, Verdict.CLEAN, False),
    "truncated": (_truncated, Verdict.CLEAN, False),
    "stamp torn": (_stamp_torn, Verdict.CLEAN, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_names_an_image_the_writer_would_map_although_it_lies(
    tmp_path: Path, case: str
) -> None:
    root = tmp_path / "s"
    build(root)
    key = first_key(root)
    damage, verdict, named = CASES[case]
    [image] = images(root)
    damage(image, key)
    report = verify_store(root)
    assert report.verdict is verdict, report.findings
    assert any(f.path == image and f.kind == "base" for f in report.findings) is named
    cli = subprocess.run(
        [sys.executable, "-m", "statelog.cli", "verify", str(root)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert cli.returncode == (1 if named else 0), cli.stdout + cli.stderr
    assert (image.name in cli.stdout) is named
    # Readers and the writer agree: an image the stamp checks pass is what both serve (which
    # verify names), any other is rebuilt from the snapshot by both.
    true_state = STREAM.model(LAST).digest()
    with statelog.open(root, readonly=True) as ro:
        assert (store_digest(ro) == true_state) is not named
    with statelog.open(root) as store:
        assert (store_digest(store) == true_state) is not named


def test_an_image_forged_with_its_mtime_put_back_is_mapped_and_verify_names_it(
    tmp_path: Path,
) -> None:
    """The limit of a settled stamp: a restart trusts an image whose inode, size and
    mtime are those recorded when it was fsynced and checked, without reading it. Bytes
    changed under them (media corruption, or a hand that restores the mtime) are not
    seen by the open; ``statelog verify`` compares the image with its snapshot and
    names it, and a read-only open, which copies the image and checks the copy's CRC,
    rebuilds it from the snapshot."""
    root = tmp_path / "s"
    build(root)
    [image] = images(root)
    st = image.stat()
    forge(image, first_key(root), b"\xa6forged")
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert image.stat().st_size == st.st_size
    true_state = STREAM.model(LAST).digest()
    with statelog.open(root) as store:
        assert store_digest(store) != true_state
    report = verify_store(root)
    assert report.verdict is Verdict.RECOVERABLE
    assert any(f.path == image and f.kind == "base" for f in report.findings)
    with statelog.open(root, readonly=True) as ro:
        assert store_digest(ro) == true_state


def test_removing_the_named_image_is_the_remedy(tmp_path: Path) -> None:
    root = tmp_path / "s"
    build(root)
    [image] = images(root)
    _forged_and_restamped(image, first_key(root))
    [finding] = [f for f in verify_store(root).findings if f.kind == "base"]
    for p in (finding.path, stamp_of(finding.path)):
        p.unlink()
    assert verify_store(root).verdict is Verdict.CLEAN
    with statelog.open(root) as store:
        assert store_digest(store) == STREAM.model(LAST).digest()


def test_a_read_only_open_copies_an_intact_image_and_leaves_base_alone(tmp_path: Path) -> None:
    root = tmp_path / "s"
    build(root)
    before = {p.name: p.stat().st_mtime_ns for p in (root / "base").iterdir()}
    with statelog.open(root, readonly=True) as ro:
        assert store_digest(ro) == STREAM.model(LAST).digest()
        mapped = Path(ro._state.base.path)  # type: ignore[attr-defined]
        assert root / "base" not in mapped.parents
    assert {p.name: p.stat().st_mtime_ns for p in (root / "base").iterdir()} == before
