"""A snapshot's chain, resolved and verified link by link, and the base it spells.

A full snapshot is a chain of one. A delta snapshot names its parent by
file name and by the parent's footer digest (``meta.delta``); its chain is
the parents back to the first full snapshot. :func:`open_chain` resolves
that chain newest first and accepts it only if every link holds:

* every file of the chain is present and verifies (each is hashed on this
  read, or its image's stamp matches it as it is now: :mod:`statelog.storage.image_cache`);
* each parent's SHA-256 is the one its child names, its depth one less,
  its store the same (its LSN is before the child's: checked on every read
  of the child's meta).

Anything else refuses the whole chain with a
:class:`~statelog.errors.CorruptionError` whose reason starts ``chain:``
and names the file that failed, so the caller walks back to an older
restore point. Then each snapshot's image is mapped, oldest first, as one
:class:`~statelog.storage.layered.LayeredBase`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from statelog.errors import CorruptionError, FormatVersionError
from statelog.format.snapshot import HEADER_SIZE
from statelog.storage.fileio import FileLayer
from statelog.storage.image_cache import (
    copy_reusable,
    extract_stamped,
    image_path,
    reusable_image,
)
from statelog.storage.image_stamp import stamp_of
from statelog.storage.layered import LayeredBase, open_levels
from statelog.storage.snapshot_read import HINT, SnapshotMeta

__all__ = [
    "MAX_DEPTH",
    "Chain",
    "ImageSources",
    "Read",
    "chain_links",
    "link_problem",
    "open_chain",
    "remove_stale_images",
]

MAX_DEPTH = 256
"""The longest chain any reader follows (the compactor's own limit is far lower)."""

log = logging.getLogger("statelog.storage.levels")


@dataclass(frozen=True)
class ImageSources:
    """Where a chain's images come from: mapped from ``map_from`` if one there is intact,
    else copied from ``copy_from``, else extracted (verified) into ``extract_to``.

    ``settle``: an image in ``extract_to`` that passes a whole check has its stamp
    settled (a writer's open or a standby, which own the directory); a read-only
    recovery and a restore's check leave stamps as they are.
    """

    extract_to: Path
    map_from: tuple[Path, ...] = ()
    copy_from: Path | None = None
    settle: bool = True


@dataclass(frozen=True)
class Chain:
    """A verified chain: its snapshots, metas and images, the full snapshot first."""

    snapshots: tuple[Path, ...]
    metas: tuple[SnapshotMeta, ...]
    images: tuple[Path, ...]
    made: tuple[Path, ...] = ()  # the images this open extracted or copied (others: reused)

    @property
    def meta(self) -> SnapshotMeta:
        """The newest snapshot's meta: the state the chain restores."""
        return self.metas[-1]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(p.name for p in self.snapshots)


def link_problem(child: SnapshotMeta, parent: SnapshotMeta) -> str | None:
    """Why ``parent`` is not the snapshot the delta ``child`` names (None: it is).

    Compares the parent's footer digest, depth and store with the child's
    ``delta`` link; the reason names the parent's file.
    """
    link = child.delta
    assert link is not None, "a full snapshot has no parent"
    if parent.sha256 != link.parent_sha256:
        return (
            f"{link.parent} hashes to {parent.sha256[:16]}..., "
            f"the delta names {link.parent_sha256[:16]}..."
        )
    if parent.depth != link.depth - 1:
        return f"{link.parent} has depth {parent.depth}, the delta says {link.depth - 1}"
    if parent.store_id != child.store_id:
        return f"{link.parent} is of store {parent.store_id}"
    return None


Read = Callable[[Path], tuple[SnapshotMeta, object]]


def chain_links(snap_dir: Path, path: Path, read: Read) -> list[tuple[Path, SnapshotMeta, object]]:
    """``(snapshot, meta, what read returned)`` for the chain of ``path``, full first.

    ``read(path)`` verifies one snapshot and returns ``(meta, extra)``.

    :raises CorruptionError: a link is missing, damaged or does not match
        (reason ``chain: <file>: ...``; ``path`` itself damaged: its own reason).
    :raises FormatVersionError: a file of the chain is of a format not read.
    """
    meta, extra = read(path)
    links: list[tuple[Path, SnapshotMeta, object]] = [(path, meta, extra)]
    while meta.delta is not None:
        if len(links) > MAX_DEPTH:
            raise CorruptionError(path, HEADER_SIZE, f"chain: longer than {MAX_DEPTH}", hint=HINT)
        parent = snap_dir / meta.delta.parent
        if not parent.exists():
            missing = f"chain: {parent.name}: the parent of {links[-1][0].name} is missing"
            raise CorruptionError(path, HEADER_SIZE, missing, hint=HINT)
        try:
            pmeta, pextra = read(parent)
        except CorruptionError as exc:
            raise CorruptionError(
                path, HEADER_SIZE, f"chain: {parent.name}: {exc.reason}", hint=HINT
            ) from exc
        why = link_problem(meta, pmeta)
        if why is not None:
            raise CorruptionError(path, HEADER_SIZE, f"chain: {why}", hint=HINT)
        links.append((parent, pmeta, pextra))
        meta = pmeta
    links.reverse()
    return links


class _Reader:
    """The image of one snapshot, from the first source that has it (see :class:`ImageSources`)."""

    def __init__(self, files: FileLayer, store_id: uuid.UUID, sources: ImageSources) -> None:
        self._files, self._sid, self._src = files, store_id, sources
        self.made: list[Path] = []  # images this reader extracted or copied

    def __call__(self, snapshot: Path) -> tuple[SnapshotMeta, object]:
        for where in self._src.map_from:
            # Only images in the directory this reader extracts to are its own to re-stamp.
            own = self._files if self._src.settle and where == self._src.extract_to else None
            found = reusable_image(where, snapshot, store_id=self._sid, files=own)
            if found is not None:
                return found[1], found[0]
        if self._src.copy_from is not None:
            self._files.makedirs(self._src.extract_to)
            found = copy_reusable(self._src.copy_from, snapshot, self._src.extract_to,
                                  store_id=self._sid)  # fmt: skip
            if found is not None:
                self.made.append(found[0])
                return found[1], found[0]
        self._files.makedirs(self._src.extract_to)
        dest = image_path(self._src.extract_to, snapshot)
        meta = extract_stamped(self._files, snapshot, dest, store_id=self._sid)
        self.made.append(dest)
        return meta, dest


def open_chain(
    files: FileLayer,
    snapshot: Path,
    store_id: uuid.UUID,
    sources: ImageSources,
) -> tuple[Chain, LayeredBase]:
    """Resolve and verify ``snapshot``'s chain, then map its images as one base.

    Images this call extracted or copied are removed again if the chain is
    refused; mapped ones are left to their owners.

    :raises CorruptionError: as :func:`chain_links`.
    :raises FormatVersionError: as :func:`chain_links`.
    :raises OSError: reading or extracting failed.
    """
    reader = _Reader(files, store_id, sources)
    try:
        links = chain_links(snapshot.parent, snapshot, reader)
        images = tuple(Path(str(extra)) for _p, _m, extra in links)
        base = open_levels(images, links[-1][1].tables)
    except (CorruptionError, FormatVersionError, OSError):
        _remove(files, reader.made)
        raise
    chain = Chain(
        tuple(p for p, _m, _e in links), tuple(m for _p, m, _e in links), images,
        tuple(reader.made),
    )  # fmt: skip
    return chain, base


def _remove(files: FileLayer, made: Sequence[Path]) -> None:
    for image in made:
        for p in (image, stamp_of(image)):
            with contextlib.suppress(OSError):
                files.remove(p)


def remove_stale_images(files: FileLayer, image_dir: Path, keep: tuple[Path, ...]) -> None:
    """Delete every file in ``image_dir`` but the images ``keep`` and their stamps,
    in a background thread.

    The list is taken now, so images a base swap extracts later are never
    touched. A process that exits first leaves the rest to the next open.
    """
    if not image_dir.is_dir():
        return
    kept = {p for image in keep for p in (image, stamp_of(image))}
    stale = [p for p in image_dir.iterdir() if p not in kept]
    if not stale:
        return

    def remove() -> None:
        for p in stale:
            try:
                files.remove(p)
            except OSError as exc:  # the next open tries again
                log.warning("image=%s event=stale_image_kept error=%r", p.name, exc)

    threading.Thread(target=remove, name="statelog-image-cleanup", daemon=True).start()
