"""The streaming full merge against a model: a stack of levels and a tail's changes,
merged in key order into a fresh image, equals applying them one after another.

Each case builds a full image, delta images (puts and tombstones) and a tail
of changes, merges them with :func:`statelog.compaction.merge.merge_levels`,
and compares the result, and its counts, with a dict model. The table of
cases names the edges a chunked merge can get wrong: keys before the full
image's first key or past its last, a tombstone over an older level's key
(a key must not come back), a key put again after a delete, tables only in
a delta or only in the tail, a table emptied, an empty full image, chunk
boundaries (more keys than one read chunk holds). And the tail's changes as a
pass folds them equal a model that applies each record in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statelog.compaction.merge
from statelog.compaction.delta import Changes
from statelog.compaction.merge import merge_levels
from statelog.storage.image import BaseLevel
from statelog.storage.layered import open_levels
from statelog.storage.snapshot_body import TOMBSTONE, StreamBuild, StreamTee, stream_image

Level = dict[str, dict[bytes, bytes | None]]  # table -> key -> value, None: tombstone


def _image(path: Path, level: Level) -> Path:
    build = StreamBuild(path, tables=max(1, len(level)), size_hint=0)
    try:
        for table in sorted(level, key=str.encode):
            pairs = sorted((k, TOMBSTONE if v is None else v) for k, v in level[table].items())
            if pairs:
                build.append_sorted(table, pairs)
    finally:
        build.close()
    return path


def _model(levels: list[Level], tail: Level) -> dict[str, dict[bytes, bytes]]:
    state: dict[str, dict[bytes, bytes]] = {}
    for level in [*levels, tail]:
        for table, entries in level.items():
            t = state.setdefault(table, {})
            for k, v in entries.items():
                if v is None:
                    t.pop(k, None)
                else:
                    t[k] = v
    return {t: e for t, e in state.items() if e}


def _merged(tmp: Path, full: Level, deltas: list[Level], tail: Level) -> dict[str, Any]:
    paths = [_image(tmp / "full.mdb", full)]
    paths += [_image(tmp / f"delta{i}.mdb", d) for i, d in enumerate(deltas)]
    counts = {t: len(e) for t, e in _model([full, *deltas], {}).items()}
    changes = Changes()
    changes.tables.update({t: dict(e) for t, e in tail.items()})  # already encoded keys
    base = open_levels(paths, counts)
    teed: list[bytes] = []
    try:
        got_counts = merge_levels(base, changes, tmp / "merged.mdb")
        # The body a merge pass writes, streamed while it builds its image: the bytes
        # streaming the finished image would give, and the same counts.
        tee = StreamTee(teed.append)
        merge_levels(base, changes, tmp / "teed.mdb", tee)
        tee_size, tee_counts = tee.finish()
    finally:
        base.close()
    read_back: list[bytes] = []
    size, counts_back = stream_image(tmp / "teed.mdb", read_back.append)
    assert b"".join(teed) == b"".join(read_back)
    assert (tee_size, tee_counts) == (size, counts_back) and tee_counts == got_counts
    with BaseLevel(tmp / "merged.mdb") as out:
        got = {t: dict(kv for c in out.raw_chunks(t) for kv in c) for t in out.tables()}
    return {"state": {t: e for t, e in got.items() if e}, "counts": got_counts}


def _keys(n: int, step: int = 1, start: int = 0) -> list[bytes]:
    return [b"\x01k%06d" % i for i in range(start, start + n * step, step)]


V1, V2, V3 = b"\xa1a", b"\xa1b", b"\xa1c"
BIG = b"\xc6" + (1 << 20).to_bytes(4, "big") + bytes(1 << 20)  # a 1 MiB bin value
MANY = 5000  # more keys than one read chunk of an image

CASES: list[tuple[str, Level, list[Level], Level]] = [
    ("tail only, empty full image", {}, [], {"t": {k: V1 for k in _keys(3)}}),
    (
        "keys before the first and past the last",
        {"t": {b"\x01m": V1}},
        [],
        {"t": {b"\x01a": V2, b"\x01z": V3}},
    ),
    (
        "tombstone hides the full image's key",
        {"t": {b"\x01a": V1, b"\x01b": V1}},
        [{"t": {b"\x01a": None}}],
        {},
    ),
    (
        "tail delete hides a delta's put",
        {"t": {b"\x01a": V1}},
        [{"t": {b"\x01b": V2}}],
        {"t": {b"\x01b": None}},
    ),
    (
        "put again after a delete",
        {"t": {b"\x01a": V1}},
        [{"t": {b"\x01a": None}}],
        {"t": {b"\x01a": V3}},
    ),
    (
        "newest level wins",
        {"t": {b"\x01a": V1}},
        [{"t": {b"\x01a": V2}}, {"t": {b"\x01a": V3}}],
        {},
    ),
    ("table only in a delta", {"t": {b"\x01a": V1}}, [{"u": {b"\x01x": V2}}], {}),
    ("table emptied", {"t": {b"\x01a": V1}, "u": {b"\x01b": V1}}, [{"u": {b"\x01b": None}}], {}),
    ("delete of a key no level holds", {"t": {b"\x01a": V1}}, [], {"t": {b"\x01q": None}}),
    (
        "chunk boundaries",
        {"t": {k: V1 for k in _keys(MANY, 2)}},
        [{"t": {k: None for k in _keys(MANY // 3, 3)}}],
        {"t": {k: V2 for k in _keys(MANY, 1, MANY)} | {_keys(1)[0]: V3}},
    ),
    (
        "stream chunks cut by count and by bytes, across tables",
        {"a": {k: V1 for k in _keys(3 * MANY)}, "b": {k: BIG for k in _keys(40)}},
        [{"a": {k: None for k in _keys(MANY, 7)}}],
        {"b": {k: BIG for k in _keys(30, 1, 40)}, "c": {k: V2 for k in _keys(MANY + 3)}},
    ),
]


@pytest.mark.parametrize(
    ("full", "deltas", "tail"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_merge_equals_the_model(
    tmp_path: Path, full: Level, deltas: list[Level], tail: Level
) -> None:
    got = _merged(tmp_path, full, deltas, tail)
    want = _model([full, *deltas], tail)
    assert got["state"] == want
    assert got["counts"] == {t: len(e) for t, e in want.items()}


def test_a_stream_teed_in_small_batches_is_the_stream_of_the_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appended in batches that cut across the stream's chunks (each batch leaves a
    remainder the next one continues), the teed stream is still the image's."""
    monkeypatch.setattr(statelog.compaction.merge, "_BATCH", 3001)
    _name, full, deltas, tail = CASES[-1]
    got = _merged(tmp_path, full, deltas, tail)
    assert got["state"] == _model([full, *deltas], tail)


_key = st.integers(0, 60).map(lambda i: b"\x01%03d" % i)
_value = st.sampled_from([V1, V2, V3])
_table = st.sampled_from(["a", "b"])
_puts = st.dictionaries(_table, st.dictionaries(_key, _value, max_size=40), max_size=2)
_level = st.dictionaries(_table, st.dictionaries(_key, st.none() | _value, max_size=40), max_size=2)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(full=_puts, deltas=st.lists(_level, max_size=3), tail=_level)
def test_merge_equals_the_model_for_any_stack(
    tmp_path_factory: pytest.TempPathFactory, full: Level, deltas: list[Level], tail: Level
) -> None:
    tmp = tmp_path_factory.mktemp("stack")
    got = _merged(tmp, dict(full), deltas, tail)
    want = _model([full, *deltas], tail)
    assert got["state"] == want
    assert got["counts"] == {t: len(e) for t, e in want.items()}


# -- the tail's changes as a pass folds them --------------------------------------------

_raw_key = st.sampled_from(["a", "b", "é", b"a", b"b", b"\x00"])
_record = st.tuples(
    _table, st.lists(st.tuples(_raw_key, _value), max_size=6), st.lists(_raw_key, max_size=3)
)


@settings(max_examples=200, deadline=None)
@given(
    level=st.dictionaries(_table, st.dictionaries(_key, st.none() | _value, max_size=5)),
    records=st.lists(st.lists(_record, max_size=3), max_size=6),
)
def test_folded_changes_equal_applying_each_record_in_order(
    level: Level, records: list[list[tuple[str, list[tuple[Any, bytes]], list[Any]]]]
) -> None:
    """A str and a bytes key of the same characters stay two keys; a delete then a put
    of one key is the put; the tail overrides the delta level loaded before it."""
    from statelog.storage.image import encode_key

    want: dict[str, dict[bytes, bytes | None]] = {t: dict(e) for t, e in level.items()}
    changes = Changes()
    for table, entries in level.items():
        changes.load_level(table, [(k, TOMBSTONE if v is None else v) for k, v in entries.items()])
    for batch in records:
        deltas = []
        for table, puts, deletes in batch:
            put = dict(puts)  # one value per key within a commit, as the writer makes them
            gone = [k for k in deletes if k not in put]
            deltas.append((table, list(put), list(put.values()), gone))
            t = want.setdefault(table, {})
            t.update(dict.fromkeys(map(encode_key, gone)))
            t.update((encode_key(k), v) for k, v in put.items())
        changes.apply_batch(deltas)
    assert changes.tables == want
