"""Snapshots whose hash is right and whose body lies: a typed error or a walk-back, never a crash.

A format-2 snapshot may come from anywhere (another host's disk, a bucket),
so its SHA-256 proves only that nobody changed it since it was framed: each
file here is framed by :func:`frame_snapshot` around a crafted, decompressed
record stream, with a right header, meta, zstd frame and footer. The store
holds an older good snapshot and the log from it, so every entry point must
refuse the crafted one and walk back to the older one (or name it, for the
checks), and read the very state the store had.

| crafted                                       | verify and extract name               |
|-----------------------------------------------|---------------------------------------|
| one rule of the record stream broken (as in   | ``body: record stream offset N: ...`` |
|   tests/test_record_stream.py, but in a file) |                                       |
| meta table counts that disagree with the body | ``meta: its table counts disagree``   |
| a negative offset, a watermark past 2**63 - 1 | ``meta: does not decode``             |
| ``body_bytes`` more or less than the stream   | ``body: ...``                         |
| ``body_bytes`` over 1024 times the frame      | ``size:``, before any decompression   |
|   (1 GiB of zeros: a bomb)                    |                                       |
| a frame that yields more than it declares     | ``body: the body yields more ...``    |
| a body that is no zstd frame, or is cut short | ``body: ...``                         |
| values no read can decode (bad UTF-8, ...)    | ``body:`` (as replay refuses them)    |

Every one of them, put in a store in place of its newest snapshot: the
read-only open and items(), the writer's open, ``statelog verify`` (exit 1,
the file named), ``statelog dump`` (the same lines) and compaction (folds
from the older snapshot, the crafted file kept) walk back to the older
snapshot and read the same state. Retention keeps the crafted file and
never counts it as one that verifies. A bucket holding a crafted snapshot
and a format-1 one: restore walks past both.

Then a seeded mutation fuzz: a valid stream mutated (bit flips, overwrites,
truncations, chunks duplicated or dropped, length fields rewritten), framed
with a right hash, and read in a subprocess per batch (verify, extract,
read-only open, items()), so a crash or a hang is a failure too: only
typed errors, or a clean read of exactly the state the stream holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard

import statelog
import statelog.cli
from statelog.compaction.fold import compact
from statelog.errors import CorruptionError, StatelogError
from statelog.format.snapshot import (
    FOOTER_SIZE,
    HEADER_SIZE,
    SnapshotHeader,
    encode_meta,
    pack_footer,
)
from statelog.remote import read_manifest, restore, ship
from statelog.state.live import Key
from statelog.storage.fileio import FileLayer
from statelog.storage.image import BaseLevel, decode_key
from statelog.storage.layout import StoreLayout
from statelog.storage.snapshot_body import MAX_RATIO, BodyTooLarge, CountingSink, body_limit
from statelog.storage.snapshots import (
    SnapshotMeta,
    extract_snapshot,
    list_snapshots,
    verify_snapshot,
    write_snapshot,
)
from tests.s3server import Remote, remote, s3  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
FILES = FileLayer()
SEG = 4096

# -- framing a snapshot around any stream ---------------------------------------------


def frame_snapshot(
    path: Path,
    meta: SnapshotMeta,
    stream: bytes,
    *,
    body_bytes: int | None = None,
    tables: dict[str, int] | None = None,
    frame: bytes | None = None,
) -> bytes:
    """Write a format-2 snapshot at ``path`` whose body is ``stream``, and whose hash is right.

    Header and meta come from ``meta``; ``body_bytes`` (default: the
    stream's length) and ``tables`` (default: ``meta.tables``) are what the
    meta declares, true or not; ``frame`` replaces the zstd frame of
    ``stream`` (for bodies that are no honest frame of it). Returns the bytes.
    """
    raw_meta = encode_meta(
        meta.offsets,
        meta.low_watermark_ms,
        meta.tables if tables is None else tables,
        len(stream) if body_bytes is None else body_bytes,
        meta.created_ms,
        commit_ms=meta.commit_ms,
    )
    body = frame
    if body is None:
        body = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(stream)
    head = SnapshotHeader(
        meta.store_id, meta.epoch, meta.lsn, meta.chain, len(raw_meta), len(body)
    ).pack()
    data = head + raw_meta + body
    data += pack_footer(hashlib.sha256(data).digest())
    tmp = path.with_name(path.name + ".craft")
    tmp.write_bytes(data)
    tmp.replace(path)
    return data


def body_of(path: Path) -> bytes:
    """The decompressed body of a snapshot file (unverified)."""
    data = path.read_bytes()
    meta_len, body_len = struct.unpack_from("<IQ", data, 52)
    frame = data[HEADER_SIZE + meta_len : HEADER_SIZE + meta_len + body_len]
    return zstandard.ZstdDecompressor().decompressobj().decompress(frame)


# -- a naive reader of streams: chunks to cut and mutate, and the state a stream holds ---


def chunks_of(stream: bytes) -> list[tuple[bytes, bytes]]:
    """``(kind, payload)`` of each whole chunk, unchecked (stops at a torn one)."""
    out, at = [], 0
    while at + 5 <= len(stream):
        kind, n = stream[at : at + 1], struct.unpack_from("<I", stream, at + 1)[0]
        if at + 5 + n > len(stream):
            break
        out.append((kind, stream[at + 5 : at + 5 + n]))
        at += 5 + n
    return out


def chunk(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("<I", len(payload)) + payload


def join(chunks: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(chunk(k, p) for k, p in chunks)


def puts(keys: list[bytes], values: list[bytes]) -> tuple[bytes, bytes]:
    return b"P", msgspec.msgpack.encode([keys, [msgspec.Raw(v) for v in values]])


def split_puts(payload: bytes) -> tuple[list[bytes], list[bytes]]:
    """Keys and raw values of a valid ``P`` payload."""
    keys, values = msgspec.msgpack.decode(payload, type=tuple[list[bytes], list[msgspec.Raw]])
    return keys, [bytes(v) for v in values]


def end(records: int, tables: int) -> tuple[bytes, bytes]:
    return b"E", struct.pack("<QI", records, tables)


def stream_state(stream: bytes) -> dict[str, dict[Key, Any]] | None:
    """The tables a stream spells out, decoded naively; None if it is not a clean stream.

    Independent of the checker under test: the oracle a snapshot that was
    accepted is held to.
    """
    try:
        out: dict[str, dict[Key, Any]] = {}
        table = None
        for kind, payload in chunks_of(stream):
            if kind == b"T":
                table = payload.decode("utf-8")
                out[table] = {}
            elif kind == b"P" and table is not None:
                keys, values = msgspec.msgpack.decode(payload)
                for k, v in zip(keys, values, strict=True):
                    out[table][decode_key(k)] = v
        return {t: kv for t, kv in out.items() if kv}
    except Exception:
        return None


def naive_counts(stream: bytes) -> dict[str, int] | None:
    """Keys per table as the chunks claim (for a meta that agrees with a mutated body)."""
    try:
        counts: dict[str, int] = {}
        table = None
        for kind, payload in chunks_of(stream):
            if kind == b"T":
                table = payload.decode("utf-8", "replace")
                counts.setdefault(table, 0)
            elif kind == b"P" and table is not None:
                counts[table] += len(msgspec.msgpack.decode(payload)[0])
        return counts
    except Exception:
        return None


def store_tables(store: statelog.StateStore) -> dict[str, dict[Key, Any]]:
    return {t: dict(store.items(t)) for t in store.tables() if store.count(t)}


def image_tables(path: Path) -> dict[str, dict[Key, Any]]:
    with BaseLevel(path) as base:
        return {
            t: {k: msgspec.msgpack.decode(v) for k, v in base.items(t)}
            for t in base.tables()
            if base.count(t)
        }


# -- the store the crafted snapshot lands in ------------------------------------------------


def commit_range(store: statelog.StateStore, start: int, stop: int) -> None:
    for i in range(start, stop):
        put: dict[Key, Any] = {
            f"k{i % 40}": {"i": i, "pad": "x" * (40 + i % 9)},
            b"b%d" % (i % 15): i,
        }
        store.commit(offsets={"p0": i}, low_watermark_ms=10 * i, put=put)
        if i % 3 == 0:
            store.commit(
                offsets={"p1": i}, low_watermark_ms=10 * i, put={f"o{i}": [i, "é"]}, table="other"
            )


@dataclass(frozen=True)
class Template:
    """A closed store: an older snapshot, a newer one (the target), the log from the older."""

    root: Path
    store_id: uuid.UUID
    older: Path
    target: Path
    meta: SnapshotMeta  # the target's
    stream: bytes  # the target's valid record stream
    state: dict[str, Any] = field(hash=False)  # what every open must read
    dump: str = ""


def state_of(root: Path) -> dict[str, Any]:
    with statelog.open(root, readonly=True) as ro:
        return {
            "epoch": ro.epoch,
            "offsets": ro.offsets,
            "wm": ro.low_watermark_ms,
            "tables": store_tables(ro),
        }


def build_template(root: Path, *, tail: bool) -> Template:
    """Snapshots of the state half-way and at the end; with ``tail``, more log after the newer."""
    with statelog.open(root, segment_bytes=SEG) as store:
        commit_range(store, 1, 60)
        assert compact(root).snapshot is not None
        commit_range(store, 60, 120)
    assert compact(root).snapshot is not None  # the close sealed the last segment: all of it
    if tail:
        with statelog.open(root, segment_bytes=SEG) as store:
            commit_range(store, 120, 160)
    snaps = [p for _, _, p in list_snapshots(root / "snapshots")]
    assert len(snaps) == 2
    target, older = snaps
    meta = verify_snapshot(FILES, target, store_id=None)
    return Template(
        root, meta.store_id, older, target, meta, body_of(target), state_of(root), dump_of(root)
    )


def dump_of(root: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "statelog.cli", "dump", str(root), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    return build_template(tmp_path_factory.mktemp("hostile") / "store", tail=True)


@pytest.fixture
def store(template: Template, tmp_path: Path) -> Template:
    """A fresh copy of the template, paths pointing into it."""
    root = tmp_path / "store"
    shutil.copytree(template.root, root, symlinks=True)
    return Template(
        root,
        template.store_id,
        root / "snapshots" / template.older.name,
        root / "snapshots" / template.target.name,
        template.meta,
        template.stream,
        template.state,
        template.dump,
    )


# -- the crafted cases ------------------------------------------------------------------------


@dataclass(frozen=True)
class Craft:
    """How to lie: a stream from the valid one, and what the meta declares."""

    stream: bytes
    body_bytes: int | None = None
    tables: dict[str, int] | None = None
    frame: bytes | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # meta fields declared otherwise


Crafter = Callable[[bytes, SnapshotMeta], Craft]


def edit(change: Callable[[list[tuple[bytes, bytes]]], None]) -> Crafter:
    """A crafted stream: the valid one's chunks, changed by ``change``."""

    def make(stream: bytes, meta: SnapshotMeta) -> Craft:
        parts = chunks_of(stream)
        change(parts)
        return Craft(join(parts))

    return make


def first(parts: list[tuple[bytes, bytes]], kind: bytes, nth: int = 0) -> int:
    return [i for i, (k, _) in enumerate(parts) if k == kind][nth]


def in_puts(change: Callable[[list[bytes], list[bytes]], None], nth: int = 0) -> Crafter:
    """A crafted stream whose ``nth`` P chunk's keys and values ``change`` rewrote."""

    def apply(parts: list[tuple[bytes, bytes]]) -> None:
        i = first(parts, b"P", nth)
        keys, values = split_puts(parts[i][1])
        change(keys, values)
        parts[i] = puts(keys, values)

    return edit(apply)


def insert_before_end(*extra: tuple[bytes, bytes]) -> Crafter:
    def apply(parts: list[tuple[bytes, bytes]]) -> None:
        parts[-1:-1] = list(extra)

    return edit(apply)


def renamed_table(name: bytes, nth: int = 1) -> Crafter:
    def apply(parts: list[tuple[bytes, bytes]]) -> None:
        parts[first(parts, b"T", nth)] = (b"T", name)

    return edit(apply)


def with_value(raw: bytes) -> Crafter:
    def change(keys: list[bytes], values: list[bytes]) -> None:
        values[len(values) // 2] = raw

    return in_puts(change)


def _swap_keys(keys: list[bytes], values: list[bytes]) -> None:
    keys[1], keys[2] = keys[2], keys[1]


def _repeat_key(keys: list[bytes], values: list[bytes]) -> None:
    keys.insert(3, keys[3])
    values.insert(3, values[3])


def _append_key(key: bytes) -> Callable[[list[bytes], list[bytes]], None]:
    def change(keys: list[bytes], values: list[bytes]) -> None:
        keys.append(key)
        values.append(msgspec.msgpack.encode(1))

    return change


def _last_str_key_plus(tail: bytes) -> Callable[[list[bytes], list[bytes]], None]:
    def change(keys: list[bytes], values: list[bytes]) -> None:
        keys[-1] = keys[-1] + tail

    return change


def _drop_value(keys: list[bytes], values: list[bytes]) -> None:
    values.pop()


def _back_across_chunks(parts: list[tuple[bytes, bytes]]) -> None:
    i = first(parts, b"P")
    keys, values = split_puts(parts[i][1])
    parts[i : i + 1] = [puts(keys[1:], values[1:]), puts(keys[:1], values[:1])]


def _puts_before_table(parts: list[tuple[bytes, bytes]]) -> None:
    parts[0], parts[1] = parts[1], parts[0]


def _tables_swapped(parts: list[tuple[bytes, bytes]]) -> None:
    second = first(parts, b"T", 1)
    parts[:-1] = parts[second:-1] + parts[:second]


def _drop_end(parts: list[tuple[bytes, bytes]]) -> None:
    parts.pop()


def _end_counts(delta_records: int, delta_tables: int) -> Crafter:
    def apply(parts: list[tuple[bytes, bytes]]) -> None:
        records, tables = struct.unpack("<QI", parts[-1][1])
        parts[-1] = end(records + delta_records, tables + delta_tables)

    return edit(apply)


def raw_tail(change: Callable[[bytes], bytes]) -> Crafter:
    return lambda stream, meta: Craft(change(stream))


def declared(body_delta: int = 0, table_delta: int = 0, extra_table: bool = False) -> Crafter:
    """The honest stream; a meta that lies about its size or its counts."""

    def make(stream: bytes, meta: SnapshotMeta) -> Craft:
        tables = dict(meta.tables)
        tables["default"] += table_delta
        if extra_table:
            tables["ghost"] = 1
        return Craft(stream, body_bytes=len(stream) + body_delta, tables=tables)

    return make


def meta_says(**fields: Any) -> Crafter:
    """The honest stream; a meta whose offsets or watermark no commit could hold."""
    return lambda stream, meta: Craft(stream, meta=fields)


@functools.cache
def zeros_frame(prefix: bytes, zero_mib: int) -> bytes:
    """A zstd frame of ``prefix`` then ``zero_mib`` MiB of zeros (about 32 bytes per MiB)."""
    cobj = zstandard.ZstdCompressor(level=1, write_checksum=True).compressobj()
    parts = [cobj.compress(prefix)]
    zero = bytes(1 << 20)
    parts.extend(cobj.compress(zero) for _ in range(zero_mib))
    parts.append(cobj.flush())
    return b"".join(parts)


def bomb(stream: bytes, meta: SnapshotMeta) -> Craft:
    """1 GiB of zeros, declared as such: over 1024 times its ~32 KiB frame."""
    frame = zeros_frame(b"", 1024)
    assert body_limit(len(frame)) < 1 << 30
    return Craft(b"", body_bytes=1 << 30, frame=frame)


def yields_more(stream: bytes, meta: SnapshotMeta) -> Craft:
    """The valid stream declared, the frame holding it and 256 MiB of zeros more."""
    return Craft(stream, frame=zeros_frame(stream, 256))


def not_zstd(stream: bytes, meta: SnapshotMeta) -> Craft:
    return Craft(stream, frame=random.Random(1).randbytes(300))


def frame_cut(stream: bytes, meta: SnapshotMeta) -> Craft:
    whole = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(stream)
    return Craft(stream, frame=whole[:-9])


STREAM_RULE = "body: record stream offset "
# name: (how to lie, what the reason starts with, what it says further on)
CASES: dict[str, tuple[Crafter, str, str]] = {
    # chunk kinds
    "unknown-kind": (insert_before_end((b"X", b"")), STREAM_RULE, "unknown chunk kind b'X'"),
    "deletes-chunk": (
        insert_before_end((b"D", msgspec.msgpack.encode([b"\x01k0"]))),
        STREAM_RULE,
        "deletes",
    ),
    "puts-before-table": (edit(_puts_before_table), STREAM_RULE, "keys before any table"),
    # tables
    "tables-out-of-order": (edit(_tables_swapped), STREAM_RULE, "out of order after 'other'"),
    "table-repeated": (renamed_table(b"default"), STREAM_RULE, "out of order after 'default'"),
    "table-name-not-utf8": (renamed_table(b"other\xff"), STREAM_RULE, "not UTF-8"),
    "table-name-nul": (renamed_table(b"other\x00"), STREAM_RULE, "NUL"),
    "table-name-256-bytes": (renamed_table(b"o" * 256), STREAM_RULE, "over 255"),
    "empty-table": (insert_before_end((b"T", b"zzz")), STREAM_RULE, "'zzz' holds no keys"),
    # keys
    "keys-not-increasing": (in_puts(_swap_keys), STREAM_RULE, "not strictly increasing"),
    "key-repeated": (in_puts(_repeat_key), STREAM_RULE, "not strictly increasing"),
    "keys-back-across-chunks": (edit(_back_across_chunks), STREAM_RULE, "does not sort after"),
    "key-tag-2": (in_puts(_append_key(b"\x02x")), STREAM_RULE, "without a valid type tag"),
    "key-501-bytes": (in_puts(_append_key(b"\x01" + b"z" * 501)), STREAM_RULE, "<= 501"),
    "key-empty": (in_puts(lambda k, v: k.__setitem__(0, b"")), STREAM_RULE, ">= 1"),
    "str-key-not-utf8": (in_puts(_last_str_key_plus(b"\xff")), STREAM_RULE, "not valid UTF-8"),
    "str-key-surrogate": (
        in_puts(_last_str_key_plus(b"\xed\xa0\x80")),
        STREAM_RULE,
        "not valid UTF-8",
    ),
    "str-key-cut-utf8": (in_puts(_last_str_key_plus(b"\xe2\x82")), STREAM_RULE, "not valid UTF-8"),
    # values
    "value-not-msgpack": (with_value(b"\xc1"), STREAM_RULE, "does not decode"),
    "value-nested-5000": (with_value(b"\x91" * 5000 + b"\xc0"), STREAM_RULE, "does not decode"),
    "value-missing": (in_puts(_drop_value), STREAM_RULE, "values in a puts chunk"),
    # the end
    "end-records-wrong": (_end_counts(1, 0), STREAM_RULE, "the end chunk counts"),
    "end-tables-wrong": (_end_counts(0, -1), STREAM_RULE, "records in 1 tables"),
    "end-wrong-size": (
        raw_tail(lambda s: s[:-17] + chunk(b"E", s[-12:] + b"\0")),
        STREAM_RULE,
        "13 bytes",
    ),
    "bytes-after-end": (
        raw_tail(lambda s: s + chunk(b"T", b"later")),
        STREAM_RULE,
        "after the end chunk",
    ),
    "no-end": (edit(_drop_end), STREAM_RULE, "stops before its end chunk"),
    "torn-at-end": (raw_tail(lambda s: s[:-3]), STREAM_RULE, "14 bytes of a torn chunk"),
    # the meta against the body
    "meta-counts-disagree": (declared(table_delta=1), "meta: its table counts disagree", ""),
    "meta-lists-a-ghost-table": (declared(extra_table=True), "meta: its table counts", ""),
    "body-bytes-more-than-stream": (declared(body_delta=1), "body: ", "bytes, the meta declares"),
    "body-bytes-less-than-stream": (declared(body_delta=-1), "body: the body yields more", ""),
    "meta-offset-negative": (meta_says(offsets={"p": -5}), "meta: does not decode", "offsets"),
    "meta-watermark-past-2**63": (
        meta_says(low_watermark_ms=1 << 63),
        "meta: does not decode",
        "low_watermark_ms",
    ),
    # the frame
    "bomb-1-gib-declared": (bomb, "size: the meta declares a body of 1073741824 bytes", "limit"),
    "frame-yields-more": (yields_more, "body: the body yields more", ""),
    "frame-not-zstd": (not_zstd, "body: the zstd frame does not decode", ""),
    "frame-cut-short": (frame_cut, STREAM_RULE, "stops before its end chunk"),
}
# Values the checker must refuse because no read could decode them (a commit record
# holding one is refused at replay): bad UTF-8 in a str, a timestamp out of range,
# a map keyed by a map.
UNDECODABLE = {
    "value-str-not-utf8": b"\xa1\xff",
    "value-bad-timestamp": b"\xd7\xff" + b"\xff" * 8,
    "value-unhashable-map-key": b"\x81\x80\x01",
}


def craft(store: Template, make: Crafter) -> Craft:
    """Replace ``store``'s target snapshot by the crafted one; return what was framed."""
    c = make(store.stream, store.meta)
    meta = dataclasses.replace(store.meta, **c.meta)
    frame_snapshot(
        store.target, meta, c.stream, body_bytes=c.body_bytes, tables=c.tables, frame=c.frame
    )
    return c


@contextlib.contextmanager
def sinks_watched() -> Iterator[list[tuple[int, int]]]:
    """``(limit, most written)`` of every body sink used meanwhile (in this process)."""
    seen: dict[int, tuple[int, int]] = {}
    real = CountingSink.write

    def write(self: CountingSink, data: bytes) -> int:
        seen[id(self)] = (self.limit, self.written + len(data))
        return real(self, data)

    out: list[tuple[int, int]] = []
    CountingSink.write = write  # type: ignore[method-assign]
    try:
        yield out
    finally:
        CountingSink.write = real  # type: ignore[method-assign]
        out.extend(seen.values())


def test_the_framing_helper_frames_a_snapshot_that_verifies(store: Template) -> None:
    """The helper itself: the valid stream, framed again, verifies and reads the same."""
    data = frame_snapshot(store.target, store.meta, store.stream)
    assert hashlib.sha256(data[:-FOOTER_SIZE]).digest() == data[-FOOTER_SIZE:-8]
    assert verify_snapshot(FILES, store.target, store_id=store.store_id) == dataclasses.replace(
        store.meta, sha256=data[-FOOTER_SIZE:-8].hex()
    )
    assert stream_state(store.stream) == {t: kv for t, kv in image_tables(extract(store)).items()}
    with statelog.open(store.root, readonly=True) as ro:
        assert ro.recovery.snapshot == store.target and ro.recovery.rejected == ()
        assert store_tables(ro) == store.state["tables"]


def extract(store: Template) -> Path:
    dest = store.root.parent / "extracted.mdb"
    extract_snapshot(FILES, store.target, dest, store_id=store.store_id)
    return dest


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_and_extract_name_the_lie(store: Template, case: str) -> None:
    make, reason, detail = CASES[case]
    craft(store, make)
    started = time.monotonic()
    with sinks_watched() as sinks:
        for portable_only in (False, True):
            with pytest.raises(CorruptionError) as err:
                verify_snapshot(
                    FILES, store.target, store_id=store.store_id, portable_only=portable_only
                )
            assert err.value.reason.startswith(reason), err.value.reason
            assert detail in err.value.reason, err.value.reason
            assert err.value.path == store.target and err.value.hint
        dest = store.root.parent / "extracted.mdb"
        with pytest.raises(CorruptionError) as again:
            extract_snapshot(FILES, store.target, dest, store_id=store.store_id)
        assert again.value.reason == err.value.reason
    # No sink took more than its limit and one write of the decompressor (1 MiB) past it.
    assert all(written <= limit + (1 << 20) for limit, written in sinks), sinks
    assert not dest.exists() and not dest.with_name(dest.name + ".tmp").exists()
    assert list(store.root.parent.glob("extracted*")) == []
    assert time.monotonic() - started < 10, "a crafted body was read for long"


@dataclass
class Ran:
    code: int
    out: str
    err: str


def run_cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> Ran:
    capsys.readouterr()
    code = statelog.cli.main([*map(str, args), "--traceback"])
    got = capsys.readouterr()
    assert "Traceback" not in got.err and "internal error" not in got.err, got.err
    return Ran(code, got.out, got.err)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_entry_point_walks_back_past_the_lie(
    store: Template, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    craft(store, CASES[case][0])
    crafted = store.target.read_bytes()

    # read-only open, then every item
    with statelog.open(store.root, readonly=True) as ro:
        r = ro.recovery
        assert r.snapshot == store.older
        assert [x.path for x in r.rejected] == [store.target] and r.rejected[0].reason
        assert ro.epoch == store.state["epoch"]
        assert store_tables(ro) == store.state["tables"]
        assert (ro.offsets, ro.low_watermark_ms) == (store.state["offsets"], store.state["wm"])

    # the checks name it: verify exits 1 (recoverable), dump prints the same state
    verified = run_cli(capsys, "verify", store.root)
    assert verified.code == 1, verified.out + verified.err
    assert store.target.name in verified.out
    dumped = run_cli(capsys, "dump", store.root, "--json")
    assert dumped.code == 0, dumped.err
    assert dumped.out == store.dump

    # the writer's open
    with statelog.open(store.root) as w:
        assert w.recovery.snapshot == store.older
        assert store_tables(w) == store.state["tables"] and w.epoch == store.state["epoch"]

    # compaction folds from the older snapshot and keeps the crafted one as evidence
    done = compact(store.root)
    assert store.target in done.damaged
    assert done.snapshot is not None and done.base == store.older
    assert store.target.read_bytes() == crafted
    assert state_of(store.root) == store.state


@pytest.mark.parametrize("case", sorted(UNDECODABLE))
def test_a_value_no_read_can_decode_is_refused_as_the_log_refuses_it(
    store: Template, case: str
) -> None:
    """What replay refuses in a commit record, the snapshot check must refuse in a body."""
    from statelog.format.records import decode_value

    raw = UNDECODABLE[case]
    with pytest.raises(Exception):  # noqa: B017 - msgspec's own error types
        decode_value(raw)
    craft(store, with_value(raw))
    with pytest.raises(CorruptionError) as err:
        verify_snapshot(FILES, store.target, store_id=store.store_id)
    assert err.value.reason.startswith("body:"), err.value.reason
    with statelog.open(store.root, readonly=True) as ro:
        assert ro.recovery.snapshot == store.older
        assert store_tables(ro) == store.state["tables"]


@pytest.mark.parametrize("tail", [False, True], ids=["nothing-new", "new-log"])
def test_retention_never_counts_a_snapshot_whose_body_lies(tmp_path: Path, tail: bool) -> None:
    """Retention keeps ``retain`` snapshots that verify: one whose body breaks the stream
    counts as damaged (kept as evidence, never one of the good ones). With nothing new to
    fold the pass writes nothing, so the older snapshot and the log it needs must stay;
    with new log the pass folds from the older one, and the lying one is still kept."""
    root = tmp_path / "store"
    t = build_template(root, tail=tail)
    craft(t, CASES["keys-not-increasing"][0])
    done = compact(root, retain=1)
    assert (done.snapshot is None) == (not tail)
    assert t.target.exists(), "retention deleted the evidence"
    if not tail:
        assert t.older.exists(), "retention deleted the only snapshot that verifies"
    assert state_of(root) == t.state


# -- bounds, without a store ----------------------------------------------------------------


def test_the_body_limit_is_1024_times_the_frame_plus_1_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STATELOG_MAX_SNAPSHOT_BYTES", raising=False)
    assert MAX_RATIO == 1024
    assert body_limit(0) == 1 << 20
    assert body_limit(32_790) == 1024 * 32_790 + (1 << 20)
    monkeypatch.setenv("STATELOG_MAX_SNAPSHOT_BYTES", "5000")
    assert body_limit(32_790) == 5000 and body_limit(1) == 5000
    for ignored in ("0", "-1", "1e9", "x", ""):
        monkeypatch.setenv("STATELOG_MAX_SNAPSHOT_BYTES", ignored)
        assert body_limit(1) == 1024 + (1 << 20)


def test_a_sink_stops_at_its_limit_and_never_writes_past_it() -> None:
    out = bytearray()

    class Out:
        def write(self, data: bytes) -> int:
            out.extend(data)
            return len(data)

    sink = CountingSink(Out(), 10)  # type: ignore[arg-type]
    assert sink.write(b"x" * 10) == 10
    with pytest.raises(BodyTooLarge):
        sink.write(b"y")
    assert bytes(out) == b"x" * 10 and sink.written == 11


def test_the_bomb_is_refused_quickly_without_decompressing(store: Template) -> None:
    frame = zeros_frame(b"", 1024)
    frame_snapshot(store.target, store.meta, b"", body_bytes=1 << 30, frame=frame)
    real = zstandard.ZstdDecompressor

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a body over its limit was handed to the decompressor")

    started = time.monotonic()
    zstandard.ZstdDecompressor = refuse  # type: ignore[misc]
    try:
        for parse in (True, False):
            with pytest.raises(CorruptionError, match="size:"):
                verify_snapshot(FILES, store.target, store_id=store.store_id, parse=parse)
        with pytest.raises(CorruptionError, match="size:"):
            extract_snapshot(FILES, store.target, store.root / "x.mdb", store_id=store.store_id)
    finally:
        zstandard.ZstdDecompressor = real  # type: ignore[misc]
    assert time.monotonic() - started < 2


# -- a bucket: a crafted snapshot, and a format-1 one -----------------------------------------


def test_restore_walks_past_a_crafted_and_a_format_1_snapshot(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
) -> None:
    src = tmp_path / "src"
    client = remote.client()
    with statelog.open(src, segment_bytes=SEG) as st:
        commit_range(st, 1, 50)
    ship(src, remote.url, client=client)
    good = compact(src, retain=5).snapshot
    assert good is not None
    ship(src, remote.url, client=client)

    # The second snapshot as an older store wrote it: format 1 (it ships: it verifies here).
    with statelog.open(src, segment_bytes=SEG) as st:
        commit_range(st, 50, 100)
    ship(src, remote.url, client=client)
    second = compact(src, retain=5).snapshot
    assert second is not None
    meta = verify_snapshot(FILES, second, store_id=None)
    image = tmp_path / "second.mdb"
    extract_snapshot(FILES, second, image, store_id=None)
    second.unlink()
    write_snapshot(FILES, second.parent, meta, image, version=1)
    assert second.read_bytes()[8] == 1
    ship(src, remote.url, client=client)

    # The third, replaced in the bucket by a crafted one (and the manifest re-hashed).
    with statelog.open(src, segment_bytes=SEG) as st:
        commit_range(st, 100, 150)
    ship(src, remote.url, client=client)
    third = compact(src, retain=5).snapshot
    assert third is not None
    ship(src, remote.url, client=client)
    with statelog.open(src, segment_bytes=SEG) as st:
        commit_range(st, 150, 170)
    ship(src, remote.url, client=client)
    want = state_of(src)

    sid = StoreLayout(src).read_identity(FILES)
    cur = read_manifest(client, sid)
    assert cur is not None
    by_name = {e.name: e for e in cur.manifest.snapshots}
    assert set(by_name) == {good.name, second.name, third.name}
    t_meta = verify_snapshot(FILES, third, store_id=sid)
    forged = tmp_path / third.name
    data = frame_snapshot(
        forged, t_meta, CASES["keys-not-increasing"][0](body_of(third), t_meta).stream
    )
    entry = by_name[third.name]
    remote.server.boto().put_object(  # type: ignore[attr-defined]
        Bucket=remote.bucket, Key=f"shard/{entry.key}", Body=data,
        Metadata={"sha256": hashlib.sha256(data).hexdigest()},
    )  # fmt: skip
    from tests.test_remote_hostile import forge_manifest

    def rehash(doc: dict[str, Any]) -> None:
        e = next(e for e in doc["objects"] if e["key"] == entry.key)
        e.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))

    forge_manifest(remote, sid, rehash)

    res = restore(remote.url, tmp_path / "dst", client=client)
    rejected = dict(res.rejected)
    assert list(rejected) == [entry.key, by_name[second.name].key]
    assert rejected[entry.key].startswith("body: record stream")
    assert "format" in rejected[by_name[second.name].key].lower()
    assert res.snapshot == by_name[good.name].key
    assert res.epoch == want["epoch"]
    assert state_of(tmp_path / "dst") == want


# -- the mutation fuzz, in subprocesses -------------------------------------------------------

SPECIAL = [0x00, 0x01, 0x02, 0x7F, 0x80, 0x90, 0x91, 0xC0, 0xC1, 0xC4, 0xDC, 0xDD, 0xFF]


def mutate(stream: bytes, rng: random.Random) -> bytes:
    """One to three random mutations of ``stream``."""
    data = bytearray(stream)
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.randrange(8)
        at = rng.randrange(max(1, len(data)))
        if op == 0 and data:  # a bit flip
            data[at] ^= 1 << rng.randrange(8)
        elif op == 1 and data:  # a byte overwritten
            data[at] = rng.choice([*SPECIAL, rng.randrange(256)])
        elif op == 2:  # cut short
            del data[at:]
        elif op == 3:  # random bytes inserted
            data[at:at] = rng.randbytes(rng.randrange(1, 9))
        else:
            parts = chunks_of(bytes(data))
            if not parts:
                continue
            i = rng.randrange(len(parts))
            if op == 4:  # a chunk repeated
                parts.insert(i, parts[i])
            elif op == 5:  # a chunk dropped
                parts.pop(i)
            elif op == 6 and len(parts) > 1:  # two chunks swapped
                j = rng.randrange(len(parts))
                parts[i], parts[j] = parts[j], parts[i]
            rebuilt = bytearray(join(parts))
            if op == 7:  # a length field rewritten
                offs = [0]
                for _k, p in parts[:-1]:
                    offs.append(offs[-1] + 5 + len(p))
                o = rng.choice(offs)
                n = struct.unpack_from("<I", rebuilt, o + 1)[0]
                new = rng.choice([n + 1, max(0, n - 1), 0, rng.randrange(1 << 32), 1 << 31])
                struct.pack_into("<I", rebuilt, o + 1, new)
            data = rebuilt
    return bytes(data)


def fuzz_cases(stream: bytes, meta: SnapshotMeta, seed: int, n: int) -> list[dict[str, Any]]:
    """``n`` mutated snapshots, each as the worker takes it: stream, declared size, counts."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        mutated = mutate(stream, rng)
        counts = naive_counts(mutated) if rng.random() < 0.7 else None
        out.append(
            {
                "i": i,
                "stream": mutated.hex(),
                "tables": counts if counts is not None else dict(meta.tables),
            }
        )
    return out


def worker() -> None:
    """Run one batch: ``argv[1]`` a JSON job file. One JSON line per case on stdout."""
    job = json.loads(Path(sys.argv[1]).read_text())
    root = Path(job["root"])
    target = Path(job["target"])
    older = Path(job["older"])
    d = job["meta"]
    meta = SnapshotMeta(
        uuid.UUID(d["store_id"]), d["epoch"], d["lsn"], d["chain"], d["offsets"],
        d["low_watermark_ms"], d["tables"], d["body_bytes"], d["created_ms"],
    )  # fmt: skip
    fallback = job["fallback"]
    scratch = Path(job["scratch"])

    def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
        try:
            return "ok", fn()
        except StatelogError as exc:
            return type(exc).__name__, None
        except Exception as exc:
            return f"UNTYPED {type(exc).__name__}: {exc}", None

    dest = scratch / "x.mdb"
    for case in job["cases"]:
        stream = bytes.fromhex(case["stream"])
        frame_snapshot(target, meta, stream, tables=case["tables"])
        oracle = stream_state(stream)
        res: dict[str, Any] = {"i": case["i"]}
        res["verify"], _ = outcome(lambda: verify_snapshot(FILES, target, store_id=meta.store_id))
        res["extract"], _ = outcome(
            lambda: extract_snapshot(FILES, target, dest, store_id=meta.store_id)
        )
        if res["extract"] == "ok":
            if oracle is None:  # accepted, yet a value does not decode: see UNDECODABLE
                res["extract_state"] = "undecodable"
            else:
                res["extract_state"] = "stream" if image_tables(dest) == oracle else "WRONG"
            dest.unlink()
        elif dest.exists() or dest.with_name("x.mdb.tmp").exists():
            res["extract_state"] = "LEFT BEHIND"

        def read(oracle: dict[str, dict[Key, Any]] | None = oracle) -> str:
            with statelog.open(root, readonly=True) as ro:
                tables = store_tables(ro)
                used = ro.recovery.snapshot
                if used == target:
                    return "stream" if tables == oracle else "WRONG"
                if used == older and digest(tables) == fallback:
                    return "fallback"
                return f"WRONG (snapshot {used})"

        res["open"], res["state"] = outcome(read)
        print(json.dumps(res), flush=True)


def digest(tables: dict[str, dict[Key, Any]]) -> str:
    canon = [[t, sorted(kv.items(), key=lambda kv: (isinstance(kv[0], str), kv[0]))]
             for t, kv in sorted(tables.items())]  # fmt: skip
    return hashlib.sha256(msgspec.msgpack.encode(canon)).hexdigest()


@pytest.fixture(scope="module")
def quiet_template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    """No log after the target: an accepted target is the whole state, a refused one the log's."""
    return build_template(tmp_path_factory.mktemp("fuzz") / "store", tail=False)


def run_fuzz(t: Template, tmp_path: Path, seed: int, cases: int, batch: int) -> dict[str, int]:
    """The mutation fuzz: ``cases`` cases in subprocess batches of ``batch``, four at once."""
    meta = t.meta
    meta_doc = {**meta.__dict__, "store_id": str(meta.store_id)}
    fallback = digest(t.state["tables"])
    all_cases = fuzz_cases(t.stream, meta, seed, cases)
    jobs: list[tuple[subprocess.Popen[str], list[dict[str, Any]], float]] = []
    seen: dict[str, int] = {}
    results: list[dict[str, Any]] = []

    def reap(proc: subprocess.Popen[str], todo: list[dict[str, Any]], began: float) -> None:
        try:
            out, err = proc.communicate(timeout=max(1.0, 120 - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            done = len(out.splitlines())
            pytest.fail(f"a batch hung at case {todo[min(done, len(todo) - 1)]['i']} (seed {seed})")
        got = [json.loads(line) for line in out.splitlines()]
        if proc.returncode != 0 or len(got) != len(todo):
            at = todo[min(len(got), len(todo) - 1)]
            pytest.fail(
                f"a batch died (exit {proc.returncode}, signal if negative) at case "
                f"{at['i']} of seed {seed}: stream {at['stream'][:200]}...\n{err[-3000:]}"
            )
        results.extend(got)

    for n, start in enumerate(range(0, cases, batch)):
        work = tmp_path / f"batch-{n}"
        shutil.copytree(t.root, work / "store", symlinks=True)
        (work / "scratch").mkdir()
        todo = all_cases[start : start + batch]
        job = {
            "root": str(work / "store"),
            "target": str(work / "store" / "snapshots" / t.target.name),
            "older": str(work / "store" / "snapshots" / t.older.name),
            "meta": meta_doc,
            "fallback": fallback,
            "scratch": str(work / "scratch"),
            "cases": todo,
        }
        (work / "job.json").write_text(json.dumps(job))
        code = "import sys; from tests.test_hostile_snapshots import worker; worker()"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(work / "job.json")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
        jobs.append((proc, todo, time.monotonic()))
        if len(jobs) == 4:
            reap(*jobs.pop(0))
    while jobs:
        reap(*jobs.pop(0))

    bad = []
    for r in results:
        verdicts = [r["verify"], r["extract"], r["open"], r.get("state") or ""]
        verdicts.append(r.get("extract_state", ""))
        if any(v.startswith(("UNTYPED", "WRONG", "LEFT")) for v in verdicts):
            bad.append(r)
        # The three readers agree: what verify accepts, extraction builds and an open uses.
        if (r["verify"] == "ok") != (r["extract"] == "ok"):
            bad.append(r)
        if r["open"] == "ok" and r["state"] == "stream" and r["verify"] != "ok":
            bad.append(r)
        key = "accepted" if r["verify"] == "ok" else f"refused:{r['verify']}"
        seen[key] = seen.get(key, 0) + 1
        if r.get("extract_state") == "undecodable":
            seen["accepted-undecodable"] = seen.get("accepted-undecodable", 0) + 1
    assert not bad, f"seed {seed}: {bad[:5]}"
    assert len(results) == cases
    return seen


def test_mutated_streams_give_typed_errors_or_their_own_state(
    quiet_template: Template, tmp_path: Path
) -> None:
    seen = run_fuzz(quiet_template, tmp_path, seed=20240, cases=240, batch=60)
    assert seen.get("refused:CorruptionError", 0) > 200, seen  # most mutations break a rule


@pytest.mark.stress
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_mutated_streams_stress(quiet_template: Template, tmp_path: Path, seed: int) -> None:
    run_fuzz(quiet_template, tmp_path, seed=seed, cases=1000, batch=100)
