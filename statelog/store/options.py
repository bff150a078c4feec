"""The settings of a store: one frozen, validated :class:`StoreOptions`.

``statelog.open(path, **options)`` and ``statelog.open(path, options=StoreOptions(...))``
end here alike. Every check runs in the constructor, before the store
touches a file, so a bad option creates and changes nothing; each refusal
is an :class:`~statelog.errors.InvalidOptionError` with a hint. The
``remote=`` URL and the ``AWS_*`` environment are parsed here too, so a bad
one fails before anything is restored, created or contacted.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from statelog.errors import InvalidOptionError
from statelog.storage.fileio import FileLayer
from statelog.store.option_checks import (
    check_at_option,
    check_chain_options,
    check_compactor_options,
    check_declared_tables,
    check_follow_options,
    check_overlay_options,
    check_remote_options,
    check_sizes,
    check_store_path,
)

__all__ = [
    "CompactorMode",
    "Durability",
    "StoreOptions",
    "check_at_option",
    "check_chain_options",
    "check_compactor_options",
    "check_follow_options",
    "check_overlay_options",
    "check_remote_options",
    "check_sizes",
    "check_store_path",
    "resolve_options",
]

Durability = Literal["commit", "group", "none"]
CompactorMode = Literal["none", "thread", "process"]

_MiB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreOptions:
    """Every option of :class:`~statelog.store.store.StateStore`, checked once.

    Build it with keywords (``StoreOptions(durability="group")``) or from a
    mapping of names (:meth:`from_kwargs`, which refuses an unknown name);
    change one with :func:`dataclasses.replace`, which checks again.

    :raises InvalidOptionError: a value out of range or of the wrong type, or
        a combination that cannot work (``remote`` with ``readonly=True`` or
        with an in-process compactor); the message names the option.
    :raises RemoteConfigError: ``remote`` is not a usable URL, or the
        ``AWS_*`` environment is unusable.
    """

    durability: Durability = "commit"
    """``"commit"`` fsyncs before ``commit`` returns; ``"group"`` fsyncs in the
    background within ``group_delay``; ``"none"`` never syncs until close or
    ``flush`` (tests and benchmarks only: a power cut loses recent commits)."""
    tables: tuple[str, ...] = ()
    """The tables the application reads before it first writes them. Reading a
    table that is neither declared here nor was ever written (nor ``"default"``)
    raises :class:`~statelog.errors.UnknownTableError`, so a misspelled name is
    an error, not an empty table. Any iterable of names; kept as a tuple."""
    group_delay: timedelta = timedelta(milliseconds=2)
    """With ``durability="group"``: the longest a commit waits to be synced, in (0, 10 s]."""
    segment_bytes: int = 64 * _MiB
    """Roll to a new segment past this size (4096 to 2**32-1)."""
    fragment_bytes: int | None = None
    """Split records larger than this into fragments; None: 16 MiB, or
    ``segment_bytes`` if smaller (see :attr:`fragment_size`)."""
    max_record_bytes: int = 64 * _MiB
    """Refuse commits whose record is larger."""
    readonly: bool = False
    """Read the last durable state without taking the writer's lock."""
    at: int | datetime | None = None
    """With ``readonly``: the state as of this epoch, or of the last epoch committed at or
    before this time (a datetime with a time zone), instead of the newest
    (``docs/cli.md``, "Point in time")."""
    strict: bool = False
    """Raise :class:`~statelog.errors.CorruptionError` on damage before the log's
    tail instead of recovering to the last good commit."""
    base_refresh: timedelta = timedelta(seconds=1)
    """How often the writer looks for a new snapshot to use as its base level."""
    compactor: CompactorMode = "none"
    """``"none"``: run the ``statelog-compactor`` daemon; ``"process"`` or
    ``"thread"``: start one with the writer."""
    compactor_interval: timedelta = timedelta(seconds=30)
    """How often the in-process compactor runs a pass."""
    min_tail_bytes: int = 64 * _MiB
    """The in-process compactor folds once this many sealed log bytes accumulated."""
    retain: int = 3
    """Snapshots the in-process compactor keeps."""
    max_chain: int = 8
    """The most delta snapshots the in-process compactor writes above a full one,
    0 to 64 (0: every pass writes a full snapshot)."""
    full_ratio: float = 0.5
    """The in-process compactor writes a full snapshot once the chain's delta
    bytes would exceed this fraction of the full snapshot's body, in (0, 10]."""
    max_overlay_bytes: int | None = None
    """The most log bytes of commits no snapshot has folded yet that the writer holds in
    memory (its overlay); a commit past it waits for the compactor's next snapshot, up to
    ``overlay_wait``, then raises :class:`~statelog.errors.WriteStallError`. At least
    twice ``segment_bytes`` (the compactor folds only sealed segments). None: no bound."""
    overlay_wait: timedelta = timedelta(seconds=60)
    """How long a commit waits for the overlay to shrink under ``max_overlay_bytes``."""
    remote: str | None = None
    """``s3://bucket/prefix`` of the store's remote copy (writer only, with
    ``compactor="none"``; ``docs/remote.md``)."""
    remote_check: timedelta = timedelta(seconds=5)
    """With ``remote``: how often the writer re-checks that its generation owns the store."""
    max_ship_lag: timedelta | None = None
    """The longest an acknowledged commit stays in an unsealed segment, which shipping
    cannot take: the writer seals the active segment once its oldest record is this old.
    None: 1 s for a shipped store (``remote=``, or a shipping daemon's ``remote.json``
    found), no bound otherwise (``docs/remote.md``, "A recovery point in seconds")."""
    follow: Path | str | None = None
    """A store directory (on a shared file system) or the ``s3://bucket/prefix`` it ships to,
    to follow: the store at ``path`` is then its standby, a local copy that keeps applying
    what the source publishes and serves reads; :meth:`~statelog.store.store.StateStore.promote`
    makes it the writer (``docs/standby.md``)."""
    follow_poll: timedelta = timedelta(milliseconds=500)
    """With ``follow``: how often the standby looks at its source."""
    file_layer: FileLayer | None = None
    """The file operations the store goes through (None: the real file system)."""

    def __post_init__(self) -> None:
        for name in _DURATIONS:  # seconds as a number are taken, and kept as a timedelta
            value = getattr(self, name)
            if value.__class__ in (int, float):
                object.__setattr__(self, name, _seconds(name, value))
        object.__setattr__(self, "tables", check_declared_tables(self.tables))
        check_sizes(
            self.durability,
            self.group_delay,
            self.segment_bytes,
            self.fragment_size,
            self.max_record_bytes,
        )
        for name, flag in (("readonly", self.readonly), ("strict", self.strict)):
            if not isinstance(flag, bool):
                raise InvalidOptionError(f"{name}={flag!r}", hint="pass True or False")
        check_compactor_options(
            self.compactor, self.compactor_interval, self.min_tail_bytes, self.retain
        )
        check_chain_options(self.max_chain, self.full_ratio)
        check_overlay_options(self.max_overlay_bytes, self.overlay_wait, self.segment_bytes)
        refresh = self.base_refresh
        if not isinstance(refresh, timedelta) or refresh <= timedelta(0):
            raise InvalidOptionError(f"base_refresh={refresh!r}", hint="a positive timedelta")
        check_remote_options(self.remote, self.remote_check, self.readonly, self.compactor)
        lag = self.max_ship_lag
        if lag is not None and (
            not isinstance(lag, timedelta) or not _MIN_SHIP_LAG <= lag <= _MAX_SHIP_LAG
        ):
            raise InvalidOptionError(
                f"max_ship_lag={lag!r}", hint="a timedelta from 10 ms to 1 day, or None"
            )
        check_follow_options(self.follow, self.follow_poll, self.remote, self.compactor)
        check_at_option(self.at, self.readonly, self.follow)
        if self.file_layer is not None and not isinstance(self.file_layer, FileLayer):
            raise InvalidOptionError(
                f"file_layer={self.file_layer!r}",
                hint="a statelog.storage.fileio.FileLayer, or None for the real file system",
            )

    @classmethod
    def from_kwargs(cls, **options: Any) -> StoreOptions:
        """The options named in ``options``; the others keep their defaults.

        :raises InvalidOptionError: a name that is no option (the hint names
            the closest option), or a bad value (as the constructor).
        """
        for name in options:
            if name not in _NAMES:
                raise _unknown(name)
        return cls(**options)

    @property
    def fragment_size(self) -> int:
        """``fragment_bytes``, or its default for this ``segment_bytes``."""
        if self.fragment_bytes is not None:
            return self.fragment_bytes
        # Large: a reader hands out a one-frame record's payload without copying it,
        # where a fragmented one is joined into a copy first (a restore, a recovery
        # and a fold each read every record of the tail).
        segment = self.segment_bytes
        return min(16 * _MiB, segment) if isinstance(segment, int) else 16 * _MiB


_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StoreOptions))
_DURATIONS = tuple(f.name for f in dataclasses.fields(StoreOptions) if "timedelta" in str(f.type))


def _seconds(name: str, value: float) -> timedelta:
    try:
        return timedelta(seconds=value)
    except (OverflowError, ValueError):  # inf, nan, or past timedelta's range
        raise InvalidOptionError(
            f"{name}={value!r}", hint="a timedelta, or seconds as a finite number"
        ) from None


_MIN_SHIP_LAG = timedelta(milliseconds=10)
_MAX_SHIP_LAG = timedelta(days=1)


def _unknown(name: str) -> InvalidOptionError:
    close = difflib.get_close_matches(name, _NAMES, n=1)
    hint = f"did you mean {close[0]}=?" if close else f"the options are {', '.join(_NAMES)}"
    return InvalidOptionError(f"{name}= is not an option of statelog.open", hint=hint)


def resolve_options(options: StoreOptions | None, kwargs: Mapping[str, Any]) -> StoreOptions:
    """A store's options from ``options=`` or from keywords: one or the other.

    :raises InvalidOptionError: both given, ``options`` of the wrong type,
        or an unknown or bad keyword.
    """
    if options is None:
        return StoreOptions.from_kwargs(**kwargs)
    if not isinstance(options, StoreOptions):
        raise InvalidOptionError(
            f"options={options!r}", hint="pass a statelog.StoreOptions, or keyword options"
        )
    if kwargs:
        raise InvalidOptionError(
            f"options= and keyword options ({', '.join(sorted(kwargs))}) were both given",
            hint="pass one of them: dataclasses.replace(options, name=value) changes one option",
        )
    return options
