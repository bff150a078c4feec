"""Authenticated shipping: the MANIFEST signed with a key only the store's hosts hold.

Without a key, a restore checks integrity only: every object against the
SHA-256 the MANIFEST lists, the MANIFEST against its own checksum line.
Whoever can write the bucket can rewrite both consistently. With a key in
``STATELOG_REMOTE_KEY`` (hex, at least :data:`MIN_KEY_BYTES` bytes), every
MANIFEST version written carries ``signature``: the HMAC-SHA256 under the
key of its canonical bytes (:func:`canonical`), which cover every object's
key, SHA-256 and size and the hash of ``IDENTITY``. A reader holding the key
refuses a MANIFEST whose signature is missing or does not verify, before it
requests any object the MANIFEST names.

What the signature does not give: freshness. An older version that was
signed with the same key verifies; the writer generation and the ETag
conditions still fence writers, but a bucket writer can put an older
signed MANIFEST back (``docs/remote.md``, "Threat model").

Pure functions; no I/O.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
from collections.abc import Mapping

from statelog.remote.errors import RemoteConfigError

__all__ = ["KEY_ENV", "MIN_KEY_BYTES", "key_from_env", "parse_key", "sign", "verify"]

KEY_ENV = "STATELOG_REMOTE_KEY"
"""The environment variable holding the shipping key, as hex digits."""

MIN_KEY_BYTES = 16
"""The shortest key accepted (32 hex digits); 32 bytes (64 hex digits) is recommended."""


def parse_key(text: str) -> bytes | None:
    """The key spelled by ``text`` (hex digits, surrounding blanks ignored); None if empty.

    :raises RemoteConfigError: not hex, or shorter than :data:`MIN_KEY_BYTES`.
    """
    text = text.strip()
    if not text:
        return None
    try:
        key = binascii.unhexlify(text)
    except (binascii.Error, ValueError):
        raise RemoteConfigError(
            f"{KEY_ENV} is not hex digits",
            hint=f"set {KEY_ENV} to the hex of a random key, e.g. `openssl rand -hex 32`",
        ) from None
    if len(key) < MIN_KEY_BYTES:
        raise RemoteConfigError(
            f"{KEY_ENV} holds {len(key)} bytes, fewer than {MIN_KEY_BYTES}",
            hint="use a key of 32 random bytes: `openssl rand -hex 32`",
        )
    return key


def key_from_env(env: Mapping[str, str]) -> bytes | None:
    """The key configured in ``env`` (:data:`KEY_ENV`), or None when it is unset or empty.

    :raises RemoteConfigError: as :func:`parse_key`.
    """
    return parse_key(env.get(KEY_ENV, ""))


def sign(key: bytes, canonical: bytes) -> str:
    """The hex HMAC-SHA256 of ``canonical`` under ``key``."""
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def verify(key: bytes, canonical: bytes, signature: str) -> bool:
    """Whether ``signature`` is :func:`sign` of ``canonical`` under ``key`` (constant time)."""
    return hmac.compare_digest(sign(key, canonical), signature)
