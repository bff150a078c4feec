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
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from statelog.compaction.delta import ChainPolicy
from statelog.errors import InvalidOptionError
from statelog.storage.fileio import FileLayer

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
    group_delay: timedelta = timedelta(milliseconds=2)
    """With ``durability="group"``: the longest a commit waits to be synced, in (0, 10 s]."""
    segment_bytes: int = 64 * _MiB
    """Roll to a new segment past this size (4096 to 2**32-1)."""
    fragment_bytes: int | None = None
    """Split records larger than this into fragments; None: 1 MiB, or
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
        segment = self.segment_bytes
        return min(_MiB, segment) if isinstance(segment, int) else _MiB


_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StoreOptions))
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


def check_sizes(durability: Any, delay: Any, segment: Any, fragment: Any, max_record: Any) -> None:
    """Validate the durability mode, ``group_delay`` and the three sizes.

    :raises InvalidOptionError: an unknown durability, a delay outside (0, 10 s],
        or a size out of range.
    """
    if durability not in ("commit", "group", "none"):
        raise InvalidOptionError(
            f"durability={durability!r}", hint='use "commit", "group" or "none"'
        )
    if not isinstance(delay, timedelta) or not timedelta(0) < delay <= timedelta(seconds=10):
        raise InvalidOptionError(f"group_delay={delay!r}", hint="a timedelta in (0, 10 s]")
    for name, value, low in (
        ("segment_bytes", segment, 4096),
        ("fragment_bytes", fragment, 64),
        ("max_record_bytes", max_record, 64),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 1 << 32:
            raise InvalidOptionError(f"{name}={value!r}", hint=f"an int from {low} to 2**32-1")
    if fragment > segment:
        raise InvalidOptionError(
            "fragment_bytes is larger than segment_bytes",
            hint="a record fragment must fit in a segment: lower fragment_bytes",
        )


def check_compactor_options(
    mode: object, interval: object, min_tail_bytes: object, retain: object
) -> None:
    """:raises InvalidOptionError: an unknown compactor mode or a bad setting of it."""
    if mode not in ("none", "thread", "process"):
        raise InvalidOptionError(f"compactor={mode!r}", hint='use "none", "thread" or "process"')
    if not isinstance(interval, timedelta) or interval <= timedelta(0):
        raise InvalidOptionError(f"compactor_interval={interval!r}", hint="a positive timedelta")
    if (
        not isinstance(min_tail_bytes, int)
        or not isinstance(retain, int)
        or min_tail_bytes < 0
        or retain < 1
    ):
        raise InvalidOptionError(
            f"min_tail_bytes={min_tail_bytes!r} retain={retain!r}",
            hint="min_tail_bytes >= 0 and retain >= 1",
        )


def check_chain_options(max_chain: object, full_ratio: object) -> None:
    """Validate the in-process compactor's chain limits when the store opens, before any
    file is touched rather than at the first pass: :meth:`ChainPolicy.checked`.

    :raises InvalidOptionError: as :meth:`~statelog.compaction.delta.ChainPolicy.checked`.
    """
    ChainPolicy.checked(max_chain, full_ratio)


def check_overlay_options(limit: object, wait: object, segment_bytes: int) -> None:
    """:raises InvalidOptionError: ``max_overlay_bytes`` neither None nor an int of at
    least twice ``segment_bytes``, or ``overlay_wait`` not a positive timedelta."""
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or limit < 2 * segment_bytes
    ):
        raise InvalidOptionError(
            f"max_overlay_bytes={limit!r}",
            hint=f"None, or an int of at least 2 * segment_bytes ({2 * segment_bytes}): the "
            "compactor folds only sealed segments, so the active one always stays in memory",
        )
    if not isinstance(wait, timedelta) or wait <= timedelta(0):
        raise InvalidOptionError(f"overlay_wait={wait!r}", hint="a positive timedelta")


def check_store_path(path: Any) -> Path:
    """``path`` as a :class:`~pathlib.Path`, if it can name a store directory.

    A str or an ``os.PathLike`` of str, not empty, without a NUL byte (which
    no system call accepts). ``bytes`` paths are refused: every name the
    store derives from its path is text.

    :raises InvalidOptionError: any other path; nothing was touched.
    """
    if not isinstance(path, str | os.PathLike):
        raise InvalidOptionError(
            f"path={path!r}: a {type(path).__name__}, not a str or os.PathLike",
            hint="pass the store's directory as a str or a pathlib.Path; nothing was changed",
        )
    text = os.fspath(path)
    if not isinstance(text, str):
        raise InvalidOptionError(
            f"path={path!r}: a bytes path",
            hint="pass the store's directory as a str or a pathlib.Path; nothing was changed",
        )
    if not text or "\0" in text:
        raise InvalidOptionError(
            f"path={text!r} is empty or holds a NUL byte",
            hint="no file name can be empty or hold NUL; nothing was changed",
        )
    return Path(text)


def check_remote_options(remote: Any, interval: Any, readonly: Any, compactor: Any) -> None:
    """Validate ``remote=`` and ``remote_check=``, parsing the URL and the environment.

    :raises InvalidOptionError: ``remote_check`` not a positive timedelta;
        ``remote`` not a str; ``remote`` with ``readonly=True`` (a read-only
        open never restores nor claims a store) or with an in-process
        compactor (it would never ship: the daemon ships).
    :raises RemoteConfigError: the URL or the environment is unusable.
    """
    if not isinstance(interval, timedelta) or interval <= timedelta(0):
        raise InvalidOptionError(f"remote_check={interval!r}", hint="a positive timedelta")
    if remote is None:
        return
    if not isinstance(remote, str):
        raise InvalidOptionError(f"remote={remote!r}", hint="an s3://bucket/prefix URL, or None")
    if readonly is True:
        raise InvalidOptionError(
            "remote= cannot be combined with readonly=True",
            hint="a read-only open never restores nor claims a store: run "
            "`statelog restore URL STORE` first, then open STORE read-only",
        )
    if compactor != "none":
        raise InvalidOptionError(
            f"remote= cannot be combined with compactor={compactor!r}",
            hint="the in-process compactor never ships: run "
            "`statelog-compactor --remote URL STORE` beside the writer instead",
        )
    # Not at import: statelog.remote loads the S3 client (obstore), which adds
    # about 45 ms to `import statelog` (measured 220 -> 265 ms), and most
    # stores have no remote.
    from statelog.remote.url import parse_remote_url

    parse_remote_url(remote)


def check_follow_options(follow: Any, poll: Any, remote: Any, compactor: Any) -> None:
    """Validate ``follow=`` and ``follow_poll=``, parsing a remote URL and the environment.

    :raises InvalidOptionError: ``follow`` neither a path nor a str;
        ``follow_poll`` not a positive timedelta; ``follow`` with ``remote`` or an
        in-process compactor (a standby writes nothing of its own until promoted).
    :raises RemoteConfigError: ``follow`` is a URL that is not usable.
    """
    if not isinstance(poll, timedelta) or poll <= timedelta(0):
        raise InvalidOptionError(f"follow_poll={poll!r}", hint="a positive timedelta")
    if follow is None:
        return
    if not isinstance(follow, str | os.PathLike) or not str(follow) or "\0" in str(follow):
        raise InvalidOptionError(
            f"follow={follow!r}", hint="the source store's directory, or its s3:// URL"
        )
    if isinstance(follow, str) and "://" in follow:
        from statelog.remote.url import parse_remote_url  # not at import: see above

        parse_remote_url(follow)
    if remote is not None or compactor != "none":
        raise InvalidOptionError(
            "follow= cannot be combined with remote= or an in-process compactor",
            hint="a standby writes nothing of its own until promote(); the source's "
            "compactor keeps its log short",
        )


def check_at_option(at: Any, readonly: Any, follow: Any) -> None:
    """Validate ``at=``: an epoch (int >= 0) or a datetime with a time zone, read-only only.

    :raises InvalidOptionError: any other value, or ``at`` without ``readonly=True``
        or with ``follow``.
    """
    if at is None:
        return
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise InvalidOptionError(
                f"at={at.isoformat()} has no time zone",
                hint="give one, e.g. datetime(2026, 12, 5, 9, 14, tzinfo=timezone.utc)",
            )
    elif not isinstance(at, int) or isinstance(at, bool) or at < 0:
        raise InvalidOptionError(
            f"at={at!r}", hint="an epoch (an int >= 0) or a datetime with a time zone"
        )
    if readonly is not True or follow is not None:
        raise InvalidOptionError(
            "at= opens a read-only view of the past",
            hint="pass readonly=True (and no follow=); to rewind the store itself, use "
            "`statelog recover STORE --to-epoch N`",
        )
