"""Writers that misbehave on purpose, to show that the drill's checks fail when they should.

Run by the drill in place of its own writer (``Drill(writer=...)``)::

    python tests/drill_liar.py double-apply write STORE --seed S --origin JSON ...
        applies every redelivered event again after a restart, as a
        downstream that is not idempotent would
    python tests/drill_liar.py lie-ack write STORE --seed S --origin JSON ...
        acknowledges each epoch two commits before it is on disk
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
from statelog.cli.drill_writer import APPLIED, BUFFER, Origin, drill_commit, redelivery

LIES = ("double-apply", "lie-ack")


def _emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


def _apply_again(eid: str, amount: int) -> int:
    return amount


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("lie", choices=LIES)
    ap.add_argument("cmd", choices=["write"])
    ap.add_argument("store", type=Path)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--origin", type=Origin.from_json, default=Origin())
    ap.add_argument("--segment-bytes", type=int, default=16 * 1024)
    args = ap.parse_args(argv)
    _emit("opening")
    store = statelog.open(
        args.store,
        durability="commit",
        segment_bytes=args.segment_bytes,
        tables=(APPLIED, BUFFER),
    )
    _emit(f"open {store.epoch}")
    redeliver = redelivery(args.seed, store.epoch)
    lead = 2 if args.lie == "lie-ack" else 0
    dup = _apply_again if args.lie == "double-apply" else (lambda eid, amount: 0)
    while True:  # until the drill's SIGKILL
        epoch = drill_commit(store, args.seed, args.origin, redeliver, on_duplicate=dup)
        redeliver = 0
        _emit(f"ack {epoch + lead}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
