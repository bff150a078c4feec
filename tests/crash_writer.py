"""A committing writer for the SIGKILL test, run as a real subprocess.

It commits the kit's seeded stream (:class:`statelog.kit.Stream`, commit
``i`` a pure function of ``(seed, i)``); the parent test recomputes the
model from the same seed at whatever epoch recovery reports.

Protocol (one line per event on stdout, written with a single ``write`` so a
SIGKILL never leaves half a line)::

    opening                   about to open the store (recovery starts)
    open <epoch> <digest>     the store opened; recovered epoch and state digest
    begin <i> [roll]          commit i is about to be attempted ("roll": the log
                              rolls to a new segment first)
    ack <i>                   commit i returned (durable: durability="commit")
    done                      every requested commit was made; the store closed

``--die-at`` makes the writer SIGKILL itself at a precise step that a timed
kill from outside rarely hits, through the kit's fault layer
(:func:`plan_faults`), armed once the store is open:

* ``torn:<n>:<frac>``: the n-th record append writes only ``frac`` of its bytes.
* ``roll:<n>:<point>[:<frac>]``: inside the n-th segment roll, at ``point``:
  ``seal-torn`` (part of the SEAL frame written), ``sealed`` (SEAL written and
  synced), ``tmp`` (part of the new segment's temp file written), ``renamed``
  (new segment renamed into place, directory not yet synced), ``opened`` (new
  segment open, nothing appended), ``first-torn`` (part of the first record
  after the roll written).

Usage::

    python tests/crash_writer.py STORE --seed 7 --count 50 [--die-at torn:3:0.4]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__":  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import statelog
from statelog.format.wal import FrameType
from statelog.kit import Crash, Fault, FaultyFiles, Step, Stream, Then, run_commit, store_digest

__all__ = ["plan_faults"]


def _is_seal(step: Step) -> bool:
    return bytes(step.chunks[0])[8] == FrameType.SEAL  # byte 8 of a frame header: its type


def _is_record(step: Step) -> bool:
    return not _is_seal(step)


def plan_faults(text: str) -> list[Fault]:
    """The faults a ``--die-at`` plan names (see the module docstring)."""
    parts = text.split(":")
    frac = float(parts[-1]) if parts[0] == "torn" or len(parts) > 3 else 0.0
    n = int(parts[1])
    if parts[0] == "torn":
        return [Crash("write", n, ".wal", _is_record, frac=frac)]
    if parts[0] != "roll":
        raise SystemExit(f"bad --die-at {text!r}")
    point = parts[2]
    record = Crash("write", 1, ".wal", _is_record, frac=frac)
    faults: dict[str, Fault] = {
        "seal-torn": Crash("write", n, ".wal", _is_seal, frac=frac),
        "sealed": Crash("create", n, ".wal.tmp"),  # the SEAL is synced; nothing of the next
        "tmp": Crash("write", n, ".wal.tmp", frac=frac),
        "renamed": Crash("rename", n, ".wal", after=True),
        "opened": Crash("open", n, ".wal", after=True),
        "first-torn": Then("open", n, ".wal", faults=(record,)),
    }
    if point not in faults:
        raise SystemExit(f"bad --die-at {text!r}")
    return [faults[point]]


def _emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("store", type=Path)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, default=100, help="commits to make before closing")
    ap.add_argument("--segment-bytes", type=int, default=16 * 1024)
    ap.add_argument("--fragment-bytes", type=int, default=2048)
    ap.add_argument("--die-at", default=None, help="self-kill plan, see the module docstring")
    args = ap.parse_args(argv)
    stream = Stream(seed=args.seed)
    layer = FaultyFiles(real_sync=True)
    _emit("opening")
    store = statelog.open(
        args.store,
        durability="commit",
        segment_bytes=args.segment_bytes,
        fragment_bytes=args.fragment_bytes,
        file_layer=layer,
    )
    _emit(f"open {store.epoch} {store_digest(store)}")
    if args.die_at:
        layer.add(*plan_faults(args.die_at))  # counted from here: recovery's steps are not
    start = store.epoch
    for i in range(start + 1, start + 1 + args.count):
        active = store._writer.wal.active_file if store._writer is not None else None
        rolls = active is None or active.size >= args.segment_bytes
        _emit(f"begin {i}{' roll' if rolls else ''}")
        got = run_commit(store, stream.commit(i))
        if got != i:
            print(f"commit {i} returned epoch {got}", file=sys.stderr)
            return 3
        _emit(f"ack {i}")
    store.close()
    _emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
