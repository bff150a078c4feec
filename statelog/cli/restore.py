"""``statelog restore SOURCE STORE``: rebuild a store from its remote copy, or from a store
directory, at its newest epoch or at a point (``--epoch N``, ``--at TIME``); exit 0, 1 or 2.

The work is :func:`statelog.remote.restore` (``docs/remote.md``, "Restore"):
the newest remote snapshot that verifies and links to the remote log, then
the segments after it, each verified on download, into a staging directory
that becomes ``STORE`` only when it recovers to the planned epoch. This
module prints what it did and maps it to the exit status:

* 0: restored to the last shipped epoch, nothing refused;
* 1: restored, but the remote copy was damaged: a snapshot was walked past
  (``rejected``) or a damaged segment stopped the restore early
  (``lost_epochs``). The store is consistent at the epoch printed;
* 2: nothing restorable (:class:`~statelog.errors.ResnapshotRequired`), or
  ``--strict`` and a damaged segment, or a MANIFEST refused before any
  download (names outside the store's grammar, an object over its limit,
  not signed with ``STATELOG_REMOTE_KEY``): :class:`RemoteIntegrityError`;
  ``STORE`` was not created;
* 3: ``STORE`` is not a new or empty directory, or the URL / the AWS_*
  environment is unusable (nothing was contacted); the usual codes
  otherwise (``docs/cli.md``).

``STORE`` is created only by the final rename, so any failure leaves it as
it was.
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

from statelog.cli.exits import EXIT_DAMAGED, EXIT_OK, EXIT_UNRECOVERABLE, EXIT_USAGE
from statelog.cli.output import fmt_bytes, print_json, say_error
from statelog.cli.point import add_point_args, point_of
from statelog.errors import InvalidOptionError, ResnapshotRequired
from statelog.recovery.point import restore_point
from statelog.store.store import open as open_store

__all__ = ["add_parser", "run"]


def _store_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a store id (a UUID): {text!r}") from None


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``restore`` on the subcommand parsers ``sub``."""
    p = sub.add_parser(
        "restore",
        parents=parents,
        help="rebuild a store from its remote copy (s3://bucket/prefix); exit 0, 1 or 2",
        description="Download the newest remote snapshot that verifies and the segments after "
        "it, verifying every object on download and walking back past damage, into STORE "
        "(a new or empty directory). The connection comes from the AWS_* environment "
        "(docs/remote.md). Exit 0: restored to the last shipped epoch. 1: restored, but "
        "the remote copy was damaged (a snapshot rejected or epochs lost); the store is "
        "consistent at the epoch printed. 2: nothing restorable (or --strict and a damaged "
        "segment, or the remote MANIFEST refused: bad names, or not signed with "
        "STATELOG_REMOTE_KEY); STORE was not created. 3: STORE is not empty, or a bad URL "
        "or key.",
    )
    p.add_argument(
        "url", metavar="SOURCE", help="the remote, s3://bucket/prefix, or a store directory"
    )
    p.add_argument("store", type=Path, metavar="STORE", help="a new or empty directory")
    add_point_args(p, "--epoch", "restore the state")
    p.add_argument(
        "--store-id",
        type=_store_id,
        default=None,
        metavar="ID",
        help="which store under the prefix (default: the only one there)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 2 on a damaged remote segment instead of stopping at the last good epoch",
    )
    p.add_argument(
        "--take-over",
        action="store_true",
        help="acquire a new writer generation first (failover): the previous owner is "
        "fenced and can add nothing after what is restored",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def run(args: argparse.Namespace) -> int:
    """Restore ``args.url`` into ``args.store``, print the result, return its exit status."""
    # Imported by this command alone: statelog.remote and obstore add about 30 ms
    # (python -X importtime) to a CLI start of about 250 ms, which every other
    # command would pay for nothing.
    if "://" not in args.url:
        return _from_directory(args)
    from statelog.remote import RemoteConfigError, RemoteIntegrityError, restore

    try:
        result = restore(
            args.url,
            args.store,
            store_id=args.store_id,
            strict=args.strict,
            take_over=args.take_over,
            upto=args.epoch if args.at is None else args.at,
        )
    except (ResnapshotRequired, RemoteIntegrityError) as exc:
        say_error(exc)
        return EXIT_UNRECOVERABLE
    except RemoteConfigError as exc:
        say_error(exc)  # a bad URL or environment is a usage error: nothing was contacted
        return EXIT_USAGE
    lost = result.lost_epochs
    doc: dict[str, Any] = {
        "store": str(result.dest),
        "url": args.url,
        "store_id": str(result.store_id),
        "generation": result.generation,
        "taken_over": args.take_over,
        "epoch": result.epoch,
        "shipped_epoch": result.shipped_epoch,
        "snapshot": result.snapshot,
        "segments": list(result.segments),
        "rejected": [{"key": k, "reason": why} for k, why in result.rejected],
        "lost_epochs": [lost.start, lost.stop - 1] if lost else [],
        "bytes_downloaded": result.bytes_downloaded,
        "asked": args.epoch is not None or args.at is not None,
        "seconds": round(result.seconds, 3),
    }
    clean = not result.rejected and not lost
    if args.json:
        print_json({**doc, "clean": clean})
    else:
        _print(doc, clean)
    return EXIT_OK if clean else EXIT_DAMAGED


def _print(doc: dict[str, Any], clean: bool) -> None:
    print(f"store      {doc['store']}")
    print(f"from       {doc['url']} (store id {doc['store_id']})")
    print(f"epoch      {doc['epoch']} (shipped epoch {doc['shipped_epoch']})")
    print(f"snapshot   {doc['snapshot'] or 'none (the log from epoch 1)'}")
    print(f"segments   {len(doc['segments'])}")
    owner = "taken over by this restore" if doc["taken_over"] else "not taken over"
    print(f"generation {doc['generation']} when read; {owner}")
    print(f"read       {fmt_bytes(doc['bytes_downloaded'])} in {doc['seconds']:.2f}s")
    for r in doc["rejected"]:
        print(f"REJECTED   {r['key']}: {r['reason']}")
    if doc["lost_epochs"]:
        first, last = doc["lost_epochs"]
        print(f"LOST       epochs {first}..{last} ({last - first + 1} commits)")
    verdict = (
        (
            "clean: the epoch asked for was restored; the remote's history after it leaves "
            "its MANIFEST when this store takes the remote over"
            if doc["asked"]
            else "clean: the last shipped epoch was restored"
        )
        if clean
        else "the remote copy is damaged; the store is consistent at the epoch above: "
        "resume the reconciler from its offsets"
    )
    print(f"verdict    {verdict}")


def _from_directory(args: argparse.Namespace) -> int:
    """``SOURCE`` is a store directory: write a new store at the point asked (the newest
    epoch without one), read-only on ``SOURCE`` (:func:`~statelog.recovery.point.restore_point`)."""
    source = Path(args.url)
    if args.take_over or args.store_id is not None:
        raise InvalidOptionError(
            "--take-over and --store-id are for a remote SOURCE",
            hint="a directory holds one store and no writer generation",
        )
    at = point_of(args, source)
    if at is None:
        with open_store(source, readonly=True) as ro:
            at = ro.epoch
    plan = restore_point(source, args.store, at)
    doc = {
        "store": str(args.store),
        "source": str(source),
        "epoch": plan.epoch,
        "chain": [p.name for p in plan.chain],
        "segments": [p.name for p in plan.segments],
        "later_epochs": [plan.epoch + 1, plan.last_epoch] if plan.last_epoch > plan.epoch else [],
    }
    if args.json:
        print_json({**doc, "clean": True})
        return EXIT_OK
    print(f"store      {doc['store']}")
    print(f"from       {doc['source']}")
    print(f"epoch      {plan.epoch} (the source holds epochs up to {plan.last_epoch})")
    chain = " <- ".join(p.name for p in plan.chain) or "none (the log from epoch 1)"
    print(f"snapshot   {chain}")
    cut = " (the last cut after the epoch)" if plan.cut else ""
    print(f"segments   {len(plan.segments)}{cut}")
    return EXIT_OK
