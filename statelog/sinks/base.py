"""What every idempotent sink shares: outputs, rows, checks, and the write sequence.

An *output* is one result a reconciler hands downstream (a verdict, an
alert, a materialised row), named by a deterministic id and a version that
only grows. A sink writes a batch of outputs as one upsert inside the
target's own transaction; a row never moves to a lower or equal version, so
writing the same batch twice changes nothing the second time. That is what
makes replay after a crash or a walk-back safe.

Every check on a batch runs here, before the target is touched: a refused
batch writes nothing anywhere.
"""

from __future__ import annotations

import logging
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self, runtime_checkable

import msgspec

from statelog.errors import SinkError

__all__ = [
    "MAX_ID_BYTES",
    "MAX_VERSION",
    "EncodedOutput",
    "InvalidOutputError",
    "Output",
    "Row",
    "Sink",
    "TransactionalSink",
    "check_epoch",
    "check_outputs",
    "check_table_name",
    "decode_payload",
]

log = logging.getLogger("statelog.sinks")

MAX_ID_BYTES = 500
"""Longest output id in UTF-8 bytes: the id is also a key of the store's marks table."""
MAX_VERSION = (1 << 63) - 1
"""Versions and epochs are stored as signed 64-bit integers (SQLite INTEGER, PostgreSQL BIGINT)."""
MAX_DEPTH = 64
"""Deepest nesting of lists and objects accepted in a payload."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_ENCODER = msgspec.json.Encoder(order="sorted")


class InvalidOutputError(SinkError, ValueError):
    """An output batch was refused before anything was written: bad id, version or payload."""

    hint = "fix the outputs (str id, int version >= 0, JSON payload); nothing was written anywhere"


@dataclass(frozen=True, slots=True)
class Output:
    """One output: ``id`` names it for ever, ``version`` orders its revisions.

    Both must be deterministic functions of the input (for example the id
    of the key and window, and the offset of the last event folded in), so
    a replay produces the same ``(id, version)`` and the upsert is a no-op.
    """

    id: str
    version: int
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Row:
    """One row as the target holds it: the output and the statelog epoch that wrote it."""

    id: str
    version: int
    epoch: int
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class EncodedOutput:
    """An output that passed every check, its payload encoded as canonical JSON text."""

    id: str
    version: int
    payload: str


@runtime_checkable
class Sink(Protocol):
    """An idempotent target: upserts keyed by output id that never lower a version."""

    @property
    def name(self) -> str:
        """A stable name; the store keeps this sink's applied marks under it."""
        ...

    def write(self, outputs: Sequence[Output], epoch: int) -> int:
        """Upsert ``outputs`` in one target transaction, each row marked with ``epoch``.

        :returns: rows inserted or moved to a higher version (0 on a replay).
        :raises InvalidOutputError: a bad output or epoch; nothing was written.
        :raises SinkError: the target failed; its transaction was rolled back.
        """
        ...

    def rows(self) -> list[Row]:
        """Every row of the target table, in id order."""
        ...

    def high_epoch(self) -> int:
        """The highest epoch any row carries (0 for an empty table)."""
        ...

    def close(self) -> None:
        """Release the connection; idempotent."""
        ...


def check_table_name(table: Any) -> str:
    """:raises InvalidOutputError: ``table`` is not a plain SQL identifier of at most 63 chars."""
    if not isinstance(table, str) or not _IDENTIFIER.fullmatch(table):
        raise InvalidOutputError(
            f"sink table name {table!r} is not a plain identifier",
            hint="use letters, digits and underscores (not first), at most 63 characters",
        )
    return table


def check_epoch(epoch: Any) -> int:
    """:raises InvalidOutputError: ``epoch`` is not an int in 1..2**63-1."""
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 1 <= epoch <= MAX_VERSION:
        raise InvalidOutputError(
            f"epoch {epoch!r} is not an int in 1..2**63-1",
            hint="pass the statelog epoch that the outputs belong to (store.epoch + 1)",
        )
    return int(epoch)


def check_outputs(outputs: Any) -> list[EncodedOutput]:
    """Check a whole batch and encode every payload; nothing is touched.

    :raises InvalidOutputError: not a sequence of :class:`Output`; an id that
        is not a non-empty str of at most MAX_ID_BYTES UTF-8 bytes without NUL;
        a version that is not an int in 0..MAX_VERSION; a payload that is not
        a JSON object (str keys; None, bool, int, finite float, str without
        NUL, lists and objects); or the same id twice in the batch.
    """
    if isinstance(outputs, str | bytes | Output) or not isinstance(outputs, Sequence):
        raise InvalidOutputError(
            f"outputs must be a sequence of Output, not {type(outputs).__name__}",
            hint="pass a list, e.g. outputs=[Output(id, version, payload)]",
        )
    seen: set[str] = set()
    out = []
    for o in outputs:
        if not isinstance(o, Output):
            raise InvalidOutputError(f"{o!r} is a {type(o).__name__}, not an Output")
        oid = _check_id(o.id)
        if oid in seen:
            raise InvalidOutputError(
                f"output id {oid!r} appears twice in one batch",
                hint="emit each output id once per commit (its latest version)",
            )
        seen.add(oid)
        v = o.version
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_VERSION:
            raise InvalidOutputError(
                f"version of output {oid!r} is {v!r}, not an int in 0..2**63-1"
            )
        if not isinstance(o.payload, Mapping):
            raise InvalidOutputError(
                f"payload of output {oid!r} is a {type(o.payload).__name__}, not a mapping"
            )
        plain = _plain(o.payload, oid, "payload", 0)
        out.append(EncodedOutput(oid, int(v), _ENCODER.encode(plain).decode()))
    return out


def decode_payload(text: str | bytes) -> dict[str, Any]:
    """A payload as written by :func:`check_outputs` (JSON text) back to a dict."""
    value = msgspec.json.decode(text)
    assert isinstance(value, dict)
    return value


def _check_id(oid: Any) -> str:
    if not isinstance(oid, str) or not oid:
        raise InvalidOutputError(f"output id {oid!r} is not a non-empty str")
    try:
        size = len(oid.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidOutputError(f"output id {oid!r} is not valid UTF-8 text") from None
    if size > MAX_ID_BYTES or "\x00" in oid:
        raise InvalidOutputError(
            f"output id {oid[:40]!r}... is over {MAX_ID_BYTES} bytes or holds a NUL",
            hint=f"use ids of at most {MAX_ID_BYTES} UTF-8 bytes without NUL (hash long ones)",
        )
    return str.__str__(oid)


def _plain(value: Any, oid: str, where: str, depth: int) -> Any:
    """``value`` as plain JSON types, or a refusal naming where in the payload it failed.

    Refuses what a JSON encoder would silently change (NaN becoming null,
    bytes becoming base64, a set in arbitrary order), so the row that lands
    is exactly the payload given, on either target.
    """
    if depth > MAX_DEPTH:
        raise InvalidOutputError(f"payload of output {oid!r} nests deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidOutputError(f"{where} of output {oid!r} is {value!r}, not a JSON number")
        return float(value)
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidOutputError(f"{where} of output {oid!r} holds a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidOutputError(f"{where} of output {oid!r} is not valid UTF-8") from None
        return str.__str__(value)
    if isinstance(value, Mapping):
        obj = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidOutputError(f"{where} of output {oid!r} has a non-str key {k!r}")
            obj[_plain(k, oid, where, depth + 1)] = _plain(v, oid, f"{where}.{k}", depth + 1)
        return obj
    if isinstance(value, list | tuple):
        return [_plain(v, oid, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise InvalidOutputError(
        f"{where} of output {oid!r} is a {type(value).__name__}, which JSON cannot hold",
        hint="payloads hold None, bool, int, finite float, str, lists and str-keyed objects; "
        "nothing was written anywhere",
    )


class TransactionalSink(ABC):
    """The write sequence both SQL targets share: check, begin, upsert, commit, or roll back.

    Subclasses provide the four target steps; each runs on the sink's one
    connection. A sink is not thread-safe: use it from one thread.
    """

    def __init__(self, table: str, name: str | None) -> None:
        self.table = check_table_name(table)
        self._name = self.table if name is None else check_table_name(name)
        self._closed = False

    @property
    def name(self) -> str:
        """The sink's name (default: its table); marks live under it in the store."""
        return self._name

    def write(self, outputs: Sequence[Output], epoch: int) -> int:
        """Upsert ``outputs`` as one target transaction; rows never move to a lower version.

        Order: every output is checked and encoded; then BEGIN; the upsert
        (a row is inserted, or updated only when the new version is higher);
        COMMIT, durable on the target before this returns. Any failure or
        interruption after BEGIN rolls the target transaction back.

        :returns: rows inserted or moved to a higher version; 0 for a replay.
        :raises InvalidOutputError: bad outputs or epoch; nothing was written.
        :raises SinkError: the sink is closed or the target failed (rolled back).
        """
        encoded = check_outputs(outputs)
        epoch = check_epoch(epoch)
        if self._closed:
            raise SinkError(f"sink {self._name!r} is closed", hint="open a new sink")
        if not encoded:
            return 0
        try:
            self._begin()
            changed = self._upsert(encoded, epoch)
            self._commit()
        except BaseException as exc:
            self._rollback_quietly()
            if isinstance(exc, self._target_errors()):
                raise SinkError(
                    f"sink {self._name!r}: writing {len(encoded)} outputs of epoch {epoch} "
                    f"failed: {exc}",
                    hint=self._failure_hint(),
                ) from exc
            raise
        log.debug(
            "sink write sink=%s epoch=%d outputs=%d rows=%d",
            self._name,
            epoch,
            len(encoded),
            changed,
        )
        return changed

    def _rollback_quietly(self) -> None:
        try:
            self._rollback()
        except Exception as exc:  # the original failure is the one to report
            log.warning("sink rollback failed sink=%s error=%r", self._name, exc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def _begin(self) -> None:
        """Start the target transaction."""

    @abstractmethod
    def _upsert(self, outputs: list[EncodedOutput], epoch: int) -> int:
        """Run the upsert inside the open transaction; return rows changed."""

    @abstractmethod
    def _commit(self) -> None:
        """Commit the target transaction durably."""

    @abstractmethod
    def _rollback(self) -> None:
        """Roll back the target transaction if one is open."""

    @abstractmethod
    def _target_errors(self) -> tuple[type[BaseException], ...]:
        """The driver's exception classes that mean "the target failed"."""

    @abstractmethod
    def _failure_hint(self) -> str:
        """What to check when the target fails."""

    @abstractmethod
    def rows(self) -> list[Row]:
        """Every row of the target table, in id order."""

    @abstractmethod
    def get(self, output_id: str) -> Row | None:
        """The row of ``output_id``, or None."""

    @abstractmethod
    def _read(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        """Rows of a read-only query on the sink's table (``self._q``, quoted)."""

    _q: str
    """The target table's name, quoted for SQL."""

    def count(self) -> int:
        """Number of rows in the table."""
        return int(self._read(f"SELECT count(*) FROM {self._q}")[0][0])

    def high_epoch(self) -> int:
        """The highest epoch any row carries (0 for an empty table)."""
        return int(self._read(f"SELECT coalesce(max(epoch), 0) FROM {self._q}")[0][0])

    @abstractmethod
    def close(self) -> None:
        """Release the connection; idempotent."""
