"""Reads and writes of a :class:`~statelog.sharding.sharded.ShardedStore`, routed to its shards.

Reads route one key to its shard (``get``) or merge every shard (``items``
in store key order, ``count``, ``tables``, ``offsets``, the watermark).
Writes are atomic per shard only: :meth:`ShardAccess.commit` splits one
call into one commit per shard it touches, validating every part against
its shard before any shard writes; :meth:`ShardAccess.commit_shard` is one
atomic commit on one shard, the unit a reconciler should build on.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statelog.errors import (
    InvalidCommitError,
    InvalidOptionError,
    StatelogError,
    StoreClosedError,
    UnknownTableError,
)
from statelog.sharding.partition import Key, ShardManifest, key_bytes, source_shard
from statelog.store.store import StateStore
from statelog.store.validate import check_offsets, check_watermark, table_delta

__all__ = ["ShardAccess", "ShardCommitError"]

log = logging.getLogger("statelog.sharding.sharded")

_EMPTY: Mapping[Any, Any] = types.MappingProxyType({})


class ShardCommitError(StatelogError):
    """A commit split over several shards failed part-way: the shards in ``committed`` kept it."""

    hint = (
        "commits are atomic per shard, not across shards: the shards in .committed hold "
        "their part; retry the failed shard's part, or keep each source partition in one shard"
    )

    def __init__(self, shard: int, committed: Mapping[int, int], cause: StatelogError) -> None:
        super().__init__(
            f"shard {shard} refused its part of a split commit ({cause.message}); "
            f"shards {sorted(committed)} had already committed theirs"
        )
        self.shard = shard
        self.committed = dict(committed)
        self.cause = cause


@dataclass
class _Part:
    offsets: dict[str, int] = field(default_factory=dict)
    put: dict[Key, Any] = field(default_factory=dict)
    delete: list[Key] = field(default_factory=list)


class ShardAccess:
    """Mixed into ShardedStore, which sets ``root``, ``manifest`` and ``_lock``."""

    root: Path
    manifest: ShardManifest
    _lock: threading.RLock
    _tables_seen: set[str]

    def shard(self, index: int) -> StateStore:
        """Shard ``index``'s store (ShardedStore opens it on first use)."""
        raise NotImplementedError

    def _check_writable(self) -> None:
        raise NotImplementedError

    def shard_for(self, key: Key) -> int:
        """The shard that holds ``key`` (stable across processes and Python versions).

        :raises InvalidCommitError: ``key`` is neither str nor bytes.
        """
        return self.manifest.shard_for(key)

    def _every(self) -> list[StateStore]:
        return [self.shard(i) for i in range(self.manifest.shards)]

    def _check_index(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, int):
            raise InvalidOptionError(f"shard index {index!r}", hint="an int")
        if not 0 <= index < self.manifest.shards:
            raise InvalidOptionError(
                f"shard {index} does not exist", hint=f"0 <= index < {self.manifest.shards}"
            )
        return index

    # -- reads -----------------------------------------------------------
    def get(self, key: Key, default: Any = None, table: str = "default") -> Any:
        """The value of ``key`` from its shard (a fresh object), or ``default``.

        :raises UnknownTableError: no shard has ``table`` and it is not declared.
        :raises ShardOpenError: the key's shard is unavailable.
        """
        shard = self.shard(self.shard_for(key))
        try:
            return shard.get(key, default, table)
        except UnknownTableError:  # another shard may have it: the table is the store's
            self._check_table(table)
            return default

    def items(self, table: str = "default", prefix: Key | None = None) -> Iterator[tuple[Key, Any]]:
        """``(key, value)`` pairs of ``table`` across every shard, in store key order.

        Each shard's pairs are taken when iteration starts; the merged view is
        not one point in time across shards (commits are per shard).

        :raises UnknownTableError: no shard has ``table`` and it is not declared.
        :raises ShardOpenError: a shard is unavailable.
        """
        self._check_table(table)
        shards = [s for s in self._every() if s.has_table(table)]
        parts = [s.items(table, prefix) for s in shards]
        if self.manifest.partition == "range":
            return itertools.chain.from_iterable(parts)  # shard i's keys all sort before i+1's
        return heapq.merge(*parts, key=lambda kv: key_bytes(kv[0]))

    def count(self, table: str = "default") -> int:
        """Live keys of ``table`` summed over every shard.

        :raises UnknownTableError: no shard has ``table`` and it is not declared.
        """
        self._check_table(table)
        return sum(s.count(table) for s in self._every() if s.has_table(table))

    def tables(self) -> list[str]:
        """Names of the tables written in any shard or declared, sorted."""
        return sorted({t for s in self._every() for t in s.tables()})

    def has_table(self, table: str) -> bool:
        """Whether ``table`` may be read: some shard has it, or it is declared, or ``"default"``.

        A table seen once stays readable for this object's life (emptied, it reads
        as empty), so a read routed to a shard that lacks it does not ask every
        shard again.
        """
        if table in self._tables_seen:
            return True
        if any(s.has_table(table) for s in self._every()):
            self._tables_seen.add(table)
            return True
        return False

    def _check_table(self, table: str) -> None:
        """:raises UnknownTableError: no shard has ``table``; the message lists the tables."""
        if not self.has_table(table):
            known = ", ".join(self.tables())
            raise UnknownTableError(f"table {table!r} does not exist in {self.root} ({known})")

    @property
    def epochs(self) -> dict[int, int]:
        """Each shard's epoch: shards commit independently, so there is no single epoch."""
        return {i: s.epoch for i, s in enumerate(self._every())}

    @property
    def offsets(self) -> dict[str, int]:
        """Every partition's committed offset; one kept in several shards shows its lowest.

        The lowest is the safe point to resume from: no shard has missed
        anything before it. Keep each partition in one shard to avoid replays.
        """
        merged: dict[str, int] = {}
        for s in self._every():
            for p, off in s.offsets.items():
                merged[p] = min(off, merged.get(p, off))
        return merged

    @property
    def low_watermark_ms(self) -> int:
        """The lowest watermark of any shard: what every shard has sealed."""
        return min(s.low_watermark_ms for s in self._every())

    # -- writes ----------------------------------------------------------
    def commit(
        self,
        *,
        offsets: Mapping[str, int] = _EMPTY,
        low_watermark_ms: int,
        put: Mapping[Any, Any] = _EMPTY,
        delete: Iterable[Key] = (),
        table: str = "default",
    ) -> dict[int, int]:
        """Split one commit by shard and commit each part: NOT atomic across shards.

        Puts and deletes go to their keys' shards; each offset goes to the
        shard :func:`statelog.sharding.partition.source_shard` names for its partition;
        the watermark goes to every shard that receives a part (to every
        shard when nothing else is given). Every part is validated against
        its shard before any shard writes, so bad input changes nothing.
        Each shard then commits its part as its own atomic commit, in shard order.

        :returns: the new epoch of every shard that committed, by shard index.
        :raises InvalidCommitError: bad input; nothing was written.
        :raises ShardOpenError: a target shard is unavailable; nothing was written.
        :raises ShardCommitError: a shard failed after others had committed
            (``committed`` names them).
        :raises StorageError: the first shard's write or sync failed; nothing is visible.
        """
        with self._lock:
            self._check_writable()
            if not isinstance(put, Mapping):
                raise InvalidCommitError(f"put= must be a mapping, not {type(put).__name__}")
            if isinstance(delete, str | bytes):
                raise InvalidCommitError(
                    "delete= must be an iterable of keys, not a single key",
                    hint="wrap a single key in a tuple: delete=(key,)",
                )
            if not isinstance(offsets, Mapping):
                raise InvalidCommitError(
                    f"offsets= must be a mapping, not {type(offsets).__name__}"
                )
            n = self.manifest.shards
            parts: dict[int, _Part] = {}
            for p, off in offsets.items():
                parts.setdefault(source_shard(p, n), _Part()).offsets[p] = off
            for k, v in put.items():
                parts.setdefault(self.shard_for(k), _Part()).put[k] = v
            for k in delete:
                parts.setdefault(self.shard_for(k), _Part()).delete.append(k)
            if not parts:
                parts = {i: _Part() for i in range(n)}
            return self._commit_parts(sorted(parts.items()), low_watermark_ms, table)

    def commit_shard(
        self,
        index: int,
        *,
        offsets: Mapping[str, int] = _EMPTY,
        low_watermark_ms: int,
        put: Mapping[Any, Any] = _EMPTY,
        delete: Iterable[Key] = (),
        table: str = "default",
    ) -> int:
        """One atomic commit on shard ``index``: the way to keep a source partition whole.

        Every key must belong to that shard; ``offsets`` are stored there as given.

        :returns: the shard's new epoch.
        :raises InvalidCommitError: bad input or a key of another shard; nothing was written.
        :raises ShardOpenError: the shard is unavailable.
        :raises StorageError: the write or sync failed; the commit is not visible.
        """
        with self._lock:
            self._check_writable()
            idx = self._check_index(index)
            if not isinstance(put, Mapping) or isinstance(delete, str | bytes):
                raise InvalidCommitError("put= must be a mapping and delete= an iterable of keys")
            dels = list(delete)
            for k in itertools.chain(put.keys(), dels):
                home = self.shard_for(k)
                if home != idx:
                    raise InvalidCommitError(
                        f"key {k!r} belongs to shard {home}, not shard {idx}",
                        hint="route keys with shard_for(); nothing was written",
                    )
            part = _Part(dict(offsets), dict(put), dels)
            return self._commit_parts([(idx, part)], low_watermark_ms, table)[idx]

    def _commit_parts(
        self, parts: list[tuple[int, _Part]], low_watermark_ms: int, table: str
    ) -> dict[int, int]:
        """Validate every part against its shard, then commit them in order. Holds ``_lock``."""
        staged = []
        for i, part in parts:
            store = self.shard(i)
            if store.closed:
                raise StoreClosedError(f"shard {i} of {self.root} is closed")
            offs = check_offsets(part.offsets, store.offsets)
            wm = check_watermark(low_watermark_ms, store.low_watermark_ms)
            staged.append((i, store, offs, wm, table_delta(table, part.put, part.delete)))
        committed: dict[int, int] = {}
        for i, store, offs, wm, delta in staged:
            try:
                # The delta is already validated and encoded: hand it over as a transaction does.
                committed[i] = store._commit_transaction(offs, wm, [delta])
            except StatelogError as exc:
                if not committed:
                    raise
                log.error(
                    "root=%s event=split_commit_partial shard=%d committed=%s error=%s",
                    self.root,
                    i,
                    sorted(committed),
                    type(exc).__name__,
                )
                raise ShardCommitError(i, committed, exc) from exc
        return committed
