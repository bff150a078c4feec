"""The base level: key encoding, read-only image access, and the image builder."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import lmdb
import pytest

from statelog.errors import CorruptionError, StoreClosedError
from statelog.format.records import encode_value
from statelog.state.live import Key, LiveState
from statelog.storage.builder import ImageBuilder
from statelog.storage.image import (
    Base,
    BaseLevel,
    EmptyBase,
    decode_key,
    encode_key,
    encode_keys,
)

KEYS: list[Key] = [b"", b"\x00", b"\xff", b"a", b"ab", "", "a", "ab", "b", "\x7f", "é", "€", "𝄞"]


def overlay_order(keys: list[Key]) -> list[Key]:
    """The order LiveState.items gives: the overlay's order the base level must match."""
    state = LiveState()
    state.apply(1, {}, 0, [("t", keys, [b"v"] * len(keys), [])])
    return [k for k, _ in state.items("t")]


def build(path: Path, tables: dict[str, dict[Key, bytes]], **options: int) -> int:
    with ImageBuilder.create(path.with_suffix(".work"), **options) as builder:
        for name, kv in tables.items():
            builder.apply(name, list(kv), list(kv.values()), [])
        return builder.finish(path)


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "image.mdb"
    build(
        path,
        {
            "default": {k: encode_value(repr(k)) for k in KEYS},
            "other": {"x": encode_value(1)},
            "empty-later": {"gone": encode_value(0)},
        },
    )
    return path


def test_key_encoding_round_trips_and_keeps_str_and_bytes_apart() -> None:
    for k in KEYS:
        assert decode_key(encode_key(k)) == k
        assert type(decode_key(encode_key(k))) is type(k)
    assert encode_key("k") != encode_key(b"k")
    assert encode_key(b"k") == b"\x00k" and encode_key("k") == b"\x01k"
    with pytest.raises(ValueError):
        decode_key(b"\x02k")
    with pytest.raises(TypeError):
        encode_key(1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "keys",
    [[], ["a", "é", ""], [b"a", b"\x00", b""], ["a", b"a", "b"], list(KEYS)],
    ids=["none", "str", "bytes", "mixed", "every-test-key"],
)
def test_batch_key_encoding_equals_one_at_a_time(keys: list[Any]) -> None:
    assert encode_keys(keys) == [encode_key(k) for k in keys]


@pytest.mark.parametrize(
    "keys", [["a", 1], [1], [b"a", None]], ids=["str-int", "int", "bytes-none"]
)
def test_batch_key_encoding_refuses_other_types(keys: list[Any]) -> None:
    with pytest.raises(TypeError):
        encode_keys(keys)


def test_encoded_order_is_the_overlay_order() -> None:
    by_encoding = sorted(KEYS, key=encode_key)
    assert by_encoding == overlay_order(KEYS)
    assert by_encoding[:5] == [b"", b"\x00", b"a", b"ab", b"\xff"]
    assert by_encoding[5:] == ["", "a", "ab", "b", "\x7f", "é", "€", "𝄞"]


def test_base_level_reads_tables_keys_and_counts(image: Path) -> None:
    with BaseLevel(image) as base:
        assert base.tables() == ["default", "empty-later", "other"]
        assert base.count("default") == len(KEYS)
        assert base.count("other") == 1 and base.count("missing") == 0
        assert base.get("default", "a") == encode_value("'a'")
        assert base.get("default", b"a") == encode_value("b'a'")
        assert base.get("default", "zz") is None
        assert base.get("missing", "a") is None
        assert [k for k, _ in base.items("default")] == overlay_order(KEYS)
        assert dict(base.items("default")) == {k: encode_value(repr(k)) for k in KEYS}
        assert list(base.items("missing")) == []


def test_prefix_selects_its_own_key_kind(image: Path) -> None:
    with BaseLevel(image) as base:
        assert [k for k, _ in base.items("default", "a")] == ["a", "ab"]
        assert [k for k, _ in base.items("default", b"a")] == [b"a", b"ab"]
        assert [k for k, _ in base.items("default", b"")] == [b"", b"\x00", b"a", b"ab", b"\xff"]
        strs = [k for k in overlay_order(KEYS) if isinstance(k, str)]
        assert [k for k, _ in base.items("default", "")] == strs
        assert list(base.items("default", "q")) == []


def test_items_crosses_chunk_boundaries_in_order(tmp_path: Path) -> None:
    keys: list[Key] = [f"k{i:05d}" for i in range(2500)] + [b"b%05d" % i for i in range(2500)]
    path = tmp_path / "big.mdb"
    build(path, {"t": {k: encode_value(i) for i, k in enumerate(keys)}})
    with BaseLevel(path) as base:
        got = [k for k, _ in base.items("t")]
        assert got == overlay_order(keys)
        assert len([k for k, _ in base.items("t", "k01")]) == 1000


def test_empty_base_and_protocol(image: Path) -> None:
    empty = EmptyBase()
    bases: list[Base] = [empty, BaseLevel(image)]
    assert (empty.get("t", "k"), empty.count("t"), empty.tables()) == (None, 0, [])
    assert list(empty.items("t", "p")) == []
    for b in bases:
        b.close()
        b.close()  # idempotent


def test_closed_base_refuses_reads(image: Path) -> None:
    base = BaseLevel(image)
    it = base.items("default")
    next(it)
    base.close()
    with pytest.raises(StoreClosedError):
        base.get("default", "a")
    with pytest.raises(StoreClosedError):
        list(base.items("default"))


def test_concurrent_readers(image: Path) -> None:
    base = BaseLevel(image)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(200):
                assert base.get("default", "a") == encode_value("'a'")
                assert len(list(base.items("default"))) == len(KEYS)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    base.close()
    assert errors == []


def test_same_image_is_never_opened_twice(image: Path) -> None:
    with BaseLevel(image), pytest.raises(lmdb.Error, match="already open"):
        BaseLevel(image)


def test_not_an_image_is_corruption(tmp_path: Path) -> None:
    junk = tmp_path / "junk.mdb"
    junk.write_bytes(b"x" * 16384)
    with pytest.raises(CorruptionError, match="LMDB"):
        BaseLevel(junk)
    junk.write_bytes(b"")
    with pytest.raises(CorruptionError, match="empty"):
        BaseLevel(junk)
    with pytest.raises(FileNotFoundError):
        BaseLevel(tmp_path / "absent.mdb")


def test_builder_grows_a_tiny_map(tmp_path: Path) -> None:
    work = tmp_path / "work.mdb"
    builder = ImageBuilder.create(work, map_size=32 << 10)
    kv = {f"key{i:06d}": encode_value("v" * 100) for i in range(20_000)}
    builder.apply("t", list(kv), list(kv.values()), [])
    assert builder.map_size > 32 << 10
    builder.apply("u", [b"x"], [encode_value(1)], [])
    size = builder.finish(tmp_path / "final.mdb")
    assert size == (tmp_path / "final.mdb").stat().st_size
    assert builder.counts() == {"t": 20_000, "u": 1}
    with BaseLevel(tmp_path / "final.mdb") as base:
        assert base.count("t") == 20_000
        assert base.get("t", "key019999") == encode_value("v" * 100)


def test_builder_adds_tables_past_max_tables(tmp_path: Path) -> None:
    builder = ImageBuilder.create(tmp_path / "work.mdb", max_tables=2)
    builder.apply_batch((f"t{i}", ["k"], [encode_value(i)], []) for i in range(9))
    builder.finish(tmp_path / "final.mdb")
    assert builder.counts() == {f"t{i}": 1 for i in range(9)}
    with BaseLevel(tmp_path / "final.mdb") as base:
        assert base.tables() == [f"t{i}" for i in range(9)]
        assert base.get("t8", "k") == encode_value(8)


def test_adopt_a_copy_then_deletes_and_puts(image: Path, tmp_path: Path) -> None:
    before = image.read_bytes()
    with pytest.raises(FileNotFoundError):
        ImageBuilder.adopt(tmp_path / "absent.mdb")
    with BaseLevel(image) as base:  # the source may be mapped meanwhile
        shutil.copyfile(image, tmp_path / "work2.mdb")  # a finished image copies without a lock
        builder = ImageBuilder.adopt(tmp_path / "work2.mdb", max_tables=1)
        builder.apply("default", ["a", b"new"], [encode_value(9), encode_value(10)], [b"a", "b"])
        builder.apply("empty-later", [], [], ["gone"])
        builder.apply_batch(
            [("other", ["y"], [encode_value(1)], []), ("other", [], [], ["y", "x"])]
        )
        builder.finish(tmp_path / "next.mdb")
        assert base.get("default", "b") is not None
    assert image.read_bytes() == before
    counts = builder.counts()
    assert counts == {"default": len(KEYS) - 1 + 1 - 1, "empty-later": 0, "other": 0}
    with BaseLevel(tmp_path / "next.mdb") as nxt:
        assert nxt.get("default", "a") == encode_value(9)
        assert nxt.get("default", b"new") == encode_value(10)
        assert nxt.get("default", b"a") is None and nxt.get("default", "b") is None
        assert nxt.count("empty-later") == 0 and list(nxt.items("other")) == []


def test_later_put_of_a_repeated_key_wins(tmp_path: Path) -> None:
    builder = ImageBuilder.create(tmp_path / "w.mdb")
    builder.apply("t", ["z", "a", "z"], [b"1", b"2", b"3"], [])
    builder.apply_batch([("t", [], [], ["a"]), ("t", ["a"], [b"4"], [])])
    builder.finish(tmp_path / "f.mdb")
    with BaseLevel(tmp_path / "f.mdb") as base:
        assert dict(base.items("t")) == {"a": b"4", "z": b"3"}


def test_builder_refuses_bad_input_and_existing_paths(tmp_path: Path) -> None:
    builder = ImageBuilder.create(tmp_path / "w.mdb")
    with pytest.raises(ValueError, match="keys"):
        builder.apply("t", ["a", "b"], [b"1"], [])
    with pytest.raises(FileExistsError):
        ImageBuilder.create(tmp_path / "w.mdb")
    (tmp_path / "taken.mdb").write_bytes(b"")
    with pytest.raises(FileExistsError):
        builder.finish(tmp_path / "taken.mdb")
    builder.finish(tmp_path / "f.mdb")
    with pytest.raises(StoreClosedError):
        builder.apply("t", [], [], [])


def test_close_while_readers_run_never_unmaps_under_them(tmp_path: Path) -> None:
    path = tmp_path / "big.mdb"
    build(path, {"t": {f"k{i:05d}": encode_value(i) for i in range(5000)}})
    base = BaseLevel(path)
    outcomes: list[str] = []
    started = threading.Barrier(5)

    def read() -> None:
        started.wait()
        try:
            while True:
                assert base.count("t") == 5000
                assert len(list(base.items("t"))) == 5000
        except StoreClosedError:
            outcomes.append("closed")
        except BaseException as exc:
            outcomes.append(repr(exc))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait()
    base.close()
    for t in threads:
        t.join()
    assert outcomes == ["closed"] * 4
