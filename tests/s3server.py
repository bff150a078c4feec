"""A real S3-protocol server on loopback for the remote-tier tests (moto's threaded server).

One server per test session, started on first use on a free port of
127.0.0.1 and stopped at exit. Each test gets its own bucket, created with
boto3, so tests never see each other's objects. :meth:`S3Server.stop` and
:meth:`S3Server.start` take the server down and bring it back on the same
port (moto keeps its buckets in the process, so the objects survive): the
transient-failure tests use that to make real connections fail.
"""

from __future__ import annotations

import atexit
import itertools
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import boto3  # type: ignore[import-untyped]
import pytest
from moto.server import ThreadedMotoServer

from statelog.remote import RemoteClient, RetryPolicy

__all__ = ["FAST_RETRY", "Remote", "S3Server", "remote", "s3"]

FAST_RETRY = RetryPolicy(
    attempts=40,
    initial=timedelta(milliseconds=20),
    maximum=timedelta(milliseconds=250),
    deadline=timedelta(seconds=20),
)
_KEY, _SECRET, _REGION = "testing", "testing", "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's threaded server on 127.0.0.1:<port>.

    ``process=True`` runs it in a child process instead (``python -m
    moto.server``): for benchmarks, whose writer must not share its
    interpreter (and its GIL) with the server it ships to. Its buckets do
    not survive :meth:`stop`.
    """

    def __init__(self, *, process: bool = False) -> None:
        self.port = _free_port()
        self._server: ThreadedMotoServer | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._process = process
        self._names = itertools.count(1)
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": _KEY,
            "AWS_SECRET_ACCESS_KEY": _SECRET,
            "AWS_DEFAULT_REGION": _REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def start(self) -> None:
        if self._process:
            cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
            self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._server.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"moto server did not listen on {self.port}")

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(30)
            self._proc = None

    def boto(self) -> object:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=_KEY,
            aws_secret_access_key=_SECRET,
            region_name=_REGION,
        )

    def new_bucket(self) -> str:
        name = f"statelog-test-{next(self._names):04d}"
        self.boto().create_bucket(Bucket=name)  # type: ignore[attr-defined]
        return name


_SERVER: S3Server | None = None


def _shared() -> S3Server:
    global _SERVER
    if _SERVER is None:
        _SERVER = S3Server()
        atexit.register(_SERVER.stop)
    return _SERVER


@dataclass
class Remote:
    """One test's bucket: its URL, a client for it, and the server behind it."""

    server: S3Server
    bucket: str
    url: str

    def client(self, retry: RetryPolicy = FAST_RETRY) -> RemoteClient:
        return RemoteClient.from_url(self.url, env=self.server.env(), retry=retry)

    def object_keys(self) -> list[str]:
        """Every object key in the bucket (via boto3, independent of the code under test)."""
        out = self.server.boto().list_objects_v2(Bucket=self.bucket)  # type: ignore[attr-defined]
        return sorted(o["Key"] for o in out.get("Contents", []))

    def damage(self, key: str) -> None:
        """Overwrite object ``key`` (relative to the URL's prefix) with one bit flipped."""
        full = f"shard/{key}"
        b = self.server.boto()
        obj = b.get_object(Bucket=self.bucket, Key=full)  # type: ignore[attr-defined]
        data = bytearray(obj["Body"].read())
        data[len(data) // 2] ^= 0x10
        b.put_object(  # type: ignore[attr-defined]
            Bucket=self.bucket, Key=full, Body=bytes(data), Metadata=obj["Metadata"]
        )


@pytest.fixture(scope="session")
def s3() -> S3Server:
    """The session's S3 server."""
    return _shared()


@pytest.fixture
def remote(s3: S3Server) -> Iterator[Remote]:
    """A fresh bucket; the URL is ``s3://<bucket>/shard``."""
    bucket = s3.new_bucket()
    yield Remote(s3, bucket, f"s3://{bucket}/shard")
