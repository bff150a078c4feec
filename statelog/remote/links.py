"""A restore's snapshot chains: each link downloaded, verified and imaged once.

A restore point is a snapshot with its whole chain (:mod:`.plan`): the full
snapshot and every delta up to it. :class:`ChainFetcher` is what the
restore's walk asks about each candidate, newest first. For each link of
the candidate's chain, full snapshot first:

1. download it into the staging ``snapshots/`` (size and SHA-256 against
   the manifest: :meth:`.staging.Staging.fetch`);
2. build its stamped image in the staging ``base/`` (a format-2 snapshot
   only, ``portable_only``: every byte of it verified on the way, so the
   restored store's first open maps the images as they are);
3. check what the file says against the manifest entry: LSN and chain,
   footer digest, depth and the parent it names.

Then the links are checked against one another by the rule every reader
applies (:func:`statelog.storage.levels.chain_links`): each parent's footer
digest is the one its child names, its depth one less, its store the same.

A link is fetched and verified once per restore, however many candidates
share it. A link that fails is removed from staging, logged at ERROR and
named in ``rejected``; so is every candidate whose chain it breaks (with
the reason ``chain: <link>: ...``), and the walk goes on to an older
restore point. At the end :meth:`ChainFetcher.keep_only` removes what the
chosen chain does not use, so the restored store holds no snapshot whose
chain it lacks.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from statelog.errors import CorruptionError, FormatVersionError
from statelog.remote.entry import Entry
from statelog.remote.errors import RemoteIntegrityError, RemoteNotFoundError
from statelog.remote.staging import Staging
from statelog.storage.image_cache import extract_stamped, image_path
from statelog.storage.image_stamp import stamp_of
from statelog.storage.layout import BASE_DIR, SNAPSHOT_DIR
from statelog.storage.levels import chain_links
from statelog.storage.snapshot_read import SnapshotMeta

__all__ = ["ChainFetcher", "entry_problem", "refuse"]

log = logging.getLogger("statelog.remote")

# What makes one link fail (and the walk go back), as opposed to an error that ends the restore.
_REFUSED = (RemoteIntegrityError, CorruptionError, FormatVersionError, RemoteNotFoundError)


def refuse(rejected: dict[str, str], key: str, why: str) -> bool:
    """Log ``key`` as refused and record why in ``rejected``; always False."""
    log.error("event=remote_object_rejected key=%s reason=%r", key, why)
    rejected[key] = why
    return False


def entry_problem(e: Entry, meta: SnapshotMeta) -> str | None:
    """Why the snapshot file ``meta`` describes is not what entry ``e`` lists; None if it is.

    An entry of an old manifest records no digest (nothing to compare) and
    depth 0: a delta listed there is refused, as its chain is unknown.
    """
    if (meta.lsn, meta.chain) != (e.last_lsn, e.end_crc):
        return "snapshot header disagrees with the manifest"
    if e.digest and meta.sha256 != e.digest:
        return f"footer digest {meta.sha256[:16]}..., the manifest lists {e.digest[:16]}..."
    if meta.depth != e.depth:
        return f"a snapshot of depth {meta.depth}, the manifest lists depth {e.depth}"
    link = meta.delta
    if link is not None and (link.parent, link.parent_sha256) != (e.parent, e.parent_sha256):
        return f"names parent {link.parent}, the manifest lists {e.parent}"
    return None


@dataclass(frozen=True)
class _Got:
    key: str  # the entry downloaded under this file name
    meta: SnapshotMeta
    image: Path


class ChainFetcher:
    """The links one restore downloaded and verified, by file name (module docstring).

    :param chain_of: the planner's chain of a snapshot (full first, it last),
        or why the manifest breaks it.
    """

    def __init__(
        self,
        st: Staging,
        store_id: uuid.UUID,
        rejected: dict[str, str],
        chain_of: Callable[[Entry], tuple[Entry, ...] | str],
    ) -> None:
        self._st, self._sid, self._rejected, self._chain_of = st, store_id, rejected, chain_of
        self._got: dict[str, _Got] = {}

    def accept(self, snap: Entry) -> bool:
        """Whether ``snap``'s whole chain downloads and verifies (refusals in ``rejected``)."""
        chain = self._chain_of(snap)
        if isinstance(chain, str):
            return refuse(self._rejected, snap.key, chain)
        for e in chain:
            why = self._link(e)
            if why is not None:
                if e.key == snap.key:
                    return False  # refused under its own key already
                return refuse(self._rejected, snap.key, f"chain: {e.name}: {why}")
        path = self._st.path_of(snap)
        try:
            chain_links(path.parent, path, self._read)
        except CorruptionError as exc:
            return refuse(self._rejected, snap.key, exc.reason)
        return True

    def _link(self, e: Entry) -> str | None:
        """Download and verify one link unless done already; why it fails, or None."""
        if e.key in self._rejected:
            return self._rejected[e.key]
        got = self._got.get(e.name)
        if got is not None and got.key == e.key:
            return None
        if got is not None:  # another entry of that name (a fork's): its file is replaced
            self._drop(e.name)
        st = self._st
        image = st.confined.path(BASE_DIR, image_path(Path(BASE_DIR), st.path_of(e)).name)
        try:
            path = st.fetch(e)
            st.files.makedirs(image.parent)
            # Verified as the image is built: the first open then maps it as it is.
            meta = extract_stamped(st.files, path, image, store_id=self._sid, portable_only=True)
        except _REFUSED as exc:
            why: str | None = getattr(exc, "reason", None) or str(exc)
        else:  # verified: now it must also be the snapshot the manifest lists
            why = entry_problem(e, meta)
            if why is None:
                self._got[e.name] = _Got(e.key, meta, image)
                return None
        st.remove(e)
        _remove_image(st, image)
        assert why is not None
        refuse(self._rejected, e.key, why)
        return why

    def _read(self, path: Path) -> tuple[SnapshotMeta, object]:
        """What :func:`chain_links` reads of a link: the meta verified when it was fetched."""
        got = self._got.get(path.name)
        if got is None:  # not a file the plan fetched: the chain on disk is not the manifest's
            raise CorruptionError(path, 0, "chain: not a link the manifest lists")
        return got.meta, got.image

    def keep_only(self, names: Collection[str]) -> None:
        """Remove every downloaded snapshot (and its image) not named in ``names``."""
        for name in [n for n in self._got if n not in names]:
            self._drop(name)

    def _drop(self, name: str) -> None:
        got = self._got.pop(name)
        self._st.files.remove(self._st.confined.path(SNAPSHOT_DIR, name))
        _remove_image(self._st, got.image)


def _remove_image(st: Staging, image: Path) -> None:
    for p in (image, stamp_of(image)):
        st.files.remove(p)
