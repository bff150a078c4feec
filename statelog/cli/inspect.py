"""``statelog inspect STORE``: what a store holds and who is using it, without changing a byte.

The state (epoch, offsets, low watermark) comes from a read-only open,
which extracts the snapshot it uses outside the store. Snapshots are
re-hashed unless ``--no-verify``; segments are described from their
names, sizes and last 24 bytes (the seal), never read whole. Each snapshot
is shown as full or delta, with a delta's depth and parent, and with
verification each delta's chain is checked link by link
(:mod:`statelog.ops.verify_chain`). Lock holders
are read from ``LOCK`` and ``COMPACTOR.LOCK`` without taking the locks:
the pid from the file, and whether a live process holds the ``flock`` from
``/proc/locks`` (a killed holder leaves its pid behind and no lock).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from statelog.cli.exits import EXIT_DAMAGED, EXIT_OK, EXIT_UNRECOVERABLE
from statelog.cli.output import fmt_age, fmt_bytes, print_json
from statelog.compaction.tail import list_segment_infos, peek_seal
from statelog.errors import (
    CorruptionError,
    FormatVersionError,
    ResnapshotRequired,
    StatelogError,
)
from statelog.format.snapshot import (
    HEADER_SIZE,
    IMAGE_VERSION,
    SnapshotHeader,
    peek_delta,
    peek_meta_len,
)
from statelog.ops.verify_chain import broken_chains, chain_members
from statelog.recovery.ladder import check_link
from statelog.remote.lag import lag
from statelog.remote.record import load_record
from statelog.replica.promoted import read_promoted
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import StoreLayout
from statelog.storage.snapshots import list_snapshots, verify_snapshot
from statelog.store.store import open as open_store

__all__ = ["add_parser", "lock_holder", "run"]

_META_MAX = 1 << 20  # a damaged length field makes inspect read no more than this


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``inspect`` on the subcommand parsers ``sub``."""
    p = sub.add_parser(
        "inspect",
        parents=parents,
        help="show epoch, offsets, snapshots, segments, tail, locks (read-only)",
        description="Show a store's state, snapshots, segments, tail size, writer lock "
        "holder and compactor status. Changes nothing in the store. Exit 0 when all is "
        "well, 1 when a snapshot fails verification, a delta's chain is broken or recovery "
        "would repair damage, "
        "2 when no open can recover the store (or its IDENTITY is damaged).",
    )
    p.add_argument("store", type=Path, metavar="STORE", help="the store directory")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="do not re-hash every snapshot (only the one recovery uses is read)",
    )


def lock_holder(path: Path) -> dict[str, Any]:
    """``{"pid", "held"}`` of a pid-lock file (``LOCK``, ``COMPACTOR.LOCK``), without taking it.

    ``pid`` is what the file says (None: empty or absent); ``held`` whether
    a live process holds the file's ``flock`` (None: unknown, no
    ``/proc/locks``). Opens the file read-only and never creates it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return {"pid": None, "held": False}
    try:
        raw = os.pread(fd, 32, 0)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        pid: int | None = int(raw.decode().strip())
    except ValueError:
        pid = None
    return {"pid": pid, "held": _flocked(st.st_dev, st.st_ino)}


def _flocked(dev: int, ino: int) -> bool | None:
    """Whether ``/proc/locks`` lists a FLOCK on the inode; None where there is no such file."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    want = (os.major(dev), os.minor(dev), ino)
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK" or parts[0] == "->" or parts[1] == "->":
            continue
        with contextlib.suppress(ValueError):
            major, minor, inode = parts[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == want:
                return True
    return False


def run(args: argparse.Namespace) -> int:
    """Print the description of ``args.store``; return the exit status (see ``add_parser``)."""
    root: Path = args.store
    files = FileLayer()
    layout = StoreLayout(root)
    try:
        store_id = layout.read_identity(files)
    except CorruptionError as exc:
        return _unidentified(root, exc, as_json=args.json)
    state, used, refused = _recovered(root)
    snaps = _snapshot_rows(files, layout, store_id, used, refused, verify=not args.no_verify)
    segs = _segment_rows(layout)
    newest: int = snaps[0]["lsn"] if snaps else 0
    doc: dict[str, Any] = {
        "store": str(root),
        "store_id": str(store_id),
        **state,
        "snapshots": snaps,
        "segments": segs,
        "tail_bytes": sum(s["bytes"] for s in segs if s["first_lsn"] > newest),
        "writer_lock": lock_holder(root / "LOCK"),
        "compactor": {
            **lock_holder(root / "COMPACTOR.LOCK"),
            "scratch_present": (root / "compactor.tmp").exists(),
        },
        "evidence": sorted(
            p.name for p in _listdir(layout.wal) if ".broken" in p.name or ".corrupt" in p.name
        ),
        "promoted": read_promoted(root),
        "remote": _remote(root),
    }
    if args.json:
        print_json(doc)
    else:
        _print(doc)
    if state["unrecoverable"] is not None:
        return EXIT_UNRECOVERABLE
    rec = state["recovery"]
    damaged = any(
        s["verified"] is False
        or (s["links"] is False and s["link_of"] is None)
        or s["chain"] is not None
        for s in snaps
    )
    return EXIT_DAMAGED if damaged or rec["rejected"] else EXIT_OK


def _unidentified(root: Path, exc: CorruptionError, *, as_json: bool) -> int:
    """Say that no open can use ``root``, whose ``IDENTITY`` is damaged; exit 2."""
    why = f"{exc.path.name}: {exc.reason}"
    if as_json:
        print_json({"store": str(root), "store_id": None, "unrecoverable": why,
                    "hint": exc.command_hint})  # fmt: skip
    else:
        print(f"{'store':<12} {root}")
        print(f"{'DAMAGED':<12} {why}")
        print(f"{'verdict':<12} NOT RECOVERABLE: no open can identify the log")
        print(f"{'hint':<12} {exc.command_hint}")
    return EXIT_UNRECOVERABLE


def _remote(root: Path) -> dict[str, Any] | None:
    """What the remote copy lacks, for a shipped store (``remote.json``); else None."""
    try:
        rec = load_record(root)
        if rec is None:
            return None
        got = lag(root)
    except (StatelogError, OSError) as exc:
        return {"error": str(exc)}
    return {"url": rec.url, "shipped_epoch": rec.last_epoch, **dataclasses.asdict(got)}


def _recovered(root: Path) -> tuple[dict[str, Any], Path | None, dict[Path, str]]:
    """What a read-only recovery of ``root`` finds: the state's summary, the
    snapshot it used, and the snapshots it read and refused (with why)."""
    try:
        with open_store(root, readonly=True) as ro:
            state = {
                "epoch": ro.epoch,
                "offsets": ro.offsets,
                "low_watermark_ms": ro.low_watermark_ms,
                "tables": {t: ro.count(t) for t in ro.tables()},
                "recovery": ro.recovery.to_dict(),
                "unrecoverable": None,
            }
            return state, ro.recovery.snapshot, {r.path: r.reason for r in ro.recovery.rejected}
    except ResnapshotRequired as exc:
        state = {"epoch": None, "offsets": {}, "low_watermark_ms": None, "tables": {}}
        state |= {"recovery": None, "unrecoverable": exc.message}
        return state, None, {}


def _snapshot_rows(
    files: FileLayer,
    layout: StoreLayout,
    store_id: uuid.UUID,
    used: Path | None,
    refused: dict[Path, str],
    *,
    verify: bool,
) -> list[dict[str, Any]]:
    """One row per snapshot, newest first; each verified, its link and chain checked if ``verify``.

    ``kind`` (full or delta), ``depth`` and ``parent`` come from the file's
    header and meta, read unverified unless ``verify``; ``chain`` is why a
    delta's chain is broken (checked only with ``verify``, None otherwise).
    """
    now = time.time()
    snaps, metas = [], {}
    for epoch, lsn, path in list_snapshots(layout.snapshots):
        st = path.stat()
        row: dict[str, Any] = {
            "file": path.name, "epoch": epoch, "lsn": lsn, "bytes": st.st_size,
            "age_seconds": round(now - st.st_mtime, 3), "verified": None, "links": None,
            "reason": None, "used_by_recovery": path == used, **_link_of(path), "chain": None,
            "link_of": None,
        }  # fmt: skip
        if path == used and not verify:
            row |= {"verified": True, "links": True}
        elif path in refused and not verify:
            row |= {"verified": False, "reason": refused[path]}
        elif verify:
            try:
                meta = verify_snapshot(files, path, store_id=store_id)
            except (CorruptionError, FormatVersionError) as exc:
                row |= {"verified": False, "reason": getattr(exc, "reason", exc.message)}
            else:
                metas[path.name] = meta
                why = check_link(layout.wal, meta)
                row |= {"verified": True, "links": why is None, "reason": why}
                row["age_seconds"] = round(now - meta.created_ms / 1000, 3)
        snaps.append(row)
    if verify:
        broken = broken_chains(metas, {r["file"] for r in snaps})
        restore = {r["file"] for r in snaps if r["verified"] and r["links"]}
        needed = chain_members(metas, broken, restore)
        for row in snaps:
            row["chain"] = broken.get(row["file"])
            row["link_of"] = needed.get(row["file"]) if not row["links"] else None
    return snaps


def _link_of(path: Path) -> dict[str, Any]:
    """``kind``, ``depth`` and ``parent`` of the snapshot at ``path``, read unverified.

    All three None when the header or meta does not read (verification
    names why); a format-1 snapshot is always full.
    """
    unknown: dict[str, Any] = {"kind": None, "depth": None, "parent": None}
    try:
        with path.open("rb") as fh:
            head = fh.read(HEADER_SIZE)
            meta_len = peek_meta_len(head)
            if meta_len is None or meta_len > _META_MAX:
                return unknown
            if SnapshotHeader.unpack(head).version == IMAGE_VERSION:
                return {"kind": "full", "depth": 0, "parent": None}
            link = peek_delta(fh.read(meta_len))
    except (OSError, msgspec.DecodeError):
        return unknown
    if link is None:
        return {"kind": "full", "depth": 0, "parent": None}
    return {"kind": "delta", "depth": link.depth, "parent": link.parent}


def _segment_rows(layout: StoreLayout) -> list[dict[str, Any]]:
    """One row per segment, in log order, with its seal if it has one."""
    segs: list[dict[str, Any]] = []
    for info in list_segment_infos(layout.wal):
        seal = peek_seal(info.path, info.size)
        segs.append(
            {
                "file": info.path.name, "sequence": info.sequence, "first_lsn": info.first_lsn,
                "bytes": info.size, "sealed": seal is not None,
                "last_lsn": seal[0] if seal else None,
            }
        )  # fmt: skip
    return segs


def _listdir(d: Path) -> list[Path]:
    try:
        return list(d.iterdir())
    except FileNotFoundError:
        return []


def _holder(lock: dict[str, Any]) -> str:
    if lock["held"] is False:
        return "none" if lock["pid"] is None else f"none (pid {lock['pid']} left it; not held)"
    if lock["held"] is None:
        return f"pid {lock['pid']} (lock state unknown)"
    return f"pid {lock['pid']}"


def _kind(row: dict[str, Any]) -> str:
    """``full``, ``delta 2 on <parent>``, or ``kind unknown`` (the header does not read)."""
    if row["kind"] is None:
        return "kind unknown"
    if row["kind"] == "full":
        return "full"
    return f"delta {row['depth']} on {row['parent']}"


def _print(doc: dict[str, Any]) -> None:
    print(f"store        {doc['store']} (id {doc['store_id']})")
    if doc["unrecoverable"] is not None:
        print(f"state        NOT RECOVERABLE: {doc['unrecoverable']}")
    else:
        rec = doc["recovery"]
        print(f"epoch        {doc['epoch']}")
        offsets = ", ".join(f"{k}={v}" for k, v in sorted(doc["offsets"].items())) or "-"
        print(f"offsets      {offsets}")
        print(f"watermark    {doc['low_watermark_ms']} ms")
        tables = ", ".join(f"{t}={n}" for t, n in sorted(doc["tables"].items())) or "-"
        print(f"tables       {tables}")
        print(f"recovery     {rec['outcome']}, {len(rec['rejected'])} rejected")
    print(f"writer lock  {_holder(doc['writer_lock'])}")
    promoted = doc["promoted"]
    if promoted is not None:
        where = f"{promoted.get('copy', '?')} at epoch {promoted.get('epoch', '?')}"
        print(f"promoted     {where if promoted else 'PROMOTED unreadable'}: writers refused")
    comp = doc["compactor"]
    scratch = ", scratch space present" if comp["scratch_present"] else ""
    print(f"compactor    {_holder(comp)}{scratch}")
    print(f"tail         {fmt_bytes(doc['tail_bytes'])} after the newest snapshot")
    print(f"snapshots    {len(doc['snapshots'])}")
    for s in doc["snapshots"]:
        ok = {None: "not verified", True: "verified", False: "DAMAGED"}[s["verified"]]
        if s["verified"] and not s["links"]:
            ok = "verified, DOES NOT LINK"
        if s["link_of"] is not None:
            ok = f"verified, a link of the chain of {s['link_of']} (not a restore point)"
        if s["chain"] is not None:
            ok = "verified, CHAIN BROKEN"
        used = ", used by recovery" if s["used_by_recovery"] else ""
        reason = s["chain"] or (None if s["link_of"] else s["reason"])
        why = f": {reason}" if reason else ""
        print(
            f"  {s['file']}  epoch {s['epoch']}  {fmt_bytes(s['bytes'])}  "
            f"age {fmt_age(s['age_seconds'])}  {_kind(s)}  {ok}{used}{why}"
        )
    print(f"segments     {len(doc['segments'])}")
    for g in doc["segments"]:
        sealed = f"sealed at LSN {g['last_lsn']}" if g["sealed"] else "not sealed"
        print(f"  {g['file']}  first LSN {g['first_lsn']}  {fmt_bytes(g['bytes'])}  {sealed}")
    for e in doc["evidence"]:
        print(f"evidence     wal/{e}")
    rem = doc["remote"]
    if rem is not None and "error" in rem:
        print(f"remote       unreadable: {rem['error']}")
    elif rem is not None:
        print(
            f"remote       {rem['url']} up to epoch {rem['shipped_epoch']}; not shipped: "
            f"{rem['epochs']} epochs, {fmt_bytes(rem['bytes'])}, oldest "
            f"{fmt_age(rem['seconds'])}"
        )
