"""The directory a restore fills before it becomes the store, and nothing outside it.

A restore writes only here: the staging directory ``.<name>.restoring``
beside the destination, both resolved once when the restore starts
(:func:`resolve_dest`). Every file name comes from the MANIFEST, which is
untrusted, and was checked against the store's grammar when the MANIFEST
was read (:func:`.checks.check_entries`); every path is checked once more
as it is used (:class:`.checks.Confined`): a plain name, under a directory
that still resolves to where it was made, itself not a symlink. Temporary
files are created with ``O_EXCL | O_NOFOLLOW``, so a link planted after
the check is refused, not followed.

Durable order of one download (:meth:`Staging.fetch`): ``<name>.tmp``
created, the object streamed in (at most the size the MANIFEST gives),
hash checks, fsync, rename to ``<name>``, fsync of its directory. An
encoded object is streamed into ``<name>.obj.tmp`` instead, hash-checked,
decoded into ``<name>.tmp`` (at most the file size the MANIFEST gives, then
the file's hash checked), and removed once the rename is done.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
from pathlib import Path

from statelog.errors import NotAStoreError
from statelog.remote.checks import Confined
from statelog.remote.client import SHA256_ATTR, RemoteClient
from statelog.remote.encoding import decode_object
from statelog.remote.entry import Entry
from statelog.remote.errors import RemoteIntegrityError
from statelog.storage.fileio import FileLayer, ReadBuffer
from statelog.storage.layout import SNAPSHOT_DIR, WAL_DIR

__all__ = ["Staging", "download", "resolve_dest", "staging_of"]

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_RW = _CREATE & ~os.O_WRONLY | os.O_RDWR


def resolve_dest(dest: Path) -> Path:
    """``dest`` resolved once (its parents' symlinks followed), if a restore may fill it.

    ``dest`` may be missing, an empty directory, or a symlink to an empty
    directory; nothing is changed here.

    :raises NotAStoreError: anything else (a file, a non-empty directory, a
        dangling symlink, which would let whoever planted it choose where
        the store lands); or a symlink or a file where the staging directory
        goes.
    """
    dest = Path(dest)
    real = Path(os.path.realpath(dest))
    if dest.is_symlink() and not real.is_dir():
        raise NotAStoreError(
            f"{dest} is a symbolic link to {real}, which is not a directory",
            hint="restore into a real directory path; nothing was changed",
        )
    if real.exists() and (not real.is_dir() or any(real.iterdir())):
        raise NotAStoreError(
            f"{dest} exists and is not an empty directory",
            hint="restore into a new or empty directory; nothing was changed",
        )
    _check_spot(staging_of(real))
    return real


def _check_spot(root: Path) -> int:
    """The mode of what stands at ``root`` (0: nothing).

    :raises NotAStoreError: a symlink or a file.
    """
    try:
        mode = os.lstat(root).st_mode
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(mode):
        raise NotAStoreError(
            f"{root} is in the way of the restore and is not a directory (a symbolic "
            "link or a file)",
            hint="remove it and find out who made it; nothing was changed",
        )
    return mode


def download(client: RemoteClient, root: Confined, files: FileLayer, e: Entry) -> Path:
    """Download ``e`` into ``wal/`` or ``snapshots/`` under ``root`` (durable order in the
    module docstring); an encoded object is decoded on the way (:mod:`.encoding`).

    :returns: the path written.
    :raises RemoteIntegrityError: the object's size or hash is not the manifest's, or it
        does not decode to the file the manifest names (the file is not created, the
        temp files removed).
    :raises NotAStoreError: a symlink was planted on the way.
    """
    sub = WAL_DIR if e.kind == "wal" else SNAPSHOT_DIR
    dest = root.path(sub, e.name)
    tmp = root.path(sub, dest.name + ".tmp")
    raw = root.path(sub, dest.name + ".obj.tmp") if e.encoding else tmp
    made: list[Path] = []  # only what this call created is removed: never another's file
    try:
        flags = _CREATE_RW if e.encoding else _CREATE  # an encoded object is read back
        fd = os.open(raw, flags, 0o644)
        made.append(raw)
        with os.fdopen(fd, "w+b" if e.encoding else "wb") as out:
            got, attrs = client.get_into(e.key, out, size=e.size)
            if got != e.sha256:
                raise RemoteIntegrityError(
                    e.key, f"sha256 {got[:16]}..., manifest {e.sha256[:16]}..."
                )
            if attrs.get(SHA256_ATTR, e.sha256) != e.sha256:
                raise RemoteIntegrityError(e.key, "the object's sha256 metadata disagrees")
            if e.encoding:
                out.seek(0)
                fd = os.open(tmp, _CREATE, 0o644)
                made.append(tmp)
                with os.fdopen(fd, "wb") as decoded:
                    decode_object(e.key, out, decoded, size=e.file_size, sha256=e.file_sha256)
                    decoded.flush()
                    os.fsync(decoded.fileno())
            else:
                out.flush()
                os.fsync(out.fileno())
        files.rename(tmp, root.path(sub, dest.name))
        made.remove(tmp)
    finally:
        for path in made:
            files.remove(path)
    files.fsync_dir(dest.parent)
    return dest


def staging_of(dest: Path) -> Path:
    """Where the restore into (resolved) ``dest`` works."""
    return dest.parent / f".{dest.name}.restoring"


class Staging:
    """A fresh staging directory for the resolved destination ``dest``."""

    def __init__(self, dest: Path, client: RemoteClient, files: FileLayer) -> None:
        """Create the staging directory (and ``wal/``, ``snapshots/``) afresh.

        A real directory left by a restore that died is removed first (without
        following any link inside it).

        :raises NotAStoreError: a symlink or a file stands where the staging
            directory goes; it is left as it is.
        :raises OSError: creating the directories failed.
        """
        self.client, self.files = client, files
        root = staging_of(dest)
        files.makedirs(dest.parent)
        if _check_spot(root):
            shutil.rmtree(root)  # a restore that died before its rename
        os.mkdir(root, 0o755)
        self.confined = Confined(root)
        self.root = self.confined.root
        for sub in (WAL_DIR, SNAPSHOT_DIR):
            os.mkdir(self.confined.path(sub))
        files.fsync_dir(root.parent)
        self.bytes = 0
        self._counting = threading.Lock()  # downloads run in threads beside the restore
        self.reads = ReadBuffer()
        """Where the restore's thread reads each segment it checks, one after another."""

    def path_of(self, e: Entry) -> Path:
        """The checked local path of entry ``e``."""
        return self.confined.path(WAL_DIR if e.kind == "wal" else SNAPSHOT_DIR, e.name)

    def fetch(self, e: Entry) -> Path:
        """Download ``e`` to its local path (:func:`download`); counts its bytes.

        :returns: the path written.
        :raises RemoteIntegrityError: the object's size or hash is not the manifest's.
        :raises NotAStoreError: a symlink was planted on the way.
        """
        path = download(self.client, self.confined, self.files, e)
        with self._counting:
            self.bytes += e.size
        return path

    def remove(self, e: Entry) -> None:
        """Remove ``e``'s local file, if it is there."""
        self.files.remove(self.path_of(e))

    def write(self, name: str, data: bytes) -> None:
        """Create the top-level file ``name`` durably (``FileLayer.create_durable``).

        :raises NotAStoreError: ``name`` or its temp file is a planted symlink.
        """
        self.confined.path(name + ".tmp")
        self.files.create_durable(self.confined.path(name), data)

    def discard(self) -> None:
        """Remove the staging directory and everything in it (links are not followed)."""
        shutil.rmtree(self.root, ignore_errors=True)
