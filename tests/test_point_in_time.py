"""Point in time: views of the past, ``epoch_at``, restores to a point and rewinds in place.

| situation                                   | expected                            |
|---------------------------------------------|-------------------------------------|
| views at random epochs across snapshots,    | exactly the model of commits 1..N,  |
| delta chains and segment rolls              | offsets and watermark included      |
| the oldest restorable epoch, one older,     | opens; EpochUnavailableError naming |
| one after the newest                        | the range                           |
| ``epoch_at`` at, between, before, after     | the last epoch at or before; before |
| commits                                     | all: EpochUnavailableError          |
| a clock stepped back                        | commit times never go backwards     |
| views while a writer commits and a          | each view is the model at its epoch |
| compactor's retention deletes               |                                     |
| ``restore SOURCE DEST --epoch N``/``--at``  | DEST opens at exactly N and goes on |
| ``recover --to-epoch N``, dry run then real | dry run changes nothing; the store  |
|                                             | opens at N, the rest kept aside     |
| ``recover --to-epoch`` killed at each step  | the old store or the rewound one    |
| a remote restore to an epoch, host lost     | the store opens at exactly N        |
| a view never writes                         | not a byte of the store changes     |
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.cli import main as cli_main
from statelog.compaction.fold import compact
from statelog.kit.workload import Stream, run_commit, store_digest
from statelog.recovery.point import restore_point
from statelog.recovery.rewind import plan_rewind
from statelog.recovery.timeline import oldest_restorable
from statelog.storage.fileio import FileLayer
from statelog.storage.snapshots import verify_snapshot
from tests.s3server import Remote, remote, s3  # noqa: F401
from tests.test_remote_wiring import env  # noqa: F401

STREAM = Stream(seed=23)
SMALL: dict[str, Any] = {"segment_bytes": 16 << 10}
REPO = Path(__file__).resolve().parent.parent
T0 = 1_796_400_000_000  # ms: the fixed clock's first commit


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "pins" not in p.parts and not p.name.endswith("LOCK")
    }


def history(root: Path, epochs: int, every: int = 60, max_chain: int = 3) -> None:
    """Commits 1..epochs of STREAM, a compaction (full or delta) every ``every`` commits."""
    with statelog.open(root, **SMALL) as w:
        for i in range(1, epochs + 1):
            assert run_commit(w, STREAM.commit(i)) == i
            if i % every == 0:
                compact(root, min_tail_bytes=0, retain=50, max_chain=max_chain, full_ratio=10.0)


def check_view(root: Path, n: int) -> None:
    with statelog.open(root, readonly=True, at=n) as v:
        model = STREAM.model(n)
        assert v.epoch == n
        assert store_digest(v) == model.digest(), n
        assert v.offsets == model.offsets and v.low_watermark_ms == model.low_watermark_ms


def test_views_at_random_epochs_are_the_model(tmp_path: Path) -> None:
    root = tmp_path / "s"
    history(root, 420)
    snaps = sorted((root / "snapshots").iterdir())
    metas = [verify_snapshot(FileLayer(), p, store_id=None) for p in snaps]
    assert len(metas) >= 5 and any(m.delta is not None for m in metas)  # delta chains too
    oldest = oldest_restorable(root)
    assert oldest is not None
    before = tree(root)
    rng = random.Random(7)
    for n in sorted({oldest, 420, *rng.sample(range(oldest, 421), 12)}):
        check_view(root, n)
    assert tree(root) == before  # views never write


def test_the_retention_boundary(tmp_path: Path) -> None:
    root = tmp_path / "s"
    history(root, 300, every=50)
    compact(root, min_tail_bytes=0, retain=2)
    oldest = oldest_restorable(root)
    assert oldest is not None and oldest > 1
    check_view(root, oldest)  # the oldest restorable epoch is restorable
    with pytest.raises(statelog.EpochUnavailableError) as err:
        statelog.open(root, readonly=True, at=oldest - 1)
    assert err.value.oldest == oldest and str(oldest) in err.value.message
    with pytest.raises(statelog.EpochUnavailableError) as err:
        statelog.open(root, readonly=True, at=301)
    assert err.value.newest == 300


@pytest.mark.parametrize(
    "bad",
    [-1, "3", 1.5, True, datetime(2026, 12, 5, 9, 14)],
    ids=["negative", "str", "float", "bool", "naive"],
)
def test_bad_at_values_are_refused(tmp_path: Path, bad: Any) -> None:
    root = tmp_path / "s"
    history(root, 3)
    with pytest.raises(statelog.InvalidOptionError):
        statelog.open(root, readonly=True, at=bad)
    with pytest.raises(statelog.InvalidOptionError):
        statelog.open(root, at=2)  # a writer has no past to open


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A settable clock (ms) behind ``time.time_ns``."""
    now = [T0]
    monkeypatch.setattr(time, "time_ns", lambda: now[0] * 1_000_000)
    return now


def timed_history(root: Path, clock: list[int], *, every: int, retain: int) -> None:
    """Commits 1..180 of STREAM, commit ``i`` at ``T0 + i`` seconds, a pass every ``every``."""
    with statelog.open(root, **SMALL) as w:
        for i in range(1, 181):
            clock[0] = T0 + i * 1000
            run_commit(w, STREAM.commit(i))
            if i % every == 0:
                compact(root, min_tail_bytes=0, retain=retain)


def at_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def test_epoch_at_finds_the_last_commit_at_or_before(tmp_path: Path, clock: list[int]) -> None:
    root = tmp_path / "s"
    with statelog.open(root, **SMALL) as w:
        for i in range(1, 201):
            clock[0] = T0 + i * 10_000  # one commit every 10 s
            run_commit(w, STREAM.commit(i))
            if i % 50 == 0:
                compact(root, min_tail_bytes=0, retain=2)
        assert w.committed_at == at_ms(T0 + 200 * 10_000)
        oldest = oldest_restorable(root)
        assert oldest is not None
        for n in (oldest, oldest + 1, 150, 200):
            assert w.epoch_at(at_ms(T0 + n * 10_000)) == n  # at a commit
            assert w.epoch_at(at_ms(T0 + n * 10_000 + 9_999)) == n  # between two
        assert w.epoch_at(at_ms(T0 + 10**9)) == 200  # after the last
        with pytest.raises(statelog.EpochUnavailableError):
            w.epoch_at(at_ms(T0 + (oldest - 1) * 10_000))  # before what is retained
        with pytest.raises(statelog.InvalidOptionError):
            w.epoch_at(datetime(2026, 12, 5))
    n = oldest + 10
    with statelog.open(root, readonly=True, at=at_ms(T0 + n * 10_000 + 5_000)) as v:
        assert v.epoch == n and store_digest(v) == STREAM.model(n).digest()


def test_a_clock_stepped_back_never_moves_commit_times_back(
    tmp_path: Path, clock: list[int]
) -> None:
    with statelog.open(tmp_path / "s") as w:
        w.commit(offsets={"p": 1}, low_watermark_ms=0)
        first = w.committed_at
        clock[0] -= 3_600_000  # an hour back
        w.commit(offsets={"p": 2}, low_watermark_ms=0)
        assert w.committed_at == first
        assert w.epoch_at(first) == 2


def test_views_while_a_writer_commits_and_retention_deletes(tmp_path: Path) -> None:
    root = tmp_path / "s"
    history(root, 100, every=50)
    stop, failures = threading.Event(), []

    def writer() -> None:
        try:
            with statelog.open(root, **SMALL) as w:
                i = w.epoch + 1
                while not stop.is_set() and i <= 600:
                    run_commit(w, STREAM.commit(i))
                    if i % 40 == 0:
                        compact(root, min_tail_bytes=0, retain=3)
                    i += 1
        except Exception as exc:  # reported below
            failures.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    rng = random.Random(5)
    opened = 0
    try:
        while t.is_alive() and opened < 40:
            with statelog.open(root, readonly=True) as newest:
                top = newest.epoch
            low = oldest_restorable(root) or 1
            n = rng.randint(low, max(low, top))
            try:
                check_view(root, n)
                opened += 1
            except statelog.EpochUnavailableError as exc:
                assert exc.oldest is None or exc.oldest > n  # retention moved on meanwhile
    finally:
        stop.set()
        t.join()
    assert not failures and opened > 5


def test_restore_a_directory_to_an_epoch_and_a_time(tmp_path: Path, clock: list[int]) -> None:
    root = tmp_path / "s"
    timed_history(root, clock, every=60, retain=5)
    before = tree(root)
    assert cli_main(["restore", str(root), str(tmp_path / "a"), "--epoch", "97"]) == 0
    at = at_ms(T0 + 140_500).isoformat()
    assert cli_main(["restore", str(root), str(tmp_path / "b"), "--at", at, "--json"]) == 0
    assert tree(root) == before
    for name, n in (("a", 97), ("b", 140)):
        with statelog.open(tmp_path / name) as r:
            assert r.epoch == n and store_digest(r) == STREAM.model(n).digest()
            run_commit(r, STREAM.commit(n + 1))  # a writer goes on from it
    assert cli_main(["restore", str(root), str(tmp_path / "a"), "--epoch", "5"]) == 3  # not empty
    assert cli_main(["restore", str(root), str(tmp_path / "c"), "--epoch", "999"]) == 2
    assert not (tmp_path / "c").exists()


def test_recover_to_epoch_dry_run_then_rewind(tmp_path: Path) -> None:
    root = tmp_path / "s"
    history(root, 240, every=80)
    before = tree(root)
    assert cli_main(["recover", str(root), "--to-epoch", "150", "--dry-run"]) == 0
    assert tree(root) == before
    with statelog.open(root):
        before = tree(root)
        assert cli_main(["recover", str(root), "--to-epoch", "150"]) == 4  # a writer holds it
        assert tree(root) == before
    assert cli_main(["recover", str(root), "--to-epoch", "150"]) == 0
    with statelog.open(root) as w:
        assert w.epoch == 150 and store_digest(w) == STREAM.model(150).digest()
        run_commit(w, STREAM.commit(151))
    evidence = [p for p in root.rglob("*.rewound-150-*")]
    assert evidence and any(p.name.endswith(".tail") for p in evidence)
    trail = (root / "AUDIT.log").read_text()
    assert '"rewind"' in trail and "[151, 240]" in trail.replace(" ", "").replace(",", ", ")


_REWIND = """
import sys
from pathlib import Path
from statelog.kit.faults import FaultyFiles
from statelog.kit.spec import Crash
from statelog.recovery.rewind import plan_rewind, rewind
root, epoch, k = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
planned = plan_rewind(root, epoch)
rewind(root, planned, FaultyFiles(None, [Crash(None, k)]))
print("done")
"""


def test_a_rewind_killed_at_every_step_leaves_the_old_or_the_rewound_store(
    tmp_path: Path,
) -> None:
    base = tmp_path / "base"
    history(base, 200, every=70)
    old = STREAM.model(200).digest()
    new = STREAM.model(120).digest()
    outcomes = []
    for k in range(1, 200):
        root = tmp_path / f"k{k}"
        subprocess.run(["cp", "-a", str(base), str(root)], check=True)
        done = subprocess.run(
            [sys.executable, "-c", _REWIND, str(root), "120", str(k)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        with statelog.open(root, readonly=True) as ro:
            seen = store_digest(ro)
        with statelog.open(root) as w:  # finishes a rewind under way
            assert store_digest(w) == seen and seen in (old, new), k
            assert not (root / "REWIND").exists()
        outcomes.append(seen == new)
        if done.returncode == 0:
            assert "done" in done.stdout and seen == new
            break
    else:
        pytest.fail("the rewind never finished")
    assert outcomes[0] is False and outcomes[-1] is True and len(outcomes) > 3


def test_a_remote_point_in_time_restore_after_local_loss(
    tmp_path: Path,
    env: Remote,  # noqa: F811
    clock: list[int],
) -> None:
    from statelog.remote import ship

    root = tmp_path / "s"
    timed_history(root, clock, every=50, retain=4)
    ship(root, env.url)
    subprocess.run(["rm", "-rf", str(root)], check=True)  # the host is lost
    cases = {"e120": ["--epoch", "120"], "e100": ["--epoch", "100"], "e60": ["--epoch", "60"]}
    cases["t77"] = ["--at", at_ms(T0 + 77_400).isoformat()]
    cases["t149"] = ["--at", at_ms(T0 + 149_000).isoformat()]
    for name, flags in cases.items():
        assert cli_main(["restore", env.url, str(tmp_path / name), *flags]) == 0, name
        n = int(name[1:])
        with statelog.open(tmp_path / name) as r:
            assert r.epoch == n and store_digest(r) == STREAM.model(n).digest(), name
            run_commit(r, STREAM.commit(n + 1))
    assert cli_main(["restore", env.url, str(tmp_path / "x"), "--epoch", "181"]) == 2
    assert not (tmp_path / "x").exists()


def _wrong_cut(root: Path) -> bytes:
    seg = max((root / "wal").glob("*.wal"))
    cut = {"file": seg.name, "offset": 100}
    doc = {"epoch": 5, "discarded": [6, 9], "evidence": ".rewound-5-1", "cut": cut}
    return json.dumps(doc).encode()


PLANTED: dict[str, Any] = {
    "garbage": lambda root: b"\xff" * 64,
    "not-an-object": lambda root: b"[1, 2]",
    "climbing-name": lambda root: json.dumps(
        {"epoch": 1, "evidence": ".rewound-1-1", "cut": {"file": "../IDENTITY", "offset": 64}}
    ).encode(),
    "wrong-cut": _wrong_cut,
    "huge": lambda root: b'{"a": "' + b"x" * (2 << 20) + b'"}',
    "foreign-epoch": lambda root: json.dumps(
        {"epoch": 3, "discarded": [4, 30], "evidence": ".rewound-3-1", "cut": None}
    ).encode(),
}


@pytest.mark.parametrize("planted", sorted([*PLANTED, "fifo"]))
def test_a_planted_rewind_intent_is_refused_and_changes_nothing(
    tmp_path: Path, planted: str
) -> None:
    root = tmp_path / "s"
    history(root, 130, every=60)  # snapshots after the planted epochs, too
    before = tree(root)
    if planted == "fifo":
        os.mkfifo(root / "REWIND")
    else:
        (root / "REWIND").write_bytes(PLANTED[planted](root))
    with pytest.raises(statelog.StatelogError) as err:
        statelog.open(root)
    assert err.value.hint
    assert {k: v for k, v in tree(root).items() if k != "REWIND"} == before


def test_records_written_before_commit_times_still_read(tmp_path: Path) -> None:
    """A five-element record (no ``commit_ms``) decodes with 0, "unknown"; ``epoch_at``
    passes over it and never answers later than the truth."""
    import msgspec

    from statelog.format.records import decode_record, encode_value

    old = msgspec.msgpack.encode([1, 3, {"p": 9}, 100, [["default", ["k"], [encode_value(1)], []]]])
    rec = decode_record(old)
    assert (rec.epoch, rec.commit_ms, rec.offsets) == (3, 0, {"p": 9})

    import statelog.store.store as store_module

    real = store_module.encode_record
    root = tmp_path / "s"
    with pytest.MonkeyPatch.context() as mp:  # a store written before commit times
        mp.setattr(
            store_module, "encode_record", lambda r: real(r)[:-9].replace(b"\x96", b"\x95", 1)
        )
        history(root, 40, every=20)
    with statelog.open(root, **SMALL) as w:
        assert w.committed_at is None and w.epoch == 40  # the old records carry no time
        check_view(root, 25)
        for i in range(41, 46):
            run_commit(w, STREAM.commit(i))  # new records carry one
        first_timed = w.committed_at
        assert first_timed is not None and w.epoch_at(first_timed) == 45
        with pytest.raises(statelog.EpochUnavailableError):
            w.epoch_at(datetime(2000, 1, 1, tzinfo=UTC))
    compact(root, min_tail_bytes=0, retain=5)
    check_view(root, 44)


def test_epoch_zero_is_neither_rewound_nor_restored_to(tmp_path: Path) -> None:
    root = tmp_path / "s"
    history(root, 5)
    before = tree(root)
    assert cli_main(["recover", str(root), "--to-epoch", "0"]) == 3
    assert cli_main(["restore", str(root), str(tmp_path / "d"), "--epoch", "0"]) == 3
    with pytest.raises(statelog.InvalidOptionError):
        plan_rewind(root, 0)
    with pytest.raises(statelog.InvalidOptionError):
        restore_point(root, tmp_path / "d", 0)
    assert tree(root) == before and not (tmp_path / "d").exists()
    with statelog.open(root, readonly=True, at=0) as empty:  # a view of it is fine
        assert empty.epoch == 0 and dict(empty.items()) == {}


def test_a_read_only_open_checks_a_pending_rewind_as_the_writer_does(tmp_path: Path) -> None:
    root = tmp_path / "s"
    history(root, 50)
    seg = max((root / "wal").glob("*.wal"))
    doc = {"epoch": 5, "discarded": [6, 9], "evidence": ".rewound-5-1",
           "cut": {"file": seg.name, "offset": 100}}  # fmt: skip
    (root / "REWIND").write_text(json.dumps(doc))
    with pytest.raises(statelog.CorruptionError):
        statelog.open(root, readonly=True)


def test_a_time_just_before_a_commit_never_finds_it(tmp_path: Path, clock: list[int]) -> None:
    with statelog.open(tmp_path / "s") as w:
        clock[0] = T0 + 1000
        w.commit(offsets={"p": 1}, low_watermark_ms=0)
        clock[0] = T0 + 2000
        w.commit(offsets={"p": 2}, low_watermark_ms=0)
        second = w.committed_at
        assert second is not None
        assert w.epoch_at(second) == 2
        assert w.epoch_at(second - timedelta(microseconds=400)) == 1  # floored, not rounded


def test_the_changes_of_a_view_end_at_its_epoch(tmp_path: Path) -> None:
    root = tmp_path / "s"
    history(root, 20)
    with statelog.open(root, readonly=True, at=10) as v:
        assert [c.epoch for c in v.changes(since=8)] == [9, 10]


def test_a_takeover_from_an_earlier_epoch_publishes_the_new_history(
    tmp_path: Path,
    env: Remote,  # noqa: F811
) -> None:
    """The remote restored to epoch 45 and taken over, the fork goes on and ships: a
    restore of the remote is the fork's history, never the discarded one."""
    from statelog.remote import ship

    root = tmp_path / "s"
    history(root, 60, every=20)
    ship(root, env.url)
    fork = tmp_path / "fork"
    assert cli_main(["restore", env.url, str(fork), "--epoch", "45", "--take-over"]) == 0
    other = Stream(seed=99)
    with statelog.open(fork, remote=env.url, **SMALL) as w:
        for i in range(46, 81):
            run_commit(w, other.commit(i))
        compact(fork, min_tail_bytes=0, retain=5)
        want = store_digest(w)
    ship(fork, env.url)
    assert cli_main(["restore", env.url, str(tmp_path / "again")]) == 0
    with statelog.open(tmp_path / "again", readonly=True) as r:
        assert r.epoch == 80 and store_digest(r) == want


def test_a_rewind_cut_short_between_two_renames_still_reads_its_epoch(tmp_path: Path) -> None:
    """Only a snapshot at the epoch itself rebuilds it (retention left no older one): what
    is left between two renames must still be an unbroken log after it."""
    base = tmp_path / "base"
    history(base, 90, every=30)
    compact(base, min_tail_bytes=0, retain=1)
    with statelog.open(base, **SMALL) as w:  # a long log after the only snapshot
        for i in range(91, 200):
            run_commit(w, STREAM.commit(i))
    target = oldest_restorable(base)
    assert target is not None and target > 1
    seen = 0
    for k in range(1, 80):
        root = tmp_path / f"k{k}"
        subprocess.run(["cp", "-a", str(base), str(root)], check=True)
        done = subprocess.run(
            [sys.executable, "-c", _REWIND, str(root), str(target), str(k)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode == 0:
            break
        aside = list((root / "wal").glob("*.rewound-*"))
        if not (root / "REWIND").exists() or not aside:
            continue  # killed before the intent, or before the first segment moved
        seen += 1
        with statelog.open(root, readonly=True) as ro:
            assert ro.epoch == target and store_digest(ro) == STREAM.model(target).digest()
            assert ro.epoch_at(datetime.now(UTC)) == target  # the pending rewind's end
    assert seen >= 2  # killed between renames more than once


def test_epoch_at_honours_a_pending_rewind(tmp_path: Path) -> None:
    root = tmp_path / "s"
    history(root, 20)
    planned = plan_rewind(root, 10)
    FileLayer().create_durable(root / "REWIND", json.dumps(planned.intent()).encode() + b"\n")
    with statelog.open(root, readonly=True) as ro:
        assert ro.epoch == 10 and ro.epoch_at(datetime.now(UTC)) == 10
