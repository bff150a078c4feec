"""StoreOptions: every option of a store in one frozen object, checked when it is built.

Each bad value is refused by the constructor with an ``InvalidOptionError``
naming the option and a hint of its own (not the class's generic one); an
unknown name is refused with the closest option suggested; ``options=`` and
keyword options open the same store; and the defaults are the documented ones.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog import InvalidOptionError, StoreOptions
from statelog.log.reader import scan_segment
from statelog.storage.fileio import FileLayer
from tests.helpers import segments

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20

DOCUMENTED_DEFAULTS: dict[str, Any] = {
    "durability": "commit",
    "tables": (),
    "group_delay": timedelta(milliseconds=2),
    "segment_bytes": 64 * MiB,
    "fragment_bytes": None,  # 16 MiB, or segment_bytes if smaller: see fragment_size
    "max_record_bytes": 64 * MiB,
    "readonly": False,
    "at": None,
    "strict": False,
    "base_refresh": timedelta(seconds=1),
    "compactor": "none",
    "compactor_interval": timedelta(seconds=30),
    "min_tail_bytes": 64 * MiB,
    "retain": 3,
    "max_chain": 8,
    "full_ratio": 0.5,
    "max_overlay_bytes": None,
    "overlay_wait": timedelta(seconds=60),
    "remote": None,
    "remote_check": timedelta(seconds=5),
    "max_ship_lag": None,
    "follow": None,
    "follow_poll": timedelta(milliseconds=500),
    "file_layer": None,
}

URL = "s3://bucket/prefix"

# (case, options, the option the message must name)
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("durability-unknown", {"durability": "fast"}, "durability"),
    ("durability-case", {"durability": "COMMIT"}, "durability"),
    ("durability-none", {"durability": None}, "durability"),
    ("group-delay-zero", {"group_delay": timedelta(0)}, "group_delay"),
    ("group-delay-inf", {"group_delay": float("inf")}, "group_delay"),
    ("group-delay-too-long", {"group_delay": timedelta(seconds=11)}, "group_delay"),
    ("segment-too-small", {"segment_bytes": 4095}, "segment_bytes"),
    ("segment-too-big", {"segment_bytes": 2**32}, "segment_bytes"),
    ("segment-bool", {"segment_bytes": True}, "segment_bytes"),
    ("segment-str", {"segment_bytes": "65536"}, "segment_bytes"),
    ("fragment-too-small", {"fragment_bytes": 63}, "fragment_bytes"),
    ("fragment-float", {"fragment_bytes": 4096.0}, "fragment_bytes"),
    ("fragment-over-segment", {"segment_bytes": 8192, "fragment_bytes": 16384}, "fragment_bytes"),
    ("max-record-zero", {"max_record_bytes": 0}, "max_record_bytes"),
    ("readonly-int", {"readonly": 1}, "readonly"),
    ("readonly-str", {"readonly": "yes"}, "readonly"),
    ("strict-none", {"strict": None}, "strict"),
    ("base-refresh-zero", {"base_refresh": timedelta(0)}, "base_refresh"),
    ("base-refresh-str", {"base_refresh": "1s"}, "base_refresh"),
    ("compactor-unknown", {"compactor": "daemon"}, "compactor"),
    ("compactor-interval-negative", {"compactor_interval": timedelta(-1)}, "compactor_interval"),
    ("min-tail-negative", {"min_tail_bytes": -1}, "min_tail_bytes"),
    ("retain-zero", {"retain": 0}, "retain"),
    ("max-chain-negative", {"max_chain": -1}, "max_chain"),
    ("max-chain-over-64", {"max_chain": 65}, "max_chain"),
    ("max-chain-bool", {"max_chain": True}, "max_chain"),
    ("max-chain-float", {"max_chain": 8.0}, "max_chain"),
    ("full-ratio-zero", {"full_ratio": 0}, "full_ratio"),
    ("full-ratio-over-10", {"full_ratio": 10.5}, "full_ratio"),
    ("full-ratio-nan", {"full_ratio": float("nan")}, "full_ratio"),
    ("max-overlay-under-two-segments", {"max_overlay_bytes": 128 * MiB - 1}, "max_overlay_bytes"),
    ("max-overlay-float", {"max_overlay_bytes": float(1 << 30)}, "max_overlay_bytes"),
    ("max-overlay-bool", {"max_overlay_bytes": True}, "max_overlay_bytes"),
    ("overlay-wait-zero", {"overlay_wait": timedelta(0)}, "overlay_wait"),
    ("overlay-wait-negative", {"overlay_wait": -5.0}, "overlay_wait"),
    ("full-ratio-str", {"full_ratio": "0.5"}, "full_ratio"),
    ("ship-lag-zero", {"max_ship_lag": timedelta(0)}, "max_ship_lag"),
    ("ship-lag-nan", {"max_ship_lag": float("nan")}, "max_ship_lag"),
    ("remote-check-zero", {"remote_check": timedelta(0)}, "remote_check"),
    ("remote-not-str", {"remote": 7}, "remote"),
    ("remote-readonly", {"remote": URL, "readonly": True}, "readonly"),
    ("remote-thread-compactor", {"remote": URL, "compactor": "thread"}, "compactor"),
    ("file-layer-not-a-layer", {"file_layer": object()}, "file_layer"),
]


@pytest.mark.parametrize(("case", "options", "named"), BAD, ids=[c for c, _, _ in BAD])
def test_each_bad_option_is_refused_with_a_hint(
    case: str, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidOptionError) as info:
        StoreOptions(**options)
    err = info.value
    assert named in err.message
    assert err.hint and err.hint != InvalidOptionError.hint, "a hint of its own"
    assert err.hint in str(err)


@pytest.mark.parametrize(("case", "options", "named"), BAD, ids=[c for c, _, _ in BAD])
def test_open_refuses_the_same_options_and_creates_nothing(
    tmp_path: Path, case: str, options: dict[str, Any], named: str
) -> None:
    target = tmp_path / "store"
    with pytest.raises(InvalidOptionError) as info:
        statelog.open(target, **options)
    assert named in info.value.message
    assert not target.exists()


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("durabilty", "durability"),
        ("segment_byte", "segment_bytes"),
        ("read_only", "readonly"),
        ("retains", "retain"),
        ("compactor_intervall", "compactor_interval"),
        ("remote_checks", "remote_check"),
        ("fragment_size", "fragment_bytes"),
    ],
)
def test_an_unknown_name_suggests_the_closest_option(
    tmp_path: Path, name: str, closest: str
) -> None:
    target = tmp_path / "store"
    for refuse in (
        lambda: StoreOptions.from_kwargs(**{name: 1}),
        lambda: statelog.open(target, **{name: 1}),
        lambda: statelog.StateStore(target, **{name: 1}),
        lambda: statelog.StateStore.open(target, **{name: 1}),
    ):
        with pytest.raises(InvalidOptionError) as info:
            refuse()
        assert name in info.value.message
        assert info.value.hint == f"did you mean {closest}=?"
    assert not target.exists()


def test_an_unknown_name_like_no_option_lists_them_all() -> None:
    with pytest.raises(InvalidOptionError) as info:
        StoreOptions.from_kwargs(durability="group", xyzzy=1)
    assert "xyzzy" in info.value.message
    for field in dataclasses.fields(StoreOptions):
        assert field.name in info.value.hint


def test_options_are_frozen_and_slotted() -> None:
    opts = StoreOptions(durability="group")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.durability = "none"  # type: ignore[misc]
    assert not hasattr(opts, "__dict__")
    assert opts == StoreOptions(durability="group") and hash(opts) == hash(
        StoreOptions(durability="group")
    )
    # replace() builds a new object, and so checks it again.
    assert dataclasses.replace(opts, retain=5).retain == 5
    with pytest.raises(InvalidOptionError):
        dataclasses.replace(opts, segment_bytes=1)


def test_defaults_are_the_documented_ones() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(StoreOptions)}
    assert fields == DOCUMENTED_DEFAULTS
    opts = StoreOptions()
    assert {name: getattr(opts, name) for name in fields} == DOCUMENTED_DEFAULTS
    assert opts.fragment_size == 16 * MiB
    assert StoreOptions(segment_bytes=8192).fragment_size == 8192
    assert StoreOptions(fragment_bytes=4096).fragment_size == 4096
    assert StoreOptions.from_kwargs() == opts


def test_the_readme_names_every_option() -> None:
    readme = (REPO / "README.md").read_text()
    paragraph = readme.split("Options of `statelog.open`:", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", paragraph))
    fields = {f.name for f in dataclasses.fields(StoreOptions)}
    assert named - {"statelog", "open"} <= fields
    # file_layer is the tests' fault-injection hook, not a user option.
    assert fields - named == {"file_layer"}


def test_options_object_and_keywords_open_the_same_store(tmp_path: Path) -> None:
    settings: dict[str, Any] = {"durability": "group", "segment_bytes": 8192, "retain": 2}
    opts = StoreOptions(**settings)
    roots = {"kwargs": tmp_path / "a", "object": tmp_path / "b"}
    for how, root in roots.items():
        store = (
            statelog.open(root, **settings)
            if how == "kwargs"
            else statelog.open(root, options=opts)
        )
        with store:
            assert store.options == opts
            assert (store.options is opts) == (how == "object")
            for i in range(60):  # several rolls at 8 KiB
                store.commit(offsets={"p": i + 1}, low_watermark_ms=i, put={f"k{i}": "v" * 300})
            assert store.wait_durable(60, timedelta(seconds=10))
    a, b = (segments(root) for root in roots.values())
    assert len(a) == len(b) > 2
    assert [p.stat().st_size for p in a] == [p.stat().st_size for p in b]
    ro_opts = dataclasses.replace(opts, readonly=True)
    with (
        statelog.open(roots["kwargs"], **settings, readonly=True) as x,
        statelog.StateStore(roots["object"], options=ro_opts) as y,
    ):
        assert x.readonly and y.readonly and x.options == y.options == ro_opts
        assert x.epoch == y.epoch == 60
        assert dict(x.items()) == dict(y.items())


def test_options_and_keywords_together_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "store"
    with pytest.raises(InvalidOptionError) as info:
        statelog.open(target, options=StoreOptions(), durability="none")
    assert "durability" in info.value.message and info.value.hint
    with pytest.raises(InvalidOptionError) as info:
        statelog.open(target, options={"durability": "none"})  # type: ignore[arg-type]
    assert "options=" in info.value.message
    assert not target.exists()


def test_a_file_layer_subclass_is_accepted(store_path: Path) -> None:
    class Counting(FileLayer):
        pass

    files = Counting()
    with statelog.open(store_path, options=StoreOptions(file_layer=files)) as store:
        assert store.options.file_layer is files
        assert store.commit(offsets={"p": 1}, low_watermark_ms=0) == 1


def test_store_options_is_public() -> None:
    assert "StoreOptions" in statelog.__all__
    assert statelog.StoreOptions is StoreOptions


def test_a_checkpoint_of_a_few_mib_is_one_frame_by_default(tmp_path: Path) -> None:
    """With the default options a 4 MiB commit record is one ``FULL`` frame, which a reader
    hands out as a view of the bytes it read: a fragmented record would be joined into a
    copy first, on every restore, recovery and fold that reads it."""
    with statelog.open(tmp_path / "s") as st:
        st.commit(put={f"k{i:06d}": "v" * 100 for i in range(40_000)})
    (path,) = sorted((tmp_path / "s" / "wal").glob("*.wal"))
    data = path.read_bytes()
    scan = scan_segment(path, data, store_id=None, prev_crc=None, is_last=False)
    (record,) = scan.records
    assert len(record.payload) > 4 * MiB
    assert isinstance(record.payload, memoryview) and record.payload.obj is data
