"""Prometheus metrics: what each series must say, as a table of situations and failure modes.

The registry is process-wide and other tests open stores too, so every
assertion compares a store's own series (its ``store`` label) before and
after, never a global total.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import statelog
from compactor import compact
from statelog import events
from statelog.errors import InvalidCommitError, StorageError
from statelog.format.wal import HEADER_SIZE
from statelog.kit import FaultyFiles
from statelog.log.segments import list_segments
from statelog.ops import metrics
from statelog.storage.snapshots import list_snapshots
from tests.helpers import flip_bit, frames, poke, segments, truncate, zero_fill

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv" / "bin" / "python"
PY = str(VENV_PY if VENV_PY.exists() else Path(sys.executable))
SEG = 4096  # the smallest segment size: a few dozen commits each


def value(name: str, store: Path, **labels: str) -> float:
    """The sample ``name`` of ``store`` in the library registry (0 when never set)."""
    got = metrics.REGISTRY.get_sample_value(name, {"store": metrics.store_label(store), **labels})
    return 0.0 if got is None else got


def sample(name: str, store: Path) -> float | None:
    """A scrape-time gauge of ``store``, or None when the scrape reports none."""
    return metrics.REGISTRY.get_sample_value(name, {"store": metrics.store_label(store)})


def hot(store: Path) -> dict[str, float]:
    """The commit-path series of ``store``."""
    return {
        "commits": value("statelog_commits_total", store),
        "commit_count": value("statelog_commit_seconds_count", store),
        "bytes": value("statelog_appended_bytes_total", store),
        "fsyncs": value("statelog_fsync_seconds_count", store),
    }


def log_bytes(store: Path) -> tuple[int, int]:
    """(bytes past the segment headers, segment count) of ``store``'s log."""
    segs = [p for _, _, p in list_segments(store / "wal")]
    return sum(p.stat().st_size for p in segs) - HEADER_SIZE * len(segs), len(segs)


def put(i: int) -> dict[str, Any]:
    return {f"k{i}": {"i": i, "pad": "x" * 40}}


def commit_n(store: statelog.StateStore, first: int, last: int) -> None:
    for i in range(first, last + 1):
        store.commit(offsets={"p0": i}, low_watermark_ms=i * 10, put=put(i))


# -- the commit path -----------------------------------------------------------------


@pytest.mark.parametrize("segment_bytes", [1 << 20, SEG], ids=["one-segment", "rolling"])
def test_commits_bytes_and_fsyncs_move_by_exact_amounts(
    store_path: Path, segment_bytes: int
) -> None:
    with statelog.open(store_path, segment_bytes=segment_bytes) as s:
        before = hot(store_path)
        commit_n(s, 1, 150)
        with s.transaction() as tx:  # a transaction is one commit too
            tx.put("k-tx", 1)
            tx.put("k-tx", 2, table="other")
        mid = hot(store_path)
    after = hot(store_path)
    appended, nsegs = log_bytes(store_path)
    assert mid["commits"] - before["commits"] == 151
    assert mid["commit_count"] - before["commit_count"] == 151  # the histogram counts commits
    # Every byte past the headers was appended by this writer: records and seals.
    assert after["bytes"] - before["bytes"] == appended
    # durability="commit": one fdatasync per commit, one per seal (every segment, on close).
    assert after["fsyncs"] - before["fsyncs"] == 151 + nsegs
    assert after["commits"] == mid["commits"]  # closing commits nothing
    if segment_bytes == SEG:
        assert nsegs > 3


def test_commit_latency_is_the_time_the_call_took(store_path: Path) -> None:
    with statelog.open(store_path) as s:
        s0 = value("statelog_commit_seconds_sum", store_path)
        started = time.perf_counter()
        commit_n(s, 1, 20)
        took = time.perf_counter() - started
        spent = value("statelog_commit_seconds_sum", store_path) - s0
    assert 0 < spent <= took


@pytest.mark.parametrize(
    ("durability", "fsyncs_before_flush"),
    [("none", 0), ("group", None)],
    ids=["none-syncs-only-on-flush", "group-syncs-in-background"],
)
def test_other_durabilities_count_their_syncs(
    store_path: Path, durability: str, fsyncs_before_flush: int | None
) -> None:
    with statelog.open(store_path, durability=durability) as s:
        before = hot(store_path)
        commit_n(s, 1, 10)
        if fsyncs_before_flush is not None:
            assert hot(store_path)["fsyncs"] - before["fsyncs"] == fsyncs_before_flush
        s.flush()
        assert hot(store_path)["fsyncs"] - before["fsyncs"] >= 1
        assert hot(store_path)["commits"] - before["commits"] == 10


def bad_offsets(s: statelog.StateStore) -> None:
    s.commit(offsets={"p0": -1}, low_watermark_ms=0)


def watermark_backwards(s: statelog.StateStore) -> None:
    s.commit(offsets={"p0": 1}, low_watermark_ms=-5)


@pytest.mark.parametrize("refuse", [bad_offsets, watermark_backwards])
def test_refused_commit_moves_no_counter(
    store_path: Path, refuse: Callable[[statelog.StateStore], None]
) -> None:
    with statelog.open(store_path) as s:
        commit_n(s, 1, 3)
        before = hot(store_path)
        with pytest.raises(InvalidCommitError):
            refuse(s)
        assert hot(store_path) == before


def test_failed_sync_counts_no_commit_and_no_bytes(store_path: Path) -> None:
    files = FaultyFiles(store_path, real_sync=True)
    s = statelog.open(store_path, file_layer=files)
    try:
        commit_n(s, 1, 3)
        before = hot(store_path)
        files.fail("sync", errno=errno.EIO)
        with pytest.raises(StorageError):
            commit_n(s, 4, 4)
        after = hot(store_path)
        assert after["commits"] == before["commits"]
        assert after["bytes"] == before["bytes"]  # the record was cut back: not appended
        assert after["fsyncs"] == before["fsyncs"]  # a failed fsync is not a latency sample
    finally:
        files.free_space()
        s.close()


def test_read_only_open_is_not_watched_and_binds_nothing(store_path: Path) -> None:
    with statelog.open(store_path) as s:
        commit_n(s, 1, 5)
    label = Path(metrics.store_label(store_path))
    assert label not in metrics.watched()
    with statelog.open(store_path, readonly=True) as ro:
        assert ro.epoch == 5
        assert label not in metrics.watched()


# -- events -------------------------------------------------------------------------

EVENTS: list[tuple[str, str, dict[str, Any], str, dict[str, str], float]] = [
    # id, kind, fields, series, extra labels, expected rise
    ("recovery-clean", "recovery", {"outcome": "clean", "records_replayed": 7},
     "statelog_recoveries_total", {"outcome": "clean"}, 1),
    ("recovery-replayed", "recovery", {"outcome": "torn", "records_replayed": 7},
     "statelog_replayed_commits_total", {}, 7),
    ("recovery-corrupt", "recovery", {"outcome": "corrupt", "records_replayed": 0},
     "statelog_recoveries_total", {"outcome": "corrupt"}, 1),
    ("walk-back", "walk_back", {"file": "a.snap", "reason": "sha256", "source": "recovery"},
     "statelog_walkbacks_total", {"source": "recovery"}, 1),
    ("mismatch-compactor", "integrity_mismatch",
     {"file": "a.snap", "offset": 9, "reason": "x", "source": "compactor"},
     "statelog_integrity_mismatches_total", {"source": "compactor"}, 1),
    ("mismatch-swap", "integrity_mismatch",
     {"file": "a.snap", "offset": None, "reason": "x", "source": "swap"},
     "statelog_integrity_mismatches_total", {"source": "swap"}, 1),
    ("truncation-torn", "truncation",
     {"file": "s.wal", "offset": 80, "bytes_dropped": 5, "reason": "torn", "saved_as": "b"},
     "statelog_truncations_total", {"reason": "torn"}, 1),
    ("compaction", "compaction", {"snapshot": "a.snap", "seconds": 1.5},
     "statelog_compactions_total", {}, 1),
    ("compaction-seconds", "compaction", {"snapshot": "a.snap", "seconds": 1.5},
     "statelog_compaction_seconds_sum", {}, 1.5),
    ("compaction-histogram", "compaction", {"snapshot": "a.snap", "seconds": 1.5},
     "statelog_compaction_seconds_count", {}, 1),
    ("retention", "retention_delete",
     {"files": [{"file": "wal/x.wal", "reason": "covered"},
                {"file": "wal/y.wal", "reason": "covered"}], "count": 2},
     "statelog_retention_deletions_total", {}, 2),
    ("base-swap", "base_swap", {"snapshot": "a.snap", "epoch": 3},
     "statelog_base_swaps_total", {}, 1),
    # Malformed fields never fail the emitter; what can be counted is counted.
    ("mismatch-no-source", "integrity_mismatch", {"file": "a.snap"},
     "statelog_integrity_mismatches_total", {"source": "unknown"}, 1),
    ("compaction-bad-seconds", "compaction", {"seconds": -1},
     "statelog_compaction_seconds_count", {}, 0),
    ("compaction-bool-seconds", "compaction", {"seconds": True},
     "statelog_compactions_total", {}, 1),
    ("recovery-bad-replayed", "recovery", {"outcome": "clean", "records_replayed": "many"},
     "statelog_replayed_commits_total", {}, 0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "fields", "series", "labels", "rise"),
    [row[1:] for row in EVENTS],
    ids=[row[0] for row in EVENTS],
)
def test_event_moves_its_counter(
    tmp_path: Path,
    kind: str,
    fields: dict[str, Any],
    series: str,
    labels: dict[str, str],
    rise: float,
) -> None:
    metrics.install()
    root = tmp_path / "some-store"
    before = value(series, root, **labels)
    events.emit(root, kind, **fields)
    assert value(series, root, **labels) - before == pytest.approx(rise)


def test_install_is_idempotent_and_labels_resolve(tmp_path: Path) -> None:
    metrics.install()
    metrics.install()
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    events.emit(tmp_path / "link", "walk_back", source="recovery")
    events.emit(tmp_path / "real" / ".." / "real", "walk_back", source="recovery")
    # One series for the store however it was named, each event counted once.
    assert value("statelog_walkbacks_total", tmp_path / "real", source="recovery") == 2


def reopen_clean(store: Path) -> dict[tuple[str, str], float]:
    return {("statelog_recoveries_total", "outcome=clean"): 1}


def cut_the_seal(store: Path) -> dict[tuple[str, str], float]:
    truncate(segments(store)[-1], -3)
    return {
        ("statelog_recoveries_total", "outcome=torn-tail"): 1,
        ("statelog_truncations_total", "reason=torn"): 1,
        ("statelog_integrity_mismatches_total", "source=recovery"): 0,  # torn is not damage
    }


def flip_an_early_record(store: Path) -> dict[tuple[str, str], float]:
    first = segments(store)[0]
    flip_bit(first, frames(first)[3].offset + 20)
    return {
        ("statelog_recoveries_total", "outcome=corruption"): 1,
        ("statelog_integrity_mismatches_total", "source=recovery"): 1,
    }


def damage_the_newest_snapshot(store: Path) -> dict[tuple[str, str], float]:
    compact(store)
    with statelog.open(store, segment_bytes=SEG) as s:
        commit_n(s, 121, 160)
    compact(store)
    damage_body(newest_snapshot(store))
    return {
        ("statelog_recoveries_total", "outcome=clean"): 1,
        ("statelog_walkbacks_total", "source=recovery"): 1,
        ("statelog_integrity_mismatches_total", "source=recovery"): 1,
    }


@pytest.mark.parametrize(
    "damage", [reopen_clean, cut_the_seal, flip_an_early_record, damage_the_newest_snapshot]
)
def test_recovery_of_a_real_store_is_counted(
    store_path: Path, damage: Callable[[Path], dict[tuple[str, str], float]]
) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commit_n(s, 1, 120)
    expected = damage(store_path)

    def read(series: str, labels: str) -> float:
        name, _, label = labels.partition("=")
        return value(series, store_path, **{name: label})

    before = {k: read(*k) for k in expected}
    replayed = value("statelog_replayed_commits_total", store_path)
    with statelog.open(store_path) as s:
        report = s.recovery
    assert {k: read(*k) - before[k] for k in expected} == expected
    assert value("statelog_replayed_commits_total", store_path) - replayed == report.replayed > 0


# -- scrape-time gauges -----------------------------------------------------------------


def tail_after(store: Path, folded: set[Path]) -> int:
    """Bytes of every segment that no snapshot folded: what a restart replays."""
    return sum(p.stat().st_size for _, _, p in list_segments(store / "wal") if p not in folded)


def test_gauges_of_a_real_store(store_path: Path) -> None:
    with statelog.open(store_path, segment_bytes=SEG, durability="none") as s:
        assert Path(metrics.store_label(store_path)) in metrics.watched()
        commit_n(s, 1, 50)
        # No snapshot yet: the whole log is tail, and there is no age to report.
        assert sample("statelog_snapshots", store_path) == 0
        assert sample("statelog_snapshot_age_seconds", store_path) is None
        assert sample("statelog_tail_bytes", store_path) == tail_after(store_path, set())
        r1 = compact(store_path, retain=3)
        commit_n(s, 51, 120)
        written = time.time()
        r2 = compact(store_path, retain=3)
        assert r1.snapshot and r2.snapshot and r2.base == r1.snapshot and r2.segments
        commit_n(s, 121, 160)
        # r2's segments stay (walking back to r1 replays them) but are not tail.
        kept = [p for p in r2.segments if p.exists()]
        assert kept
        tail = tail_after(store_path, {*r1.segments, *r2.segments})
        assert 0 < tail < tail_after(store_path, set())
        assert sample("statelog_tail_bytes", store_path) == tail
        assert sample("statelog_snapshots", store_path) == 2
        age = sample("statelog_snapshot_age_seconds", store_path)
        assert age is not None and 0 <= age <= time.time() - written + 1
    # A closed store is no longer watched: its gauges leave the scrape.
    assert sample("statelog_tail_bytes", store_path) is None


def newest_snapshot(store: Path) -> Path:
    return list_snapshots(store / "snapshots")[0][2]


def damage_body(snap: Path) -> str:
    flip_bit(snap, snap.stat().st_size // 2)
    return "created_ms"  # the header and meta are intact: the age still comes from them


def damage_header(snap: Path) -> str:
    zero_fill(snap, 0, 8)  # no magic: the meta cannot be trusted to be where it says
    return "mtime"


def damage_meta_length(snap: Path) -> str:
    poke(snap, 52, "<I", 3)  # meta_len too short for the msgpack map
    return "mtime"


@pytest.mark.parametrize("damage", [damage_body, damage_header, damage_meta_length])
def test_snapshot_age_of_a_damaged_snapshot(
    store_path: Path, damage: Callable[[Path], str]
) -> None:
    with statelog.open(store_path, segment_bytes=SEG) as s:
        commit_n(s, 1, 60)
    compact(store_path)
    snap = newest_snapshot(store_path)
    old = time.time() - 3600
    os.utime(snap, (old, old))  # mtime an hour ago, created_ms just now: tell them apart
    source = damage(snap)
    os.utime(snap, (old, old))
    metrics.watch(store_path)
    try:
        age = sample("statelog_snapshot_age_seconds", store_path)
        assert age is not None
        if source == "mtime":
            assert 3600 <= age < 3700
        else:
            assert age < 600
        assert sample("statelog_snapshots", store_path) == 1
    finally:
        metrics.unwatch(store_path)


def test_vanished_store_yields_no_samples_and_no_failed_scrape(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    metrics.watch(gone)
    try:
        assert sample("statelog_tail_bytes", gone) is None
        # The rest of the registry still renders.
        assert metrics.REGISTRY.get_sample_value("statelog_commits_total", {"store": "x"}) is None
    finally:
        metrics.unwatch(gone)


def test_watch_is_counted(store_path: Path) -> None:
    with statelog.open(store_path) as s:
        commit_n(s, 1, 2)
    label = Path(metrics.store_label(store_path))
    metrics.unwatch(store_path)  # not watched: a no-op, never an error
    metrics.watch(store_path)
    metrics.watch(store_path)
    metrics.unwatch(store_path)
    assert label in metrics.watched()
    metrics.unwatch(store_path)
    assert label not in metrics.watched()


# -- the daemon's endpoint ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample served on ``port``, keyed by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def key(name: str, store: Path, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The :func:`scrape` key of a sample of ``store``."""
    return name, tuple(sorted({"store": metrics.store_label(store), **labels}.items()))


def poll(port: int, proc: subprocess.Popen[bytes], until: Callable[[Any], bool]) -> Any:
    """Scrape until ``until(samples)`` holds; fail after a deadline or if the daemon died."""
    deadline = time.monotonic() + 30
    last: Any = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"daemon exited with {proc.returncode}"
        try:
            last = scrape(port)
        except (urllib.error.URLError, ConnectionError):
            last = None  # not listening yet
        if last is not None and until(last):
            return last
        time.sleep(0.1)
    raise AssertionError(f"not reached within 30 s; last scrape: {last}")


@pytest.fixture
def stopping() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_daemon_endpoint_shows_mismatch_rise_after_walking_past_damaged_snapshot(
    store_path: Path, stopping: list[subprocess.Popen[bytes]]
) -> None:
    writer = statelog.open(store_path, segment_bytes=SEG, durability="none")
    try:
        commit_n(writer, 1, 80)
        compact(store_path, retain=3)
        commit_n(writer, 81, 160)
        newest = compact(store_path, retain=3).snapshot
        assert newest is not None
        port = free_port()
        proc = subprocess.Popen(
            [PY, "-m", "compactor", "--interval", "0.2", "--min-tail-bytes", "0",
             "--metrics-port", str(port), str(store_path)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stopping.append(proc)
        label = (("store", metrics.store_label(store_path)),)
        mismatch = key("statelog_integrity_mismatches_total", store_path, source="compactor")
        walkback = key("statelog_walkbacks_total", store_path, source="compactor")
        # Served, watching the store, and nothing damaged seen yet.
        first = poll(port, proc, lambda m: m.get(("statelog_snapshots", label)) == 2)
        assert first.get(mismatch, 0) == 0
        assert first[("statelog_tail_bytes", label)] > 0  # the writer's active segment
        flip_bit(newest, newest.stat().st_size // 2)  # in the body
        commit_n(writer, 161, 240)  # new sealed segments: the next pass must extract the base
        seen = poll(port, proc, lambda m: m.get(mismatch, 0) >= 1)
        assert seen[mismatch] == 1 and seen[walkback] == 1
        # It walked back to the older snapshot and folded from there.
        done = poll(port, proc, lambda m: m.get(("statelog_compactions_total", label), 0) >= 1)
        assert done[mismatch] == 1  # the same damage is counted once, not once per pass
    finally:
        writer.close()


def test_daemon_exits_3_when_the_metrics_port_is_taken(store_path: Path) -> None:
    with statelog.open(store_path) as s:
        commit_n(s, 1, 3)
    listing = sorted(p.relative_to(store_path) for p in store_path.rglob("*"))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [PY, "-m", "compactor", "--once", "--metrics-port", str(port), str(store_path)],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert f"cannot serve metrics on 127.0.0.1 port {port}: address already in use" in done.stderr
    assert "event=metrics_unavailable" in done.stderr
    # Refused before any store was touched: no lock, no snapshot, nothing new.
    assert sorted(p.relative_to(store_path) for p in store_path.rglob("*")) == listing


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_daemon_refuses_a_bad_metrics_port(store_path: Path, port: str) -> None:
    done = subprocess.run(
        [PY, "-m", "compactor", "--once", "--metrics-port", port, str(store_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 3 and "--metrics-port" in done.stderr
    assert not store_path.exists()
