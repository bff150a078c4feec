"""The audit trail: every way of damaging it, and the crash windows it must accept.

Each row of the tamper table builds a five-entry trail, damages it with a
small helper, and states exactly which problems ``verify`` must name. The
hashes the helpers recompute follow ``docs/format.md``, independently of
``statelog.ops.audit``, so a drift between the code and the spec fails here.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

import statelog
from statelog import events
from statelog.errors import AuditError
from statelog.kit import FaultyFiles
from statelog.ops import audit
from statelog.ops.audit import AuditInputError, AuditTrail
from statelog.storage.fileio import FileLayer


@pytest.fixture(autouse=True)
def _no_global_listener() -> Any:
    """``import statelog`` installs the listener; these tests decide when it listens."""
    audit.uninstall()
    yield
    audit.install()


N = 5

# -- helpers that build trails and damage them ---------------------------------------------


def new_store(path: Path) -> Path:
    statelog.open(path).close()
    return path


def trail_of(path: Path, n: int = N, files: FileLayer | None = None) -> AuditTrail:
    """A store at ``path`` whose trail holds ``n`` compaction entries."""
    new_store(path)
    trail = AuditTrail(path, files=files)
    for i in range(n):
        trail.append("compaction", {"epoch": i + 1, "snapshot": f"s{i + 1}", "seconds": 0.25})
    return trail


def read_lines(trail: AuditTrail) -> list[bytes]:
    return trail.log_path.read_bytes().split(b"\n")[:-1]


def write_lines(trail: AuditTrail, lines: list[bytes], tail: bytes = b"") -> None:
    trail.log_path.write_bytes(b"".join(line + b"\n" for line in lines) + tail)


def doc(line: bytes) -> dict[str, Any]:
    decoded: dict[str, Any] = msgspec.json.decode(line)
    return decoded


def seal(d: dict[str, Any]) -> bytes:
    """The line for ``d`` with its own hash recomputed, as docs/format.md defines it."""
    body = {k: v for k, v in d.items() if k != "hash"}
    raw = msgspec.json.encode(body)
    return raw[:-1] + b',"hash":"' + hashlib.sha256(raw).hexdigest().encode() + b'"}'


def edit(trail: AuditTrail, seq: int, *, rehash: bool) -> None:
    lines = read_lines(trail)
    d = doc(lines[seq - 1])
    d["fields"]["epoch"] = 999
    lines[seq - 1] = seal(d) if rehash else msgspec.json.encode(d)
    write_lines(trail, lines)


def delete(trail: AuditTrail, seq: int) -> None:
    lines = read_lines(trail)
    del lines[seq - 1]
    write_lines(trail, lines)


def swap(trail: AuditTrail, a: int, b: int) -> None:
    lines = read_lines(trail)
    lines[a - 1], lines[b - 1] = lines[b - 1], lines[a - 1]
    write_lines(trail, lines)


def forge_before(trail: AuditTrail, seq: int, *, rehash: bool = True) -> None:
    """Insert a forged entry ``seq`` that chains correctly from entry ``seq - 1``."""
    lines = read_lines(trail)
    d = doc(lines[seq - 1])
    d["kind"], d["fields"] = "retention_delete", {"file": "forged", "reason": "cover-up"}
    lines.insert(seq - 1, seal(d) if rehash else msgspec.json.encode(d))
    write_lines(trail, lines)


def respace(trail: AuditTrail, seq: int) -> None:
    """Same JSON value, different bytes: a space after the first colon."""
    lines = read_lines(trail)
    lines[seq - 1] = lines[seq - 1].replace(b":", b": ", 1)
    write_lines(trail, lines)


def garble_line(trail: AuditTrail, seq: int) -> None:
    lines = read_lines(trail)
    lines[seq - 1] = b"this is not json"
    write_lines(trail, lines)


def set_anchor(trail: AuditTrail, seq: int, digest: str | None = None) -> None:
    """Point AUDIT.head at entry ``seq`` (with its real hash unless ``digest`` is given)."""
    real = doc(read_lines(trail)[seq - 1])["hash"]
    body = {"seq": seq, "hash": digest or real}
    trail.anchor_path.write_bytes(msgspec.json.encode(body) + b"\n")


def other_store_trail(trail: AuditTrail) -> None:
    """Replace the trail by a valid one written for another store."""
    other = trail_of(trail.root.parent / "other")
    shutil.copy(other.log_path, trail.log_path)
    shutil.copy(other.anchor_path, trail.anchor_path)


def garble_anchor(trail: AuditTrail) -> None:
    trail.anchor_path.write_bytes(b"{not json")


Damage = Callable[[AuditTrail], None]
# (damage, expected problems as (kind, seq)); seq None where no entry can be named.
TAMPER_TABLE: dict[str, tuple[Damage, set[tuple[str, int | None]]]] = {
    "clean": (lambda t: None, set()),
    "field edited": (lambda t: edit(t, 3, rehash=False), {("edited", 3)}),
    "field edited, own hash recomputed": (lambda t: edit(t, 3, rehash=True), {("edited", 3)}),
    "last entry edited, own hash recomputed": (
        lambda t: edit(t, N, rehash=True),
        {("edited", N)},  # the anchor still names the old hash
    ),
    "bytes changed, same JSON value": (lambda t: respace(t, 2), {("edited", 2)}),
    "middle line deleted": (lambda t: delete(t, 3), {("deleted", 3)}),
    "first line deleted": (lambda t: delete(t, 1), {("deleted", 1)}),
    "last line deleted": (lambda t: delete(t, N), {("truncated", N)}),
    "whole log deleted": (lambda t: t.log_path.unlink(), {("truncated", N)}),
    "two lines swapped": (lambda t: swap(t, 3, 4), {("reordered", 3)}),
    "forged line inserted": (lambda t: forge_before(t, 3), {("inserted", 3)}),
    "forged line inserted, hash not recomputed": (
        lambda t: forge_before(t, 3, rehash=False),
        {("inserted", 3), ("edited", 3)},
    ),
    "line garbled": (lambda t: garble_line(t, 2), {("unreadable", None), ("deleted", 2)}),
    "another store's trail": (other_store_trail, {("edited", 1)}),
    "anchor missing": (lambda t: t.anchor_path.unlink(), {("deleted", None)}),
    "anchor garbled": (lambda t: garble_anchor(t), {("unreadable", None)}),
    "anchor names another hash": (lambda t: set_anchor(t, N, "ab" * 32), {("edited", N)}),
    "anchor rewound two entries": (lambda t: set_anchor(t, N - 2), {("inserted", N - 2)}),
    "crash window: log one entry ahead of the anchor": (lambda t: set_anchor(t, N - 1), set()),
}


@pytest.mark.parametrize("case", list(TAMPER_TABLE))
def test_tampering_is_detected(case: str, store_path: Path) -> None:
    damage, expected = TAMPER_TABLE[case]
    trail = trail_of(store_path)
    damage(trail)
    before = {p.name: p.read_bytes() for p in store_path.iterdir() if p.is_file()}
    verdict = trail.verify()
    assert {(p.kind, p.seq) for p in verdict.problems} == expected, verdict.problems
    assert verdict.ok is (not expected)
    assert all(p.reason for p in verdict.problems)
    after = {p.name: p.read_bytes() for p in store_path.iterdir() if p.is_file()}
    assert after == before  # verify changes nothing on disk


def test_problems_name_the_line_and_file(store_path: Path) -> None:
    trail = trail_of(store_path)
    swap(trail, 2, 3)
    [problem] = trail.verify().problems
    assert (problem.line, problem.seq, problem.file) == (3, 2, "AUDIT.log")
    trail.anchor_path.write_bytes(b"garbage")
    anchor_problems = [p for p in trail.verify().problems if p.file == "AUDIT.head"]
    assert [(p.line, p.kind) for p in anchor_problems] == [(None, "unreadable")]


def test_appended_lines_follow_the_spec(store_path: Path) -> None:
    trail = trail_of(store_path, n=3)
    lines = read_lines(trail)
    sid = uuid.UUID(doc(store_path.joinpath("IDENTITY").read_bytes())["store_id"])
    genesis = hashlib.sha256(b"statelog-audit-genesis\x00" + sid.bytes).hexdigest()
    prev = genesis
    for seq, line in enumerate(lines, 1):
        d = doc(line)
        assert list(d) == ["seq", "ts", "kind", "pid", "fields", "prev", "hash"]
        assert (d["seq"], d["prev"], d["pid"]) == (seq, prev, os.getpid())
        assert seal(d) == line
        assert d["ts"].endswith("Z") and d["ts"][10] == "T"
        prev = d["hash"]
    assert doc(trail.anchor_path.read_bytes()) == {"seq": 3, "hash": prev}
    listed = list(trail.entries())
    assert [e.seq for e in listed] == [1, 2, 3]
    assert listed[2].fields == {"epoch": 3, "snapshot": "s3", "seconds": 0.25}


def test_append_returns_the_entry_and_accepts_paths(store_path: Path) -> None:
    new_store(store_path)
    entry = AuditTrail(store_path).append("retention_delete", {"file": store_path / "x.snap"})
    assert entry.seq == 1 and entry.fields == {"file": str(store_path / "x.snap")}
    assert list(AuditTrail(store_path).entries()) == [entry]


def test_a_truncation_is_not_laundered_by_the_next_append(store_path: Path) -> None:
    trail = trail_of(store_path)
    delete(trail, N)
    trail.append("recovery", {"epoch": 7})
    verdict = trail.verify()
    assert not verdict.ok
    assert [(p.kind, p.seq) for p in verdict.problems] == [("truncated", N)]
    assert "audit_anchor_mismatch" in list(trail.entries())[-1].fields


# -- torn tails and crash windows ----------------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [b'{"seq":6,"ts":"2026-01-0', b"\0" * 40, b"{"],
    ids=["cut mid-line", "zeros (size before data)", "one byte"],
)
def test_torn_tail_is_reported_then_repaired(tail: bytes, store_path: Path) -> None:
    trail = trail_of(store_path)
    write_lines(trail, read_lines(trail), tail)
    verdict = trail.verify()
    assert verdict.ok and verdict.entries == N
    assert [(p.kind, p.line) for p in verdict.problems] == [("torn", N + 1)]
    entry = trail.append("recovery", {"epoch": 9})
    assert entry.seq == N + 1
    note = entry.fields["audit_torn_tail"]
    assert note["bytes"] == len(tail) and note["sha256"] == hashlib.sha256(tail).hexdigest()
    assert (store_path / note["saved_as"]).read_bytes() == tail
    assert trail.verify() == audit.AuditVerdict(True, N + 1, [])


def test_crash_after_log_fsync_before_anchor_is_accepted(store_path: Path) -> None:
    files = FaultyFiles(store_path)
    trail = trail_of(store_path, files=files)
    files.fail("create", errno=5, match="AUDIT.head.tmp")  # the anchor's temp file
    with pytest.raises(AuditError):
        trail.append("recovery", {"epoch": 6})
    files.crash("drop")
    assert doc(trail.anchor_path.read_bytes())["seq"] == N
    assert len(read_lines(trail)) == N + 1
    assert AuditTrail(store_path).verify() == audit.AuditVerdict(True, N + 1, [])
    assert AuditTrail(store_path).append("recovery", {"epoch": 7}).seq == N + 2
    assert AuditTrail(store_path).verify().ok


def _before_cut(path: Path, scenario: str) -> tuple[FaultyFiles, AuditTrail]:
    """A trail in the state the cut append starts from, written through a fault layer."""
    files = FaultyFiles(path)
    trail = trail_of(path, n=0 if scenario == "first append" else 2, files=files)
    if scenario == "append that cuts a torn tail":
        with trail.log_path.open("ab") as fh:
            fh.write(b'{"seq":3,"ts":"20')
            os.fsync(fh.fileno())
    return files, trail


CUT_SCENARIOS = ["first append", "later append", "append that cuts a torn tail"]


@pytest.mark.parametrize("mode", ["drop", "zeros", "prefix"])
@pytest.mark.parametrize("scenario", CUT_SCENARIOS)
def test_power_cut_at_every_step_of_an_append(scenario: str, mode: str, tmp_path: Path) -> None:
    files, trail = _before_cut(tmp_path / "count", scenario)
    start = files.ops
    trail.append("recovery", {"epoch": 3})
    steps = files.ops - start
    assert steps >= 9  # anchor read, open, write, sync, anchor temp, write, sync, rename, dir
    for cut in range(1, steps + 2):  # the last one cuts after the append returned
        path = tmp_path / f"cut-{cut}"
        files, trail = _before_cut(path, scenario)
        acked = [e.hash for e in trail.entries()]
        files.cut_power(at=files.ops + cut)
        with contextlib.suppress(AuditError):
            acked.append(trail.append("recovery", {"epoch": 3}).hash)
        files.crash(mode, seed=cut)  # type: ignore[arg-type]
        after = AuditTrail(path)
        verdict = after.verify()
        assert verdict.ok, (cut, verdict.problems)
        assert [p.kind for p in verdict.problems] in ([], ["torn"])
        assert [e.hash for e in after.entries()][: len(acked)] == acked
        after.append("recovery", {"epoch": 4})
        assert after.verify().problems == [], (cut, mode)


# -- several processes ---------------------------------------------------------------------


def _append_many(root: str, who: int, count: int) -> None:
    trail = AuditTrail(Path(root))
    for i in range(count):
        trail.append("compaction", {"who": who, "i": i})


def test_concurrent_appenders_leave_one_valid_chain(store_path: Path) -> None:
    new_store(store_path)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(store_path), w, 200)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    trail = AuditTrail(store_path)
    verdict = trail.verify()
    assert verdict == audit.AuditVerdict(True, 400, [])
    seen = sorted((e.fields["who"], e.fields["i"]) for e in trail.entries())
    assert seen == [(w, i) for w in (0, 1) for i in range(200)]
    assert len({e.pid for e in trail.entries()}) == 2


# -- the events listener -------------------------------------------------------------------


@pytest.fixture
def listening(store_path: Path) -> Any:
    """A store created before the listener is installed, so its own open leaves no entry."""
    new_store(store_path)
    audit.install()
    audit.install()  # idempotent: still one listener
    yield store_path
    audit.uninstall()


def audit_files(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if p.name.startswith("AUDIT"))


def test_listener_records_writable_events_once(listening: Path) -> None:
    events.emit(listening, "truncation", file=Path("wal/x.wal"), offset=64, bytes_dropped=8)
    [entry] = AuditTrail(listening).entries()
    assert (entry.kind, entry.fields) == (
        "truncation",
        {"file": "wal/x.wal", "offset": 64, "bytes_dropped": 8},
    )
    assert AuditTrail(listening).verify().ok


def test_listener_writes_nothing_for_readonly_events(listening: Path) -> None:
    events.emit(listening, "recovery", writable=False, epoch=0, readonly=True)
    statelog.open(listening, readonly=True).close()
    assert audit_files(listening) == []


def test_listener_ignores_a_directory_without_a_store(listening: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    events.emit(empty, "compaction", epoch=1)
    assert list(empty.iterdir()) == []


def test_listener_failure_does_not_reach_the_emitter(listening: Path) -> None:
    events.emit(listening, "compaction", snapshot=object())  # not serialisable: logged
    assert not (listening / "AUDIT.log").exists()


def test_unknown_event_kind_is_the_bus_error(listening: Path) -> None:
    with pytest.raises(ValueError, match="unknown event kind"):
        events.emit(listening, "coffee_break")
    assert audit_files(listening) == []


def test_uninstall_stops_recording(listening: Path) -> None:
    audit.uninstall()
    events.emit(listening, "compaction", epoch=1)
    assert audit_files(listening) == []


# -- bad input and foreign files -----------------------------------------------------------

BAD_APPENDS: dict[str, tuple[Any, Any]] = {
    "field not serialisable": ("compaction", {"x": object()}),
    "field is a set of objects": ("compaction", {"x": {object()}}),
    "field holds a lone surrogate": ("compaction", {"x": "a\udc80"}),
    "non-str field name": ("compaction", {1: "x"}),
    "reserved field name": ("compaction", {"audit_torn_tail": 1}),
    "fields not a mapping": ("compaction", [("a", 1)]),
    "kind with spaces": ("Bad Kind", {}),
    "empty kind": ("", {}),
    "kind not a str": (5, {}),
}


@pytest.mark.parametrize("case", list(BAD_APPENDS))
def test_bad_input_is_refused_and_writes_nothing(case: str, store_path: Path) -> None:
    kind, fields = BAD_APPENDS[case]
    trail = trail_of(store_path, n=2)
    before = {p.name: p.read_bytes() for p in store_path.iterdir() if p.is_file()}
    with pytest.raises(AuditInputError) as info:
        trail.append(kind, fields)
    assert isinstance(info.value, ValueError) and info.value.hint
    assert {p.name: p.read_bytes() for p in store_path.iterdir() if p.is_file()} == before


def test_first_append_refused_leaves_no_file(store_path: Path) -> None:
    new_store(store_path)
    with pytest.raises(AuditInputError):
        AuditTrail(store_path).append("compaction", {"x": object()})
    assert not any(p.name.startswith("AUDIT") for p in store_path.iterdir())


def test_no_store_is_an_audit_error(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="store identity"):
        AuditTrail(tmp_path).append("compaction", {})
    with pytest.raises(AuditError):
        AuditTrail(tmp_path).verify()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [b"hello\nworld\n", b"#!/bin/sh", b"\x00\x01binary\n"])
def test_a_foreign_file_is_not_an_audit_trail(content: bytes, store_path: Path) -> None:
    new_store(store_path)
    (store_path / "AUDIT.log").write_bytes(content)
    with pytest.raises(AuditError, match="not an audit trail"):
        AuditTrail(store_path).verify()


def test_entries_refuse_an_unreadable_line(store_path: Path) -> None:
    trail = trail_of(store_path)
    garble_line(trail, 2)
    with pytest.raises(AuditError, match="line 2"):
        list(trail.entries())


def test_empty_trail_verifies(store_path: Path) -> None:
    new_store(store_path)
    assert AuditTrail(store_path).verify() == audit.AuditVerdict(True, 0, [])
    assert not (store_path / "AUDIT.lock").exists()  # readers never create files


# -- scale ---------------------------------------------------------------------------------


def test_verify_100k_entries_in_seconds(store_path: Path) -> None:
    new_store(store_path)
    sid = uuid.UUID(doc(store_path.joinpath("IDENTITY").read_bytes())["store_id"])
    prev = hashlib.sha256(b"statelog-audit-genesis\x00" + sid.bytes).hexdigest()
    lines = []
    for seq in range(1, 100_001):
        d = {"seq": seq, "ts": "2026-01-01T00:00:00.000000Z", "kind": "compaction", "pid": 1}
        d |= {"fields": {"epoch": seq, "lsn": seq * 3, "snapshot": f"{seq:016x}"}, "prev": prev}
        lines.append(seal(d))
        prev = doc(lines[-1])["hash"]
    trail = AuditTrail(store_path)
    write_lines(trail, lines)
    set_anchor(trail, 100_000)
    start = time.perf_counter()
    verdict = trail.verify()
    elapsed = time.perf_counter() - start
    assert verdict == audit.AuditVerdict(True, 100_000, [])
    assert elapsed < 5.0, f"verify of 100k entries took {elapsed:.2f} s"
    start = time.perf_counter()
    appended = trail.append("compaction", {"epoch": 100_001})
    assert appended.seq == 100_001 and appended.prev == prev
    assert time.perf_counter() - start < 0.5  # reads only the tail
