"""The live state's levels: generations over a base, merges and swaps."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import statelog
from statelog.format.records import encode_value
from statelog.state.live import MAX_GENERATIONS, MAX_HELD_GENERATIONS, Generation, LiveState
from statelog.storage.builder import ImageBuilder
from statelog.storage.image import BaseLevel

# Where merges happen: at the roll (a store whose rolls pass ``hold``), or at the reads
# after rolls (the default: a roll past the read limit merges nothing by itself).
MERGED_AT = {"roll": MAX_GENERATIONS, "read": MAX_HELD_GENERATIONS}


def _roll(state: LiveState, seg: int, merged_at: str) -> None:
    state.begin_generation(seg, hold=MERGED_AT[merged_at])
    if merged_at == "read":
        state.get("t", "nothing")


@pytest.mark.parametrize("merged_at", list(MERGED_AT))
def test_delete_survives_a_generation_merge_and_a_later_swap(
    tmp_path: Path, merged_at: str
) -> None:
    """A key deleted in a merged generation stays deleted when a snapshot lands below it."""
    state = LiveState()
    state.begin_generation(1)
    state.apply(1, {}, 0, [("t", ["k"], [encode_value("old")], [])])
    epoch, live = 1, 0
    for seg in range(2, MAX_GENERATIONS + 10):
        _roll(state, seg, merged_at)
        epoch += 1
        deletes = ["k"] if seg == 5 else []
        # Segments 5 (the delete) and 6 hold the fewest entries: the first pair merged.
        keys = [f"x{seg}"] if seg in (5, 6) else [f"x{seg}", f"y{seg}", f"z{seg}"]
        state.apply(epoch, {}, 0, [("t", keys, [encode_value(seg)] * len(keys), deletes)])
        live += len(keys)
    assert len(state.generations) <= MAX_GENERATIONS
    # The delete's marker is in a generation a merge made (spanning several epochs).
    marked = [g for g in state.generations if g.tables["t"].get("k", b"") is None]
    assert len(marked) == 1 and marked[0].first_epoch < marked[0].last_epoch
    assert state.get("t", "k") is None
    # A snapshot of epoch 1 (segment 1's end) still holds k.
    image = tmp_path / "img.mdb"
    with ImageBuilder.create(tmp_path / "work.mdb") as b:
        b.apply("t", ["k"], [encode_value("old")], [])
        b.finish(image)
    state.swap_base(BaseLevel(image), 1).close()
    assert state.get("t", "k") is None
    assert "k" not in dict(state.items("t"))
    assert state.count("t") == live


@pytest.mark.parametrize("merged_at", list(MERGED_AT))
def test_merges_join_the_small_recent_generations_not_the_large_oldest(merged_at: str) -> None:
    """Above the limit, the adjacent pair with the fewest entries is merged: the oldest
    generation, grown large while no snapshot landed, is not rewritten by every roll."""
    state = LiveState()
    state.begin_generation(1)
    big = [f"k{i}" for i in range(1000)]
    state.apply(1, {}, 0, [("t", big, [encode_value(0)] * len(big), [])])
    for seg in range(2, 3 * MAX_GENERATIONS):
        _roll(state, seg, merged_at)
        state.apply(seg, {}, 0, [("t", [f"s{seg}"], [encode_value(seg)], [])])
    oldest = state.generations[0]
    assert len(state.generations) <= MAX_GENERATIONS
    assert (oldest.first_epoch, oldest.last_epoch, len(oldest.tables["t"])) == (1, 1, 1000)
    assert state.count("t") == 1000 + 3 * MAX_GENERATIONS - 2


def test_a_merge_of_two_sealed_generations_keeps_the_newer_entries_and_the_markers() -> None:
    """The merged generation spans both epoch ranges and segments; the newer value of a key
    wins and a delete marker stays (a base may later land inside the merged range)."""
    state = LiveState()
    v = encode_value
    commits = {  # segment: [(keys put, values, keys deleted), one commit each]
        1: [(["a", "b", "x", "y"], [v(1)] * 4, [])],
        2: [(["a"], [v(2)], []), ([], [], ["b"])],
        3: [(["a"], [v(3)], []), (["c"], [v(3)], [])],
        4: [(["d"], [v(4)], [])],
    }
    epoch = 0
    for seg, rows in commits.items():
        state.begin_generation(seg, limit=3, hold=3)
        for keys, values, deletes in rows:
            epoch += 1
            state.apply(epoch, {}, 0, [("t", keys, values, deletes)])
    # Sealed entries 4, 2, 2: segments 2 and 3 are the smallest adjacent pair.
    first, merged, top = state.generations
    assert (first.first_epoch, first.last_epoch, first.segment) == (1, 1, 1)
    assert (merged.first_epoch, merged.last_epoch, merged.segment) == (2, 5, 3)
    assert merged.tables["t"] == {"a": v(3), "b": None, "c": v(3)}
    assert top.segment == 4
    assert [state.get("t", k) for k in "abcdxy"] == [v(3), None, v(3), v(4), v(1), v(1)]


def test_a_swap_hands_the_generations_it_folds_to_the_caller(tmp_path: Path) -> None:
    """The watcher frees folded entries after releasing the view lock: it must get
    exactly the generations the swap dropped, and the state must hold none of them."""
    state = LiveState()
    for seg, epoch in ((1, 1), (2, 2), (3, 3)):
        state.begin_generation(seg)
        state.apply(epoch, {}, 0, [("t", [f"k{seg}"], [encode_value(seg)], [])])
    first, second, third = state.generations
    assert state.get("t", "k1") == encode_value(1)  # a read before the swap, through all three
    image = tmp_path / "img.mdb"
    with ImageBuilder.create(tmp_path / "work.mdb") as b:
        b.apply("t", ["k1", "k2"], [encode_value(1), encode_value(2)], [])
        b.finish(image)
    dropped: list[Generation] = []
    state.swap_base(BaseLevel(image), 2, dropped).close()
    assert dropped == [first, second]
    assert state.generations == [third]
    assert [state.get("t", k) for k in ("k1", "k2", "k3")] == [encode_value(n) for n in (1, 2, 3)]
    # Nothing the state keeps for its reads still holds a folded table: freeing the
    # dropped generations frees their entries.
    for folded in (first.tables["t"], second.tables["t"]):
        assert not [r for r in gc.get_referrers(folded) if isinstance(r, list)]


def _rolled(limit: int, hold: int, segments: int) -> LiveState:
    state = LiveState()
    for seg in range(1, segments + 1):
        state.begin_generation(seg, limit, hold)
        assert len(state.generations) == min(seg, hold)  # no roll below hold merges
        state.apply(seg, {}, 0, [("t", [f"k{seg}", "same"], [encode_value(seg)] * 2, [])])
    return state


def test_rolls_merge_nothing_until_hold_and_merge_at_once_past_it() -> None:
    """A writer that does not read pays no merge below ``hold``: each generation stays
    for the next snapshot swap to drop whole; past ``hold`` the roll itself merges."""
    state = _rolled(limit=4, hold=12, segments=20)
    assert len(state.generations) == 12
    assert [state.get("t", f"k{n}") for n in range(1, 21)] == [
        encode_value(n) for n in range(1, 21)
    ]


def test_a_read_above_the_limit_merges_one_pair_before_it_walks() -> None:
    """One merge per read while the overlay holds more than ``limit`` generations: a burst
    of reads after many rolls shares the merges, and no read finds a value it should not."""
    state = _rolled(limit=4, hold=12, segments=9)
    counts = []
    for n in (1, 5, 9, 1, 9, 3):
        assert state.get("t", f"k{n}") == encode_value(n)
        counts.append(len(state.generations))
        assert state.get("t", "same") == encode_value(9)  # the newest value of a key in every one
    assert counts == [8, 6, 4, 4, 4, 4]  # one merge per read until the limit, none after
    assert state.count("t") == 10


def test_a_standby_holds_everything_sealed_in_one_generation() -> None:
    """``limit=2, hold=2`` (the standby's): every roll merges, reads or none."""
    state = _rolled(limit=2, hold=2, segments=6)
    assert len(state.generations) == 2
    assert len(state.generations[0].tables["t"]) == 6  # k1..k5 and "same"


# -- reads against a model, across generations, merges and swaps ----------------------

import tempfile  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from statelog.state.live import Key  # noqa: E402

_keys = st.one_of(st.sampled_from(["a", "ab", "abc", "b", "ba"]), st.sampled_from([b"a", b"ab"]))
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(["t", "u"]), _keys, st.integers(0, 9)),
        st.tuples(st.just("del"), st.sampled_from(["t", "u"]), _keys, st.none()),
        st.tuples(st.just("roll"), st.none(), st.none(), st.none()),
        st.tuples(st.just("swap"), st.none(), st.none(), st.integers(0, 6)),
        st.tuples(st.just("read"), st.sampled_from(["t", "u"]), _keys, st.none()),
    ),
    max_size=60,
)


def _order(keys: list[Key]) -> list[Key]:
    return sorted(keys, key=lambda k: (0, k) if isinstance(k, bytes) else (1, k))


@settings(max_examples=200, deadline=None)
@given(ops=_ops, limit=st.integers(2, 6), hold=st.integers(2, 8))
def test_items_count_and_prefix_reads_match_a_model(
    ops: list[tuple[str, str, Key, int]], limit: int, hold: int
) -> None:
    """Reads merge the newest generation, the cached sealed ones and the base like a dict,
    whichever adjacent generations a merge joined (``limit`` small: merges are frequent)
    and at whichever segment's end a new base lands (inside a merged generation too)."""
    model: dict[str, dict[Key, int]] = {"t": {}, "u": {}}
    history = [{t: dict(kv) for t, kv in model.items()}]  # the model after each epoch
    ends = [0]  # epochs at which a segment ended: where a snapshot can land
    state = LiveState()
    state.begin_generation(1, limit, hold)
    segment, epoch = 1, 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, (op, table, key, value) in enumerate(ops):
            if op in ("put", "del"):
                epoch += 1
                if op == "put":
                    state.apply(epoch, {}, 0, [(table, [key], [encode_value(value)], [])])
                    model[table][key] = value
                else:
                    state.apply(epoch, {}, 0, [(table, [], [], [key])])
                    model[table].pop(key, None)
                history.append({t: dict(kv) for t, kv in model.items()})
            elif op == "roll":
                segment += 1
                state.begin_generation(segment, limit, hold)
                ends.append(epoch)
            elif op == "swap":
                # A snapshot of the state at the end of a segment ``value`` segments back
                # (never behind the base) lands; the active segment ends here.
                ends.append(epoch)
                later = [e for e in ends if e >= state.base_epoch]
                at = later[max(0, len(later) - 1 - value)]
                image = Path(tmp) / f"img{n}.mdb"
                with ImageBuilder.create(Path(tmp) / f"work{n}.mdb") as b:
                    for t, kv in history[at].items():
                        ks = _order(list(kv))
                        b.apply(t, ks, [encode_value(kv[k]) for k in ks], [])
                    b.finish(image)
                state.swap_base(BaseLevel(image), at).close()
                segment += 1
                state.begin_generation(segment, limit, hold)
            else:
                want = [k for k in _order(list(model[table])) if type(k) is type(key)
                        and k.startswith(key)]  # type: ignore[arg-type]  # fmt: skip
                got = [k for k, _v in state.items(table, key)]
                assert got == want
            for t, kv in model.items():
                assert list(state.items(t)) == [(k, encode_value(kv[k])) for k in _order(list(kv))]
                assert [state.get(t, k) for k in kv] == [encode_value(v) for v in kv.values()]
                assert state.count(t) == len(kv)
        state.base.close()


def test_an_open_replays_a_long_tail_into_at_most_the_read_bound(tmp_path: Path) -> None:
    """No read comes between an open's rolls: its replay merges as it goes, so the first
    reads after it neither pay nor wait for a long tail's merges."""
    path = tmp_path / "s"
    with statelog.open(path, compactor="none", segment_bytes=4096) as s:
        for i in range(3 * MAX_GENERATIONS):
            s.commit(offsets={"p": i}, low_watermark_ms=0, put={f"k{i}": "v" * 3000})
        assert len(s._state.generations) > MAX_GENERATIONS  # the writer's rolls held them
    with statelog.open(path, compactor="none") as s:
        assert len(s._state.generations) <= MAX_GENERATIONS
        assert [s.get(f"k{i}") for i in (0, 3 * MAX_GENERATIONS - 1)] == ["v" * 3000] * 2
