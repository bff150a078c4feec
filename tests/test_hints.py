"""Error hints and messages that fit the caller: a library caller, or a user of the commands.

Each table row is a situation a new user meets; the assertions say what
the message must tell them (and what it must not send them to do).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog import errors
from statelog.cli import main as cli_main
from statelog.cli.output import say_error
from statelog.compaction.fold import compact
from statelog.errors import (
    AuditError,
    CompactorLockedError,
    CorruptionError,
    InvalidOptionError,
    PromotionLostError,
    PromotionRefusedError,
    ReadOnlyStoreError,
    ResnapshotRequired,
    StandbyCopyError,
    StatelogError,
    StoreClosedError,
    StoreLockedError,
    StoreNotFoundError,
)
from statelog.ops.audit import AuditTrail

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv" / "bin" / "python"
PY = str(VENV_PY if VENV_PY.exists() else Path(sys.executable))

# What a command user cannot act on: Python keyword arguments and calls.
PYTHON_ONLY = re.compile(r"\w+=True|\w+=False|readonly|strict|open\(|follow=")


def make_store(path: Path, commits: int = 20, *, snapshot: bool = True) -> int:
    """A closed store with ``commits`` epochs (and a snapshot of most of them); its epoch."""
    with statelog.open(path) as s:
        for i in range(commits):
            with s.transaction() as t:
                t.put(f"k{i}", b"v" * 50)
    if snapshot:
        compact(path)
        with statelog.open(path) as s, s.transaction() as t:
            t.put("after", b"snapshot")
    with statelog.open(path, readonly=True) as ro:
        return ro.epoch


def run_cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = cli_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def files_of(store: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(store)): p.read_bytes()
        for sub in ("wal", "snapshots")
        for p in sorted((store / sub).iterdir())
    }


# -- 1. a damaged IDENTITY ---------------------------------------------------------------


def _foreign_id(raw: bytes) -> bytes:
    doc = json.loads(raw)
    doc["store_id"] = str(uuid.uuid4())
    return json.dumps(doc).encode()


IDENTITY_DAMAGE: list[tuple[str, Callable[[bytes], bytes]]] = [
    ("not JSON", lambda raw: b"garbage"),
    ("empty", lambda raw: b""),
    ("not a statelog identity", lambda raw: b'{"kind": "x", "version": 1, "store_id": "y"}'),
    ("no store id", lambda raw: b'{"kind": "statelog-store", "version": 1}'),
    ("another store's id", _foreign_id),
]
DAMAGES = [damage for _, damage in IDENTITY_DAMAGE]
DAMAGE_IDS = [name for name, _ in IDENTITY_DAMAGE]


@pytest.mark.parametrize("damage", DAMAGES, ids=DAMAGE_IDS)
def test_a_damaged_identity_stops_every_open_with_a_hint_that_helps(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    store = tmp_path / "s"
    make_store(store)
    identity = store / "IDENTITY"
    good = identity.read_bytes()
    sid = json.loads(good)["store_id"]
    identity.write_bytes(damage(good))
    before = files_of(store)
    for options in ({}, {"strict": True}, {"readonly": True}):
        with pytest.raises(CorruptionError) as info:
            statelog.open(store, **options)
        exc = info.value
        assert exc.path == identity, options
        assert "strict=True" not in exc.hint  # the caller never passed it, and it cannot help
        assert "IDENTITY holds the store's id" in exc.hint
        assert "statelog verify" in exc.hint and "statelog restore" in exc.hint
        assert sid in exc.hint  # the id every segment names: the way to rebuild IDENTITY
    assert files_of(store) == before  # nothing moved aside: the log is intact


@pytest.mark.parametrize("damage", DAMAGES, ids=DAMAGE_IDS)
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_inspect_and_verify_call_a_damaged_identity_not_recoverable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Callable[[bytes], bytes],
    command: str,
) -> None:  # fmt: skip
    store = tmp_path / "s"
    make_store(store)
    identity = store / "IDENTITY"
    identity.write_bytes(damage(identity.read_bytes()))
    code, out, _ = run_cli(capsys, command, "-q", store)
    assert code == 2, out
    assert "NOT RECOVERABLE" in out and "IDENTITY" in out
    assert "statelog restore" in out  # what to do, not only what is wrong
    code, out, _ = run_cli(capsys, command, "-q", "--json", store)
    assert code == 2
    doc = json.loads(out)
    assert "statelog restore" in doc["hint"]


@pytest.mark.parametrize("damage", DAMAGES, ids=DAMAGE_IDS)
@pytest.mark.parametrize(
    "argv",
    [["dump"], ["recover"], ["recover", "--dry-run"], ["compact"]],
    ids=lambda a: "-".join(a),
)
def test_every_command_calls_a_damaged_identity_not_recoverable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Callable[[bytes], bytes],
    argv: list[str],
) -> None:  # fmt: skip
    store = tmp_path / "s"
    make_store(store)
    identity = store / "IDENTITY"
    identity.write_bytes(damage(identity.read_bytes()))
    before = files_of(store)
    code, out, err = run_cli(capsys, argv[0], "-q", store, *argv[1:])
    assert code == 2, out + err
    assert "IDENTITY" in out + err
    assert files_of(store) == before  # refused, nothing moved aside


def test_writing_back_the_id_the_hint_names_repairs_the_store(tmp_path: Path) -> None:
    store = tmp_path / "s"
    epoch = make_store(store)
    identity = store / "IDENTITY"
    identity.write_bytes(_foreign_id(identity.read_bytes()))
    with pytest.raises(CorruptionError) as info:
        statelog.open(store)
    written = re.search(r"\{\"kind\".*?\}", info.value.hint)
    assert written is not None, info.value.hint
    identity.write_text(written.group(0) + "\n")
    with statelog.open(store) as s:
        assert s.epoch == epoch
        assert not s.recovery.rejected


# -- 2. hints in the caller's terms ------------------------------------------------------


def _python_hinted() -> list[type[StatelogError]]:
    """Every error class whose library hint names Python keyword arguments or calls."""
    return [
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, StatelogError) and PYTHON_ONLY.search(cls.hint)
    ]


def test_the_python_hinted_errors_are_the_expected_ones() -> None:
    named = {c.__name__ for c in _python_hinted()}
    assert {"CorruptionError", "StoreLockedError", "ReadOnlyStoreError"} <= named


@pytest.mark.parametrize("cls", _python_hinted(), ids=lambda c: c.__name__)
def test_no_command_hint_names_a_python_keyword_argument(cls: type[StatelogError]) -> None:
    exc = cls.__new__(cls)  # the class's hints, whatever its constructor takes
    assert not PYTHON_ONLY.search(exc.command_hint), exc.command_hint
    assert exc.command_hint != exc.hint


CLI_HINTS: list[tuple[Callable[[], StatelogError], str]] = [
    (lambda: StoreLockedError(Path("/s"), 123), "statelog recover --dry-run"),
    (lambda: StoreLockedError(Path("/s"), 123), "statelog inspect"),
    (lambda: CompactorLockedError(Path("/s"), 123), "statelog inspect"),
    (lambda: ReadOnlyStoreError("read-only"), "writer"),
    (lambda: CorruptionError(Path("/s/wal/x.wal"), 8, "crc"), "statelog recover --dry-run"),
    (lambda: ResnapshotRequired("nothing verifies"), "statelog restore"),
    (lambda: StoreNotFoundError("/s holds no statelog store"), "IDENTITY"),
    (lambda: StandbyCopyError("a copy"), "statelog promote"),
    (lambda: PromotionRefusedError("unreadable source"), "statelog promote --force"),
    (lambda: InvalidOptionError("bad"), "--help"),
    (lambda: AuditError("line 1"), "statelog audit --verify"),
    (lambda: StoreClosedError("closed"), "again"),
]


@pytest.mark.parametrize(
    ("make", "names"), CLI_HINTS, ids=[f"{m().__class__.__name__}-{n}" for m, n in CLI_HINTS]
)
def test_say_error_prints_the_command_hint(
    capsys: pytest.CaptureFixture[str], make: Callable[[], StatelogError], names: str
) -> None:
    exc = make()
    say_error(exc)
    err = capsys.readouterr().err
    assert names in err
    assert not PYTHON_ONLY.search(err), err
    assert exc.hint in str(exc)  # the library's message keeps the library's hint


WHICH_HINT: list[tuple[str, Callable[[], StatelogError], str]] = [
    # A hint given for one error replaces the class's advice for both audiences.
    ("own hint", lambda: CorruptionError(Path("/x"), 0, "bad", hint="do this"), "do this"),
    ("own both", lambda: CorruptionError(Path("/x"), 0, "bad", hint="py", cli_hint="cmd"), "cmd"),
    ("raiser's", lambda: StoreLockedError(Path("/x"), 1, hint="stop the source"), "stop the"),
    # A subclass with advice of its own does not inherit its parent's command hint.
    ("subclass", lambda: PromotionLostError("lost"), PromotionLostError.hint),
    # No command hint: the hint serves both.
    ("none", lambda: StatelogError("plain", hint="generic"), "generic"),
]


@pytest.mark.parametrize(
    ("make", "want"), [(m, w) for _, m, w in WHICH_HINT], ids=[n for n, _, _ in WHICH_HINT]
)
def test_which_hint_a_command_prints(make: Callable[[], StatelogError], want: str) -> None:
    assert make().command_hint.startswith(want)


def test_recover_on_a_locked_store_names_commands_not_keyword_arguments(tmp_path: Path) -> None:
    store = tmp_path / "s"
    make_store(store, snapshot=False)
    with statelog.open(store):
        done = subprocess.run(
            [PY, "-m", "statelog.cli", "recover", str(store)],
            capture_output=True, text=True, cwd=REPO, timeout=120,
        )  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert f"locked by process {os.getpid()}" in done.stderr
    assert "statelog recover --dry-run" in done.stderr
    assert "readonly=True" not in done.stderr


# -- 3. a second open in the same process -------------------------------------------------


def test_a_second_open_in_the_same_process_says_so(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with statelog.open(store), pytest.raises(StoreLockedError) as info:
        statelog.open(store)
    text = str(info.value)
    assert "already open in this process" in text
    assert f"process {os.getpid()}" not in text
    assert "close the other StateStore first, or use a `with` block" in text
    statelog.open(store).close()  # released with the first: a third open works


def test_another_process_holding_the_lock_is_still_named_by_pid(tmp_path: Path) -> None:
    store = tmp_path / "s"
    statelog.open(store).close()
    holder = subprocess.Popen(
        [PY, "-c", "import statelog, sys; s = statelog.open(sys.argv[1]); print(1, flush=True); "
         "sys.stdin.read()", str(store)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "1"
        with pytest.raises(StoreLockedError) as info:
            statelog.open(store)
        assert f"locked by process {holder.pid}" in str(info.value)
        assert "this process" not in str(info.value)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)


# -- 4. the audit trail's damage, named as precisely by --verify ---------------------------


@pytest.mark.parametrize("marker", [b'"kind"', b',"pid"', b'"fields"', b'"hash"'])
def test_audit_verify_is_at_least_as_precise_as_the_listing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], marker: bytes
) -> None:
    store = tmp_path / "s"
    statelog.open(store).close()  # one recovery: a trail of one entry
    log = AuditTrail(store).log_path
    assert log.read_bytes().count(b"\n") == 1
    raw = log.read_bytes()
    at = raw.index(marker)  # a byte the JSON needs: the line no longer parses
    log.write_bytes(raw[:at] + b"#" + raw[at + 1 :])
    code, _, listing = run_cli(capsys, "audit", store)
    assert code == 1
    where = re.search(r"line (\d+) is not an audit entry: (.*) \(hint: (.*)\)$", listing.strip())
    assert where is not None, listing
    line, reason, hint = where.groups()
    assert "statelog audit --verify" in hint
    code, out, err = run_cli(capsys, "audit", "--verify", store)
    assert code == 1, err
    assert "not an audit trail" not in out + err
    assert f"line {line}: not an audit entry: {reason}" in out
    problems = [p for p in out.splitlines() if not p.startswith("audit trail")]
    assert len(problems) == 1, out  # the unreadable line, not also a "truncated" trail
    doc = json.loads(run_cli(capsys, "audit", "--verify", "--json", store)[1])
    assert [(p["line"], p["kind"]) for p in doc["problems"]] == [(int(line), "unreadable")]
    assert reason in doc["problems"][0]["reason"]


def test_a_foreign_file_is_still_not_an_audit_trail_and_says_where(tmp_path: Path) -> None:
    store = tmp_path / "s"
    statelog.open(store).close()
    (store / "AUDIT.log").write_bytes(b"hello\nworld\n")
    with pytest.raises(AuditError, match=r"not an audit trail.*line 1: not an audit entry"):
        AuditTrail(store).verify()


# -- 5. why a compaction pass did nothing ------------------------------------------------


def _pass(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, "compact", "-q", "--json", *args)
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    code, human, _ = run_cli(capsys, "compact", "-q", *args)
    assert code == 0
    doc["human"] = human
    return doc


def test_below_trigger_says_how_far_below(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "s"
    make_store(store, 30, snapshot=False)
    doc = _pass(tmp_path, capsys, "--min-tail-bytes", "64MiB", str(store))
    assert doc["skipped"] == "below_trigger"
    assert re.fullmatch(r"below_trigger: [\d.]+ KiB of 64 MiB", doc["skip_reason"])
    assert f"skipped  {doc['skip_reason']}" in doc["human"]
    doc = _pass(tmp_path, capsys, "--min-tail-records", "1000", str(store))
    assert doc["skip_reason"] == "below_trigger: 30 of 1000 commits"


def test_nothing_new_counts_the_commits_waiting_in_the_active_segment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "s"
    make_store(store, 5, snapshot=False)
    compact(store)
    doc = _pass(tmp_path, capsys, str(store))
    assert doc["skip_reason"] == "nothing_new: no commit after epoch 5"
    with statelog.open(store) as s:  # a writer keeps its segment open and unsealed
        for i in range(200):
            with s.transaction() as t:
                t.put(f"w{i}", b"x" * 100)
        doc = _pass(tmp_path, capsys, str(store))
        assert doc["skipped"] == "nothing_new"
        want = re.compile(
            r"nothing_new: 200 commits \([\d.]+ KiB\) in the active segment, not sealed"
        )
        assert want.fullmatch(doc["skip_reason"]), doc["skip_reason"]
        assert f"skipped  {doc['skip_reason']}" in doc["human"]
        caplog.set_level("INFO", logger="statelog.compactor")
        caplog.clear()  # the first pass above may have been logged too (its detail differs)
        result = compact(store)
    assert result.skip_reason == doc["skip_reason"]
    line = next(r.getMessage() for r in caplog.records if "compaction_skipped" in r.getMessage())
    assert "reason=nothing_new" in line
    assert 'detail="200 commits (' in line


def test_the_daemon_once_says_why_it_wrote_nothing(tmp_path: Path) -> None:
    store = tmp_path / "s"
    make_store(store, 30, snapshot=False)
    done = subprocess.run(
        [PY, "-m", "compactor", "--once", str(store)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = re.search(r'reason=below_trigger detail="[\d.]+ KiB of 64 MiB"', done.stderr)
    assert said, done.stderr
