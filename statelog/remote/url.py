"""Where a store lives remotely: the URL, the AWS_* environment, and the object keys.

A remote URL names a bucket and an optional prefix, ``s3://bucket/prefix``.
Every store shipped under it gets its own directory named by its store id
(from ``IDENTITY``), so one prefix holds many shards::

    <prefix>/<store-id>/IDENTITY                          the store's identity file
    <prefix>/<store-id>/MANIFEST                          generation + index (conditional writes)
    <prefix>/<store-id>/wal/<generation:08x>/<segment>    sealed segments, immutable
    <prefix>/<store-id>/snapshots/<generation:08x>/<snap> snapshots, immutable
    <prefix>/<store-id>/pins/<token>.pin                  restores in progress (with an expiry)

Objects are keyed by the writer generation that shipped them, so a fenced
writer's uploads can never take a key its successor needs.

Connection settings come from the standard environment: ``AWS_ENDPOINT_URL``
(or ``AWS_ENDPOINT_URL_S3``), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION`` (else ``AWS_DEFAULT_REGION``) and
``AWS_ALLOW_HTTP=true`` for a plain-HTTP endpoint.

``file:///absolute/path`` names a shared directory instead (an NFS export or
a mounted volume): the same keys as files under it, written by
:class:`statelog.remote.directory.DirectoryClient`, whose conditional
writes rest on an exclusive create and a lock file (``docs/remote.md``,
"A shared directory").
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from statelog.remote.errors import RemoteConfigError

__all__ = ["RemoteConfig", "StoreKeys", "parse_remote_url"]

# S3 bucket naming rules, simplified: 3-63 of lowercase letters, digits, dots, hyphens.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class RemoteConfig:
    """Everything needed to reach the object store; secrets are kept out of ``repr``."""

    url: str
    bucket: str
    prefix: str
    endpoint: str | None
    region: str
    allow_http: bool
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    directory: str | None = None
    """A ``file://`` URL's absolute path; None for ``s3://``."""


def parse_remote_url(url: str, env: Mapping[str, str] | None = None) -> RemoteConfig:
    """Read ``url`` and the AWS_* variables of ``env`` (default: the process environment).

    Checks only; nothing is contacted and nothing is written.

    :raises RemoteConfigError: not an ``s3://`` URL, a bad bucket name, a
        prefix with empty or ``..`` parts, an ``http://`` endpoint without
        ``AWS_ALLOW_HTTP=true``, or only one of the two credential variables.
    """
    env = os.environ if env is None else env
    if not isinstance(url, str):
        raise RemoteConfigError(f"remote URL {url!r} is not a string")
    parts = urlsplit(url)
    if parts.scheme == "file":
        return _directory_config(url, parts.netloc, parts.path, parts.query or parts.fragment)
    if parts.scheme != "s3" or parts.query or parts.fragment:
        raise RemoteConfigError(f"{url}: expected s3://bucket[/prefix] or file:///path")
    bucket = parts.netloc
    if not _BUCKET.match(bucket):
        raise RemoteConfigError(f"{url}: {bucket!r} is not a valid bucket name")
    prefix = parts.path.strip("/")
    if prefix and any(p in ("", ".", "..") for p in prefix.split("/")):
        raise RemoteConfigError(f"{url}: the prefix {prefix!r} has empty, '.' or '..' parts")
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    allow_http = env.get("AWS_ALLOW_HTTP", "").strip().lower() in _TRUE
    if endpoint is not None:
        scheme = urlsplit(endpoint).scheme
        if scheme not in ("http", "https"):
            raise RemoteConfigError(f"AWS_ENDPOINT_URL={endpoint!r} is not an http(s) URL")
        if scheme == "http" and not allow_http:
            raise RemoteConfigError(
                f"AWS_ENDPOINT_URL={endpoint} is plain HTTP",
                hint="set AWS_ALLOW_HTTP=true to allow it (loopback and test servers only)",
            )
    key_id = env.get("AWS_ACCESS_KEY_ID") or None
    secret = env.get("AWS_SECRET_ACCESS_KEY") or None
    if (key_id is None) != (secret is None):
        raise RemoteConfigError(
            "only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set",
            hint="set both, or neither to use the instance's or container's credentials",
        )
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    return RemoteConfig(
        url=url,
        bucket=bucket,
        prefix=prefix,
        endpoint=endpoint,
        region=region,
        allow_http=allow_http,
        access_key_id=key_id,
        secret_access_key=secret,
        session_token=env.get("AWS_SESSION_TOKEN") or None,
    )


def _directory_config(url: str, host: str, path: str, extra: str) -> RemoteConfig:
    """A ``file://`` URL: an absolute, normalised path on this host.

    :raises RemoteConfigError: a host other than ``localhost``, a relative path,
        a query or fragment, or empty, ``.`` or ``..`` parts.
    """
    if host not in ("", "localhost") or extra or not path.startswith("/"):
        raise RemoteConfigError(f"{url}: expected file:///absolute/path")
    parts = path.strip("/").split("/")
    if path.strip("/") and any(p in ("", ".", "..") for p in parts):
        raise RemoteConfigError(f"{url}: the path {path!r} has empty, '.' or '..' parts")
    return RemoteConfig(
        url=url, bucket="", prefix="", endpoint=None, region="", allow_http=False,
        directory="/" + path.strip("/"),
    )  # fmt: skip


@dataclass(frozen=True)
class StoreKeys:
    """Object keys of one store, relative to the URL's prefix."""

    store_id: uuid.UUID

    @property
    def root(self) -> str:
        return str(self.store_id)

    @property
    def manifest(self) -> str:
        return f"{self.root}/MANIFEST"

    @property
    def identity(self) -> str:
        return f"{self.root}/IDENTITY"

    @property
    def pins(self) -> str:
        return f"{self.root}/pins/"

    def segment(self, generation: int, name: str) -> str:
        """Key of a sealed segment shipped by writer ``generation``."""
        return f"{self.root}/wal/{generation:08x}/{name}"

    def snapshot(self, generation: int, name: str) -> str:
        """Key of a snapshot shipped by writer ``generation``."""
        return f"{self.root}/snapshots/{generation:08x}/{name}"

    def pin(self, token: str) -> str:
        return f"{self.pins}{token}.pin"
