"""statelog as the state store of Faust tables.

One option switches an app's tables over (``pip install 'statelog[faust]'``)::

    app = faust.App("counts", broker="kafka://localhost:9092",
                    store="statelog:///var/lib/counts/tables?durability=group")

Faust finds :class:`Store` through the ``faust.stores`` entry point by the
URL's scheme. Importing this module checks the installed faust-streaming
against the range the ``statelog[faust]`` extra pins.

:raises IntegrationError: at import, faust-streaming is missing or outside the range.
"""

from __future__ import annotations

from statelog.integrations.support import require

try:
    import faust
except ImportError:  # the gate below says what to install
    _version: str | None = None
else:
    _version = faust.__version__

require("faust-streaming", _version, at_least=(0, 15), below=(0, 16), extra="faust")

from statelog.integrations.faust.positions import offset_name  # noqa: E402
from statelog.integrations.faust.store import TABLE, Store  # noqa: E402
from statelog.integrations.faust.url import StoreURL, parse_store_url  # noqa: E402

__all__ = ["TABLE", "Store", "StoreURL", "offset_name", "parse_store_url"]
