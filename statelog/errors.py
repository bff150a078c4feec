"""Typed errors raised by statelog.

Every error derives from :class:`StatelogError` and carries a one-line
``hint`` telling the caller what to do next. ``str(error)`` includes the
hint, so a log line or a traceback is actionable on its own; ``cli_hint``,
where set, gives that advice in ``statelog`` commands and options instead.

Bad input (:class:`InvalidCommitError` and its kin) is always detected before
anything reaches the disk: a refused commit changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "AuditError",
    "AuditWarning",
    "ChangesUnavailableError",
    "CompactorLockedError",
    "CorruptionError",
    "DataLossWarning",
    "EpochNotCommittedError",
    "EpochUnavailableError",
    "FencedError",
    "FormatVersionError",
    "IntegrationError",
    "InvalidCommitError",
    "InvalidOptionError",
    "NotAStoreError",
    "PromotionLostError",
    "PromotionRefusedError",
    "ReadOnlyStoreError",
    "RemoteError",
    "ResnapshotRequired",
    "SinkError",
    "StandbyCopyError",
    "StatelogError",
    "StatelogWarning",
    "StorageError",
    "StoreClosedError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StorePromotedError",
    "UnknownTableError",
    "WriteStallError",
]


class StatelogError(Exception):
    """Base class of every error statelog raises."""

    hint: str = "see the statelog documentation"
    cli_hint: str | None = None  # None: ``hint`` serves the commands' users too

    def __init__(self, message: str, *, hint: str | None = None, cli_hint: str | None = None):
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint
        if cli_hint is not None:
            self.cli_hint = cli_hint

    @property
    def command_hint(self) -> str:
        """What the commands print: the ``cli_hint`` given beside the ``hint`` in force
        (the error's own, else the nearest class's), else that ``hint``."""
        own = vars(self)
        if "hint" in own or "cli_hint" in own:
            return own.get("cli_hint") or self.hint
        where = next(vars(c) for c in type(self).__mro__ if "hint" in vars(c))
        return where.get("cli_hint") or self.hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})"


class CorruptionError(StatelogError):
    """Stored bytes failed verification: a checksum mismatch, a chain break or a foreign file."""

    hint = (
        "run `statelog verify STORE` to see the damage; an open without strict=True "
        "recovers to the last good commit and keeps the damaged bytes aside as .corrupt files"
    )
    cli_hint = (
        "run `statelog verify STORE` to see the damage and `statelog recover --dry-run STORE` "
        "to see what recovery keeps; `statelog recover STORE` then repairs it"
    )

    def __init__(self, path: Path, offset: int, reason: str, **hints: str | None) -> None:
        super().__init__(f"{path} at offset {offset}: {reason}", **hints)
        self.path = path
        self.offset = offset
        self.reason = reason


class ResnapshotRequired(StatelogError):
    """No verified snapshot and no complete log remain: the state cannot be rebuilt safely."""

    hint = (
        "restore the store from a backup or rebuild the state from the source "
        "(a full re-snapshot); statelog refuses to guess"
    )
    cli_hint = (
        "restore the store from its remote copy (`statelog restore SOURCE NEW_DIR`) or a "
        "backup, or rebuild the state from the source; `statelog verify STORE` names each file"
    )

    def __init__(
        self, message: str, tried: Sequence[tuple[Path, str]] = (), **hints: str | None
    ) -> None:
        detail = "; ".join(f"{p}: {why}" for p, why in tried)
        super().__init__(f"{message}: {detail}" if detail else message, **hints)
        self.tried = list(tried)


class StoreLockedError(StatelogError):
    """Another writer holds the store's lock (or this process has the store open already)."""

    hint = "stop the other writer first, or open with readonly=True to read without taking the lock"
    cli_hint = (
        "a writer has the store open (`statelog inspect STORE` names its pid): stop it first, "
        "or run `statelog recover --dry-run STORE`, which reads without the lock"
    )

    def __init__(
        self, path: Path, pid: int | None, *, this_process: bool = False, **hints: str | None
    ):
        if this_process:  # the holder is this very process: a second open
            what = "is already open in this process"
            hints.setdefault("hint", "close the other StateStore first, or use a `with` block")
        else:
            what = f"is locked by {f'process {pid}' if pid is not None else 'another process'}"
        super().__init__(f"store {path} {what}", **hints)
        self.path = path
        self.pid = pid


class CompactorLockedError(StatelogError):
    """Another compactor holds the store's ``COMPACTOR.LOCK``: one compactor per store."""

    hint = (
        "one compactor per store: stop the other compactor (its pid is named) or let it "
        "do the work; a compactor that died released its lock with its process"
    )
    cli_hint = "stop the other compactor (`statelog inspect STORE` names it) or let it work"

    def __init__(self, path: Path, pid: int | None, **hints: str | None) -> None:
        who = f"process {pid}" if pid is not None else "another process"
        super().__init__(f"store {path} is being compacted by {who}", **hints)
        self.path = path
        self.pid = pid


class FormatVersionError(StatelogError):
    """A file was written in a format version this statelog does not read."""

    hint = "upgrade statelog to a version that reads this format; nothing was changed"

    def __init__(self, path: Path, found: int, supported: int, *, hint: str | None = None) -> None:
        super().__init__(
            f"{path}: format version {found}, this statelog reads version {supported}",
            hint=hint,
        )
        self.path = path
        self.found = found
        self.supported = supported


class InvalidCommitError(StatelogError, ValueError):
    """A commit was refused before anything was written: bad key, value, offset or size."""

    hint = "fix the commit's arguments; nothing was written"


class InvalidOptionError(StatelogError, ValueError):
    """An option passed to ``statelog.open`` is unknown or out of range."""

    hint = "see the options of statelog.open in the README; nothing was changed"
    cli_hint = "see the command's options (`statelog COMMAND --help`); nothing was changed"


class NotAStoreError(StatelogError):
    """The path exists and holds something that is not a statelog store."""

    hint = "choose an empty or new directory for a new store; nothing was changed"


class StoreClosedError(InvalidCommitError):
    """The store was used after ``close()``."""

    hint = "open the store again with statelog.open()"
    cli_hint = "run the command again"


class ReadOnlyStoreError(InvalidCommitError):
    """A write was attempted through a store opened with ``readonly=True``."""

    hint = "open the store without readonly=True (one writer per store) to commit"
    cli_hint = "only the store's writer (the application) commits; the commands only read"


class StoreNotFoundError(StatelogError, FileNotFoundError):
    """A read-only open named a directory that holds no statelog store."""

    hint = "check the path; a writer creates the store on its first open"
    cli_hint = "check the path: name a store directory (one that holds IDENTITY)"


class StorageError(StatelogError, OSError):
    """The operating system refused a write or a sync (ENOSPC, EIO, ...).

    The failed commit is neither visible nor replayed. It is not corruption:
    nothing was truncated or moved aside because of it.
    """

    hint = "free disk space or fix the device, then retry the commit"

    def __init__(self, message: str, *, errno: int | None = None, hint: str | None = None) -> None:
        StatelogError.__init__(self, message, hint=hint)
        self.errno = errno


class WriteStallError(StatelogError):
    """The overlay of commits no snapshot has folded yet reached ``max_overlay_bytes``,
    and no compactor pass brought it back under within ``overlay_wait``.

    Nothing was written: the commit may be retried as it is.
    """

    hint = (
        "a compactor must fold the log: run `statelog-compactor STORE` (or open with "
        'compactor="process"), check its log for failed passes, or raise max_overlay_bytes '
        "or overlay_wait"
    )


class AuditError(StatelogError):
    """The audit trail could not be read or written, or is not an audit trail."""

    hint = "AuditTrail(STORE).verify() names every damaged line and why"
    cli_hint = "run `statelog audit --verify STORE`: it names every damaged line and why"


class SinkError(StatelogError):
    """An idempotent sink refused an output or could not reach its target."""

    hint = "check the sink's target (database file or server); the state was not committed"


class RemoteError(StatelogError):
    """The object store refused a request or returned bytes that do not verify."""

    hint = (
        "check the remote URL and the AWS_* environment; nothing local was changed "
        "because of this error"
    )


class FencedError(StatelogError):
    """A newer writer generation owns the store: this writer was fenced off after a takeover."""

    hint = (
        "another host took this store over; stop this writer and reopen the store "
        "(or restore it) on the host that owns it now"
    )

    def __init__(self, message: str, *, ours: int, current: int, hint: str | None = None) -> None:
        super().__init__(f"{message} (our generation {ours}, current {current})", hint=hint)
        # reason: the message without the generations that ``message`` ends with
        self.reason, self.ours, self.current = message, ours, current


class ChangesUnavailableError(StatelogError):
    """The changes asked for are no longer in the retained log: compaction folded them away."""

    hint = (
        "load the state from a snapshot (statelog.open or `statelog restore`) and read "
        "changes after its epoch, or keep more log with the compactor's --retain"
    )

    def __init__(self, path: Path, since: int, earliest: int, *, hint: str | None = None) -> None:
        super().__init__(
            f"{path}: the changes after epoch {since} are gone from the log; the oldest "
            f"change still held is epoch {earliest} (read with since >= {earliest - 1})",
            hint=hint,
        )
        self.path = path
        self.since = since
        self.earliest = earliest
        """The oldest epoch whose change the retained log still holds."""


class EpochUnavailableError(StatelogError):
    """The state as of that epoch (or time) cannot be rebuilt from what the store retains."""

    hint = (
        "pick an epoch in the range the message names; keep more history with the "
        "compactor's --retain or --retain-for"
    )

    def __init__(
        self, message: str, *, epoch: int | None, oldest: int | None, newest: int | None,
        hint: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message, hint=hint)
        self.epoch = epoch
        """The epoch asked for (None: a time that matched no epoch)."""
        self.oldest = oldest
        """The oldest epoch the store can still rebuild (None: not known)."""
        self.newest = newest
        """The newest epoch the store holds (None: not known)."""


class PromotionRefusedError(StatelogError):
    """A standby cannot be promoted safely: its source could not be read one last time."""

    hint = (
        "if the source's writer is certainly dead (its host down or fenced), promote with "
        "force=True (`statelog promote --force`): the copy's state is promoted as it is, "
        "without the commits after its last look; nothing was changed"
    )
    cli_hint = (
        "if the source's writer is certainly dead (its host down or fenced), run `statelog "
        "promote --force`: the copy is promoted as its last look left it; nothing was changed"
    )


class PromotionLostError(PromotionRefusedError):
    """Another standby was promoted first: it claimed the writer generation this one saw."""

    hint = (
        "another standby of the same store became its writer first; this one changed "
        "nothing and goes on following: point the reconciler at the writer that won"
    )


class StandbyCopyError(StatelogError):
    """This directory is a standby's copy of another store, not promoted: it has no writer."""

    hint = (
        "open it with follow=SOURCE to keep it following (or readonly=True to read it as it "
        "stands); to make it the writer, promote it (store.promote(), `statelog promote "
        "COPY --source SOURCE`), which fences the source's writer first"
    )
    cli_hint = (
        "`statelog inspect COPY` reads it as it stands; to make it the writer, run `statelog "
        "promote COPY --source SOURCE`, which fences the source's writer first"
    )


class StorePromotedError(StatelogError):
    """A standby of this store was promoted: its copy, not this directory, has the writer."""

    hint = (
        "open the promoted copy named in this store's PROMOTED file; if this directory is "
        "the one to keep after all, move PROMOTED aside deliberately (the copy's writer "
        "must then stop: two writers would continue the same log)"
    )


class IntegrationError(StatelogError, ValueError):
    """A stream processor's store could not be set up: an unsupported engine version or option."""

    hint = (
        "install the engine in the version range of statelog's extra (`pip install "
        "statelog[quix]` or `statelog[faust]`) and check the store's options; nothing was "
        "written"
    )


class UnknownTableError(StatelogError, LookupError):
    """A read named a table that was never written and is not declared (``tables=``)."""

    hint = "declare the tables the code reads before it first writes them: tables=(...)"


class EpochNotCommittedError(StatelogError, ValueError):
    """``wait_durable`` asked for an epoch this store has not committed (it would never come)."""

    hint = "wait for an epoch that commit() returned"


class StatelogWarning(UserWarning):
    """Base of the warnings statelog emits where something was lost or not recorded.

    They are shown without any logging set up; ``warnings.simplefilter("error",
    statelog.StatelogWarning)`` makes them raise, ``logging.captureWarnings(True)``
    routes them to the ``py.warnings`` logger.
    """


class DataLossWarning(StatelogWarning):
    """An open recovered to less than the files held: epochs were lost, or an older
    snapshot was used because a newer one was damaged (``strict=True`` raises instead)."""


class AuditWarning(StatelogWarning):
    """The audit trail could not be read or appended: recoveries are not being recorded."""
