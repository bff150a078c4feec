"""statelog as the state store of the stream processors its users run.

Each engine has its own module, imported only by an application that uses
it (``statelog.integrations.quix``, ``statelog.integrations.faust``), so
``import statelog`` never loads an engine. Each module checks at import
that the installed engine is in the version range its extra pins
(:func:`require`), because an integration leans on the engine's internals
and is tested against exactly that range.
"""

from __future__ import annotations

from statelog.integrations.support import require

__all__ = ["require"]
