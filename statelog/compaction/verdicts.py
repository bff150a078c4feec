"""How much of a snapshot retention reads to count it, given what this process read before.

Retention counts a snapshot as a restore point only once it was parsed in
full (its record stream checked, not only its hash): a hash says the file is
what was written, not that what was written is a state, and older snapshots
are deleted on the strength of the ones counted. Parsing a snapshot of
millions of keys every pass would make each pass cost the state's size, so
this process remembers what it read (:mod:`statelog.storage.whole_checks`):

* a snapshot this process wrote itself (:func:`mark_verified`, from an image
  it verified), parsed within the hour, or whose stamped image in ``base/``
  is intact (:func:`verified`) is not parsed again;
* one it also hashed within the hour, the file unchanged since (device,
  inode, size, mtime, ctime), is not read at all: its header, meta and
  footer are checked;
* with ``hashed_since`` (retention asks for it before it deletes what only the
  full snapshots it keeps make unneeded) the hash is read again unless this
  process read it (or wrote it) at or after that moment: the pass's own
  read-ahead (:mod:`statelog.compaction.read_ahead`) hashes those snapshots on
  another core while the pass folds its tail.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

from statelog.storage.fileio import FileLayer
from statelog.storage.image_cache import reusable_image
from statelog.storage.image_stamp import footer_hash
from statelog.storage.layout import BASE_DIR
from statelog.storage.snapshots import SnapshotMeta, verify_snapshot
from statelog.storage.whole_checks import HASHED, PARSED, READ_BACK, note_intact, seen_intact

__all__ = ["mark_verified", "read_back", "verified"]


def mark_verified(path: Path) -> None:
    """Note that the snapshot at ``path`` was parsed and hashed in full: its writer built
    it from an image it verified, so neither retention nor shipping reads it again."""
    with contextlib.suppress(OSError):
        footer = footer_hash(path)
        note_intact(path, (HASHED, footer))
        note_intact(path, (PARSED, footer))


def read_back(files: FileLayer, path: Path, store_id: uuid.UUID) -> None:
    """Hash the snapshot at ``path`` read back from the file, and note it so
    (:data:`~statelog.storage.whole_checks.READ_BACK`, which :func:`verified` with
    ``hashed_since`` accepts): the read retention's rule asks for, made ahead of it.

    :raises CorruptionError: as :func:`~statelog.storage.snapshots.verify_snapshot`
        (nothing is noted).
    :raises OSError: reading failed (nothing is noted).
    """
    footer = footer_hash(path)
    verify_snapshot(files, path, store_id=store_id, parse=False)
    _note_read_back(path, footer)


def _note_read_back(path: Path, footer: str) -> None:
    note_intact(path, (HASHED, footer))
    note_intact(path, (READ_BACK, footer))


def verified(
    files: FileLayer, path: Path, store_id: uuid.UUID, *, hashed_since: float | None = None
) -> SnapshotMeta:
    """``verify_snapshot`` of ``path``, reading only what this process has not read (above).

    An intact stamped image of the snapshot in ``STORE/base`` also counts as a parse
    and a hash: it was built from this very file by a verified extraction (or by the
    pass that wrote it), and :func:`~statelog.storage.image_cache.reusable_image`
    either hashes the snapshot against its footer or finds the stamp *settled* (both
    files unchanged since both were checked whole: the trust under which a writer's
    open maps the image without reading either). So a compactor process, or a
    one-shot ``statelog compact``, that starts on a large store reads its full
    snapshot only when it is about to delete an older full one.

    :param hashed_since: a reading of :func:`~statelog.storage.whole_checks.now`: hash
        the file unless this process read it back and hashed it, unchanged, at or after
        it (:data:`~statelog.storage.whole_checks.READ_BACK`).
    :raises CorruptionError: as :func:`~statelog.storage.snapshots.verify_snapshot`.
    :raises OSError: reading failed.
    """
    try:
        footer = footer_hash(path)
    except OSError:  # shorter than a footer, say: the full check names what is wrong
        return verify_snapshot(files, path, store_id=store_id)
    parsed, hashed = (PARSED, footer), (HASHED, footer)
    if (
        not seen_intact(path, parsed)
        and reusable_image(path.parent.parent / BASE_DIR, path, store_id=store_id) is not None
    ):
        note_intact(path, parsed)
        # Hashed just now, or settled: trusted unchanged exactly as the writer's open
        # trusts it to map the image without reading either file.
        note_intact(path, hashed)
    parse = not seen_intact(path, parsed)
    if hashed_since is None:
        skip_body = not parse and seen_intact(path, hashed)
    else:  # read back from the file since then: not on trust, not the writer's own hash
        skip_body = not parse and seen_intact(path, (READ_BACK, footer), since=hashed_since)
    meta = verify_snapshot(files, path, store_id=store_id, parse=parse, body=not skip_body)
    if not skip_body:
        _note_read_back(path, footer)
    if parse:
        note_intact(path, parsed)
    return meta
