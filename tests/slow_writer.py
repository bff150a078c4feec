"""A writer for the recovery-point tests: one small commit every ``--every`` seconds.

After each commit returns (``durability="commit"``: on disk) it appends
``EPOCH UNIX_TIME`` to ``--acks``, so the test knows what was acknowledged
and when. ``--count N`` stops committing after N commits and then stays open,
quiet, until killed: the writer that goes quiet.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import statelog


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store", type=Path)
    p.add_argument("--acks", type=Path, required=True)
    p.add_argument("--every", type=float, default=0.1)
    p.add_argument("--count", type=int, default=0)
    args = p.parse_args()
    with statelog.open(args.store) as store, args.acks.open("a") as acks:
        i = store.epoch
        while not args.count or i < args.count:
            i += 1
            epoch = store.commit(offsets={"p": i}, low_watermark_ms=i, put={f"k{i}": i})
            acks.write(f"{epoch} {time.time()}\n")
            acks.flush()
            time.sleep(args.every)
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main()
