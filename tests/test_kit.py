"""The testing kit itself: every fault does what it says, at the step it names.

Each fault kind is checked against the step it must hit (a test fails when
the hook is never called), the power-loss model against its rules, the
seeded workload for determinism per seed, and its model against a store
that replayed the commits. The reconciler workload of the benchmarks is
pinned by a digest, so benchmark results stay comparable across releases.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

import statelog
from statelog.kit import (
    DEFAULT_SEED,
    KINDS,
    Crash,
    Fail,
    FaultyFiles,
    Kind,
    Pause,
    PowerCut,
    Step,
    Stream,
    Then,
    Workload,
    run_commit,
    store_digest,
)
from tests.crash_writer import plan_faults
from tests.helpers import snapshot_of

REPO = Path(__file__).resolve().parent.parent


class Died(Exception):
    """Raised by the test's ``die`` in place of a SIGKILL."""

    def __init__(self, step: Step) -> None:
        super().__init__(step.label)
        self.step = step


def die(step: Step) -> None:
    raise Died(step)


def _prepare(d: Path) -> None:
    (d / "a").write_bytes(b"0123456789")
    (d / "src").write_bytes(b"s")


# Every kind, and an operation that passes exactly one step of it first.
OPS: list[tuple[Kind, Callable[[FaultyFiles, Path], Any]]] = [
    ("open", lambda f, d: f.open_append(d / "a")),
    ("create", lambda f, d: f.create_durable(d / "new", b"x")),
    ("write", lambda f, d: f.open_append(d / "a").write([b"abc"])),
    ("sync", lambda f, d: f.open_append(d / "a").sync()),
    ("fsync_dir", lambda f, d: f.fsync_dir(d)),
    ("truncate", lambda f, d: f.truncate(d / "a", 3)),
    ("rename", lambda f, d: f.rename(d / "src", d / "dst")),
    ("remove", lambda f, d: f.remove(d / "a")),
    ("mkdir", lambda f, d: f.makedirs(d / "sub")),
    ("read", lambda f, d: f.read(d / "a")),
]


def test_the_table_covers_every_kind() -> None:
    assert sorted(k for k, _ in OPS) == sorted(KINDS)


@pytest.mark.parametrize(("kind", "op"), OPS, ids=[k for k, _ in OPS])
def test_each_kind_is_hooked(tmp_path: Path, kind: Kind, op: Callable[..., Any]) -> None:
    _prepare(tmp_path)
    files = FaultyFiles(tmp_path, [Fail(kind, errno=errno.EIO)])
    with pytest.raises(OSError) as exc:
        op(files, tmp_path)
    assert exc.value.errno == errno.EIO
    assert any(t.startswith(f"{kind} ") for t in files.trace)


@pytest.mark.parametrize(("kind", "op"), OPS, ids=[k for k, _ in OPS])
def test_crash_before_a_step_kills_at_it(
    tmp_path: Path, kind: Kind, op: Callable[..., Any]
) -> None:
    _prepare(tmp_path)
    files = FaultyFiles(tmp_path, [Crash(kind)], die=die)
    with pytest.raises(Died) as exc:
        op(files, tmp_path)
    assert exc.value.step.kind == kind


@pytest.mark.parametrize(
    ("fault", "src_left", "dst_made"),
    [
        (Crash("rename"), True, False),  # before: nothing renamed
        (Crash("rename", after=True), False, True),  # after: the rename was made
    ],
    ids=["before", "after"],
)
def test_crash_before_or_after_the_step(
    tmp_path: Path, fault: Crash, src_left: bool, dst_made: bool
) -> None:
    _prepare(tmp_path)
    files = FaultyFiles(tmp_path, [fault], die=die)
    with pytest.raises(Died):
        files.rename(tmp_path / "src", tmp_path / "dst")
    assert (tmp_path / "src").exists() is src_left
    assert (tmp_path / "dst").exists() is dst_made


@pytest.mark.parametrize(("frac", "kept"), [(0.0, 0), (0.5, 5), (0.99, 9), (1.0, 9)])
def test_a_torn_write_keeps_that_fraction_and_never_all(
    tmp_path: Path, frac: float, kept: int
) -> None:
    _prepare(tmp_path)
    files = FaultyFiles(tmp_path, [Crash("write", frac=frac)], die=die)
    f = files.open_append(tmp_path / "a")
    with pytest.raises(Died):
        f.write([b"ABCDE", b"FGHIJ"])
    assert (tmp_path / "a").read_bytes() == b"0123456789" + b"ABCDEFGHIJ"[:kept]


def test_nth_match_and_when_choose_the_step(tmp_path: Path) -> None:
    _prepare(tmp_path)
    (tmp_path / "b.wal").write_bytes(b"")
    files = FaultyFiles(
        tmp_path, [Crash("write", 2, ".wal", lambda s: s.data.startswith(b"R"))], die=die
    )
    f, g = files.open_append(tmp_path / "a"), files.open_append(tmp_path / "b.wal")
    f.write([b"R1"])  # not .wal
    g.write([b"S1"])  # .wal, but not a record
    g.write([b"R1"])  # the first matching step
    with pytest.raises(Died) as exc:
        g.write([b"R2"])
    assert exc.value.step.label == "write:b.wal" and exc.value.step.data == b"R2"


def test_faults_count_from_when_they_are_armed(tmp_path: Path) -> None:
    _prepare(tmp_path)
    files = FaultyFiles(tmp_path, die=die)
    for _ in range(3):
        files.read(tmp_path / "a")
    files.add(Crash("read", 2))
    files.read(tmp_path / "a")
    with pytest.raises(Died) as exc:
        files.read(tmp_path / "a")
    assert exc.value.step.number == 5


def test_pause_waits_before_the_step_then_takes_it(tmp_path: Path) -> None:
    _prepare(tmp_path)
    seen: list[tuple[str, bool]] = []
    files = FaultyFiles(
        tmp_path,
        [Pause("rename", wait=lambda s: seen.append((s.label, (tmp_path / "dst").exists())))],
    )
    files.rename(tmp_path / "src", tmp_path / "dst")
    assert seen == [("rename:dst", False)]
    assert (tmp_path / "dst").exists()


def test_fail_after_a_short_write_and_for_n_times(tmp_path: Path) -> None:
    _prepare(tmp_path)
    files = FaultyFiles(tmp_path, [Fail("write", 2, errno=errno.ENOSPC, times=2, partial=3)])
    f = files.open_append(tmp_path / "a")
    f.write([b"ok"])
    for _ in range(2):
        with pytest.raises(OSError) as exc:
            f.write([b"WXYZ"])
        assert exc.value.errno == errno.ENOSPC
    f.write([b"!"])  # times=2: the third matching write succeeds
    assert (tmp_path / "a").read_bytes() == b"0123456789" + b"ok" + b"WXY" * 2 + b"!"


def test_free_space_drops_every_failure(tmp_path: Path) -> None:
    _prepare(tmp_path)
    files = FaultyFiles(tmp_path)
    files.fail("read", times=None)
    with pytest.raises(OSError):
        files.read(tmp_path / "a")
    files.free_space()
    assert files.read(tmp_path / "a") == b"0123456789"


def test_power_cut_fails_the_step_and_everything_after(tmp_path: Path) -> None:
    _prepare(tmp_path)
    files = FaultyFiles(tmp_path, [PowerCut("rename")])
    files.read(tmp_path / "a")
    with pytest.raises(OSError) as exc:
        files.rename(tmp_path / "src", tmp_path / "dst")
    assert exc.value.errno == errno.EIO and files.dead
    with pytest.raises(OSError):
        files.read(tmp_path / "a")
    assert (tmp_path / "src").exists()


def test_then_arms_its_faults_once_the_step_is_done(tmp_path: Path) -> None:
    _prepare(tmp_path)
    files = FaultyFiles(tmp_path, [Then("open", 2, faults=(Crash("write"),))], die=die)
    files.open_append(tmp_path / "a").write([b"x"])  # before the second open: no crash
    f = files.open_append(tmp_path / "a")
    with pytest.raises(Died):
        f.write([b"y"])
    assert (tmp_path / "a").read_bytes() == b"0123456789x"


def test_the_default_crash_is_a_real_sigkill(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from statelog.kit import Crash, FaultyFiles\n"
        "f = FaultyFiles(None, [Crash('fsync_dir')]); f.fsync_dir(Path(sys.argv[1]))\n"
        "print('survived')\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True
    )
    assert got.returncode == -9 and "survived" not in got.stdout


# -- the power-loss model ----------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "want"),
    [("drop", b"base"), ("zeros", b"base" + bytes(5))],
)
def test_unsynced_appends_are_lost(tmp_path: Path, mode: Any, want: bytes) -> None:
    (tmp_path / "f").write_bytes(b"base")  # present before the layer: durable
    files = FaultyFiles(tmp_path)
    f = files.open_append(tmp_path / "f")
    f.write([b"synced"])
    f.sync()
    f.write([b"later"])
    files.crash(mode, into=tmp_path.with_name(tmp_path.name + "-img"))
    img = tmp_path.with_name(tmp_path.name + "-img")
    assert (img / "f").read_bytes() == (b"basesynced" + want[4:] if mode == "zeros" else
                                        b"basesynced")  # fmt: skip
    assert (tmp_path / "f").read_bytes() == b"basesyncedlater"  # the run goes on


def test_prefix_mode_keeps_a_prefix_of_the_unsynced_bytes(tmp_path: Path) -> None:
    files = FaultyFiles(tmp_path)
    files.create_durable(tmp_path / "f", b"head")
    f = files.open_append(tmp_path / "f")
    f.write([b"0123456789"])
    files.crash("prefix", seed=3)
    data = (tmp_path / "f").read_bytes()
    assert b"head0123456789".startswith(data) and len(data) >= 4


def test_directory_entries_need_a_directory_fsync(tmp_path: Path) -> None:
    (tmp_path / "old").write_bytes(b"old")
    (tmp_path / "gone").write_bytes(b"keep me")
    files = FaultyFiles(tmp_path)
    files.makedirs(tmp_path / "d")  # mkdir fsyncs its parent: durable
    files.create_durable(tmp_path / "d" / "durable", b"x")  # fsyncs d: durable
    fd = os.open(tmp_path / "new.tmp", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)
    files.rename(tmp_path / "old", tmp_path / "renamed")  # no fsync of tmp_path
    files.remove(tmp_path / "gone")  # neither
    files.crash()
    assert (tmp_path / "d" / "durable").read_bytes() == b"x"
    assert (tmp_path / "old").read_bytes() == b"old" and not (tmp_path / "renamed").exists()
    assert (tmp_path / "gone").read_bytes() == b"keep me"
    with pytest.raises(OSError):
        files.read(tmp_path / "old")  # dead after an in-place crash


def test_crash_needs_the_power_model() -> None:
    with pytest.raises(ValueError, match="root="):
        FaultyFiles().crash()


# -- the crash writer's plans hit the step they name -----------------------------


@pytest.mark.parametrize(
    ("plan", "label_end", "torn"),
    [
        ("torn:2:0.5", ".wal", True),
        ("roll:1:seal-torn:0.5", ".wal", True),
        ("roll:1:sealed", ".wal.tmp", False),
        ("roll:1:tmp:0.5", ".wal.tmp", True),
        ("roll:1:renamed", ".wal", False),
        ("roll:1:opened", ".wal", False),
        ("roll:1:first-torn:0.5", ".wal", True),
    ],
)
def test_crash_writer_plans_hit_their_step(
    tmp_path: Path, plan: str, label_end: str, torn: bool
) -> None:
    files = FaultyFiles(tmp_path, die=die)
    store = statelog.open(tmp_path / "s", segment_bytes=4096, file_layer=files)
    files.add(*plan_faults(plan))
    stream = Stream(seed=1, blob_ratio=0.0, medium_ratio=0.0)
    with pytest.raises(Died) as exc:
        for i in range(1, 500):
            run_commit(store, stream.commit(i))
    files.abandon(store)
    assert exc.value.step.path.name.endswith(label_end), exc.value.step
    assert (exc.value.step.kind == "write") is torn


# -- the seeded workload -----------------------------------------------------------


def test_commits_are_a_pure_function_of_seed_and_index() -> None:
    a, b = Stream(seed=7), Stream(seed=7)
    assert [a.commit(i) for i in range(1, 60)] == [b.commit(i) for i in reversed(range(1, 60))][
        ::-1
    ]
    assert [a.commit(i) for i in range(1, 20)] != [Stream(seed=8).commit(i) for i in range(1, 20)]
    assert a.model(50) == b.advance(b.model(20), 50)
    specs = [a.commit(i) for i in range(1, 400)]
    assert {s.form for s in specs} == {"commit", "transaction"}
    keys = {op.key for s in specs for op in s.ops}
    assert any(isinstance(k, bytes) for k in keys) and any(isinstance(k, str) for k in keys)
    assert any(op.delete for s in specs for op in s.ops)


def test_parameters_shape_the_stream() -> None:
    plain = Stream(seed=3, transaction_ratio=0.0, blob_ratio=0.0, medium_ratio=0.0,
                   delete_ratio=0.0, tables=("t",), key_space=5, value_size=10)  # fmt: skip
    specs = [plain.commit(i) for i in range(1, 200)]
    assert {s.form for s in specs} == {"commit"}
    assert all(not op.delete and op.table == "t" for s in specs for op in s.ops)
    assert {op.key for s in specs for op in s.ops} <= {plain.key("t", n) for n in range(5)}


def test_the_model_is_what_a_store_holds_after_replay(tmp_path: Path) -> None:
    stream = Stream(seed=11)
    with statelog.open(tmp_path / "s", segment_bytes=16 * 1024, fragment_bytes=2048) as s:
        for i in range(1, 121):
            assert run_commit(s, stream.commit(i)) == i
    model = stream.model(120)
    with statelog.open(tmp_path / "s") as s:
        assert s.recovery.replayed == 120
        assert snapshot_of(s) == model.state()
        assert store_digest(s) == model.digest()
    assert stream.model(119).digest() != model.digest()


def test_the_reconciler_workload_is_bit_identical_for_a_seed() -> None:
    w = Workload(state_keys=300, updates=40, seed=DEFAULT_SEED)
    h = hashlib.sha256()
    for chunk in w.initial_chunks(chunk=128):
        h.update(msgspec.msgpack.encode(chunk))
    for i in (0, 1, 17):
        cp = w.checkpoint(i)
        h.update(msgspec.msgpack.encode(
            [cp.index, cp.offsets, cp.low_watermark_ms, cp.put, list(cp.delete)]
        ))  # fmt: skip
    assert h.hexdigest() == "609033beeccf9852e85c7f45f1d1538fef8b049b362037827ecd9cf941f6da5d"


def test_nothing_on_the_commit_path_imports_the_kit(tmp_path: Path) -> None:
    code = (
        "import sys, statelog\n"
        "with statelog.open(sys.argv[1]) as s:\n"
        "    s.commit(offsets={'p': 1}, low_watermark_ms=1, put={'k': 1})\n"
        "print(sorted(m for m in sys.modules if m.startswith('statelog.kit')))\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "s")], cwd=REPO, capture_output=True, text=True
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "[]"
