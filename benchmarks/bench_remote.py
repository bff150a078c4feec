"""The remote tier against the loopback S3 server of the tests: lag, bytes shipped, restore.

moto keeps the objects in this process's memory on the same host: no real
network, so these times are a floor for a real object store.
``test_shipping_lag``: a writer thread commits 100 puts per checkpoint
(``durability="group"``, 1 MiB segments) for ``remote_seconds`` while the store
is shipped every 0.5 s; ``extra_info`` holds the lag before each ship and the
bytes uploaded. ``test_restore``: a ``remote_keys``-key store (a snapshot and a
10k-update tail) is shipped once, then each round restores it into an empty
directory; ``extra_info`` adds the first ship, a local restart of the same store
and the open after the restore.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.remote import RemoteClient, lag, restore, ship
from tests.s3server import S3Server

from .conftest import Sizes
from .probe import percentile


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server()
    yield server
    server.stop()


def _client(s3: S3Server, url: str) -> RemoteClient:
    return RemoteClient.from_url(url, env=s3.env())


def test_shipping_lag(benchmark: Any, s3: S3Server, sizes: Sizes, tmp_path: Path) -> None:
    url = f"s3://{s3.new_bucket()}/lag"
    client, store, stop, commits = _client(s3, url), tmp_path / "lag", threading.Event(), [0]

    def writer() -> None:
        with statelog.open(store, segment_bytes=1 << 20, durability="group") as st:
            for i in itertools.count():
                if stop.is_set():
                    commits[0] = i
                    return
                put = {f"k{(i * 100 + j) % 50_000}": i for j in range(100)}
                st.commit(offsets={"p": i}, low_watermark_ms=i, put=put)

    lags: list[tuple[int, float]] = []
    uploaded = [0]

    def run() -> None:
        thread = threading.Thread(target=writer)
        thread.start()
        end = time.monotonic() + sizes.remote_seconds
        while time.monotonic() < end:
            time.sleep(0.5)
            before = lag(store)
            lags.append((before.bytes, before.seconds))
            uploaded[0] += ship(store, url, client=client).bytes_uploaded
        stop.set()
        thread.join()
        uploaded[0] += ship(store, url, client=client).bytes_uploaded

    benchmark.pedantic(run, rounds=1, iterations=1)
    sizes_, ages = [b for b, _ in lags], [s for _, s in lags]
    info = {"suite": "remote-lag", "commits": commits[0], "bytes_uploaded": uploaded[0]}
    info |= {"lag_bytes_p50": percentile(sizes_, 50), "lag_bytes_max": max(sizes_)}
    info |= {"lag_seconds_p50": percentile(ages, 50), "lag_seconds_max": max(ages)}
    benchmark.extra_info.update(info)
    assert commits[0] > 0 and uploaded[0] > 0 and lag(store).bytes == 0


def test_restore(benchmark: Any, s3: S3Server, sizes: Sizes, tmp_path: Path) -> None:
    keys, url = sizes.remote_keys, f"s3://{s3.new_bucket()}/big"
    big = tmp_path / "big"
    with statelog.open(big, durability="none") as st:
        for b in range(0, keys, 10_000):
            put = {f"key-{k:08d}": {"v": k} for k in range(b, min(keys, b + 10_000))}
            st.commit(offsets={"p": b}, low_watermark_ms=b, put=put)
    compact(big, retain=2)
    with statelog.open(big, durability="none") as st:
        put = {f"key-{k:08d}": {"v": -k} for k in range(min(keys, 10_000))}
        st.commit(offsets={"p": keys}, low_watermark_ms=keys, put=put)
    t0 = time.perf_counter()
    shipped = ship(big, url, client=_client(s3, url))
    first_ship = time.perf_counter() - t0
    t0 = time.perf_counter()
    with statelog.open(big) as st:
        epoch = st.epoch
    local_open = time.perf_counter() - t0
    dests = (tmp_path / f"restored{i}" for i in itertools.count())
    restored: list[tuple[Path, int]] = []

    def run(dest: Path) -> None:
        restored.append((dest, restore(url, dest, client=_client(s3, url)).epoch))

    benchmark.pedantic(run, setup=lambda: ((next(dests),), {}), rounds=3, iterations=1)
    dest, restored_epoch = restored[-1]
    t0 = time.perf_counter()
    st = statelog.open(dest)
    open_after = time.perf_counter() - t0
    opened_epoch, count = st.epoch, st.count()
    st.close()
    info = {"suite": "remote-restore", "keys": keys, "bytes_shipped": shipped.bytes_uploaded}
    info |= {"first_ship_seconds": first_ship, "local_open_seconds": local_open}
    benchmark.extra_info.update(info, open_after_restore_seconds=open_after)
    assert restored_epoch == opened_epoch == epoch and count == keys
