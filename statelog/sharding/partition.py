"""Partitioners and the ``SHARDS`` manifest of a sharded root.

A sharded root fixes, once and for all, how many shards it has and how a key
picks its shard. Both live in ``ROOT/SHARDS``, a small JSON file written
durably (temp file, fsync, rename, fsync of the root) when the root is
created and never rewritten. Changing the shard count or the partitioning
would move keys between shards, which nothing here migrates: a reopen with
other parameters is refused with :class:`ShardMismatchError`.

Routing must give the same shard in every process, on every machine and
under every Python version, so it never uses ``hash()`` (salted per
process). Keys are turned into canonical bytes (:func:`key_bytes`: a type
tag, then the raw bytes or the UTF-8 text), which is also the order the
store lists keys in, so range boundaries and ``items()`` agree.

:func:`expand_stores` reads only manifests: it lets one compactor daemon
serve every shard of a root without opening any shard.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from statelog.errors import (
    CorruptionError,
    FormatVersionError,
    InvalidCommitError,
    InvalidOptionError,
    StatelogError,
    StorageError,
)
from statelog.storage.fileio import FileLayer
from statelog.storage.layout import parse_json_doc

__all__ = [
    "MANIFEST",
    "MANIFEST_VERSION",
    "MAX_SHARDS",
    "Partition",
    "ShardManifest",
    "ShardMismatchError",
    "expand_stores",
    "key_bytes",
    "read_manifest",
    "shard_dir_name",
    "source_shard",
    "write_manifest",
]

MANIFEST = "SHARDS"
MANIFEST_VERSION = 1
MAX_SHARDS = 9999  # shard directories are named with four digits
_KIND = "statelog-shards"
# 9,998 boundaries of up to 500 key bytes, each escaped up to 6 characters a byte.
_MAX_MANIFEST_BYTES = 64 << 20
_HINT = "restore SHARDS from a backup of this root; nothing was changed"
HASH_SCHEME = "blake2b64-tagged"
"""Named in the manifest so that a future scheme is refused, never silently mixed."""
_KEY_PERSON = b"statelog.key"
_SOURCE_PERSON = b"statelog.source"

Partition = Literal["hash", "range"]
Key = str | bytes


class ShardMismatchError(StatelogError):
    """A sharded root was reopened with a shard count or partitioning other than its manifest's."""

    hint = (
        "reopen without shards=, partition= and boundaries= to use the root's SHARDS "
        "manifest; resharding is not supported (copy the state into a new root); "
        "nothing was changed"
    )


def shard_dir_name(index: int) -> str:
    """The directory of shard ``index`` under the root: ``shard-0000``, ``shard-0001``, ..."""
    return f"shard-{index:04d}"


def key_bytes(key: Key) -> bytes:
    """The canonical bytes of a key: tag ``0x00`` + raw bytes, or tag ``0x01`` + UTF-8 text.

    Sorting by these bytes is the store's key order (every bytes key before
    every str key, each kind bytewise); hashing them is stable everywhere.

    :raises InvalidCommitError: the key is neither str nor bytes, or is not valid UTF-8.
    """
    if isinstance(key, bytes):
        return b"\x00" + key
    if isinstance(key, str):
        try:
            return b"\x01" + key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidCommitError(f"key {key!r} cannot be encoded as UTF-8: {exc}") from exc
    raise InvalidCommitError(
        f"keys are str or bytes, not {type(key).__name__}", hint="pass a str or bytes key"
    )


def _digest64(data: bytes, person: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=person).digest(), "big")


def source_shard(partition: str, shards: int) -> int:
    """The shard that keeps the offsets of source partition ``partition`` in a split commit.

    :raises InvalidCommitError: ``partition`` is not a str.
    """
    if not isinstance(partition, str):
        raise InvalidCommitError(f"partition names are str, not {type(partition).__name__}")
    try:
        raw = partition.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidCommitError(f"partition {partition!r} is not valid UTF-8") from exc
    return _digest64(raw, _SOURCE_PERSON) % shards


@dataclass(frozen=True)
class ShardManifest:
    """What ``ROOT/SHARDS`` fixes: the shard count and how keys are routed."""

    shards: int
    partition: Partition
    boundaries: tuple[Key, ...] = ()

    @classmethod
    def build(cls, shards: object, partition: object, boundaries: object) -> ShardManifest:
        """Check the parameters of a new root.

        :raises InvalidOptionError: a bad count, an unknown partitioning, or
            boundaries that are missing, unsorted, duplicated or of a bad type.
        """
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise InvalidOptionError(
                f"shards={shards!r}", hint=f"an int from 1 to {MAX_SHARDS}; nothing was changed"
            )
        if partition == "hash":
            if boundaries not in (None, (), []):
                raise InvalidOptionError(
                    "boundaries= is only for partition='range'",
                    hint="drop boundaries= or use partition='range'; nothing was changed",
                )
            return cls(shards, "hash")
        if partition != "range":
            raise InvalidOptionError(
                f"partition={partition!r}", hint="use 'hash' or 'range'; nothing was changed"
            )
        if isinstance(boundaries, str | bytes) or not isinstance(boundaries, Sequence):
            raise InvalidOptionError(
                f"boundaries={boundaries!r}",
                hint=f"a sorted list of {shards - 1} str or bytes keys; nothing was changed",
            )
        keys = tuple(boundaries)
        if len(keys) != shards - 1:
            raise InvalidOptionError(
                f"{len(keys)} boundaries for {shards} shards",
                hint=f"give shards - 1 = {shards - 1} boundary keys; nothing was changed",
            )
        try:
            raw = [key_bytes(k) for k in keys]
        except InvalidCommitError as exc:
            raise InvalidOptionError(f"boundaries: {exc.message}") from None
        if any(a >= b for a, b in itertools.pairwise(raw)):
            raise InvalidOptionError(
                "boundaries are not strictly increasing",
                hint="sort them in store key order (bytes keys before str keys) without "
                "repeats; nothing was changed",
            )
        return cls(shards, "range", keys)

    def shard_for(self, key: Key) -> int:
        """The shard holding ``key``: stable across processes, machines and Python versions.

        Hash: blake2b (64 bits, personalised) of :func:`key_bytes`, modulo the
        shard count. Range: shard ``i`` holds ``boundaries[i-1] <= key <
        boundaries[i]`` in store key order.

        :raises InvalidCommitError: the key is neither str nor bytes.
        """
        raw = key_bytes(key)
        if self.partition == "hash":
            return _digest64(raw, _KEY_PERSON) % self.shards
        return bisect.bisect_right(self._raw_boundaries, raw)

    @property
    def _raw_boundaries(self) -> list[bytes]:
        cached: list[bytes] | None = self.__dict__.get("_raw_cache")
        if cached is None:
            cached = [key_bytes(k) for k in self.boundaries]
            object.__setattr__(self, "_raw_cache", cached)
        return cached

    def mismatches(self, shards: object, partition: object, boundaries: object) -> list[str]:
        """The parameters given (None: not given) that differ from this manifest."""
        out: list[str] = []
        if shards is not None and shards != self.shards:
            out.append(f"shards={shards!r} (manifest: {self.shards})")
        if partition is not None and partition != self.partition:
            out.append(f"partition={partition!r} (manifest: {self.partition!r})")
        if boundaries is not None:
            given = tuple(boundaries) if isinstance(boundaries, Sequence) else boundaries
            if given != self.boundaries:
                out.append(f"boundaries={boundaries!r} (manifest: {list(self.boundaries)!r})")
        return out

    def encode(self) -> bytes:
        """The manifest file's bytes (JSON; bytes keys as hex)."""
        doc: dict[str, Any] = {
            "kind": _KIND,
            "version": MANIFEST_VERSION,
            "shards": self.shards,
            "partition": self.partition,
            "hash": HASH_SCHEME,
            "boundaries": [
                {"bytes": k.hex()} if isinstance(k, bytes) else {"str": k} for k in self.boundaries
            ],
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        return (json.dumps(doc, indent=1) + "\n").encode()

    @classmethod
    def decode(cls, path: Path, raw: bytes) -> ShardManifest:
        """Parse and check a manifest file.

        :raises FormatVersionError: a manifest version this statelog does not read.
        :raises CorruptionError: not a statelog shard manifest, or inconsistent.
        """
        try:
            doc = parse_json_doc(raw, max_bytes=_MAX_MANIFEST_BYTES)
            kind, version = doc["kind"], doc["version"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(path, 0, f"unreadable shard manifest: {exc}", hint=_HINT) from exc
        if kind != _KIND or not isinstance(version, int) or isinstance(version, bool):
            raise CorruptionError(
                path, 0, f"not a statelog shard manifest: {doc!r:.200}", hint=_HINT
            )
        if version != MANIFEST_VERSION:
            raise FormatVersionError(path, version, MANIFEST_VERSION)
        try:
            if doc["hash"] != HASH_SCHEME:
                raise ValueError(f"unknown hash scheme {doc['hash']!r}")
            keys: list[Key] = [
                bytes.fromhex(b["bytes"]) if "bytes" in b else str(b["str"])
                for b in doc["boundaries"]
            ]
            return cls.build(doc["shards"], doc["partition"], keys or None)
        except (ValueError, KeyError, TypeError, AttributeError, InvalidOptionError) as exc:
            raise CorruptionError(
                path, 0, f"inconsistent shard manifest: {exc}", hint=_HINT
            ) from exc


def read_manifest(root: Path, files: FileLayer | None = None) -> ShardManifest | None:
    """The manifest of ``root``, or None if it has none.

    :raises CorruptionError: the manifest is damaged.
    :raises FormatVersionError: a newer manifest version.
    :raises StorageError: an I/O error reading it (never taken for damage).
    """
    path = root / MANIFEST
    try:
        raw = (files or FileLayer()).read(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise StorageError(f"reading {path} failed: {exc}", errno=exc.errno) from exc
    manifest = ShardManifest.decode(path, raw)
    _check_no_extra_shards(root, path, manifest.shards)
    return manifest


_SHARD_DIR = re.compile(r"shard-(\d{4})")


def _check_no_extra_shards(root: Path, path: Path, shards: int) -> None:
    """Refuse a manifest naming fewer shards than the root holds directories for.

    Opening it would hide the keys of the shards beyond the count and route
    new commits by the wrong count; the count never changes after creation.

    :raises CorruptionError: a ``shard-NNNN`` directory at or past ``shards``.
    :raises StorageError: the root could not be listed.
    """
    try:
        names = [e.name for e in os.scandir(root) if e.is_dir()]
    except OSError as exc:
        raise StorageError(f"listing {root} failed: {exc}", errno=exc.errno) from exc
    extra = sorted(n for n in names if (m := _SHARD_DIR.fullmatch(n)) and int(m[1]) >= shards)
    if extra:
        raise CorruptionError(
            path,
            0,
            f"names {shards} shard(s) but {len(extra)} more shard director"
            f"{'y' if len(extra) == 1 else 'ies'} exist: {', '.join(extra[:5])}",
            hint="the shard count never changes after creation: " + _HINT,
        )


def write_manifest(root: Path, manifest: ShardManifest, files: FileLayer) -> Path:
    """Write ``ROOT/SHARDS`` durably: temp file, fsync, rename, fsync of ``root``.

    A crash leaves either no manifest or the whole one (plus, at worst,
    ``SHARDS.tmp``, which the next creation removes).

    :raises StorageError: a step failed; no manifest is visible.
    """
    path = root / MANIFEST
    try:
        files.create_durable(path, manifest.encode())
    except OSError as exc:
        raise StorageError(f"writing {path} failed: {exc}", errno=exc.errno) from exc
    return path


def expand_stores(paths: Sequence[Path]) -> list[Path]:
    """Replace every sharded root (a directory with ``SHARDS``) by its shard directories.

    Plain store paths are kept as given, in order; nothing is opened or changed.

    :raises CorruptionError: a root's manifest is damaged.
    :raises FormatVersionError: a manifest of a newer version.
    :raises StorageError: a manifest could not be read.
    """
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        manifest = read_manifest(path)
        if manifest is None:
            out.append(path)
        else:
            out.extend(path / shard_dir_name(i) for i in range(manifest.shards))
    return out
