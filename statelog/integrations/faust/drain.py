"""A source commit waits until the changelog records before it have left the worker.

Faust commits the source topic's offsets after flushing its producer, but the
producer buffer's flush returns once 0.1 s passes without a send, with
records still queued. A worker that dies then has committed events whose
changelog records never reached Kafka, and a recovery from the changelog (on
another worker, or after a revoke) lacks their effects while the events do
not come again. With a statelog store, the buffer's flush keeps waiting
until the buffer is empty, for at most ``broker_request_timeout`` (then it
logs what is left and returns, as before).
"""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["install"]

log = logging.getLogger(__name__)


def install() -> None:
    """Make ``ProducerBuffer.flush`` drain the buffer (once per process)."""
    from faust.transport.producer import ProducerBuffer

    if getattr(ProducerBuffer.flush, "statelog_drains", False):
        return

    async def flush(self: Any) -> None:
        app = getattr(self, "app", None)
        limit = float(app.conf.broker_request_timeout) if app is not None else 90.0
        deadline = time.monotonic() + limit
        while self.size and time.monotonic() < deadline:
            await self.flush_atmost(None)  # returns after 0.1 s without a send
        if self.size:
            log.warning(
                "event=producer_not_drained left=%d seconds=%g "
                "hint='the broker did not take the changelog records in time'",
                self.size, limit,
            )  # fmt: skip

    flush.statelog_drains = True  # type: ignore[attr-defined]
    ProducerBuffer.flush = flush  # type: ignore[method-assign]
