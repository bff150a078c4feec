"""Records whose checksums verify but which break the record schema, as a table of rows.

Each row is one commit record a crafted or foreign file could hold: a key
that is not ``str``/``bytes`` or is over the key limit, a bad table name,
an offset or watermark out of range, a value that does not decode. Each is
encoded as raw msgpack with the commit record's array shape and appended
with the log writer's own framing, so every frame's CRC and the chain
verify; only the schema check can tell it apart from a good record.

The store: segment 1 holds epochs 1..3 (sealed), segment 2 holds epochs
4..5, the hostile record (epoch 6) and one more good record (epoch 7, the
evidence that an epoch was lost after it), then its seal. Every reader
must treat the hostile record exactly as a checksum mismatch there: stop
at epoch 5 and report epochs 6..7 lost; ``strict=True`` raises.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

import statelog
from statelog import Outcome
from statelog.cli import main as cli
from statelog.errors import CorruptionError, InvalidCommitError
from statelog.format.records import (
    CommitRecord,
    RecordSchemaError,
    TableDelta,
    check_record,
    decode_record,
    decode_record_head,
    encode_record,
    encode_value,
)
from statelog.format.wal import segment_name
from statelog.ops.verify import verify_store
from statelog.ops.verify_report import Verdict
from tests.helpers import Commit, commit_with_model, frames, model_at, segments, snapshot_of
from tests.s3server import Remote, remote, s3  # noqa: F401

Models = list[dict[str, Any]]

_enc = msgspec.msgpack.encode
GOOD = 5  # the last good epoch
HOSTILE = GOOD + 1
LAST = HOSTILE + 1  # a good record after the hostile one: evidence of the loss
DEEP = 5000


def _bin(raw: bytes) -> bytes:
    """``raw`` as a msgpack ``bin 32`` (a value is stored as the bin of its msgpack)."""
    return b"\xc6" + len(raw).to_bytes(4, "big") + raw


def raw_record(
    epoch: int,
    *,
    name: str = "default",
    key: bytes | None = None,
    value: bytes | None = None,
    delete: bytes | None = None,
    offsets: bytes | None = None,
    wm: bytes | None = None,
) -> bytes:
    """A commit record as raw msgpack: ``key``, ``value`` (the inner msgpack) and
    ``delete`` are spliced in as bytes, so they can be anything at all."""
    keys = [_enc("k")] if key is None else [key]
    values = [_bin(_enc(1) if value is None else value)]
    deletes = [] if delete is None else [delete]
    delta = (
        b"\x94"
        + _enc(name)
        + bytes([0x90 + len(keys)])
        + b"".join(keys)
        + bytes([0x90 + len(values)])
        + b"".join(values)
        + bytes([0x90 + len(deletes)])
        + b"".join(deletes)
    )
    return (
        b"\x95"
        + _enc(1)
        + _enc(epoch)
        + (_enc({"p0": epoch}) if offsets is None else offsets)
        + (_enc(epoch * 10) if wm is None else wm)
        + b"\x91"
        + delta
    )


HOSTILE_ROWS: dict[str, dict[str, Any]] = {
    # keys
    "key-list": {"key": _enc(["a"])},
    "key-map": {"key": _enc({"a": 1})},
    "key-nested-5000-deep": {"key": b"\x91" * DEEP + b"\xc0"},
    "key-int": {"key": _enc(7)},
    "key-none": {"key": _enc(None)},
    "key-nan": {"key": _enc(float("nan"))},
    "key-str-501-bytes": {"key": _enc("é" * 250 + "k")},
    "key-bytes-501": {"key": _enc(b"k" * 501)},
    "deleted-key-float": {"delete": _enc(1.5)},
    "deleted-key-600-bytes": {"delete": _enc("d" * 600)},
    # table names
    "table-empty": {"name": ""},
    "table-600-chars": {"name": "t" * 600},
    "table-513-utf8-bytes": {"name": "€" * 171},
    "table-nul": {"name": "a\x00b"},
    # offsets and the watermark
    "offset-negative": {"offsets": _enc({"p0": -1})},
    "offset-2**64-1": {"offsets": _enc({"p0": (1 << 64) - 1})},
    "watermark-negative": {"wm": _enc(-5)},
    "watermark-2**63": {"wm": _enc(1 << 63)},
    # values
    "value-not-msgpack": {"value": b"\xc1"},
    "value-trailing-bytes": {"value": b"\x01\x02"},
    "value-empty": {"value": b""},
    "value-nested-5000-deep": {"value": b"\x91" * DEEP + b"\xc0"},
    "value-bad-utf8": {"value": b"\xa2\xff\xfe"},
    "value-bad-timestamp": {"value": b"\xd5\xff\x00\x00"},
    "value-unhashable-map-key": {"value": b"\x81\x81\x01\x02\x03"},
}


def craft(path: Path, hostile: bytes, **options: Any) -> Models:
    """The store described in the module docstring; returns the models per epoch."""
    models: Models = [{"offsets": {}, "low_watermark_ms": 0, "tables": {}}]
    with statelog.open(path, **options) as st:
        for i in range(1, GOOD + 1):
            if i == 4:
                st._writer.wal.roll()  # type: ignore[union-attr]
            commit_with_model(st, models, Commit(put={f"k{i}": {"i": i}, b"b%d" % i: [i]}))
        wal = st._writer.wal  # type: ignore[union-attr]
        wal.append(hostile, sync=True)
        after = CommitRecord(
            LAST, {"p0": LAST}, LAST * 10, [TableDelta("default", ["z"], [encode_value(0)], [])]
        )
        wal.append(encode_record(after), sync=True)
    return models


def segments_named(sequence: int) -> str:
    """The file name of segment ``sequence`` of the crafted store."""
    return segment_name(sequence, {1: 1, 2: 4}[sequence])


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def hostile_offset(path: Path) -> int:
    """Byte offset of the hostile record's frame in segment 2 (the third record there)."""
    return frames(segments(path)[1])[2].offset


@pytest.fixture(params=sorted(HOSTILE_ROWS), ids=sorted(HOSTILE_ROWS))
def hostile(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Models]:
    path = tmp_path / "s"
    models = craft(path, raw_record(HOSTILE, **HOSTILE_ROWS[request.param]))
    return path, models


def assert_at_good(st: statelog.StateStore, models: Models) -> None:
    assert st.epoch == GOOD
    assert st.offsets == models[GOOD]["offsets"]
    assert st.low_watermark_ms == models[GOOD]["low_watermark_ms"]
    assert snapshot_of(st) == model_at(models, GOOD)


def test_writer_open_stops_at_last_good_commit(hostile: tuple[Path, Models]) -> None:
    path, models = hostile
    seg2 = segments(path)[1]
    at = hostile_offset(path)
    with statelog.open(path) as st:
        rep = st.recovery
        assert_at_good(st, models)
        assert rep.outcome is Outcome.CORRUPTION
        assert rep.lost_epochs == range(HOSTILE, LAST + 1)
        assert [(r.path.name, r.offset) for r in rep.rejected] == [(seg2.name, at)]
        assert "commit record" in rep.rejected[0].reason
        assert [p.name for p in rep.saved_aside] == [seg2.name + ".corrupt"]
        assert st.commit(offsets={"p0": 100}, low_watermark_ms=1000, put={"n": 1}) == HOSTILE
    with statelog.open(path) as st:  # the repair settles: the next open is clean
        assert st.recovery.outcome is Outcome.CLEAN
        assert st.epoch == HOSTILE and st.get("n") == 1


def test_readonly_open_verify_and_strict_change_no_byte(hostile: tuple[Path, Models]) -> None:
    path, models = hostile
    before = tree(path)
    with statelog.open(path, readonly=True) as ro:
        assert_at_good(ro, models)
        assert ro.recovery.outcome is Outcome.CORRUPTION
        assert ro.recovery.lost_epochs == range(HOSTILE, LAST + 1)
    report = verify_store(path)
    assert report.verdict is Verdict.RECOVERABLE
    assert [(f.path.name, f.offset) for f in report.findings] == [
        (segments(path)[1].name, hostile_offset(path))
    ]
    assert cli(["verify", str(path)]) == 1
    for kwargs in ({}, {"readonly": True}):
        with pytest.raises(CorruptionError) as info:
            statelog.open(path, strict=True, **kwargs)
        assert info.value.offset == hostile_offset(path)
    assert tree(path) == before


def test_dump_prints_the_recovered_state(
    hostile: tuple[Path, Models], capsys: pytest.CaptureFixture[str]
) -> None:
    path, models = hostile
    assert cli(["dump", str(path), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    keys = {(d["table"], json.dumps(d["key"])) for d in lines}
    want = {
        ("default", json.dumps(k if isinstance(k, str) else {"bytes": k.hex()}))
        for k in models[GOOD]["tables"]["default"]
    }
    assert keys == want


def test_compact_folds_the_clean_prefix_and_never_fails(hostile: tuple[Path, Models]) -> None:
    path, models = hostile
    for _ in range(2):  # a second pass meets the same damage: the same outcome, no failure
        assert cli(["compact", str(path), "--json"]) == 1
    snaps = sorted((path / "snapshots").glob("*.snap"))
    assert [s.name.split("-")[0] for s in snaps] == [f"{3:016x}"]
    with statelog.open(path, readonly=True) as ro:  # from the snapshot, then the log to epoch 5
        assert ro.recovery.snapshot is not None
        assert_at_good(ro, models)


# -- commit-time limits --------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["€" * 171, "t" * 256, "é" * 128], ids=["513-utf8-bytes", "256-chars", "256-utf8-bytes"]
)
def test_table_name_over_the_byte_limit_is_refused_at_commit(tmp_path: Path, name: str) -> None:
    with statelog.open(tmp_path / "s") as st:
        with pytest.raises(InvalidCommitError) as info:
            st.commit(offsets={}, low_watermark_ms=0, put={"k": 1}, table=name)
        assert "bytes" in info.value.hint
        with pytest.raises(InvalidCommitError), st.transaction() as tx:
            tx.put("k", 1, table=name)
        with pytest.raises(InvalidCommitError), st.transaction() as tx:
            tx.delete("k", table=[name])  # type: ignore[arg-type]
        assert st.epoch == 0
        # the longest name allowed commits, folds and reads back
        ok = "€" * 85  # 255 bytes
        st.commit(offsets={}, low_watermark_ms=0, put={"k": 1}, table=ok)
    assert cli(["compact", str(tmp_path / "s")]) == 0
    with statelog.open(tmp_path / "s", readonly=True) as ro:
        assert ro.recovery.snapshot is not None and ro.get("k", table=ok) == 1


class _NamedSink:
    """A sink of the protocol with a chosen name (a custom sink need not be SQL-named)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, outputs: Any, epoch: int) -> int:
        return len(outputs)

    def rows(self) -> list[Any]:
        return []

    def high_epoch(self) -> int:
        return 0

    def close(self) -> None:
        pass


@pytest.mark.parametrize("length, ok", [(246, True), (247, False), (600, False)])
def test_sink_name_keeps_its_marks_table_within_the_limits(
    tmp_path: Path, length: int, ok: bool
) -> None:
    from statelog.sinks import MAX_SINK_NAME_BYTES, SinkedStore

    assert MAX_SINK_NAME_BYTES == 246
    with statelog.open(tmp_path / "s") as st:
        sink = _NamedSink("n" * length)
        if not ok:
            with pytest.raises(InvalidCommitError):
                SinkedStore(st, sink)  # type: ignore[arg-type]
            return
        sinked = SinkedStore(st, sink)  # type: ignore[arg-type]
        assert len(sinked.marks_table.encode()) == 255


# -- reads ---------------------------------------------------------------------


@pytest.mark.parametrize("value", [b"\xc1", b"\x91" * DEEP + b"\xc0"], ids=["invalid", "deep"])
def test_undecodable_stored_value_is_a_corruption_error_on_read(
    tmp_path: Path, value: bytes
) -> None:
    """Damage past every check (here planted in the live state) reads as CorruptionError."""
    with statelog.open(tmp_path / "s") as st:
        st.commit(offsets={}, low_watermark_ms=0, put={"k": 1})
        st._state.generations[-1].tables["default"]["k"] = value
        with pytest.raises(CorruptionError) as info:
            st.get("k")
        assert "statelog verify" in info.value.hint
        with pytest.raises(CorruptionError):
            list(st.items())


# -- a hostile record in a remote segment ---------------------------------------


@pytest.mark.parametrize(
    "hostile",
    [
        {"key": b"\x91" * DEEP + b"\xc0"},
        # A restore's own recovery check does not decode values again: the check of each
        # segment it downloads must find this one.
        {"value": b"\xc1"},
        {"value": b"\x91" * DEEP + b"\xc0"},
    ],
    ids=["key-deep", "value-invalid", "value-deep"],
)
def test_hostile_record_in_a_remote_segment_restores_to_the_last_good_commit(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    hostile: dict[str, bytes],
) -> None:
    from statelog.remote import restore, ship

    src = tmp_path / "src"
    models = craft(src, raw_record(HOSTILE, **hostile))
    ship(src, remote.url, client=remote.client())
    shutil.rmtree(src)
    with pytest.raises(statelog.StatelogError):
        restore(remote.url, tmp_path / "strict", client=remote.client(), strict=True)
    assert not (tmp_path / "strict").exists()
    # As for a checksum mismatch in a remote segment: the segment is refused
    # whole and the restore stops at the end of the one before it.
    res = restore(remote.url, tmp_path / "dst", client=remote.client())
    assert res.epoch == 3
    assert res.lost_epochs == range(4, LAST + 1)
    assert [k.rsplit("/", 1)[-1] for k, _ in res.rejected] == [segments_named(2)]
    assert "commit record" in res.rejected[0][1]
    with statelog.open(tmp_path / "dst", readonly=True) as ro:
        assert ro.epoch == 3
        assert snapshot_of(ro) == model_at(models, 3)


_HEAD_ROWS = {
    name: row for name, row in HOSTILE_ROWS.items() if name.startswith(("offset", "watermark"))
}


@pytest.mark.parametrize("row", list(HOSTILE_ROWS))
def test_a_records_head_is_checked_as_the_whole_record_checks_it(row: str) -> None:
    """``decode_record_head`` (for records checked whole before) refuses every head the
    whole check refuses, and reads the same epoch, offsets and watermark otherwise; what
    breaks only the tables is left to the whole check it relies on."""
    payload = raw_record(HOSTILE, **HOSTILE_ROWS[row])
    with pytest.raises(RecordSchemaError):
        decode_record(payload)
    if row in _HEAD_ROWS:
        with pytest.raises(RecordSchemaError):
            decode_record_head(payload)
        return
    try:
        head = decode_record_head(payload)
    except RecordSchemaError:
        assert "nested" in row  # skipping 5000 levels may be refused too: never a crash
        return
    assert (head.epoch, head.offsets, head.low_watermark_ms) == (HOSTILE, {"p0": 6}, 60)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(raw_record(0), id="epoch-0"),
        pytest.param(raw_record(HOSTILE)[:-3], id="cut-in-the-tables"),
        pytest.param(raw_record(HOSTILE) + b"\xc0", id="trailing-byte"),
        pytest.param(b"\x95\x02" + raw_record(HOSTILE)[2:], id="another-tag"),
        pytest.param(_enc([1, 2, 3]), id="too-short"),
        pytest.param(b"", id="empty"),
    ],
)
def test_a_records_head_refuses_what_is_no_record(payload: bytes) -> None:
    with pytest.raises(RecordSchemaError):
        decode_record_head(payload)


def test_a_good_records_head_is_the_records() -> None:
    rec = CommitRecord(9, {"p": 3}, 40, [TableDelta("t", ["a"], [encode_value(1)], [])], 77)
    head = decode_record_head(encode_record(rec))
    assert (head.epoch, head.offsets, head.low_watermark_ms, head.commit_ms) == (
        9,
        {"p": 3},
        40,
        77,
    )


def test_limits_table_of_the_format_is_the_codes() -> None:
    from statelog.format import limits
    from statelog.sinks import MAX_SINK_NAME_BYTES
    from tests.docs_markdown import ROOT, marked_table

    rows = {r["What"]: r["Limit"] for r in marked_table(ROOT / "docs" / "format.md", "limits")}
    assert f"at most {limits.MAX_KEY_BYTES} bytes" in rows["key (`str` or `bytes`)"]
    assert f"1 to {limits.MAX_TABLE_NAME_BYTES} bytes in UTF-8" in rows["table name"]
    assert f"at most {MAX_SINK_NAME_BYTES} bytes" in rows["sink name"]


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ([b"\xc1", b"\x01", b"\x02"], "value 0"),
        ([b"\x01", b"\x02", b"\x92\x01"], "value 2"),  # truncated: its neighbour cannot finish it
        ([b"\x01", b"\x01\x02", b"\x03"], "value 1"),  # two objects in one value
    ],
)
def test_the_schema_check_names_the_value_that_does_not_decode(
    values: list[bytes], named: str
) -> None:
    """Values are checked in one batch; a failure is then named by its index."""
    keys = [f"k{i}" for i in range(len(values))]
    rec = CommitRecord(1, {}, 0, [TableDelta("t", keys, values, [])])
    why = check_record(rec)
    assert why is not None and why.startswith(f"table delta 0: {named} does not decode"), why
    assert check_record(CommitRecord(1, {}, 0, [TableDelta("t", keys, [b"\x01"] * 3, [])])) is None
