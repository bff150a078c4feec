"""Bad input gets a clear typed error and changes nothing.

Every case asserts four things: the error is the right ``StatelogError``
subclass; it carries a non-empty ``hint`` that ``str(err)`` includes; not one
byte in the store directory changed (every file, ``LOCK`` included); and the
store goes on accepting good commits with no gap in the epochs, also after a
reopen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import statelog

REPO = Path(__file__).resolve().parent.parent
MAX_RECORD = 64 * 1024

# The state every commit case starts from (epoch 2).
OFFSETS = {"p0": 10, "p1": 20}
WATERMARK = 1_000
DEFAULT_ROWS: dict[str | bytes, Any] = {"a": 1, b"b": [2], "c": {"x": 3}}
OTHER_ROWS: dict[str | bytes, Any] = {"o": "other"}


# -- helpers ----------------------------------------------------------------------


def tree_bytes(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` by relative path: file bytes, or None for a directory."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = None if p.is_dir() else p.read_bytes()
    return out


def visible(store: statelog.StateStore) -> dict[str, Any]:
    return {
        "epoch": store.epoch,
        "offsets": store.offsets,
        "wm": store.low_watermark_ms,
        "tables": {t: list(store.items(t)) for t in store.tables()},
    }


def assert_typed(err: BaseException, kind: type[statelog.StatelogError]) -> None:
    assert isinstance(err, kind), f"{type(err).__name__}: {err}"
    assert isinstance(err, statelog.StatelogError)
    assert isinstance(err.hint, str) and err.hint.strip()
    assert err.hint in str(err)


def refused(
    root: Path, kind: type[statelog.StatelogError], action: Callable[[], object]
) -> statelog.StatelogError:
    """Run ``action``; it must raise ``kind`` and leave every byte under ``root`` as it was."""
    before = tree_bytes(root)
    with pytest.raises(BaseException) as info:  # the type is checked below
        action()
    err = info.value
    assert_typed(err, kind)
    assert tree_bytes(root) == before
    assert isinstance(err, statelog.StatelogError)
    return err


def good_commit(store: statelog.StateStore, n: int) -> int:
    return store.commit(
        offsets={"p0": store.offsets.get("p0", 0) + 1},
        low_watermark_ms=store.low_watermark_ms + 1,
        put={f"good{n}": n},
    )


def assert_still_good(store: statelog.StateStore, path: Path, before: dict[str, Any]) -> None:
    """After a refused commit: same state, the next commit is epoch + 1, and replay agrees."""
    assert visible(store) == before
    epoch = before["epoch"]
    assert good_commit(store, 1) == epoch + 1
    assert good_commit(store, 2) == epoch + 2
    expected = visible(store)
    store.close()
    with statelog.open(path, max_record_bytes=MAX_RECORD) as again:
        assert visible(again) == expected
        assert again.recovery.replayed == epoch + 2
        assert len(again.recovery.rejected) == 0
        assert len(again.recovery.lost_epochs) == 0


@pytest.fixture
def store(store_path: Path) -> Iterator[statelog.StateStore]:
    """A writer at epoch 2 with offsets, a watermark and two tables."""
    s = statelog.open(store_path, max_record_bytes=MAX_RECORD)
    try:
        s.commit(offsets=OFFSETS, low_watermark_ms=WATERMARK, put=DEFAULT_ROWS)
        s.commit(offsets={}, low_watermark_ms=WATERMARK, put=OTHER_ROWS, table="other")
        yield s
    finally:
        s.close()


# -- commit(): one case per kind of bad argument ---------------------------------------------

Cyclic = list[Any]


def _cyclic() -> Cyclic:
    loop: Cyclic = []
    loop.append(loop)
    return loop


def _deep(depth: int) -> list[Any]:
    root: list[Any] = []
    cur = root
    for _ in range(depth):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    return root


BASE: dict[str, Any] = {"offsets": {"p0": 11}, "low_watermark_ms": WATERMARK + 1}

COMMIT_CASES: list[tuple[str, dict[str, Any]]] = [
    # keys that are neither str nor bytes
    ("put-int-key", {"put": {1: "v"}}),
    ("put-tuple-key", {"put": {("a", 1): "v"}}),
    ("put-none-key", {"put": {None: "v"}}),
    ("put-float-key", {"put": {1.5: "v"}}),
    ("put-bad-key-among-good", {"put": {"fine": 1, 2: "bad", "also-fine": 3}}),
    ("delete-int-key", {"delete": [1]}),
    ("delete-tuple-key", {"delete": [("a", 1)]}),
    ("delete-none-key", {"delete": [None]}),
    ("delete-list-key", {"delete": [["a"]]}),
    # delete= that is not an iterable of keys
    ("delete-single-str", {"delete": "a"}),
    ("delete-single-bytes", {"delete": b"b"}),
    ("delete-none", {"delete": None}),
    ("delete-int", {"delete": 42}),
    # put= that is not a mapping
    ("put-none", {"put": None}),
    ("put-list-of-pairs", {"put": [("a", 1)]}),
    # values msgpack cannot encode
    ("value-object", {"put": {"k": object()}}),
    ("value-int-too-big", {"put": {"k": 2**70}}),
    ("value-int-too-small", {"put": {"k": -(2**64)}}),
    ("value-complex", {"put": {"k": 1j}}),
    ("value-nested-object", {"put": {"k": {"deep": [1, object()]}}}),
    ("value-bad-among-good", {"put": {"fine": 1, "bad": object()}}),
    ("value-lone-surrogate", {"put": {"k": "\ud800"}}),
    ("value-cyclic", {"put": {"k": _cyclic()}}),
    ("value-too-deep", {"put": {"k": _deep(100_000)}}),
    # keys msgpack cannot encode or that are too long
    ("put-key-lone-surrogate", {"put": {"\udc80": 1}}),
    ("delete-key-lone-surrogate", {"delete": ["\udc80"]}),
    ("put-str-key-501-bytes", {"put": {"x" * 501: 1}}),
    ("put-str-key-504-utf8-bytes", {"put": {"\U0001f600" * 126: 1}}),
    ("put-str-key-501-utf8-bytes", {"put": {"\u20ac" * 167: 1}}),
    ("put-bytes-key-501", {"put": {b"x" * 501: 1}}),
    ("delete-key-501-bytes", {"delete": ["x" * 501]}),
    # offsets
    ("offset-negative", {"offsets": {"p0": -1}}),
    ("offset-negative-new-partition", {"offsets": {"new": -5}}),
    ("offset-bool-true", {"offsets": {"p0": True}}),
    ("offset-bool-false-new", {"offsets": {"new": False}}),
    ("offset-float", {"offsets": {"p0": 11.0}}),
    ("offset-str", {"offsets": {"p0": "11"}}),
    ("offset-none", {"offsets": {"p0": None}}),
    ("offset-too-big", {"offsets": {"p0": 2**63}}),
    ("offset-backwards", {"offsets": {"p0": 9}}),
    ("offset-backwards-with-good", {"offsets": {"p0": 12, "p1": 19}}),
    ("partition-not-str", {"offsets": {0: 11}}),
    ("partition-lone-surrogate", {"offsets": {"\ud800": 1}}),
    ("offsets-list", {"offsets": [("p0", 11)]}),
    ("offsets-list", {"offsets": [("p0", 11)]}),
    # watermark
    ("watermark-backwards", {"low_watermark_ms": WATERMARK - 1}),
    ("watermark-negative", {"low_watermark_ms": -1}),
    ("watermark-float", {"low_watermark_ms": float(WATERMARK + 1)}),
    ("watermark-str", {"low_watermark_ms": "5"}),
    ("watermark-bool", {"low_watermark_ms": True}),
    ("watermark-str", {"low_watermark_ms": "1001"}),
    ("watermark-too-big", {"low_watermark_ms": 2**63}),
    # table names
    ("table-empty", {"table": "", "put": {"k": 1}}),
    ("table-int", {"table": 1, "put": {"k": 1}}),
    ("table-none", {"table": None, "put": {"k": 1}}),
    ("table-bytes", {"table": b"default", "put": {"k": 1}}),
    ("table-nul", {"table": "a\x00b", "put": {"k": 1}}),
    ("table-too-long", {"table": "t" * 256, "put": {"k": 1}}),
    ("table-lone-surrogate", {"table": "\ud800", "put": {"k": 1}}),
    # a key both put and deleted
    ("put-and-delete-str", {"put": {"a": 1}, "delete": ["a"]}),
    ("put-and-delete-bytes", {"put": {b"b": 1}, "delete": [b"b"]}),
    # records over max_record_bytes
    ("record-one-big-value", {"put": {"big": b"x" * (MAX_RECORD + 1)}}),
    ("record-many-values", {"put": {f"k{i:05d}": "v" * 100 for i in range(1000)}}),
]


@pytest.mark.parametrize(("case", "kwargs"), COMMIT_CASES, ids=[c for c, _ in COMMIT_CASES])
def test_bad_commit_is_refused_and_changes_nothing(
    store: statelog.StateStore, store_path: Path, case: str, kwargs: dict[str, Any]
) -> None:
    before = visible(store)
    call = {**BASE, **kwargs}
    err = refused(store_path, statelog.InvalidCommitError, lambda: store.commit(**call))
    assert err.message.strip()
    assert_still_good(store, store_path, before)


def test_record_limit_counts_the_whole_record(store_path: Path) -> None:
    """A commit just under the limit is accepted; the same commit grown past it is refused."""
    with statelog.open(store_path, max_record_bytes=4096) as s:
        assert s.commit(offsets={}, low_watermark_ms=0, put={"k": b"x" * 3000}) == 1
        refused(
            store_path,
            statelog.InvalidCommitError,
            lambda: s.commit(offsets={}, low_watermark_ms=0, put={"k": b"x" * 4096}),
        )
        assert s.commit(offsets={}, low_watermark_ms=0, put={"k2": 1}) == 2


def test_unknown_commit_argument_is_refused(store: statelog.StateStore, store_path: Path) -> None:
    before = visible(store)
    call: dict[str, Any] = {**BASE, "watermark": 5}
    with pytest.raises(TypeError):
        store.commit(**call)
    assert visible(store) == before


# -- transactions ---------------------------------------------------------------------------

TX_CASES: list[tuple[str, Callable[[statelog.Transaction], None]]] = [
    ("put-int-key", lambda tx: tx.put(1, "v")),  # type: ignore[arg-type]
    ("put-none-key", lambda tx: tx.put(None, "v")),  # type: ignore[arg-type]
    ("put-tuple-key", lambda tx: tx.put(("a",), "v")),  # type: ignore[arg-type]
    ("put-list-key", lambda tx: tx.put(["a"], "v")),  # type: ignore[arg-type]
    ("put-bytearray-key", lambda tx: tx.put(bytearray(b"a"), "v")),  # type: ignore[arg-type]
    ("put-surrogate-key", lambda tx: tx.put("\udc80", "v")),
    ("put-long-key", lambda tx: tx.put("x" * 501, "v")),
    ("delete-int-key", lambda tx: tx.delete(1)),  # type: ignore[arg-type]
    ("delete-list-key", lambda tx: tx.delete(["a"])),  # type: ignore[arg-type]
    ("put-object-value", lambda tx: tx.put("k", object())),
    ("put-big-int-value", lambda tx: tx.put("k", 2**70)),
    ("put-cyclic-value", lambda tx: tx.put("k", _cyclic())),
    ("put-empty-table", lambda tx: tx.put("k", 1, table="")),
    ("put-int-table", lambda tx: tx.put("k", 1, table=7)),  # type: ignore[arg-type]
    ("delete-empty-table", lambda tx: tx.delete("k", table="")),
    ("offset-backwards", lambda tx: tx.set_offset("p0", 9)),
    ("offset-negative", lambda tx: tx.set_offset("new", -1)),
    ("offset-bool", lambda tx: tx.set_offset("p0", True)),
    ("offset-float", lambda tx: tx.set_offset("p0", 11.5)),  # type: ignore[arg-type]
    ("partition-not-str", lambda tx: tx.set_offset(3, 11)),  # type: ignore[arg-type]
    ("watermark-backwards", lambda tx: setattr(tx, "low_watermark_ms", WATERMARK - 1)),
    ("watermark-negative", lambda tx: setattr(tx, "low_watermark_ms", -1)),
    ("watermark-float", lambda tx: setattr(tx, "low_watermark_ms", 1e9)),
    ("record-too-big", lambda tx: tx.put("big", b"x" * (MAX_RECORD + 1), table="t2")),
]


@pytest.mark.parametrize(("case", "stage"), TX_CASES, ids=[c for c, _ in TX_CASES])
def test_bad_transaction_is_refused_and_changes_nothing(
    store: statelog.StateStore,
    store_path: Path,
    case: str,
    stage: Callable[[statelog.Transaction], None],
) -> None:
    """Good changes staged around the bad one are dropped with it: the block commits nothing."""
    before = visible(store)

    def run() -> None:
        with store.transaction() as tx:
            tx.put("staged", 1)
            tx.put("staged", 2, table="t2")
            tx.delete("a")
            tx.set_offset("p1", 21)
            stage(tx)
            tx.put("after", 3)

    refused(store_path, statelog.InvalidCommitError, run)
    assert_still_good(store, store_path, before)


# -- closed and read-only stores -------------------------------------------------------------


def test_commit_after_close(store: statelog.StateStore, store_path: Path) -> None:
    store.close()
    before = visible(store)
    refused(
        store_path,
        statelog.StoreClosedError,
        lambda: store.commit(offsets={"p0": 11}, low_watermark_ms=WATERMARK, put={"x": 1}),
    )
    refused(store_path, statelog.StoreClosedError, store.transaction)
    assert visible(store) == before
    with statelog.open(store_path) as again:
        assert again.epoch == 2
        assert again.get("x") is None


def test_transaction_open_when_the_store_closes(
    store: statelog.StateStore, store_path: Path
) -> None:
    tx = store.transaction()
    tx.put("x", 1)
    store.close()

    def finish() -> None:
        with tx:
            pass

    refused(store_path, statelog.StoreClosedError, finish)
    with statelog.open(store_path) as again:
        assert again.epoch == 2
        assert again.get("x") is None


def test_commit_on_a_readonly_store(store: statelog.StateStore, store_path: Path) -> None:
    with statelog.open(store_path, readonly=True) as ro:
        before = visible(ro)
        refused(
            store_path,
            statelog.ReadOnlyStoreError,
            lambda: ro.commit(offsets={"p0": 11}, low_watermark_ms=WATERMARK, put={"x": 1}),
        )
        assert isinstance(
            refused(store_path, statelog.ReadOnlyStoreError, ro.transaction),
            statelog.InvalidCommitError,
        )
        assert visible(ro) == before
    # The writer never noticed.
    assert good_commit(store, 1) == 3


# -- statelog.open(): options and paths --------------------------------------------------------

OPTION_CASES: list[tuple[str, dict[str, Any]]] = [
    ("unknown-option", {"no_such_option": 1}),
    ("misspelt-option", {"durabilty": "commit"}),
    ("durability-unknown", {"durability": "fast"}),
    ("durability-case", {"durability": "COMMIT"}),
    ("durability-none-object", {"durability": None}),
    ("durability-bool", {"durability": True}),
    ("segment-bytes-zero", {"segment_bytes": 0}),
    ("segment-bytes-negative", {"segment_bytes": -4096}),
    ("segment-bytes-too-small", {"segment_bytes": 4095}),
    ("segment-bytes-too-big", {"segment_bytes": 2**32}),
    ("segment-bytes-bool", {"segment_bytes": True}),
    ("segment-bytes-str", {"segment_bytes": "65536"}),
    ("segment-bytes-float", {"segment_bytes": 65536.0}),
    ("fragment-over-segment", {"segment_bytes": 8192, "fragment_bytes": 16384}),
    ("max-record-zero", {"max_record_bytes": 0}),
    ("max-record-negative", {"max_record_bytes": -1}),
    ("group-delay-zero", {"durability": "group", "group_delay": timedelta(0)}),
    ("group-delay-negative", {"durability": "group", "group_delay": timedelta(seconds=-1)}),
    ("group-delay-nan", {"durability": "group", "group_delay": float("nan")}),
    ("group-delay-too-long", {"durability": "group", "group_delay": timedelta(minutes=5)}),
]


@pytest.mark.parametrize(("case", "options"), OPTION_CASES, ids=[c for c, _ in OPTION_CASES])
def test_bad_option_on_a_new_path_creates_nothing(
    tmp_path: Path, case: str, options: dict[str, Any]
) -> None:
    target = tmp_path / "new-store"
    refused(tmp_path, statelog.InvalidOptionError, lambda: statelog.open(target, **options))
    assert not target.exists()


@pytest.mark.parametrize(("case", "options"), OPTION_CASES, ids=[c for c, _ in OPTION_CASES])
def test_bad_option_on_an_existing_store_changes_nothing(
    store_path: Path, case: str, options: dict[str, Any]
) -> None:
    with statelog.open(store_path) as s:
        s.commit(offsets={"p": 1}, low_watermark_ms=1, put={"k": 1})
    refused(store_path, statelog.InvalidOptionError, lambda: statelog.open(store_path, **options))
    refused(
        store_path,
        statelog.InvalidOptionError,
        lambda: statelog.open(store_path, readonly=True, **options),
    )
    with statelog.open(store_path) as s:
        assert s.epoch == 1
        assert s.commit(offsets={"p": 2}, low_watermark_ms=2) == 2


def test_statestore_open_alias_refuses_unknown_options(tmp_path: Path) -> None:
    opener = getattr(statelog.StateStore, "open")  # noqa: B009 (assigned after the class)
    target = tmp_path / "s"
    refused(tmp_path, statelog.InvalidOptionError, lambda: opener(target, bogus=True))
    assert not target.exists()


@pytest.mark.parametrize("readonly", [False, True], ids=["writer", "readonly"])
def test_open_a_path_that_is_a_file(tmp_path: Path, readonly: bool) -> None:
    target = tmp_path / "not-a-dir"
    target.write_bytes(b"precious data\n")
    refused(tmp_path, statelog.NotAStoreError, lambda: statelog.open(target, readonly=readonly))
    assert target.read_bytes() == b"precious data\n"


def test_open_a_non_empty_directory_that_is_not_a_store(tmp_path: Path) -> None:
    target = tmp_path / "project"
    target.mkdir()
    (target / "notes.txt").write_text("keep me\n")
    (target / "sub").mkdir()
    (target / "sub" / "data.bin").write_bytes(b"\x00\x01")
    refused(tmp_path, statelog.NotAStoreError, lambda: statelog.open(target))
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt", "sub"]
    # A reader finds no store there either, and creates nothing.
    refused(tmp_path, statelog.StoreNotFoundError, lambda: statelog.open(target, readonly=True))


def test_open_a_directory_holding_a_stray_wal_name(tmp_path: Path) -> None:
    """A foreign file next to a name statelog uses is still foreign."""
    target = tmp_path / "mixed"
    target.mkdir()
    (target / "wal").mkdir()
    (target / "README").write_text("not a store\n")
    refused(tmp_path, statelog.NotAStoreError, lambda: statelog.open(target))


# -- one writer ---------------------------------------------------------------------------------

HOLDER = """
    import os, sys
    import statelog
    store = statelog.open(sys.argv[1])
    store.commit(offsets={"p": 1}, low_watermark_ms=1, put={"held": os.getpid()})
    print(os.getpid(), flush=True)
    sys.stdin.readline()
    store.close()
"""

SECOND_WRITER = """
    import json, sys
    import statelog
    try:
        statelog.open(sys.argv[1])
    except statelog.StoreLockedError as exc:
        print(json.dumps({"type": type(exc).__name__, "pid": exc.pid, "hint": exc.hint,
                          "text": str(exc), "base": isinstance(exc, statelog.StatelogError)}))
    else:
        print(json.dumps({"type": None}))
"""


def run_second_writer(path: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SECOND_WRITER), str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_second_writer_in_another_process_names_the_holder(store_path: Path) -> None:
    with statelog.open(store_path) as holder:
        holder.commit(offsets={"p": 1}, low_watermark_ms=1, put={"k": 1})
        before = tree_bytes(store_path)
        out = run_second_writer(store_path)
        assert out["type"] == "StoreLockedError"
        assert out["base"] is True
        assert out["pid"] == os.getpid()
        assert str(os.getpid()) in out["text"]
        assert out["hint"] and out["hint"] in out["text"]
        assert tree_bytes(store_path) == before
        assert holder.commit(offsets={"p": 2}, low_watermark_ms=2) == 2


def test_writer_in_this_process_is_refused_by_another_holder(store_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(store_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line.strip(), proc.stderr.read() if proc.stderr else ""
        holder_pid = int(line)
        assert holder_pid == proc.pid
        err = refused(store_path, statelog.StoreLockedError, lambda: statelog.open(store_path))
        assert isinstance(err, statelog.StoreLockedError)
        assert err.pid == holder_pid
        assert str(holder_pid) in str(err)
        # Reading is still allowed, without the lock.
        with statelog.open(store_path, readonly=True) as ro:
            assert ro.get("held") == holder_pid
        proc.stdin.write("done\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Once the holder is gone the lock is free.
    with statelog.open(store_path) as s:
        assert s.epoch == 1


def test_second_writer_in_the_same_process(store_path: Path) -> None:
    with statelog.open(store_path) as first:
        first.commit(offsets={"p": 1}, low_watermark_ms=1, put={"k": 1})
        err = refused(store_path, statelog.StoreLockedError, lambda: statelog.open(store_path))
        assert isinstance(err, statelog.StoreLockedError)
        assert err.pid == os.getpid()
        assert "already open in this process" in str(err)
        # Other option sets are no way around the lock.
        refused(
            store_path,
            statelog.StoreLockedError,
            lambda: statelog.open(store_path, durability="none", strict=True),
        )
        # The refused open did not release the holder's lock as a side effect.
        out = run_second_writer(store_path)
        assert out["type"] == "StoreLockedError" and out["pid"] == os.getpid()
        assert first.commit(offsets={"p": 2}, low_watermark_ms=2) == 2
    with statelog.open(store_path) as again:
        assert again.epoch == 2


# -- after failures, the store goes on ------------------------------------------------------


def test_many_refusals_leave_no_gap(store_path: Path) -> None:
    """Refused and good commits interleaved: epochs stay dense and replay agrees with a model."""
    names = {
        "put-int-key",
        "delete-single-str",
        "value-object",
        "value-int-too-big",
        "put-str-key-501-bytes",
        "offset-negative",
        "watermark-negative",
        "table-empty",
        "put-and-delete-str",
        "record-one-big-value",
    }
    bad: list[dict[str, Any]] = [kw for name, kw in COMMIT_CASES if name in names]
    assert len(bad) == len(names)
    model: dict[str | bytes, Any] = {}
    offset = 0
    with statelog.open(store_path, max_record_bytes=MAX_RECORD) as s:
        for i, kwargs in enumerate(bad, start=1):
            call = {"offsets": {"p0": offset}, "low_watermark_ms": i - 1, **kwargs}
            with pytest.raises(statelog.InvalidCommitError):
                s.commit(**call)
            offset += 1
            key = f"k{i}"
            assert s.commit(offsets={"p0": offset}, low_watermark_ms=i, put={key: i}) == i
            model[key] = i
        epoch = s.epoch
        assert epoch == len(bad)
    with statelog.open(store_path) as s:
        assert s.epoch == epoch
        assert s.recovery.replayed == epoch
        assert dict(s.items()) == model
        assert s.offsets == {"p0": offset}
