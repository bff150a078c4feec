"""Sharded stores, as a table of failure modes.

| situation                                    | expected                                      |
|----------------------------------------------|-----------------------------------------------|
| hash routing, any process or hash seed       | the fixed key -> shard table below            |
| range routing                                | the fixed key -> shard table below            |
| split commit, close, reopen                  | every key in its shard; merged items in order |
| reopen with other count/partition/boundaries | ShardMismatchError; no byte on disk changes   |
| bad parameters or options at creation        | InvalidOptionError; nothing created           |
| foreign root / shard commits w/o manifest    | NotAStoreError; nothing changed               |
| split commit with bad input for one shard    | InvalidCommitError; no shard commits          |
| one shard's log flipped mid-log, strict      | reported (or raised, naming it); the others   |
|                                              | as a plain reopen leaves them; its repair     |
|                                              | touches only files under its own directory    |
| one shard: snapshots damaged, early log gone | ResnapshotRequired for it alone               |
| lazy open                                    | only the shards used are opened and locked    |
| compactor over a root                        | expand_stores lists shards; compact each one  |
| SIGKILL of a writer spanning several shards  | each shard prefix-exact; split commit resumed |
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.compaction.fold import compact
from statelog.log.segments import list_segments
from statelog.sharding.partition import ShardManifest, ShardMismatchError, source_shard
from statelog.sharding.sharded import ShardCommitError, ShardedStore, ShardOpenError, expand_stores
from statelog.storage.snapshots import list_snapshots
from tests.helpers import flip_bit, frames, segments

REPO = Path(__file__).resolve().parent.parent
KEYS: list[str | bytes] = ["", "a", "order:1", "order:2", "order:17", "payment:9", "ü-umlaut"]
KEYS += [b"", b"a", b"\x00\xff", b"order:1"]
HASH4 = [2, 3, 0, 3, 3, 0, 0, 2, 1, 2, 2]  # shard of each KEYS entry, 4 shards
HASH7 = [1, 2, 6, 6, 2, 3, 1, 6, 5, 3, 1]  # the same keys over 7 shards
SOURCES4 = {"orders-0": 3, "orders-1": 2, "payments-0": 1, "payments-1": 2}
RANGE3: dict[str | bytes, int] = {
    b"": 0,
    b"l": 0,
    b"m": 1,
    b"zz": 1,
    "": 1,
    "f": 1,
    "g": 2,
    "zzz": 2,
}


def tree(path: Path) -> dict[str, Any]:
    """Every directory (None) and file (its bytes) under ``path``, by relative name.

    The audit trail records when and by which process each recovery ran, so
    its entries are compared without their clock, pid, timing and hash chain.
    """
    if not path.exists():
        return {}
    out: dict[str, Any] = {}
    for p in sorted(path.rglob("*")):
        if p.is_dir():
            out[str(p.relative_to(path))] = None
        elif p.name == "AUDIT.log":
            out[str(p.relative_to(path))] = [_steady(line) for line in p.read_text().splitlines()]
        elif p.name in ("AUDIT.head", "AUDIT.lock"):
            out[str(p.relative_to(path))] = "present"
        else:
            out[str(p.relative_to(path))] = p.read_bytes()
    return out


def _steady(line: str) -> Any:
    entry = json.loads(line)
    fields = {k: v for k, v in entry.get("fields", {}).items() if k != "seconds"}
    return entry.get("seq"), entry.get("kind"), fields


def outside(root: Path, shard: Path) -> dict[str, Any]:
    return {k: v for k, v in tree(root).items() if not k.startswith(shard.name)}


def keys_of(m: ShardManifest, shard: int, n: int) -> list[str]:
    """``n`` str keys that route to ``shard`` (found by scanning, not assumed)."""
    out = [k for k in (f"key:{i:04d}" for i in range(10 * n * m.shards)) if m.shard_for(k) == shard]
    assert len(out) >= n
    return out[:n]


def fill(root: Path, shards: int, commits: int, **options: Any) -> dict[int, dict[str, Any]]:
    """Create a root and give every shard ``commits`` atomic commits; return each shard's model."""
    models: dict[int, dict[str, Any]] = {}
    with ShardedStore(root, shards, **options) as s:
        for i in range(shards):
            pool = keys_of(s.manifest, i, 6)
            model: dict[str, Any] = {}
            for e in range(1, commits + 1):
                put = {pool[e % 6]: {"e": e, "pad": "x" * 300}, pool[(e + 1) % 6]: e}
                dele = [pool[(e + 3) % 6]]
                s.commit_shard(i, offsets={f"src-{i}": e}, low_watermark_ms=e, put=put, delete=dele)
                for k in dele:
                    model.pop(k, None)
                model.update(put)
            models[i] = model
    return models


# -- routing ----------------------------------------------------------------


def test_hash_routing_is_the_fixed_table() -> None:
    assert [ShardManifest.build(4, "hash", None).shard_for(k) for k in KEYS] == HASH4
    assert [ShardManifest.build(7, "hash", None).shard_for(k) for k in KEYS] == HASH7
    assert {p: source_shard(p, 4) for p in SOURCES4} == SOURCES4


def test_hash_routing_is_the_same_in_another_process_and_hash_seed() -> None:
    code = (
        "from statelog.sharding.partition import ShardManifest\n"
        "from tests.test_sharded import KEYS\n"
        "print([ShardManifest.build(4, 'hash', None).shard_for(k) for k in KEYS])"
    )
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, check=True
        )
        assert out.stdout.decode().strip() == str(HASH4)


def test_range_routing_is_the_fixed_table() -> None:
    m = ShardManifest.build(3, "range", [b"m", "g"])
    assert {k: m.shard_for(k) for k in RANGE3} == RANGE3


@pytest.mark.parametrize(
    ("shards", "partition", "boundaries"), [(4, "hash", None), (3, "range", [b"k", "order:2"])]
)
def test_split_commit_round_trips_across_shards(
    tmp_path: Path, shards: int, partition: Any, boundaries: list[Any] | None
) -> None:
    root = tmp_path / "root"
    model: dict[str | bytes, Any] = {}
    with ShardedStore(root, shards, partition=partition, boundaries=boundaries) as s:
        for e in range(1, 6):
            put: dict[str | bytes, Any] = {k: [e, str(k)] for k in KEYS[e - 1 :: 2]}
            dele = [k for k in model if k not in put][:2]
            got = s.commit(offsets={"orders-0": e}, low_watermark_ms=100 + e, put=put, delete=dele)
            assert set(got) == {s.shard_for(k) for k in [*put, *dele]} | {
                source_shard("orders-0", shards)
            }
            for k in dele:
                del model[k]
            model.update(put)
    with ShardedStore.open(root) as s:
        assert s.shards == shards and s.manifest.partition == partition
        for k, v in model.items():
            assert s.get(k) == v
            assert s.shard(s.shard_for(k)).get(k) == v  # physically in its own shard
        items = list(s.items())
        assert items == sorted(model.items(), key=lambda kv: (isinstance(kv[0], str), kv[0]))
        assert s.count() == len(model)
        assert sum(s.shard(i).count() for i in range(shards)) == len(model)
        assert s.offsets == {"orders-0": 5}
        assert s.shard(source_shard("orders-0", shards)).offsets == {"orders-0": 5}
        assert set(s.recovery) == set(range(shards))


def test_the_example_in_the_docs_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (REPO / "docs" / "sharding.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/sharding.md", "exec"), {})
    with ShardedStore(tmp_path / "state", readonly=True) as s:
        assert s.get("order:17") == {"src": 99.5} and s.offsets == {"orders-3": 1042}


# -- parameters and the manifest ---------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shards": 3},
        {"shards": 4, "partition": "range", "boundaries": ["a", "b", "c"]},
        {"partition": "range"},
    ],
)
def test_reopen_with_other_parameters_is_refused_and_changes_nothing(
    tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    root = tmp_path / "root"
    fill(root, 4, 2)
    before = tree(root)
    with pytest.raises(ShardMismatchError) as err:
        ShardedStore(root, **kwargs)
    assert err.value.hint and "SHARDS" in str(err.value)
    assert tree(root) == before


def test_range_reopen_with_other_boundaries_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ShardedStore(root, 3, partition="range", boundaries=[b"m", "g"]).close()
    before = tree(root)
    with pytest.raises(ShardMismatchError):
        ShardedStore(root, boundaries=["m", "g"])  # str "m" is not bytes b"m"
    assert tree(root) == before
    with ShardedStore(root, boundaries=[b"m", "g"]) as s:  # the same ones are fine
        assert s.manifest.boundaries == (b"m", "g")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shards": 0},
        {"shards": True},
        {"shards": 2, "partition": "modulo"},
        {"shards": 2, "boundaries": ["m"]},
        {"shards": 3, "partition": "range", "boundaries": ["m"]},
        {"shards": 3, "partition": "range", "boundaries": ["m", "g"]},
        {"shards": 3, "partition": "range", "boundaries": ["m", "m"]},
        {"shards": 2, "partition": "range", "boundaries": [7]},
        {"shards": 2, "durability": "sometimes"},
        {"shards": 2, "no_such_option": 1},
        {"shards": 2, "on_failure": "ignore"},
        {},
    ],
)
def test_bad_parameters_create_nothing(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    root = tmp_path / "new" / "root"
    with pytest.raises(statelog.InvalidOptionError) as err:
        ShardedStore(root, **kwargs)
    assert err.value.hint
    assert not (tmp_path / "new").exists()


def test_foreign_root_and_commits_without_manifest_are_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(statelog.NotAStoreError):
        ShardedStore(foreign, 2)
    assert tree(foreign) == {"notes.txt": b"mine"}
    # A shard that holds commits while SHARDS is missing is not a crash leftover.
    root = tmp_path / "root"
    fill(root, 2, 2)
    (root / "SHARDS").unlink()
    before = tree(root)
    with pytest.raises(statelog.NotAStoreError):
        ShardedStore(root, 2)
    assert tree(root) == before
    with pytest.raises(statelog.StoreNotFoundError):
        ShardedStore(tmp_path / "absent", readonly=True)


def test_unfinished_creation_is_adopted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    statelog.open(root / "shard-0001").close()  # as if creation died before SHARDS
    (root / "SHARDS.tmp").write_bytes(b"{half")
    with ShardedStore(root, 2) as s:
        assert s.epochs == {0: 0, 1: 0}
    assert sorted(p.name for p in root.iterdir()) == ["SHARDS", "shard-0000", "shard-0001"]


def test_corrupt_manifest_is_corruption_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fill(root, 2, 1)
    (root / "SHARDS").write_bytes(b'{"kind": "statelog-shards", "version": 1, "shards": "x"}')
    with pytest.raises(statelog.CorruptionError):
        ShardedStore(root)
    with pytest.raises(statelog.CorruptionError):
        expand_stores([root])


# -- commits -----------------------------------------------------------------


def test_split_commit_with_bad_input_commits_nowhere(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with ShardedStore(root, 4) as s:
        s.commit(low_watermark_ms=50, put={k: 1 for k in KEYS})
        before = tree(root)
        epochs = s.epochs
        bad_value = {k: 2 for k in KEYS} | {"order:1": object()}
        with pytest.raises(statelog.InvalidCommitError):
            s.commit(low_watermark_ms=60, put=bad_value)
        with pytest.raises(statelog.InvalidCommitError):
            s.commit(low_watermark_ms=40, put={"a": 3})  # watermark going backwards
        with pytest.raises(statelog.InvalidCommitError):
            s.commit(low_watermark_ms=60, put={"a": 3}, delete=[7])  # type: ignore[list-item]
        with pytest.raises(statelog.InvalidCommitError):
            s.commit_shard(0, low_watermark_ms=60, put={"a": 3})  # "a" lives in shard 3
        assert s.epochs == epochs and tree(root) == before
        assert [s.get(k) for k in KEYS] == [1] * len(KEYS)


def test_split_commit_failing_midway_names_the_shards_that_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    with ShardedStore(root, 4) as s:

        def full_disk(*args: Any) -> int:
            raise statelog.StorageError("no space left", errno=28)

        monkeypatch.setattr(s.shard(2), "_commit_transaction", full_disk)
        with pytest.raises(ShardCommitError) as err:
            s.commit(low_watermark_ms=1, put={k: 1 for k in KEYS})
        assert err.value.shard == 2 and err.value.committed == {0: 1, 1: 1}
        assert isinstance(err.value.cause, statelog.StorageError) and err.value.hint
        assert s.epochs == {0: 1, 1: 1, 2: 0, 3: 0}
        s.shard(3).close()  # a shard found closed before any write: nothing is written
        with pytest.raises(statelog.StoreClosedError):
            s.commit(low_watermark_ms=2, put={k: 2 for k in KEYS})
        assert [s.shard(i).epoch for i in range(3)] == [1, 1, 0]


# -- independent recovery ----------------------------------------------------


def _flip_mid_log(shard: Path) -> None:
    seg = segments(shard)[-1]
    fs = frames(seg)
    assert len(fs) >= 8
    flip_bit(seg, fs[len(fs) // 2].offset + 20)


def test_damaged_shard_is_reported_and_the_others_are_untouched(tmp_path: Path) -> None:
    root, ref, other = tmp_path / "root", tmp_path / "ref", tmp_path / "other"
    models = fill(root, 3, 10)
    _flip_mid_log(root / "shard-0001")
    shutil.copytree(root, ref)
    shutil.copytree(root, other)
    for i in (0, 2):  # what an ordinary, unsharded reopen does to a healthy shard
        statelog.open(ref / f"shard-{i:04d}", strict=True).close()

    with pytest.raises(ShardOpenError) as err:  # the default: raise, naming the shard
        ShardedStore(other, strict=True)
    assert err.value.shard == 1 and isinstance(err.value.cause, statelog.CorruptionError)
    assert "shard 1" in str(err.value) and err.value.hint
    statelog.open(other / "shard-0000").close()  # the failed open released every lock

    with ShardedStore(root, strict=True, on_failure="report") as s:
        assert set(s.failures) == {1} and isinstance(s.failures[1], statelog.CorruptionError)
        assert set(s.recovery) == {0, 2}
        for i in (0, 2):
            assert dict(s.shard(i).items()) == models[i] and s.shard(i).epoch == 10
        with pytest.raises(ShardOpenError):
            s.get(keys_of(s.manifest, 1, 1)[0])
        with pytest.raises(ShardOpenError):
            s.count()
    for i in (0, 2):
        assert tree(root / f"shard-{i:04d}") == tree(ref / f"shard-{i:04d}")
    assert tree(root / "shard-0001") == tree(ref / "shard-0001")  # strict changed nothing

    with ShardedStore(root, strict=True, lazy=True) as s:
        others = outside(root, root / "shard-0001")
        repaired = s.open_shard(1, strict=False)
        r = repaired.recovery
        assert r.outcome == statelog.Outcome.CORRUPTION and r.lost_epochs
        assert 0 < repaired.epoch < 10 and s.recovery.keys() == {1}
        assert outside(root, root / "shard-0001") == others
    assert tree(root / "shard-0001") != tree(ref / "shard-0001")


def test_shard_needing_resnapshot_fails_alone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    models = fill(root, 3, 30, segment_bytes=4096)
    victim = root / "shard-0002"
    res = compact(victim)
    assert res.snapshot is not None, res.skipped
    [(_epoch, snap_lsn, snap)] = list_snapshots(victim / "snapshots")
    for _seq, first_lsn, seg in list_segments(victim / "wal"):
        if first_lsn <= snap_lsn:
            seg.unlink()  # the early log the snapshot covers is gone, as after retention
    flip_bit(snap, snap.stat().st_size // 2)
    with pytest.raises(ShardOpenError) as err:
        ShardedStore(root)
    assert err.value.shard == 2 and isinstance(err.value.cause, statelog.ResnapshotRequired)
    with ShardedStore(root, on_failure="report") as s:
        assert set(s.failures) == {2}
        assert isinstance(s.failures[2], statelog.ResnapshotRequired)
        assert {i: dict(s.shard(i).items()) for i in (0, 1)} == {i: models[i] for i in (0, 1)}


def test_missing_shard_directory_is_never_recreated(tmp_path: Path) -> None:
    root = tmp_path / "root"
    models = fill(root, 3, 2)
    shutil.rmtree(root / "shard-0001")
    with pytest.raises(ShardOpenError) as err:
        ShardedStore(root)
    assert isinstance(err.value.cause, statelog.StoreNotFoundError)
    with ShardedStore(root, on_failure="report") as s:
        assert set(s.failures) == {1}
        assert dict(s.shard(2).items()) == models[2]
    assert not (root / "shard-0001").exists()


def test_lazy_open_opens_only_the_shards_used(tmp_path: Path) -> None:
    root = tmp_path / "root"
    models = fill(root, 4, 3)
    key = next(iter(models[3]))
    with ShardedStore(root, lazy=True) as s:
        assert s.recovery == {}
        assert s.get(key) == models[3][key]
        assert set(s.recovery) == {3}
        statelog.open(root / "shard-0001").close()  # not locked by the sharded store
        with pytest.raises(statelog.StoreLockedError):
            statelog.open(root / "shard-0003")
        s.close_shard(3)
        statelog.open(root / "shard-0003").close()


# -- compaction ----------------------------------------------------------------


def test_expand_stores_and_compact_each_shard(tmp_path: Path) -> None:
    root, plain = tmp_path / "root", tmp_path / "plain"
    models = fill(root, 3, 20, segment_bytes=4096)
    statelog.open(plain).close()
    shards = [root / f"shard-{i:04d}" for i in range(3)]
    assert expand_stores([plain, root]) == [plain, *shards]
    assert expand_stores([plain]) == [plain]
    for shard in expand_stores([root]):
        res = compact(shard)
        assert res.snapshot is not None and res.snapshot.parent == shard / "snapshots"
    with ShardedStore(root) as s:
        for i in range(3):
            assert s.recovery[i].snapshot is not None
            assert dict(s.shard(i).items()) == models[i]


# -- SIGKILL of a writer that spans shards ------------------------------------

SHARDS = 3
SOURCES = ("orders-0", "orders-1", "payments-0")


def call(seed: int, n: int, m: ShardManifest) -> dict[int, tuple[dict[str, int], dict[str, Any]]]:
    """Split commit ``n``: each shard's (offsets, puts); deletes are puts of None-free keys."""
    rng = random.Random(f"sharded:{seed}:{n}")
    parts: dict[int, tuple[dict[str, int], dict[str, Any]]] = {i: ({}, {}) for i in range(m.shards)}
    for i in range(m.shards):
        for k in rng.sample(keys_of(m, i, 12), 3):
            parts[i][1][k] = {"n": n, "blob": "b" * rng.randrange(0, 400)}
    for src in SOURCES:
        parts[source_shard(src, m.shards)][0][src] = n * 10
    return parts


def writer_main(root: Path, seed: int, count: int) -> None:
    """Commit split commits forever; on start, finish the one a kill interrupted."""
    with ShardedStore(root, SHARDS) as s:
        epochs = s.epochs
        top = max(epochs.values())
        for i, e in epochs.items():
            if e < top:  # the interrupted split commit: this shard's part is missing
                off, put = call(seed, top, s.manifest)[i]
                s.commit_shard(i, offsets=off, low_watermark_ms=top, put=put)
        os.write(1, f"open {top}\n".encode())
        for n in range(top + 1, top + 1 + count):
            os.write(1, f"begin {n}\n".encode())
            parts = call(seed, n, s.manifest)
            put = {k: v for _, p in parts.values() for k, v in p.items()}
            offsets = {k: v for o, _ in parts.values() for k, v in o.items()}
            got = s.commit(offsets=offsets, low_watermark_ms=n, put=put)
            assert got == dict.fromkeys(range(SHARDS), n), got
            os.write(1, f"ack {n}\n".encode())


def shard_model(seed: int, m: ShardManifest, shard: int, epoch: int) -> dict[str, Any]:
    items: dict[str, Any] = {}
    offsets: dict[str, int] = {}
    for n in range(1, epoch + 1):
        off, put = call(seed, n, m)[shard]
        items.update(put)
        offsets.update(off)
    return {"items": items, "offsets": offsets, "wm": epoch}


def _lines(proc: subprocess.Popen[bytes], deadline: float, want: int) -> Iterator[str]:
    assert proc.stdout is not None
    acks = 0
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            return
        yield line.strip()
        acks += line.startswith("ack")
        if acks >= want:
            return


def kill_rounds(root: Path, rounds: int, seed: int = 11) -> None:
    """SIGKILL the writer ``rounds`` times; after each, every shard must be prefix-exact."""
    m = ShardManifest.build(SHARDS, "hash", None)
    rng = random.Random(seed)
    acked = 0
    for rnd in range(rounds):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.test_sharded", str(root), str(seed), "400"],
            cwd=REPO,
            stdout=subprocess.PIPE,
        )
        lines = list(_lines(proc, time.monotonic() + 60, rng.randrange(1, 12)))
        time.sleep(rng.random() * 0.01)
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate()
        lines += rest.decode().splitlines()
        acks = [int(x.split()[1]) for x in lines if x.startswith("ack")]
        begun = [int(x.split()[1]) for x in lines if x.startswith("begin")]
        acked = max([acked, *acks])
        with ShardedStore(root, readonly=True) as s:
            epochs = s.epochs
            assert all(acked <= e <= max([acked, *begun]) for e in epochs.values()), (rnd, epochs)
            # Shards commit their parts in order: a kill leaves a suffix of them behind.
            assert [epochs[i] for i in range(SHARDS)] == sorted(epochs.values(), reverse=True)
            assert max(epochs.values()) - min(epochs.values()) <= 1
            for i in range(SHARDS):
                want = shard_model(seed, m, i, epochs[i])
                st = s.shard(i)
                assert dict(st.items()) == want["items"], (rnd, i)
                assert st.offsets == want["offsets"] and st.low_watermark_ms == want["wm"]
    assert acked > 0


def test_sigkill_of_a_multi_shard_writer_recovers_each_shard_prefix_exact(tmp_path: Path) -> None:
    kill_rounds(tmp_path / "root", 8)


@pytest.mark.stress
@pytest.mark.timeout(1800)  # each round starts a Python process: ~1-2 s on a busy machine
def test_sigkill_of_a_multi_shard_writer_many_times(tmp_path: Path) -> None:
    kill_rounds(tmp_path / "root", 120, seed=23)


if __name__ == "__main__":
    writer_main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
