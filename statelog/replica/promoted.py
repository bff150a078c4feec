"""``STORE/PROMOTED``: the mark a promotion leaves in the store directory its standby followed.

When a standby of a store directory is promoted, its copy continues the
source's log. Two things must then never happen: a second standby of the same
source promoted as well, and the source's old writer restarted on the source
(its host back from the dead). Both would continue the same log twice. So the
promotion claims the source first, by creating ``PROMOTED`` in it with
``O_CREAT | O_EXCL`` (atomic on a local file system and on NFSv3 and later):
of two promoters, exactly one creates it and the other changes nothing
(:class:`~statelog.errors.PromotionLostError`); a writer's open of a store
holding it is refused (:class:`~statelog.errors.StorePromotedError`), until an
operator moves it aside deliberately. Read-only opens and standbys still read
the source.

The file is one JSON object, at most :data:`~statelog.storage.layout.MAX_JSON_BYTES`
(``docs/format.md``): ``copy`` (the promoted copy's absolute path), ``host``,
``pid``, ``epoch`` (the copy's epoch when it was promoted) and ``at_ms``.
Durable order: created exclusive, written, fsync, fsync of the directory. A
crash between the create and the fsync can leave it empty or partial; it is
still a claim, and the refusal says so.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from statelog.errors import PromotionLostError, StatelogError, StorePromotedError
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import PROMOTED, REMOTE_RECORD, STANDBY
from statelog.storage.marks import check_not_standby, clear_standby, read_mark, standby_source

__all__ = [
    "check_not_promoted",
    "check_not_standby_copy",
    "check_unclaimed",
    "claim_source",
    "promoted_here",
    "read_promoted",
]

log = logging.getLogger("statelog.replica.promoted")

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def claim_source(source: Path, copy: Path, epoch: int, files: FileLayer | None = None) -> None:
    """Create ``source/PROMOTED`` naming ``copy`` (durable order in the module docstring).

    :raises PromotionLostError: it exists: another promotion claimed ``source``
        first; nothing was written.
    :raises OSError: ``source`` cannot be written; nothing was claimed.
    """
    files = files or FileLayer()
    path = source / PROMOTED
    doc = {
        "copy": str(Path(os.path.realpath(copy))),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "epoch": epoch,
        "at_ms": int(time.time() * 1000),
    }
    try:
        fd = os.open(path, _CREATE, 0o644)
    except FileExistsError:
        raise PromotionLostError(
            f"{source} was claimed by another promotion first ({_describe(source)})"
        ) from None
    try:
        os.write(fd, json.dumps(doc).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    files.fsync_dir(source)


def read_promoted(store: Path) -> dict[str, Any] | None:
    """The claim in ``store/PROMOTED`` (None: there is none); ``{}`` if it cannot be read.

    The file may come from anywhere: it is bounded and checked before it is parsed
    (:func:`~statelog.storage.marks.read_mark`).
    """
    return read_mark(store / PROMOTED)


def check_not_promoted(store: Path) -> None:
    """:raises StorePromotedError: a standby of ``store`` was promoted (``PROMOTED`` exists)."""
    if read_promoted(store) is not None:
        raise StorePromotedError(
            f"{store} was taken over by a promoted standby: {_describe(store)}"
        )


def _describe(store: Path) -> str:
    doc = read_promoted(store)
    if not doc:
        return "its PROMOTED file is there but unreadable (a promotion that died as it wrote it)"
    copy, epoch = str(doc.get("copy", "?"))[:4096], doc.get("epoch", "?")
    return f"{copy!r} became the writer at epoch {epoch} (host {str(doc.get('host', '?'))[:255]})"


def promoted_here(source: Path, copy: Path) -> bool:
    """Whether ``source``'s ``PROMOTED`` names ``copy``: the copy is that promotion's writer."""
    return _names(read_promoted(source), copy)


def _names(doc: dict[str, Any] | None, copy: Path) -> bool:
    return doc is not None and doc.get("copy") == os.path.realpath(copy)


def check_unclaimed(source: Path, copy: Path) -> None:
    """Refuse to follow a source that a promotion claimed (its standby became a writer).

    :raises StorePromotedError: ``source`` holds ``PROMOTED``: naming ``copy`` (open
        it as the writer it became) or another copy (follow that one instead).
    """
    doc = read_promoted(source)
    if doc is None:
        return
    if _names(doc, copy):
        raise StorePromotedError(
            f"{copy} was promoted from its source {source} already",
            hint="open it without follow=: it is a writer's store now",
            cli_hint="it is a writer's store now: nothing to promote",
        )
    raise StorePromotedError(
        f"{source} was taken over by a promoted standby: {_describe(source)}",
        hint="follow the promoted copy instead: it is the writer's store now",
    )


def check_not_standby_copy(copy: Path, files: FileLayer | None = None) -> None:
    """Refuse a writer's open of a standby's copy that was not promoted.

    A promotion claims the source first and removes the copy's ``STANDBY`` mark
    after (:mod:`statelog.storage.marks`); a copy whose claim is complete but
    whose mark survived (the promotion died in between) is a promoted writer's
    store, so the mark is removed here and the open goes on.

    :raises StandbyCopyError: ``copy`` is marked and its source was not claimed for it.
    :raises OSError: removing a stale mark failed.
    """
    if read_mark(copy / STANDBY) is None:
        return
    source = standby_source(copy)
    if source is not None and _claimed_for(copy, source):
        clear_standby(copy, files)
        log.warning("event=standby_mark_cleared store=%s source=%s", copy, source)
        return
    check_not_standby(copy)


def _claimed_for(copy: Path, source: str) -> bool:
    if "://" not in source:
        return promoted_here(Path(source), copy)
    if not (copy / REMOTE_RECORD).exists():
        return False
    # Not at import: the remote tier (obstore) adds about 45 ms to `import statelog`.
    from statelog.remote.record import load_record

    try:
        rec = load_record(copy)
    except (StatelogError, OSError):
        return False
    return rec is not None and rec.generation > 0 and rec.url == source
