"""Pins: files that retention must not delete while someone reads them (invariant 8).

A reader (a recovery, a ``verify``, a restore, the compactor's own fold)
that is about to open files of a store pins them first::

    with pin(store, ["snapshots/X.snap", "wal/Y.wal"], purpose="restore") as p:
        ...  # every named file that existed when pin() returned is still there

A pin is the file ``STORE/pins/<pid>-<random>.pin`` holding JSON (``pid``,
``purpose``, ``created``, ``files``: names relative to the store) and an
exclusive ``flock`` held by the pinning process for the pin's whole life.
The kernel drops the flock when its holder dies, so a pin can never outlive
its reader: :func:`pinned_names` treats a pin file whose lock is free as
stale, ignores it and removes it.

**The race, and why the order closes it.** Retention chooses what to
delete, *then* lists the pins, then deletes what is not pinned. A reader
pins, *then* opens. Without more, one interleaving still loses: retention
lists the pins, the reader's pin appears, the reader finds the file present,
retention deletes it, the reader's later open fails. So retention lists
pins and deletes inside :func:`retention_guard` (an exclusive flock on
``pins/.guard``), and :func:`pin` makes its pin visible while holding the
same guard shared. Each pin therefore lands either before retention lists
pins (retention sees it and skips its names) or after retention's deletions
are done (they are all over by then). :func:`pin` looks at the named files
only after its pin is visible and the guard is released, so what it finds
present stays present until the pin is released; names already gone are
reported in :attr:`Pin.missing`, and the reader chooses again. An open file
survives its unlink on POSIX anyway; the pin is what protects the files a
reader will open *later* (the segments after the snapshot it restores).

Pins are deliberately not durable (no fsync): a pin means "a live process
is reading", and after a crash no process is. The guard and the pins rely
on ``flock``; they hold between processes of one host (and between separate
opens within one process), not across hosts sharing a network file system.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from statelog.storage.layout import parse_json_doc

__all__ = [
    "ALL",
    "PIN_DIR",
    "Note",
    "Pin",
    "log_notes",
    "pin",
    "pinned_names",
    "retention_guard",
]

log = logging.getLogger("statelog.storage.pins")

PIN_DIR = "pins"
PIN_SUFFIX = ".pin"
GUARD = ".guard"
_TMP_GRACE = 60.0  # seconds before an unlocked *.pin.tmp counts as stale
ALL = "*"
"""Returned by :func:`pinned_names` when a live pin cannot be read: treat every file as pinned."""


@dataclass(frozen=True)
class Pin:
    """A pin that is held: ``path`` is its file, ``missing`` the names absent when it was taken."""

    path: Path
    names: frozenset[str]
    missing: frozenset[str]


def _normalise(name: str) -> str:
    """``name`` as a clean relative POSIX path inside the store.

    :raises ValueError: an absolute name, an empty one, or one that climbs out with ``..``.
    """
    p = PurePosixPath(str(name))
    if p.is_absolute() or not p.parts or ".." in p.parts or str(p) == ".":
        raise ValueError(f"pin names are relative paths inside the store, not {name!r}")
    return str(p)


@contextlib.contextmanager
def _guard(store: Path, how: int) -> Iterator[None]:
    """Hold ``pins/.guard`` with ``flock(how)`` (blocking) for the ``with`` block."""
    d = store / PIN_DIR
    os.makedirs(d, exist_ok=True)
    fd = os.open(d / GUARD, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def retention_guard(store: Path) -> contextlib.AbstractContextManager[None]:
    """Exclusive guard for a deleter: call :func:`pinned_names` and delete inside it.

    Held only while listing pins and unlinking (milliseconds); :func:`pin`
    waits for it, and it waits for pins being created. Never call :func:`pin`
    inside it: flocks of two opens conflict even within one process.
    """
    return _guard(store, fcntl.LOCK_EX)


@contextlib.contextmanager
def pin(store: Path, names: Iterable[str], *, purpose: str) -> Iterator[Pin]:
    """Pin ``names`` (relative to ``store``) for the ``with`` block.

    Steps, in order: create ``pins/<pid>-<random>.pin.tmp`` exclusively and
    flock it; write the JSON; under the shared guard, rename it to
    ``.pin`` (the flock follows the inode, so the pin is never visible
    unlocked); release the guard; look which names exist. On exit the pin
    file is unlinked, then closed (which drops the flock). Not durable: see
    the module docstring.

    :raises ValueError: a name is absolute or climbs out of the store.
    :raises OSError: the pin could not be created (e.g. a read-only store).
    """
    clean = frozenset(_normalise(n) for n in names)
    d = store / PIN_DIR
    os.makedirs(d, exist_ok=True)
    final = d / f"{os.getpid()}-{secrets.token_hex(8)}{PIN_SUFFIX}"
    tmp = final.with_name(final.name + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    visible: Path = tmp
    try:
        # Blocking: pinned_names() may hold this fresh file's lock for an instant
        # while it decides the file is not stale.
        fcntl.flock(fd, fcntl.LOCK_EX)
        doc = {
            "pid": os.getpid(),
            "purpose": purpose,
            "created": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "files": sorted(clean),
        }
        data = memoryview((json.dumps(doc) + "\n").encode())
        while data:
            data = data[os.write(fd, data) :]
        with _guard(store, fcntl.LOCK_SH):
            os.rename(tmp, final)
            visible = final
        missing = frozenset(n for n in clean if not (store / n).exists())
        yield Pin(final, clean, missing)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(visible)
        os.close(fd)


def _lock_is_free(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


Note = tuple[int, str, tuple[object, ...]]
"""A log record kept for later: ``(level, format, args)``."""


def log_notes(notes: Iterable[Note]) -> None:
    """Log the records :func:`pinned_names` kept in ``notes``, in order."""
    for level, fmt, args in notes:
        log.log(level, fmt, *args)


def pinned_names(store: Path, *, notes: list[Note] | None = None) -> set[str]:
    """Names pinned by every live pin of ``store`` (an empty set if there is none).

    A pin is live while its flock is held. A pin file whose lock is free
    belongs to a process that is gone: it is removed (so are stale
    ``*.pin.tmp`` files of a process that died while pinning). A live pin
    whose JSON cannot be read makes the result contain :data:`ALL`, so a
    deleter that honours pins deletes nothing.

    :param notes: keep the log records here instead of logging them: a
        caller inside :func:`retention_guard` logs them (:func:`log_notes`)
        once it is released, since a log handler may block and every pin
        waits for the guard.
    :raises OSError: the pins directory exists but cannot be read.
    """

    def say(level: int, fmt: str, *args: object) -> None:
        if notes is None:
            log.log(level, fmt, *args)
        else:
            notes.append((level, fmt, args))

    d = store / PIN_DIR
    try:
        entries = sorted(d.iterdir())
    except FileNotFoundError:
        return set()
    names: set[str] = set()
    for p in entries:
        if not (p.name.endswith(PIN_SUFFIX) or p.name.endswith(PIN_SUFFIX + ".tmp")):
            continue
        try:
            # Without blocking: a FIFO planted under a pin's name would wait for a writer.
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            continue  # released meanwhile
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                say(logging.ERROR, "event=unreadable_pin pin=%s reason=%r", p.name,
                    "not a regular file")  # fmt: skip
                continue
            tmp = not p.name.endswith(PIN_SUFFIX)
            if _lock_is_free(fd):
                # A fresh .pin.tmp may be unlocked for the instant between its
                # creation and its flock: only an old one is surely stale.
                if not tmp or time.time() - os.fstat(fd).st_mtime > _TMP_GRACE:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p)
                    say(logging.INFO, "event=stale_pin_removed pin=%s", p.name)
                continue
            if tmp:
                continue  # being created: it becomes visible under the guard
            try:
                doc = parse_json_doc(os.pread(fd, 1 << 20, 0))
                names.update(_normalise(n) for n in doc["files"])
            except (ValueError, KeyError, TypeError) as exc:
                say(logging.ERROR, "event=unreadable_pin pin=%s reason=%r", p.name, str(exc))
                names.add(ALL)
        finally:
            os.close(fd)
    return names
