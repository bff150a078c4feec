"""The declarative fault spec of :class:`statelog.kit.FaultyFiles`.

A fault names the steps it watches (a kind or several, a file-name suffix,
an optional predicate over the :class:`Step`) and which of them it acts on
(the ``nth`` matching step, counted from the moment the fault was armed).
What it then does is its class:

* :class:`Crash` SIGKILLs the process before the step, after it
  (``after=True``), or part way through a write (``frac``: a torn write);
* :class:`Pause` calls ``wait(step)`` before the step and then does it;
* :class:`Fail` raises an :class:`OSError` with a real errno for ``times``
  matching steps, optionally after a short write (``partial`` bytes);
* :class:`PowerCut` turns the power off before the step (see
  :meth:`statelog.kit.FaultyFiles.crash` for what a disk then keeps);
* :class:`Then` arms more faults once its step has been done, so a fault
  can be aimed at "the first write after the second segment roll".

Faults compose: a layer holds any number of them, each counting on its own.
"""

from __future__ import annotations

import errno as errnos
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from statelog.storage.fileio import Buffer

__all__ = [
    "DURABLE",
    "KINDS",
    "Crash",
    "Fail",
    "Fault",
    "Kind",
    "Pause",
    "PowerCut",
    "Step",
    "Then",
]

Kind = Literal[
    "open", "create", "write", "sync", "fsync_dir", "truncate", "rename", "remove", "mkdir", "read"
]
KINDS: tuple[Kind, ...] = (
    "open", "create", "write", "sync", "fsync_dir", "truncate", "rename", "remove", "mkdir", "read",
)  # fmt: skip
"""Every kind of step the layer hooks, in no particular order."""

DURABLE: tuple[Kind, ...] = (
    "create", "write", "sync", "fsync_dir", "truncate", "rename", "remove", "mkdir",
)  # fmt: skip
"""The kinds that change what is on disk (``open`` and ``read`` do not)."""


@dataclass(frozen=True)
class Step:
    """One hooked step, as a fault's predicate sees it.

    ``number`` is the layer's count of steps so far, this one included
    (:attr:`statelog.kit.FaultyFiles.ops`). For a ``write``, ``chunks`` are
    the bytes about to be written (:attr:`data` joins them).
    """

    kind: Kind
    path: Path
    number: int
    chunks: Sequence[Buffer] = ()

    @property
    def data(self) -> bytes:
        """The bytes of a write step (empty for other kinds)."""
        return b"".join(bytes(c) for c in self.chunks)

    @property
    def label(self) -> str:
        """``kind:name``, e.g. ``rename:snap-00000012.snap`` (``fsync-dir`` for directories)."""
        return f"{self.kind.replace('_', '-')}:{self.path.name}"


@dataclass
class Fault:
    """Which steps a fault acts on; the subclass says what it does.

    :param kind: one kind, several, or None for every kind.
    :param nth: act on the ``nth`` matching step (1: the first one after arming).
    :param match: only steps whose file name ends with this string.
    :param when: only steps this predicate accepts.
    """

    kind: Kind | tuple[Kind, ...] | None = None
    nth: int = 1
    match: str | None = None
    when: Callable[[Step], bool] | None = None
    seen: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.nth < 1:
            raise ValueError(f"nth={self.nth}: steps are counted from 1")

    def _matches(self, step: Step) -> bool:
        kinds = (self.kind,) if isinstance(self.kind, str) else self.kind
        if kinds is not None and step.kind not in kinds:
            return False
        if self.match is not None and not step.path.name.endswith(self.match):
            return False
        return self.when is None or self.when(step)

    def hit(self, step: Step) -> bool:
        """Count ``step`` if it matches; True when the fault acts on it."""
        if not self._matches(step):
            return False
        self.seen += 1
        return self.seen == self.nth


@dataclass
class Crash(Fault):
    """SIGKILL the process at the step (the kill itself is the layer's ``die``).

    :param frac: for a write: write this fraction of its bytes (at most all
        but one), then die: a torn write.
    :param after: die once the step is done instead of before it.
    """

    frac: float | None = None
    after: bool = False


@dataclass
class Pause(Fault):
    """Call ``wait(step)`` before the step, then do it (the drill holds a compactor so)."""

    wait: Callable[[Step], None] = lambda step: None


@dataclass
class Fail(Fault):
    """Fail ``times`` matching steps from the ``nth`` on (None: until freed) with ``errno``.

    :param partial: for a write: append this many bytes before failing (a
        short write then the error, as a disk that just filled up gives).
    """

    errno: int = errnos.ENOSPC
    times: int | None = 1
    partial: int = 0

    def hit(self, step: Step) -> bool:
        if not self._matches(step):
            return False
        self.seen += 1
        return self.seen >= self.nth and (self.times is None or self.seen < self.nth + self.times)


@dataclass
class PowerCut(Fault):
    """The power goes off just before the step: it and every later one fail with EIO."""


@dataclass
class Then(Fault):
    """Once the step is done, arm ``faults`` (they count from the next step on)."""

    faults: tuple[Fault, ...] = ()
