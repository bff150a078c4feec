"""The checks behind :class:`~statelog.store.options.StoreOptions`, one per group of options.

Each refuses a bad value with an :class:`~statelog.errors.InvalidOptionError`
naming the option and hinting at its range, before the store touches a file.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from statelog.compaction.delta import ChainPolicy
from statelog.errors import InvalidOptionError
from statelog.format.limits import table_name_problem

__all__ = [
    "check_at_option",
    "check_chain_options",
    "check_compactor_options",
    "check_declared_tables",
    "check_follow_options",
    "check_overlay_options",
    "check_remote_options",
    "check_sizes",
    "check_store_path",
]

_MiB = 1 << 20


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


def check_declared_tables(tables: Any) -> tuple[str, ...]:
    """``tables=`` as a tuple of distinct names.

    :raises InvalidOptionError: not an iterable of valid table names (a
        single str is refused: it would declare one table per character).
    """
    if isinstance(tables, str | bytes):
        raise InvalidOptionError(
            f"tables={tables!r} is a single name", hint=f"wrap it in a tuple: tables=({tables!r},)"
        )
    try:
        names = tuple(tables)
    except TypeError:
        raise InvalidOptionError(
            f"tables={tables!r}", hint="a tuple of table names, e.g. tables=('buffer',)"
        ) from None
    for name in names:
        problem = table_name_problem(name)
        if problem is not None:
            raise InvalidOptionError(f"tables= names {name!r}: {problem}")
    return tuple(dict.fromkeys(names))
