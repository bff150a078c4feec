"""``statelog verify``'s check of ``STORE/base``: would the writer map an image that lies?

A writer's next open maps an image in ``STORE/base`` instead of building it
from its snapshot when the image's stamp names the snapshot as it is now
and the image has the stamped CRC-32C (:mod:`statelog.storage.image_cache`).
Those checks catch a torn or rotted image, not one edited together with its
stamp. So for every image that would be mapped, this module reads the
snapshot's record stream and the image side by side and reports an image
whose tables, keys or values differ. A delta snapshot's image holds only
the delta's own records: each put with its value, each deleted key with
the value :data:`~statelog.storage.snapshot_body.TOMBSTONE`; it is compared
with the delta's stream key by key (deletes and puts of a table are each
sorted, not together), and must hold nothing else. Images that would not be mapped (no
stamp, a stale stamp, a CRC that differs) are rebuilt by the next open and
are not damage. Read-only: the image is opened read-only, nothing is removed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import crc32c
import lmdb

from statelog.errors import CorruptionError, FormatVersionError
from statelog.format.snapshot import FLAG_DELTA, HEADER_SIZE, IMAGE_VERSION, SnapshotHeader
from statelog.format.stream import TableChunk
from statelog.storage.image_cache import image_crc, reusable_image
from statelog.storage.image_stamp import STAMP_SUFFIX
from statelog.storage.snapshot_body import TOMBSTONE
from statelog.storage.snapshot_read import read_snapshot
from statelog.storage.snapshots import list_snapshots

__all__ = ["BaseMismatch", "check_base_images"]

_READ_ONLY = {"subdir": False, "readonly": True, "lock": False, "readahead": False}


@dataclass(frozen=True, slots=True)
class BaseMismatch:
    """An image a writer would map whose state is not its snapshot's."""

    image: Path
    snapshot: Path
    reason: str


class _Differs(Exception):
    pass


class _Compare:
    """Walks an image's tables alongside a snapshot's checked chunks."""

    def __init__(self, env: lmdb.Environment) -> None:
        self._env = env
        self._seen: dict[str, int] = {}

    def add(self, chunk: TableChunk) -> None:
        try:
            db = self._env.open_db(chunk.table.encode("utf-8"), create=False)
        except lmdb.NotFoundError:
            raise _Differs(f"table {chunk.table!r} is missing from the image") from None
        with self._env.begin(db=db, buffers=False) as txn, txn.cursor() as cur:
            if not cur.set_key(chunk.keys[0]):
                raise _Differs(f"table {chunk.table!r}: key {chunk.keys[0][1:17]!r} is missing")
            got = list(islice(cur.iternext(), len(chunk.keys)))
        want = list(zip(chunk.keys, map(bytes, chunk.values), strict=True))
        if got != want:
            for g, w in zip([*got, None], want, strict=False):
                if g != w:
                    break
            raise _Differs(f"table {chunk.table!r}: key {w[0][1:17]!r} differs from the snapshot")
        self._seen[chunk.table] = self._seen.get(chunk.table, 0) + len(got)

    def finish(self) -> None:
        """The image holds no table or key the snapshot lacks (a delta's: it did not name)."""
        with self._env.begin() as txn:
            names = sorted(bytes(k).decode("utf-8", "replace") for k, _ in txn.cursor())
        for name in names:
            db = self._env.open_db(name.encode("utf-8"), create=False)
            with self._env.begin() as txn:
                held = txn.stat(db)["entries"]
            want = self._seen.get(name, 0)
            if held != want:
                raise _Differs(f"table {name!r}: the image holds {held} keys, the snapshot {want}")


class _DeltaCompare(_Compare):
    """Looks each key of a delta's chunks up in its image: a put's value, or a tombstone."""

    def add(self, chunk: TableChunk) -> None:
        try:
            db = self._env.open_db(chunk.table.encode("utf-8"), create=False)
        except lmdb.NotFoundError:
            raise _Differs(f"table {chunk.table!r} is missing from the image") from None
        wants: list[bytes] = (
            [TOMBSTONE] * len(chunk.keys) if chunk.deleted else list(map(bytes, chunk.values))
        )
        with self._env.begin(db=db, buffers=False) as txn:
            for key, want in zip(chunk.keys, wants, strict=True):
                got = txn.get(key)
                if got is None:
                    raise _Differs(f"table {chunk.table!r}: key {key[1:17]!r} is missing")
                if got != want:
                    what = "a delete" if chunk.deleted else "a put"
                    raise _Differs(
                        f"table {chunk.table!r}: key {key[1:17]!r} differs from the delta's "
                        f"record ({what})"
                    )
        self._seen[chunk.table] = self._seen.get(chunk.table, 0) + len(chunk.keys)


def _images(base: Path) -> Iterator[Path]:
    try:
        stamps = sorted(base.glob(f"*.mdb{STAMP_SUFFIX}"))
    except OSError:
        return
    for stamp in stamps:
        yield stamp.with_name(stamp.name.removesuffix(STAMP_SUFFIX))


def check_base_images(base: Path, snapshots: Path, store_id: uuid.UUID) -> list[BaseMismatch]:
    """Every image in ``base`` that a writer would map and whose state is not its snapshot's.

    An image this process already maps (a store open here) cannot be opened
    a second time and is skipped.

    :raises OSError: reading failed.
    """
    found: list[BaseMismatch] = []
    by_stem = {p.name.removesuffix(".snap"): p for *_, p in list_snapshots(snapshots)}
    for image in _images(base):
        snap = by_stem.get(image.name.split(".", 1)[0])
        if snap is None:
            continue
        usable = reusable_image(base, snap, store_id=store_id)
        if usable is None or usable[0] != image:
            continue  # not what an open would map: it builds a fresh image instead
        why = _differs(image, snap, store_id)
        if why is not None:
            found.append(BaseMismatch(image, snap, why))
    return found


class _Crc:
    """A file-like sink that only computes the CRC-32C of what it is given."""

    def __init__(self) -> None:
        self.crc = 0

    def write(self, data: bytes) -> int:
        self.crc = crc32c.crc32c(data, self.crc)
        return len(data)


def _differs(image: Path, snap: Path, store_id: uuid.UUID) -> str | None:
    with open(snap, "rb") as fh:
        head = fh.read(HEADER_SIZE)
    version = SnapshotHeader.peek_version(head)
    if version is None or len(head) < HEADER_SIZE:
        return None  # the snapshot's own check reports it
    if version == IMAGE_VERSION:  # the body is the image itself: compare their bytes
        body = _Crc()
        try:
            read_snapshot(snap, store_id, out=body)  # type: ignore[arg-type]
        except (CorruptionError, FormatVersionError):
            return None
        if body.crc != image_crc(image):
            return "the image's bytes differ from the snapshot's body"
        return None
    try:
        env = lmdb.open(str(image), max_dbs=1024, map_size=1, **_READ_ONLY)
    except lmdb.Error:
        return None  # open in this process, or not an image an open could map either
    try:
        delta = bool(SnapshotHeader.unpack(head).flags & FLAG_DELTA)
        compare = _DeltaCompare(env) if delta else _Compare(env)
        read_snapshot(snap, store_id, consume=compare)
        compare.finish()
    except _Differs as exc:
        return str(exc)
    except (CorruptionError, FormatVersionError):
        return None  # the snapshot's own check reports it
    except lmdb.Error as exc:
        return f"the image does not read as LMDB: {exc}"
    finally:
        env.close()
    return None
