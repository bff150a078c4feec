"""``statelog promote COPY [--source SOURCE]``: make a standby's copy the writer's store.

For a copy whose standby process is gone (a standby running in a process is
promoted by that process, ``store.promote()``): opens ``COPY`` as a standby of
``SOURCE`` (which takes the copy's writer lock, so a standby still running
makes this exit 4), and promotes it, with every step of
:meth:`~statelog.store.store.StateStore.promote`: one last look at the source,
the refusal while the source's writer holds its lock (exit 4), the writer's
open of the copy. Then closes the new writer and prints the epoch, offsets and
watermark the reconciler resumes from. ``SOURCE`` defaults to the one the
copy's ``STANDBY`` mark names (:mod:`statelog.storage.marks`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from statelog.cli.exits import EXIT_OK
from statelog.errors import (
    InvalidOptionError,
    PromotionRefusedError,
    StorageError,
    StoreNotFoundError,
)
from statelog.sharding.partition import MANIFEST, shard_dir_name
from statelog.sharding.sharded import ShardedStore, ShardOpenError
from statelog.storage.lock import StoreLock
from statelog.storage.marks import clear_standby, standby_source
from statelog.store.standby_role import Promotion
from statelog.store.store import StateStore
from statelog.store.store import open as open_store

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``promote`` on the subcommand parsers ``sub``."""
    p = sub.add_parser(
        "promote",
        parents=parents,
        help="make a standby's copy of a store the writer's store",
        description="Catch the copy at COPY up with SOURCE one last time, then make it a "
        "store its own writer opens, and print the epoch, offsets and watermark to resume "
        "from. SOURCE is the store directory the copy follows, or the s3:// URL its writer "
        "ships to (default: the one the copy names). Exit 0 promoted; 4 the source's "
        "writer still holds its lock, a standby or "
        "writer holds the copy's, or another standby was promoted first (nothing changed but "
        "the catch-up); 5 SOURCE cannot be read (for a directory, --force promotes the copy "
        "as it is); 3 COPY holds another store.",
    )
    p.add_argument("copy", type=Path, metavar="COPY", help="the standby's store directory")
    p.add_argument(
        "--source",
        metavar="SOURCE",
        help="the store directory it follows, or the s3:// URL its writer ships to "
        "(default: the source the copy was following)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="promote even if SOURCE cannot be read (its host is gone): the copy as its "
        "standby last saw it; only when the source's writer is certainly dead",
    )
    p.add_argument(
        "--shard",
        type=int,
        metavar="N",
        help="a sharded root: promote shard N only (default: every shard still a standby)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def run(args: argparse.Namespace) -> int:
    """Promote ``args.copy``; print where the writer resumes; return the exit status."""
    if args.source is None:
        args.source = _followed(args.copy)
    sharded = (args.copy / MANIFEST).exists() or (
        "://" not in args.source and (Path(args.source) / MANIFEST).exists()
    )
    if args.shard is not None and not sharded:
        raise InvalidOptionError(
            f"--shard {args.shard}: {args.copy} is not a sharded root",
            hint="leave --shard out to promote a single store",
        )
    promoted = _promote_root(args) if sharded else {None: _promote_store(args)}
    if args.json:
        docs = {i: _doc(p) for i, p in promoted.items()}
        doc = {"store": str(args.copy), **(docs[None] if not sharded else {"shards": docs})}
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    for i, p in promoted.items():
        offsets = ", ".join(f"{part}={o}" for part, o in sorted(p.offsets.items())) or "-"
        which = "" if i is None else f" shard {i}"
        print(f"promoted {args.copy}{which} at epoch {p.epoch}")
        print(f"resume from offsets {offsets}, watermark {p.low_watermark_ms}")
    return EXIT_OK


def _doc(p: Promotion) -> dict[str, Any]:
    return {"epoch": p.epoch, "offsets": p.offsets, "low_watermark_ms": p.low_watermark_ms}


def _promote_store(args: argparse.Namespace) -> Promotion:
    try:
        store = open_store(args.copy, follow=args.source)
    except (StoreNotFoundError, StorageError) as exc:
        if not _may_force(args) or not (args.copy / "IDENTITY").exists():
            raise PromotionRefusedError(f"{args.source} cannot be read: {exc}") from exc
        lock = StoreLock(args.copy)  # a standby still running holds it: exit 4
        try:
            clear_standby(args.copy)  # forced: the copy as it is, its writer's open recovers it
        finally:
            lock.release()
        store = open_store(args.copy)
    with store:
        if store.standby:
            return store.promote(force=args.force)
        return Promotion(store.epoch, store.offsets, store.low_watermark_ms)


def _promote_root(args: argparse.Namespace) -> dict[int | None, Promotion]:
    """Every shard still a standby (or ``--shard``), one shard at a time."""
    try:
        root = ShardedStore(args.copy, follow=args.source)
    except (StoreNotFoundError, StorageError, ShardOpenError) as exc:
        cause = exc.cause if isinstance(exc, ShardOpenError) else exc
        if not isinstance(cause, StoreNotFoundError | StorageError):
            raise cause from exc  # busy, promoted or damaged: its own exit status
        if not _may_force(args) or not (args.copy / MANIFEST).exists():
            raise PromotionRefusedError(f"{args.source} cannot be read: {exc}") from exc
        return _force_root(args)
    with root:
        return {i: p for i, p in root.promote(args.shard, force=args.force).items()}


def _as_is(store: StateStore) -> Promotion:
    return Promotion(store.epoch, store.offsets, store.low_watermark_ms)


def _may_force(args: argparse.Namespace) -> bool:
    """``--force`` applies to a directory source only: a remote one holds the generation."""
    return bool(args.force) and "://" not in args.source


def _followed(copy: Path) -> str:
    """The source the copy (or, for a sharded root, its shards' parent) was following.

    :raises InvalidOptionError: the copy names none: ``--source`` is needed.
    """
    source = standby_source(copy)
    if source is not None:
        return source
    for shard in sorted(copy.glob("shard-*")):
        followed = standby_source(shard)
        if followed is not None and "://" not in followed:
            return str(Path(followed).parent)
    raise InvalidOptionError(
        f"{copy} names no source it follows (it is not a standby's copy, or an older one)",
        hint="give the source: statelog promote COPY --source SOURCE",
    )


def _force_root(args: argparse.Namespace) -> dict[int | None, Promotion]:
    """``--force`` on a sharded root whose source cannot be read: each shard's copy as it
    is, its STANDBY mark removed only while this process holds the copy's lock (a standby
    still running holds it: exit 4, nothing changed)."""
    todo = [args.shard] if args.shard is not None else None
    locks = []
    try:
        for shard in sorted(args.copy.glob("shard-*")):
            if todo is None or shard.name in {shard_dir_name(i) for i in todo}:
                locks.append((shard, StoreLock(shard)))
        for shard, _lock in locks:
            clear_standby(shard)
    finally:
        for _shard, lock in locks:
            lock.release()
    with ShardedStore(args.copy) as forced:
        which = todo if todo is not None else range(forced.shards)
        return {i: _as_is(forced.shard(i)) for i in which}
