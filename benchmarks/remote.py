"""Remote-tier benchmark: shipping lag, restore time vs a local restart, bytes per checkpoint.

Stand-alone::

    .venv/bin/python benchmarks/remote.py [--keys 1000000] [--seconds 10] [--report FILE]

With ``--report docs/benchmarks.md`` the table also replaces the report's
remote-tier section (between the ``remote:start``/``remote:end`` markers),
or is appended; ``benchmarks/run.py`` runs it that way as its ``remote`` part.

Uses the S3 endpoint of the AWS_* environment if ``AWS_ENDPOINT_URL`` is
set, else starts moto's S3 server on loopback (which holds objects in this
process's memory: restore times include no real network). Prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import boto3  # type: ignore[import-untyped]

import statelog
from statelog.compaction.fold import compact
from statelog.remote import RemoteClient, lag, restore, ship


def _endpoint() -> tuple[dict[str, str], object | None]:
    if os.environ.get("AWS_ENDPOINT_URL"):
        return dict(os.environ), None
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    return env, server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--bucket", default=f"statelog-bench-{uuid.uuid4().hex[:8]}")
    ap.add_argument("--report", type=Path, help="write the table into this markdown report")
    args = ap.parse_args()
    env, server = _endpoint()
    boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"),
    ).create_bucket(Bucket=args.bucket)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="statelog-remote-bench-") as tmp:
        root = Path(tmp)
        # 1. Shipping lag under sustained commits (1 MiB segments, ship every 0.5 s).
        url = f"s3://{args.bucket}/lag"
        client = RemoteClient.from_url(url, env=env)
        store = root / "lag"
        stop = threading.Event()
        commits = [0]

        def writer() -> None:
            with statelog.open(store, segment_bytes=1 << 20, durability="group") as st:
                i = 0
                while not stop.is_set():
                    put = {f"k{(i * 100 + j) % 50_000}": i for j in range(100)}
                    st.commit(offsets={"p": i}, low_watermark_ms=i, put=put)
                    i += 1
                commits[0] = i

        t = threading.Thread(target=writer)
        t.start()
        lag_bytes: list[int] = []
        lag_secs: list[float] = []
        uploaded = 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            time.sleep(0.5)
            before = lag(store)
            lag_bytes.append(before.bytes)
            lag_secs.append(before.seconds)
            uploaded += ship(store, url, client=client).bytes_uploaded
        stop.set()
        t.join()
        uploaded += ship(store, url, client=client).bytes_uploaded
        rows += [
            ("commits (100 puts each)", f"{commits[0]}"),
            ("lag before a ship, bytes p50/max", f"{statistics.median(lag_bytes):.0f} / "
             f"{max(lag_bytes)}"),
            ("lag before a ship, seconds p50/max", f"{statistics.median(lag_secs):.2f} / "
             f"{max(lag_secs):.2f}"),
            ("bytes uploaded per checkpoint", f"{uploaded / max(1, commits[0]):.0f}"),
        ]  # fmt: skip
        # 2. Restore of a large store vs a local restart.
        url = f"s3://{args.bucket}/big"
        big = root / "big"
        with statelog.open(big, durability="none") as st:
            batch = 10_000
            for b in range(0, args.keys, batch):
                st.commit(
                    offsets={"p": b},
                    low_watermark_ms=b,
                    put={f"key-{k:08d}": {"v": k} for k in range(b, min(args.keys, b + batch))},
                )
        compact(big, retain=2)
        with statelog.open(big, durability="none") as st:  # a 10k-update tail after it
            st.commit(
                offsets={"p": args.keys}, low_watermark_ms=args.keys,
                put={f"key-{k:08d}": {"v": -k} for k in range(0, min(args.keys, 10_000))},
            )  # fmt: skip
        t0 = time.perf_counter()
        shipped = ship(big, url, client=RemoteClient.from_url(url, env=env))
        t_ship = time.perf_counter() - t0
        t0 = time.perf_counter()
        with statelog.open(big) as st:
            local_epoch = st.epoch
        t_local = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = restore(url, root / "restored", client=RemoteClient.from_url(url, env=env))
        t_restore = time.perf_counter() - t0
        t0 = time.perf_counter()
        with statelog.open(root / "restored") as st:
            assert st.epoch == local_epoch == res.epoch
        t_open = time.perf_counter() - t0
        rows += [
            (f"store of {args.keys} keys: bytes shipped", f"{shipped.bytes_uploaded}"),
            ("first ship, seconds", f"{t_ship:.2f}"),
            ("local restart (open), seconds", f"{t_local:.2f}"),
            ("restore from the object store, seconds", f"{t_restore:.2f}"),
            ("open after restore, seconds", f"{t_open:.2f}"),
            ("restore + open vs local restart", f"{(t_restore + t_open) / t_local:.1f}x"),
        ]
    if server is not None:
        server.stop()  # type: ignore[attr-defined]
    w = max(len(k) for k, _ in rows)
    print(f"{'measure'.ljust(w)}  value")
    for k, v in rows:
        print(f"{k.ljust(w)}  {v}")
    if args.report is not None:
        where = "moto's S3 server on loopback" if server is not None else "AWS_ENDPOINT_URL"
        write_section(args.report, rows, args, where)


START, END = "<!-- remote:start -->", "<!-- remote:end -->"


def write_section(
    report: Path, rows: list[tuple[str, str]], args: argparse.Namespace, where: str
) -> None:
    """Put the remote-tier table into ``report`` between the markers (or append it)."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cmd = f".venv/bin/python benchmarks/remote.py --keys {args.keys} --seconds {args.seconds:g}"
    lines = [
        START,
        "## Remote tier (issue 7): shipping lag, restore, bytes per checkpoint",
        "",
        f"Measured by `{cmd}` on {when}, against {where}"
        + (
            " (objects held in the server's memory on the same host: no real network, so "
            "these times are a floor for a real object store)."
            if "moto" in where
            else "."
        ),
        'A writer commits 100 puts per checkpoint (`durability="group"`, 1 MiB segments) '
        f"for {args.seconds:g} s while the store is shipped every 0.5 s; then a {args.keys:,}-key "
        "store with a snapshot and a 10k-update tail is shipped, restored into an empty "
        "directory and opened, side by side with a local restart of the same store.",
        "",
        "| measure | value |",
        "|---|---:|",
        *[f"| {k} | {v} |" for k, v in rows],
        END,
    ]
    section = "\n".join(lines) + "\n"
    text = report.read_text() if report.exists() else ""
    if START in text and END in text:
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    report.write_text(text)
    print(f"wrote the remote-tier section of {report}", file=sys.stderr)


if __name__ == "__main__":
    main()
