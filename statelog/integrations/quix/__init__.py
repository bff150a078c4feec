"""statelog as the state store of Quix Streams.

One line switches an application over::

    from statelog.integrations.quix import Application

    app = Application(broker_address="localhost:9092", consumer_group="counts")

It takes ``quixstreams.Application``'s arguments, plus ``statelog=`` (a
:class:`statelog.StoreOptions`). Every checkpoint of the application is then
one statelog record holding the state of every store partition it touched,
the processed offsets and the changelog offsets, and each assigned partition
resumes from statelog's offsets. See the guide's "Quix Streams" section.

Importing this module checks the installed Quix Streams against the range
the ``statelog[quix]`` extra pins, since the integration subclasses Quix's
internals.

:raises IntegrationError: at import, Quix Streams is missing or outside the range.
"""

from __future__ import annotations

from statelog.integrations.support import require

try:
    import quixstreams
except ImportError:  # the gate below says what to install
    _version: str | None = None
else:
    _version = quixstreams.__version__

require("quixstreams", _version, at_least=(3, 28), below=(3, 29), extra="quix")

from statelog.integrations.quix.app import (  # noqa: E402  (only once the version passed)
    DEFAULT_OPTIONS,
    Application,
    StatelogCheckpoint,
    StatelogProcessingContext,
    StatelogStateManager,
)
from statelog.integrations.quix.state import QuixState  # noqa: E402
from statelog.integrations.quix.store import (  # noqa: E402
    StatelogPartitionTransaction,
    StatelogStore,
    StatelogStorePartition,
)

__all__ = [
    "DEFAULT_OPTIONS",
    "Application",
    "QuixState",
    "StatelogCheckpoint",
    "StatelogPartitionTransaction",
    "StatelogProcessingContext",
    "StatelogStateManager",
    "StatelogStore",
    "StatelogStorePartition",
]
