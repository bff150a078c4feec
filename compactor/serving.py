"""The daemon's metrics endpoint: ``--metrics-port`` serving statelog's registry.

The server's threads start while the daemon's stop signals are blocked, so
they inherit the mask and a SIGTERM still reaches only the main thread.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import start_http_server
from prometheus_client.registry import Collector

from compactor.options import EXIT_BAD_OPTIONS
from statelog.compaction.logfmt import LOGGER, kv
from statelog.ops import metrics
from statelog.remote import LagCollector

__all__ = ["lag_collector", "metrics_server"]

log = logging.getLogger(LOGGER)


@contextmanager
def metrics_server(args: argparse.Namespace, stores: list[Path] | None = None) -> Iterator[bool]:
    """Serve :data:`statelog.ops.metrics.REGISTRY` while the daemon runs, if ``--metrics-port``.

    Called with the stop signals blocked, so the server's threads never
    take a SIGTERM meant for the main thread. Yields False (after saying
    why on stderr) when the port cannot be bound; the server is shut down
    and its socket closed on the way out.

    :param stores: the stores served (default: ``args.stores`` as named).
    """
    metrics.install()
    if stores is None:
        stores = [Path(os.path.abspath(s)) for s in args.stores]
    for store in stores:
        metrics.watch(store)
    try:
        if args.metrics_port is None:
            yield True
            return
        try:
            server, thread = start_http_server(
                args.metrics_port, addr=args.metrics_addr, registry=metrics.REGISTRY
            )
        except OSError as exc:
            why = "address already in use" if exc.errno == errno.EADDRINUSE else str(exc)
            where = f"{args.metrics_addr} port {args.metrics_port}"
            port = args.metrics_port
            log.error(
                "%s", kv(event="metrics_unavailable", addr=args.metrics_addr, port=port, error=why)
            )
            print(
                f"statelog-compactor: cannot serve metrics on {where}: {why}; pick a free "
                "--metrics-port or stop the program holding it "
                f"(exiting, status {EXIT_BAD_OPTIONS})",
                file=sys.stderr,
            )
            yield False
            return
        port = server.server_port
        log.info(
            "%s", kv(event="metrics_serving", addr=args.metrics_addr, port=port, path="/metrics")
        )
        lag = lag_collector(stores) if args.remote is not None else None
        try:
            yield True
        finally:
            if lag is not None:
                metrics.REGISTRY.unregister(lag)
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
    finally:
        for store in stores:
            metrics.unwatch(store)


def lag_collector(stores: list[Path]) -> Collector:
    """Register the shipping-lag gauges of ``stores`` (unregistered when the server stops)."""
    # The same ``store`` label as every other per-store series: the resolved path.
    lag = LagCollector([Path(metrics.store_label(s)) for s in stores])
    metrics.REGISTRY.register(lag)
    return lag
