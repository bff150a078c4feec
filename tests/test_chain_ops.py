"""Operators' settings and tools on delta chains: each a table of settings or failure modes.

The chain limits (``max_chain``, ``full_ratio``) are refused alike by the
daemon and ``statelog compact`` (usage error, exit 3) and
``StoreOptions`` (``InvalidOptionError``), and reach the pass when good.
``statelog inspect`` shows each snapshot's kind, depth and parent;
``statelog verify`` names a delta whose chain is broken (kind ``chain``,
exit 1, both files named) and compares a delta's image in ``base/`` with
its stream; ``statelog recover --dry-run`` names the chain it would
restore; ``statelog dump`` prints the chain's merged state; the metrics
and the audit trail carry each pass's kind, depth and bytes written.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import statelog
from compactor.daemon import main as daemon_main
from compactor.options import parse_args
from statelog.cli import main as cli_main
from statelog.compaction.fold import CompactionResult, compact
from statelog.log.segments import list_segments
from statelog.ops import metrics
from statelog.ops.audit import AuditTrail
from statelog.ops.verify import Verdict, verify_store
from statelog.storage.fileio import FileLayer
from statelog.storage.snapshots import list_snapshots, verify_snapshot
from tests.test_base_images import forge, restamp

SEG = 4096
KEYS = 200


class Chain:
    """A store with two full snapshots, then two deltas: ``Q``, ``P``, ``D1`` on P, ``D2`` on D1.

    Each round is written by its own open (its close seals the segment, so
    the pass folds it); every pass keeps ten restore points, so every
    snapshot and the log back to ``Q`` stay.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.model: dict[str, int] = {}
        self.epoch = 0
        self.results: list[CompactionResult] = []
        self.write({f"k{i}": i for i in range(KEYS)})
        self.fold(max_chain=0)  # Q
        self.write({f"k{i}": -i for i in range(KEYS, KEYS + 20)})
        self.fold(max_chain=0)  # P
        self.write({"k1": 1001}, delete=["k2", "k3"])
        self.fold(full_ratio=10.0)  # D1
        self.write({"k4": 1004, "new": 7}, delete=["k5"])
        self.fold(full_ratio=10.0)  # D2

    def write(self, put: dict[str, int], delete: list[str] | tuple[str, ...] = ()) -> None:
        self.epoch += 1
        with statelog.open(self.root, segment_bytes=SEG) as s:
            s.commit(offsets={"p0": self.epoch}, low_watermark_ms=self.epoch, put=put,
                     delete=delete)  # fmt: skip
        self.model.update(put)
        for k in delete:
            self.model.pop(k, None)

    def fold(self, **chain: Any) -> CompactionResult:
        r = compact(self.root, min_tail_bytes=0, retain=10, **chain)
        assert r.snapshot is not None, r.skipped
        self.results.append(r)
        return r

    def snap(self, i: int) -> Path:
        """The snapshot of pass ``i`` (0: Q, 1: P, 2: D1, 3: D2)."""
        path = self.results[i].snapshot
        assert path is not None
        return path


@pytest.fixture(scope="module")
def chain_template(tmp_path_factory: pytest.TempPathFactory) -> Chain:
    built = Chain(tmp_path_factory.mktemp("chain") / "store")
    assert [(r.full, r.depth) for r in built.results] == [(True, 0), (True, 0), (False, 1),
                                                          (False, 2)]  # fmt: skip
    return built


@pytest.fixture
def chain(chain_template: Chain, tmp_path: Path) -> Chain:
    """A private copy of the chain store (tests damage it)."""
    copy = Chain.__new__(Chain)
    copy.__dict__ |= chain_template.__dict__
    copy.model = dict(chain_template.model)
    copy.root = tmp_path / "store"
    shutil.copytree(chain_template.root, copy.root)
    copy.results = [
        CompactionResult(copy.root, snapshot=copy.root / "snapshots" / r.snapshot.name,
                         full=r.full, depth=r.depth, written_bytes=r.written_bytes)
        for r in chain_template.results if r.snapshot is not None
    ]  # fmt: skip
    return copy


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = cli_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- settings: refused alike everywhere, with a hint -------------------------------------

BAD_FLAGS = [
    ("--max-chain", "-1", "outside 0..64"),
    ("--max-chain", "65", "outside 0..64"),
    ("--max-chain", "eight", "not an integer"),
    ("--max-chain", "1.5", "not an integer"),
    ("--full-ratio", "0", "outside (0, 10]"),
    ("--full-ratio", "-0.5", "outside (0, 10]"),
    ("--full-ratio", "10.5", "outside (0, 10]"),
    ("--full-ratio", "nan", "outside (0, 10]"),
    ("--full-ratio", "inf", "outside (0, 10]"),
    ("--full-ratio", "half", "not a number"),
]


@pytest.mark.parametrize(("flag", "text", "why"), BAD_FLAGS)
def test_the_daemon_refuses_a_bad_chain_limit_with_exit_3(
    flag: str, text: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args([flag, text, str(tmp_path)])
    assert info.value.code == 3
    err = capsys.readouterr().err
    assert flag in err and why in err and "hint:" in err


@pytest.mark.parametrize(("flag", "text", "why"), BAD_FLAGS)
def test_statelog_compact_refuses_a_bad_chain_limit_as_a_usage_error(
    flag: str, text: str, why: str, chain: Chain, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.name for p in (chain.root / "snapshots").iterdir())
    code, _out, err = run_cli(capsys, "compact", chain.root, flag, text)
    assert code == 3  # the usage status of both commands (2 means "not recoverable")
    assert flag in err and why in err and "hint:" in err
    assert sorted(p.name for p in (chain.root / "snapshots").iterdir()) == before


@pytest.mark.parametrize(
    ("argv", "max_chain", "full_ratio"),
    [([], 8, 0.5), (["--max-chain", "0"], 0, 0.5), (["--max-chain", "64", "--full-ratio", "10"],
     64, 10.0), (["--full-ratio", "0.01"], 8, 0.01)],
)  # fmt: skip
def test_the_daemon_parses_good_chain_limits(
    argv: list[str], max_chain: int, full_ratio: float, tmp_path: Path
) -> None:
    args, _client = parse_args([*argv, str(tmp_path)])
    assert (args.max_chain, args.full_ratio) == (max_chain, full_ratio)


BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"max_chain": -1}, "max_chain"),
    ({"max_chain": 65}, "max_chain"),
    ({"max_chain": None}, "max_chain"),
    ({"max_chain": False}, "max_chain"),
    ({"full_ratio": 0.0}, "full_ratio"),
    ({"full_ratio": 10.000001}, "full_ratio"),
    ({"full_ratio": float("inf")}, "full_ratio"),
    ({"full_ratio": True}, "full_ratio"),
    ({"full_ratio": None}, "full_ratio"),
]


@pytest.mark.parametrize(("options", "named"), BAD_OPTIONS)
def test_open_refuses_a_bad_chain_limit_before_touching_a_file(
    options: dict[str, Any], named: str, tmp_path: Path
) -> None:
    target = tmp_path / "store"
    with pytest.raises(statelog.InvalidOptionError) as info:
        statelog.open(target, compactor="thread", **options)
    assert named in info.value.message
    assert info.value.hint and info.value.hint != statelog.InvalidOptionError.hint
    assert not target.exists()


def newest_kind(root: Path) -> tuple[bool, int]:
    """(full, depth) of the newest snapshot, verified."""
    meta = verify_snapshot(FileLayer(), list_snapshots(root / "snapshots")[0][2], store_id=None)
    return meta.delta is None, meta.depth


@pytest.mark.parametrize(
    ("flags", "expect"),
    [(["--max-chain", "0"], (True, 0)), (["--full-ratio", "10"], (False, 3))],
    ids=["max-chain-0-merges", "full-ratio-10-adds-a-delta"],
)
def test_the_daemon_hands_its_chain_limits_to_the_pass(
    flags: list[str], expect: tuple[bool, int], chain: Chain
) -> None:
    chain.write({"k9": 9009})
    assert daemon_main(["--once", "--min-tail-bytes", "0", "--retain", "10", *flags,
                        str(chain.root)]) == 0  # fmt: skip
    assert newest_kind(chain.root) == expect


@pytest.mark.parametrize(
    ("flags", "expect", "kind"),
    [(["--max-chain", "0"], (True, 0), "a full snapshot"),
     (["--full-ratio", "10"], (False, 3), "a delta, depth 3")],
)  # fmt: skip
def test_statelog_compact_hands_its_chain_limits_to_the_pass(
    flags: list[str], expect: tuple[bool, int], kind: str, chain: Chain,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    chain.write({"k9": 9009})
    code, out, _err = run_cli(capsys, "compact", chain.root, "--retain", "10", *flags)
    assert code == 0
    assert newest_kind(chain.root) == expect
    assert kind in out


@pytest.mark.parametrize(
    ("options", "expect"),
    [({"max_chain": 0}, (True, 0)), ({"full_ratio": 10.0}, (False, 3))],
    ids=["max-chain-0-merges", "full-ratio-10-adds-a-delta"],
)
def test_the_thread_compactor_hands_its_chain_limits_to_the_pass(
    options: dict[str, Any], expect: tuple[bool, int], chain: Chain
) -> None:
    newest = list_snapshots(chain.root / "snapshots")[0][1]
    with statelog.open(chain.root, segment_bytes=SEG, compactor="thread", min_tail_bytes=0,
                       compactor_interval=timedelta(milliseconds=20), retain=10,
                       **options) as s:  # fmt: skip
        for i in range(60):  # past one segment: the first is sealed, so the pass folds it
            chain.epoch += 1
            s.commit(offsets={"p0": chain.epoch}, low_watermark_ms=chain.epoch,
                     put={"k9": i, "pad": "x" * 100})  # fmt: skip
        deadline = time.monotonic() + 20
        while list_snapshots(chain.root / "snapshots")[0][1] == newest:
            assert time.monotonic() < deadline, "the in-process compactor wrote nothing"
            time.sleep(0.02)
    full, depth = newest_kind(chain.root)
    # The thread may run a second pass before the close stops it (the log holds more
    # than one sealed segment): each adds a delta, so the depth is at least the first's.
    assert full == expect[0] and (depth == expect[1] if full else depth >= expect[1])


# -- inspect, recover --dry-run, dump -------------------------------------------------------


def test_inspect_shows_kind_depth_and_parent_of_each_snapshot(
    chain: Chain, capsys: pytest.CaptureFixture[str]
) -> None:
    q, p, d1, d2 = (chain.snap(i).name for i in range(4))
    for extra in ([], ["--no-verify"]):
        code, out, _ = run_cli(capsys, "inspect", chain.root, "--json", *extra)
        assert code == 0, out
        rows = {
            r["file"]: (r["kind"], r["depth"], r["parent"]) for r in json.loads(out)["snapshots"]
        }
        assert rows == {q: ("full", 0, None), p: ("full", 0, None), d1: ("delta", 1, p),
                        d2: ("delta", 2, d1)}  # fmt: skip
    code, out, _ = run_cli(capsys, "inspect", chain.root)
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines() if ".snap" in line}
    assert f"delta 2 on {d1}" in lines[d2] and "used by recovery" in lines[d2]
    assert f"delta 1 on {p}" in lines[d1]
    assert "  full  " in lines[p] and "  full  " in lines[q]


def test_recover_dry_run_names_the_chain_it_would_restore(
    chain: Chain, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [chain.snap(i).name for i in (1, 2, 3)]
    code, out, _ = run_cli(capsys, "recover", "--dry-run", chain.root, "--json")
    assert code == 0
    assert json.loads(out)["chain"] == names
    code, out, _ = run_cli(capsys, "recover", "--dry-run", chain.root)
    assert f"would restore the chain {' <- '.join(names)} (2 deltas)" in out


def test_dump_prints_the_merged_state_of_the_chain(
    chain: Chain, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "dump", chain.root, "--json")
    assert code == 0
    got = {json.loads(line)["key"]: json.loads(line)["value"] for line in out.splitlines()}
    assert got == chain.model
    assert "k2" not in got and got["k1"] == 1001 and got["new"] == 7  # D1's delete, D2's put


# -- verify: a broken chain, table of how it breaks ------------------------------------------


def parent_missing(c: Chain) -> tuple[Path, str]:
    c.snap(1).unlink()
    return c.snap(2), "the parent is missing"


def parent_damaged(c: Chain) -> tuple[Path, str]:
    data = bytearray(c.snap(1).read_bytes())
    data[len(data) // 2] ^= 0x40
    c.snap(1).write_bytes(bytes(data))
    return c.snap(2), "the parent does not verify"


def parent_replaced(c: Chain) -> tuple[Path, str]:
    """Another snapshot of the same epochs (a later pass over the same log) under P's name."""
    twin = c.root.parent / "twin"
    shutil.copytree(c.root, twin)
    for name in (c.snap(i).name for i in (1, 2, 3)):
        (twin / "snapshots" / name).unlink()
    shutil.rmtree(twin / "base", ignore_errors=True)
    [p_lsn] = [lsn for _e, lsn, path in list_snapshots(c.root / "snapshots") if path == c.snap(1)]
    for _seq, first_lsn, seg in list_segments(twin / "wal"):
        if first_lsn > p_lsn:  # the twin's log ends where P does
            seg.unlink()
    time.sleep(0.005)  # a later created_ms: the same state, another SHA-256
    assert compact(twin, min_tail_bytes=0, retain=10, max_chain=0).snapshot is not None
    shutil.copyfile(twin / "snapshots" / c.snap(1).name, c.snap(1))
    return c.snap(2), "hashes to"


def grandparent_missing(c: Chain) -> tuple[Path, str]:
    c.snap(1).unlink()
    return c.snap(3), "the parent's chain is broken"


BROKEN: dict[str, Callable[[Chain], tuple[Path, str]]] = {
    "parent missing": parent_missing,
    "parent damaged": parent_damaged,
    "parent replaced": parent_replaced,
    "grandparent missing": grandparent_missing,
}


@pytest.mark.parametrize("case", BROKEN)
def test_verify_names_a_broken_chain_with_both_files(
    case: str, chain: Chain, capsys: pytest.CaptureFixture[str]
) -> None:
    delta, why = BROKEN[case](chain)
    parent = verify_snapshot(FileLayer(), delta, store_id=None).delta
    assert parent is not None
    report = verify_store(chain.root)
    assert report.verdict is Verdict.RECOVERABLE
    [finding] = [f for f in report.findings if f.kind == "chain" and f.path == delta]
    assert delta.name in finding.reason and parent.parent in finding.reason
    assert why in finding.reason
    code, out, _ = run_cli(capsys, "verify", chain.root, "--json")
    assert code == 1
    kinds = {(f["file"], f["kind"]) for f in json.loads(out)["findings"]}
    assert (str(delta), "chain") in kinds
    code, out, _ = run_cli(capsys, "inspect", chain.root, "--json")
    assert code == 1
    row = next(r for r in json.loads(out)["snapshots"] if r["file"] == delta.name)
    assert row["chain"] is not None and why in row["chain"]


def test_verify_is_clean_on_a_chain_whose_older_links_no_longer_link_to_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = Chain(tmp_path / "store")
    for i in range(3):  # retain=1: the log before the newest delta is deleted
        c.write({f"k{i}": 5000 + i})
        compact(c.root, min_tail_bytes=0, retain=1, full_ratio=10.0)
    report = verify_store(c.root)
    assert report.verdict is Verdict.CLEAN, [str(f) for f in report.findings]
    members = [s for s in report.snapshots if not s.links]
    assert members and all(s.reason and "not a restore point" in s.reason for s in members)
    code, _out, _ = run_cli(capsys, "inspect", c.root)
    assert code == 0


def base_images(root: Path, stem: str) -> list[Path]:
    return sorted((root / "base").glob(f"{stem}.*.mdb"))


@pytest.mark.parametrize(
    ("edit", "verdict"),
    [("none", Verdict.CLEAN), ("put forged", Verdict.RECOVERABLE),
     ("tombstone revived", Verdict.RECOVERABLE), ("key added", Verdict.RECOVERABLE)],
)  # fmt: skip
def test_verify_compares_a_delta_image_with_its_stream(
    edit: str, verdict: Verdict, chain: Chain
) -> None:
    with statelog.open(chain.root):
        pass  # the writer's open maps the chain from base/
    d2 = chain.snap(3)
    [image] = base_images(chain.root, d2.name.removesuffix(".snap"))
    if edit == "put forged":
        forge(image, ("default", "k4"), b"\x01")
    elif edit == "tombstone revived":
        forge(image, ("default", "k5"), b"\x02")
    elif edit == "key added":
        forge(image, ("default", "k77"), b"\x03")
    if edit != "none":
        restamp(image)
    report = verify_store(chain.root)
    assert report.verdict is verdict, [str(f) for f in report.findings]
    assert [f.path for f in report.findings if f.kind == "base"] == (
        [] if edit == "none" else [image]
    )


# -- metrics and the audit trail --------------------------------------------------------------


def series(root: Path) -> dict[str, float]:
    def v(name: str, **labels: str) -> float:
        got = metrics.REGISTRY.get_sample_value(
            name, {"store": metrics.store_label(root), **labels}
        )
        return 0.0 if got is None else got

    return {
        "full": v("statelog_compaction_passes_total", kind="full"),
        "delta": v("statelog_compaction_passes_total", kind="delta"),
        "full_bytes": v("statelog_compaction_written_bytes_total", kind="full"),
        "delta_bytes": v("statelog_compaction_written_bytes_total", kind="delta"),
        "chain": v("statelog_snapshot_chain_length"),
    }


@pytest.mark.parametrize(
    ("chain_limits", "kind", "depth"),
    [({"full_ratio": 10.0}, "delta", 3), ({"max_chain": 0}, "full", 0),
     ({"max_chain": 2, "full_ratio": 10.0}, "delta", 1), ({"full_ratio": 0.01}, "full", 0)],
    ids=["delta-pass", "full-merge-max-chain-0", "rebase-chain-at-limit", "full-merge-by-bytes"],
)  # fmt: skip
def test_metrics_count_each_pass_by_kind_and_gauge_the_chain(
    chain_limits: dict[str, Any], kind: str, depth: int, chain: Chain
) -> None:
    metrics.install()
    metrics.watch(chain.root)
    try:
        before = series(chain.root)
        assert before["chain"] == 2
        chain.write({"k9": 9009})
        r = chain.fold(**chain_limits)
        after = series(chain.root)
    finally:
        metrics.unwatch(chain.root)
    assert r.snapshot is not None and (r.full, r.depth) == (kind == "full", depth)
    assert r.written_bytes == r.snapshot.stat().st_size > 0
    other = "full" if kind == "delta" else "delta"
    assert after[kind] - before[kind] == 1 and after[other] == before[other]
    assert after[f"{kind}_bytes"] - before[f"{kind}_bytes"] == r.written_bytes
    assert after[f"{other}_bytes"] == before[f"{other}_bytes"]
    assert after["chain"] == depth


def test_the_audit_trail_records_each_pass_kind_depth_and_bytes(chain: Chain) -> None:
    entries = [e for e in AuditTrail(chain.root).entries() if e.kind == "compaction"]
    got = [(e.fields["snapshot"], e.fields["snapshot_kind"], e.fields["depth"],
            e.fields["written_bytes"]) for e in entries]  # fmt: skip
    want = [(chain.snap(i).name, "full" if i < 2 else "delta", max(0, i - 1),
             chain.snap(i).stat().st_size) for i in range(4)]  # fmt: skip
    assert got == want
    assert AuditTrail(chain.root).verify().ok
