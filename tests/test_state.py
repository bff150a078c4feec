"""The live state's levels: generations over a base, merges and swaps."""

from __future__ import annotations

from pathlib import Path

from statelog.base import BaseLevel, ImageBuilder
from statelog.records import encode_value
from statelog.state import MAX_GENERATIONS, LiveState


def test_delete_survives_a_generation_merge_and_a_later_swap(tmp_path: Path) -> None:
    """A key deleted in a merged generation stays deleted when a snapshot lands below it."""
    state = LiveState()
    state.begin_generation(1)
    state.apply(1, {}, 0, [("t", ["k"], [encode_value("old")], [])])
    epoch = 1
    for seg in range(2, MAX_GENERATIONS + 10):
        state.begin_generation(seg)
        epoch += 1
        deletes = ["k"] if seg == 5 else []
        state.apply(epoch, {}, 0, [("t", [f"x{seg}"], [encode_value(seg)], deletes)])
    assert len(state.generations) <= MAX_GENERATIONS
    assert state.get("t", "k") is None
    # A snapshot of epoch 1 (segment 1's end) still holds k.
    image = tmp_path / "img.mdb"
    with ImageBuilder.create(tmp_path / "work.mdb") as b:
        b.apply("t", ["k"], [encode_value("old")], [])
        b.finish(image)
    state.swap_base(BaseLevel(image), 1).close()
    assert state.get("t", "k") is None
    assert "k" not in dict(state.items("t"))
    assert state.count("t") == len(range(2, MAX_GENERATIONS + 10))
