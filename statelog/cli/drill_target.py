"""Where ``statelog drill`` runs, and what a drill in place changed.

:func:`choose_target` turns the drill's ``STORE-OR-TEMP`` argument into the
store the rounds run on:

* ``temp`` or a path that does not exist (or an empty directory): a fresh
  store, removed after a pass;
* an existing store: a copy of it, in a new directory of the system's
  temporary directory (``TMPDIR``), made the way ``statelog restore STORE
  DEST`` makes one (:func:`statelog.recovery.point.restore_point`): the
  store is only read, its files pinned while they are copied, and the copy
  must recover read-only to exactly the epoch read, so a writer may hold
  the store meanwhile. The copy is removed after a pass and kept after a
  failure;
* an existing store with ``--in-place``: the store itself.

For a drill in place, :func:`footprint` reads the store before and after,
:func:`settle_damage` puts back every byte ``--damage`` flipped (and moves
a snapshot aside only when it still fails ``statelog verify`` once
restored), and :func:`changes` / :func:`print_changes` tell what changed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from statelog.cli.drill_rounds import Flip
from statelog.cli.drill_writer import APPLIED, BUFFER, PARTITIONS
from statelog.errors import DataLossWarning, NotAStoreError
from statelog.log.segments import list_segments
from statelog.ops.verify import verify_store
from statelog.recovery.point import PointPlan, restore_point, write_point
from statelog.storage.layout import IDENTITY, SNAPSHOT_DIR, WAL_DIR
from statelog.store.store import open as open_store

__all__ = [
    "ASIDE",
    "Footprint",
    "Target",
    "changes",
    "choose_target",
    "copy_store",
    "footprint",
    "print_changes",
    "settle_damage",
]

ASIDE = ".drill-damaged"
"""Appended to the name of a snapshot the drill damaged that ``statelog verify`` still
names once its byte is put back (retention removed the log it links to while the snapshot
was damaged): so named, it is no snapshot any more and verify passes it by."""


@dataclass(frozen=True)
class Target:
    """The store the rounds run on, and where it came from."""

    path: Path
    mode: str
    """``temp``, ``new`` (a path that did not exist, or an empty directory), ``copy``
    (of :attr:`source`) or ``in-place`` (:attr:`source` itself)."""
    source: Path | None
    cleanup: Callable[[], None] | None
    """Removes what the drill created (None: the drill created nothing, in place)."""


def _remover(path: Path) -> Callable[[], None]:
    return lambda: shutil.rmtree(path, ignore_errors=True)


def choose_target(arg: str, *, in_place: bool) -> Target:
    """The store to drill for the argument ``arg`` (module docstring).

    :raises NotAStoreError: ``arg`` exists and is neither a store nor an empty directory.
    :raises StatelogError: the copy of an existing store failed (as :func:`copy_store`);
        nothing of it is left.
    """
    if arg == "temp":
        root = Path(tempfile.mkdtemp(prefix="statelog-drill-"))
        return Target(root / "store", "temp", None, _remover(root))
    path = Path(arg)
    if not path.exists():
        return Target(path, "new", None, _remover(path))
    if path.is_dir() and (path / IDENTITY).is_file():
        if in_place:
            return Target(path, "in-place", path, None)
        root = Path(tempfile.mkdtemp(prefix=f"statelog-drill-{path.name}-"))
        try:
            copy_store(path, root / "store")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return Target(root / "store", "copy", path, _remover(root))
    if path.is_dir() and not any(path.iterdir()):

        def empty() -> None:
            for entry in path.iterdir():
                shutil.rmtree(entry, ignore_errors=True)

        return Target(path, "new", None, empty)
    raise NotAStoreError(
        f"{path} exists and is not a statelog store", hint="name a store, a new path or 'temp'"
    )


def copy_store(source: Path, dest: Path) -> int:
    """Write at ``dest`` (new) a copy of the store ``source`` at its newest epoch; only
    read ``source`` (its files pinned while they are copied); the epoch copied.

    :raises ResnapshotRequired: ``source`` cannot be recovered.
    :raises StorageError: a copy failed, or the copy does not recover to the epoch read;
        ``dest`` was not created.
    :raises StatelogError: ``source`` cannot be opened read-only.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataLossWarning)  # the drill reports damage itself
        with open_store(source, readonly=True) as ro:
            epoch = ro.epoch
        if epoch:
            restore_point(source, dest, epoch)
        else:  # a store nothing was committed to: its identity and its empty log
            segs = tuple(p for _s, _f, p in list_segments(source / WAL_DIR))
            write_point(source, dest, PointPlan(0, (), segs, None, 0, (), (), 0))
    return epoch


@dataclass(frozen=True)
class Footprint:
    """What a drill in place may change in a store."""

    epoch: int
    watermark_ms: int
    offsets: dict[str, int]
    tables: frozenset[str]
    files: frozenset[str]
    """The entries of ``wal/`` and ``snapshots/``, as ``wal/<name>``."""


def footprint(store: Path) -> Footprint:
    """Read ``store`` (read-only) for :func:`changes`.

    :raises StatelogError: the store cannot be opened read-only.
    """
    files = frozenset(
        f"{sub}/{p.name}"
        for sub in (WAL_DIR, SNAPSHOT_DIR)
        if (store / sub).is_dir()
        for p in (store / sub).iterdir()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataLossWarning)
        with open_store(store, readonly=True) as ro:
            return Footprint(
                ro.epoch, ro.low_watermark_ms, dict(ro.offsets), frozenset(ro.tables()), files
            )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def settle_damage(store: Path, flips: Sequence[Flip]) -> tuple[list[dict[str, Any]], str]:
    """Put back every byte in ``flips`` that still holds its flipped value; then move
    aside (:data:`ASIDE`) each of those snapshots ``statelog verify`` still names.

    :returns: per flip ``file``, ``offset``, ``restored``, ``moved_to`` (None: left in
        ``snapshots/``) and ``why`` (what ``statelog verify`` said of it once put back,
        None when it said nothing); and the verdict of ``statelog verify`` at the end
        ("" when nothing was flipped).
    :raises StatelogError: the store cannot be verified.
    :raises OSError: a snapshot could not be written or moved.
    """
    done: list[dict[str, Any]] = []
    for f in flips:
        restored = False
        if f.path.is_file():
            with f.path.open("r+b") as fh:
                fh.seek(f.offset)
                if fh.read(1) == bytes([f.byte ^ 0xFF]):
                    fh.seek(f.offset)
                    fh.write(bytes([f.byte]))
                    fh.flush()
                    os.fsync(fh.fileno())
                    restored = True
        rel = f"{SNAPSHOT_DIR}/{f.path.name}"
        done.append(
            {"file": rel, "offset": f.offset, "restored": restored, "moved_to": None, "why": None}
        )
    if not flips:
        return done, ""
    report = verify_store(store)
    named = {x.path.name: x.reason for x in report.findings if x.path.parent.name == SNAPSHOT_DIR}
    moved = False
    for f, entry in zip(flips, done, strict=True):
        if f.path.is_file() and f.path.name in named:
            os.replace(f.path, f.path.with_name(f.path.name + ASIDE))
            _fsync_dir(f.path.parent)
            entry["moved_to"] = f"{SNAPSHOT_DIR}/{f.path.name}{ASIDE}"
            entry["why"] = named[f.path.name]
            moved = True
    if moved:
        report = verify_store(store)
    return done, str(report.verdict)


def changes(
    before: Footprint, after: Footprint, damaged: list[dict[str, Any]], verdict: str
) -> dict[str, Any]:
    """What a drill in place changed, from the store's footprint ``before`` and ``after``
    it, and :func:`settle_damage`'s answer (JSON-ready)."""

    def names(sub: str, fp: Footprint, other: Footprint, suffix: str) -> list[str]:
        return sorted(
            x for x in fp.files - other.files if x.startswith(f"{sub}/") and x.endswith(suffix)
        )

    drill_tables = (APPLIED, BUFFER)
    return {
        "epoch": [before.epoch, after.epoch],
        "low_watermark_ms": [before.watermark_ms, after.watermark_ms],
        "partitions_added": sorted(p for p in after.offsets if p not in before.offsets),
        "partitions_moved": sorted(
            p for p in PARTITIONS if p in before.offsets and before.offsets[p] != after.offsets[p]
        ),
        "tables_added": sorted(t for t in after.tables - before.tables),
        "tables_rewritten": sorted(t for t in drill_tables if t in before.tables),
        "snapshots_added": names(SNAPSHOT_DIR, after, before, ".snap"),
        "snapshots_removed": names(SNAPSHOT_DIR, before, after, ".snap"),
        "segments_added": names(WAL_DIR, after, before, ".wal"),
        "segments_removed": names(WAL_DIR, before, after, ".wal"),
        "evidence_added": sorted(
            x for x in after.files - before.files if x.endswith((".broken", ".corrupt"))
        ),
        "damaged": damaged,
        "verify": verdict or None,
    }


def _damage_line(d: dict[str, Any]) -> str:
    head = f"{d['file']}: the byte at offset {d['offset']} flipped"
    if d["moved_to"]:
        return f"{head}; moved aside to {d['moved_to']} (verify, once put back: {d['why']})"
    return f"{head}, put back (it verifies again)" if d["restored"] else f"{head}, left as is"


def print_changes(store: Path, doc: dict[str, Any]) -> None:
    """Print :func:`changes`' ``doc`` for people."""
    e0, e1 = doc["epoch"]
    w0, w1 = doc["low_watermark_ms"]
    print(f"changed in place: {store}")
    print(f"  epoch          {e0} -> {e1}")
    print(f"  low watermark  {w0} -> {w1} ms ({(w1 - w0) / 1000:+.3f} s)")
    for what, added, other, verb in (
        ("partitions", doc["partitions_added"], doc["partitions_moved"], "moved"),
        ("tables", doc["tables_added"], doc["tables_rewritten"], "rewritten"),
    ):
        parts = [f"added {', '.join(added)}"] if added else []
        parts += [f"{verb} {', '.join(other)}"] if other else []
        print(f"  {what:<14} {'; '.join(parts) or 'none added'}")
    for what in ("snapshots", "segments"):
        print(
            f"  {what:<14} {len(doc[what + '_added'])} written, "
            f"{len(doc[what + '_removed'])} removed by retention"
        )
    for x in doc["evidence_added"]:
        print(f"  evidence       {x} (kept by a recovery)")
    for d in doc["damaged"]:
        print(f"  damaged        {_damage_line(d)}")
    if doc["verify"]:
        print(f"  verify         {doc['verify']}")
