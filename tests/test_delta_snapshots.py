"""Delta snapshots: their format, their chains, and recovery walking back past a bad link.

| case                                            | must                                     |
|-------------------------------------------------|------------------------------------------|
| a delta a pass wrote                            | verify; its body parse in delta mode     |
|                                                 |   only; counts = ``delta.changes``       |
| a crafted delta body or meta (hash right)       | ``CorruptionError`` whose reason starts  |
|   breaking one rule (table ``HOSTILE``)         |   ``body:`` / ``meta:`` / ``header:``    |
| one link of full + 3 deltas damaged, deleted,   | open (writer and read-only) at exactly   |
|   or replaced by a valid twin (``WALK_BACK``)   |   the newest state, from the newest      |
|                                                 |   intact restore point, the refused ones |
|                                                 |   in ``recovery.rejected`` (``chain:``)  |
| the same with the log to replay gone            | ``ResnapshotRequired`` naming each file  |
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard

import statelog
from statelog.errors import CorruptionError, ResnapshotRequired
from statelog.format.snapshot import (
    DeltaDoc,
    SnapshotHeader,
    encode_meta,
    pack_footer,
    snapshot_name,
)
from statelog.format.stream import (
    StreamChecker,
    StreamError,
    encode_deletes,
    encode_end,
    encode_puts,
    encode_table,
)
from statelog.storage.fileio import FileLayer
from statelog.storage.image import encode_key
from statelog.storage.snapshots import SnapshotMeta, extract_snapshot, verify_snapshot
from tests.delta_stores import (
    ChainStore,
    build_chain,
    contents,
    copy_store,
    drop_segments_through,
    twin,
)
from tests.helpers import flip_bit
from tests.test_hostile_snapshots import body_of

FILES = FileLayer()


@pytest.fixture(scope="module")
def chain_template(tmp_path_factory: pytest.TempPathFactory) -> ChainStore:
    return build_chain(tmp_path_factory.mktemp("chain") / "store")


@pytest.fixture
def chain(chain_template: ChainStore, tmp_path: Path) -> ChainStore:
    return copy_store(chain_template, tmp_path / "store")


# -- what a pass writes ----------------------------------------------------------------


def test_a_pass_writes_deltas_that_verify_and_parse_in_delta_mode_only(chain: ChainStore) -> None:
    metas = [verify_snapshot(FILES, chain.snap(i), store_id=None) for i in range(5)]
    assert [m.depth for m in metas] == [0, 0, 1, 2, 3]
    for i in (2, 3, 4):
        link = metas[i].delta
        assert link is not None
        assert link.parent == chain.names[i - 1]
        assert link.parent_sha256 == metas[i - 1].sha256
        assert link.full_bytes == metas[1].body_bytes
        assert link.chain_bytes == sum(m.body_bytes for m in metas[2 : i + 1])
        assert chain.snap(i).read_bytes()[-40:-8].hex() == metas[i].sha256
        counts = {t: len(kv) for t, kv in chain.models[chain.names[i]].items()}
        assert metas[i].tables == counts  # the whole state's, not the delta's
        stream = body_of(chain.snap(i))
        checker = StreamChecker(delta=True)
        for _ in checker.feed(stream):
            pass
        checker.finish()
        assert checker.counts == link.changes
        with pytest.raises(StreamError, match="a deletes chunk in a full snapshot"):
            list(StreamChecker().feed(stream))  # each round deletes keys the state held


# -- crafted delta files ----------------------------------------------------------------


def _key(s: str) -> bytes:
    return encode_key(s)


def _puts(*keys: str) -> bytes:
    return encode_puts([_key(k) for k in keys], [msgspec.msgpack.encode(1)] * len(keys))


def _dels(*keys: str) -> bytes:
    return encode_deletes([_key(k) for k in keys])


def _stream(*chunks: bytes, records: int, tables: int = 1) -> bytes:
    return b"".join(chunks) + encode_end(records, tables)


T = encode_table("default")
GOOD = _stream(T, _dels("a", "c"), _puts("b", "d"), records=4)


def craft(
    path: Path,
    meta: SnapshotMeta,
    stream: bytes,
    *,
    flags: int | None = None,
    delta: DeltaDoc | str | None = "keep",
) -> None:
    """Write a snapshot at ``path`` of ``meta``'s header and meta around ``stream``, its
    hash right; ``delta`` replaces the link ("keep": the meta's), ``flags`` the header's
    (default: 1 exactly when there is a link)."""
    link = meta.delta if delta == "keep" else delta
    assert not isinstance(link, str)
    raw = encode_meta(
        meta.offsets, meta.low_watermark_ms, meta.tables, len(stream), meta.created_ms,
        delta=link, commit_ms=meta.commit_ms,
    )  # fmt: skip
    body = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(stream)
    head = SnapshotHeader(
        meta.store_id, meta.epoch, meta.lsn, meta.chain, len(raw), len(body),
        flags=(1 if link is not None else 0) if flags is None else flags,
    ).pack()  # fmt: skip
    data = head + raw + body
    path.write_bytes(data + pack_footer(hashlib.sha256(data).digest()))


def _link(meta: SnapshotMeta, **fields: Any) -> DeltaDoc:
    """``meta``'s own link, counting :data:`GOOD`'s records unless ``fields`` say otherwise."""
    assert meta.delta is not None
    return msgspec.structs.replace(meta.delta, **{"changes": {"default": 4}, **fields})


Craft = Callable[[SnapshotMeta], tuple[bytes, dict[str, Any]]]
HOSTILE: list[tuple[str, Craft, str, str]] = [
    ("D chunk in a full snapshot", lambda m: (GOOD, {"delta": None}), "body:",
     "a deletes chunk in a full snapshot"),
    ("D after P", lambda m: (_stream(T, _puts("b"), _dels("a"), records=2), {}), "body:",
     "deletes after puts"),
    ("a key deleted and put", lambda m: (_stream(T, _dels("a"), _puts("a"), records=2), {}),
     "body:", "both deleted and put"),
    ("unsorted deletes", lambda m: (_stream(T, _dels("c", "a"), records=2), {}), "body:",
     "not strictly increasing"),
    ("deletes out of order across chunks", lambda m: (_stream(T, _dels("c"), _dels("a"),
     records=2), {}), "body:", "does not sort after"),
    ("a deleted key repeated", lambda m: (_stream(T, _dels("a", "a"), records=2), {}), "body:",
     "not strictly increasing"),
    ("empty D", lambda m: (_stream(T, encode_deletes([]), _puts("b"), records=1), {}), "body:",
     "an empty deletes chunk"),
    ("a table with no chunk", lambda m: (_stream(T, records=0), {}), "body:", "holds no keys"),
    ("flags=1 without a link", lambda m: (GOOD, {"delta": None, "flags": 1}), "meta:",
     "without the header's delta flag"),
    ("a link with flags=0", lambda m: (GOOD, {"flags": 0}), "meta:", "delta link"),
    ("flags=2", lambda m: (GOOD, {"flags": 2}), "header:", "flags=0x2"),
    ("flags=3", lambda m: (GOOD, {"flags": 3}), "header:", "flags=0x3"),
    ("parent at the child's LSN", lambda m: (GOOD, {"delta": _link(
     m, parent=snapshot_name(m.epoch, m.lsn))}), "meta:", "does not end before"),
    ("parent after the child", lambda m: (GOOD, {"delta": _link(
     m, parent=snapshot_name(m.epoch + 5, m.lsn + 5))}), "meta:", "does not end before"),
    ("changes count fewer records", lambda m: (GOOD, {"delta": _link(m, changes={
     "default": 3})}), "meta:", "table counts disagree"),
    ("changes name another table", lambda m: (GOOD, {"delta": _link(m, changes={
     "default": 4, "other": 1})}), "meta:", "table counts disagree"),
    ("changes empty", lambda m: (GOOD, {"delta": _link(m, changes={})}), "meta:",
     "table counts disagree"),
]  # fmt: skip


@pytest.fixture(scope="module")
def delta_meta(chain_template: ChainStore) -> SnapshotMeta:
    return verify_snapshot(FILES, chain_template.snap(2), store_id=None)


def test_the_crafting_itself_makes_a_delta_that_verifies(
    delta_meta: SnapshotMeta, tmp_path: Path
) -> None:
    path = tmp_path / delta_meta_name(delta_meta)
    craft(path, delta_meta, GOOD, delta=_link(delta_meta))
    got = verify_snapshot(FILES, path, store_id=delta_meta.store_id)
    assert got.delta is not None and got.delta.changes == {"default": 4}
    extract_snapshot(FILES, path, tmp_path / "x.mdb", store_id=None)


def delta_meta_name(meta: SnapshotMeta) -> str:
    return snapshot_name(meta.epoch, meta.lsn)


@pytest.mark.parametrize(("case", "make", "part", "words"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_delta_is_corruption_of_the_right_part(
    delta_meta: SnapshotMeta, tmp_path: Path, case: str, make: Craft, part: str, words: str
) -> None:
    stream, how = make(delta_meta)
    how.setdefault("delta", _link(delta_meta))
    path = tmp_path / delta_meta_name(delta_meta)
    craft(path, delta_meta, stream, **how)
    checks: list[Callable[[], SnapshotMeta]] = [
        lambda: verify_snapshot(FILES, path, store_id=None),
        lambda: extract_snapshot(FILES, path, tmp_path / "x.mdb", store_id=None),
    ]
    for check in checks:
        with pytest.raises(CorruptionError) as info:
            check()
        assert info.value.reason.startswith(part), info.value.reason
        assert words in info.value.reason, info.value.reason
    assert not list(tmp_path.glob("x.mdb*"))  # nothing half-built is left


# -- walking back past a bad link ------------------------------------------------------------

# (damaged link, what is done to it, restore point used, snapshots refused newest first)
FA, FB, D1, D2, D3 = range(5)


def _flip(path: Path) -> None:
    flip_bit(path, path.stat().st_size - 40 - 12, 3)  # inside the body's zstd frame


WALK_BACK: list[tuple[int, Callable[[Path], None], int, list[int]]] = [
    (D3, _flip, D2, [D3]),
    (D2, _flip, D1, [D3, D2]),
    (D1, _flip, FB, [D3, D2, D1]),
    (FB, _flip, FA, [D3, D2, D1, FB]),
    (D2, Path.unlink, D1, [D3]),
    (D1, Path.unlink, FB, [D3, D2]),
    (FB, Path.unlink, FA, [D3, D2, D1]),
    (D2, twin, D2, [D3]),
    (D1, twin, D1, [D3, D2]),
    (FB, twin, FB, [D3, D2, D1]),
]
LINKS = ("Fa", "Fb", "D1", "D2", "D3")
_IDS = [f"{LINKS[b]}-{f.__name__}" for b, f, _u, _r in WALK_BACK]


def _check_rejected(chain: ChainStore, report: Any, bad: int, refused: list[int]) -> None:
    got = [(r.path.name, r.reason) for r in report.rejected if r.path.suffix == ".snap"]
    assert [n for n, _ in got] == [chain.names[i] for i in refused]
    for name, reason in got:
        if name == chain.names[bad]:
            assert not reason.startswith("chain:"), reason  # its own damage
        else:
            assert reason.startswith("chain:") and chain.names[bad] in reason, reason


@pytest.mark.parametrize(("bad", "damage", "used", "refused"), WALK_BACK, ids=_IDS)
def test_a_bad_link_walks_back_to_the_newest_intact_restore_point(
    chain: ChainStore, bad: int, damage: Callable[[Path], None], used: int, refused: list[int]
) -> None:
    damage(chain.snap(bad))
    for readonly in (True, False):
        with statelog.open(chain.root, readonly=readonly) as store:
            report = store.recovery
            assert report.snapshot is not None and report.snapshot.name == chain.names[used]
            _check_rejected(chain, report, bad, refused)
            assert store.epoch == chain.epoch
            assert contents(store) == chain.final
    if damage is not Path.unlink:
        assert chain.snap(bad).exists()  # kept as evidence


@pytest.mark.parametrize("bad", [FB, D1], ids=["Fb", "D1"])
def test_a_walk_back_the_log_no_longer_serves_requires_a_resnapshot(
    chain: ChainStore, bad: int
) -> None:
    """Every restore point left is refused (a chain broken at ``bad``, and what is older
    no longer links to the log): nothing is guessed, every file is named."""
    fb_lsn = verify_snapshot(FILES, chain.snap(FB), store_id=None).lsn
    assert drop_segments_through(chain.root, fb_lsn)
    _flip(chain.snap(bad))
    if bad == D1:
        _flip(chain.snap(FB))
    with pytest.raises(ResnapshotRequired) as info:
        statelog.open(chain.root, readonly=True)
    tried = {p.name: why for p, why in info.value.tried}
    assert set(chain.names) <= set(tried), tried
    assert all(name in str(info.value) for name in chain.names)
    for i in (D1, D2, D3):
        if i > bad:
            assert tried[chain.names[i]].startswith("chain:"), tried
    assert "the log continues at LSN" in tried[chain.names[FA]]
