"""How a sealed segment travels: its bytes zstd-compressed into one object, and back.

A segment's records are checksummed, not compressed; the bucket and the
link between them are where size costs most (every byte is uploaded once
and downloaded by every restore and standby). So the shipper stores each
sealed segment as one zstd frame (level :data:`LEVEL`, the content size in
its header), and its manifest entry records ``encoding="zstd"``, the
object's size and SHA-256 (what the download checks) and the file's size
(``file_size``: what the decoding must produce, exactly). Decoding is a
function of the object's bytes, so the object's hash binds the file too; a
shipper before manifest format 3 also named the file's own SHA-256
(``file_sha256``), which is still checked where it is present. Snapshots
are already compressed and ship as they are.

Decoding reads untrusted bytes: it stops at the first byte past the
declared file size, and any frame that does not decode is refused; the
caller removes what was written.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import IO, cast

import msgspec
import zstandard

from statelog.remote.entry import Entry
from statelog.remote.errors import RemoteIntegrityError

__all__ = ["ENCODING", "LEVEL", "as_encoded", "as_raw", "decode_object", "decode_to_bytes"]
__all__ += ["encode_segment", "holds_file"]

ENCODING = "zstd"
LEVEL = 1
"""zstd's fastest standard level: the shipper (the daemon, or the writer's shipping
thread), never the commit path, pays for it once per segment."""
_CHUNK = 1 << 20
_MAX_WINDOW = 8 << 20
"""The largest window a frame may ask the decoder for (level 1 uses far less), so a
hostile frame cannot make it allocate more."""


def as_encoded(e: Entry, obj: bytes, file_size: int) -> Entry:
    """``e`` for ``obj``, the encoding of a file of ``file_size`` bytes (no file hash:
    the object's binds it)."""
    return msgspec.structs.replace(
        e, sha256=hashlib.sha256(obj).hexdigest(), size=len(obj), encoding=ENCODING,
        file_size=file_size, file_sha256="",
    )  # fmt: skip


def as_raw(e: Entry, data: bytes | memoryview) -> Entry:
    """``e`` for ``data``, the file itself shipped as it is."""
    return msgspec.structs.replace(
        e, sha256=hashlib.sha256(data).hexdigest(), size=len(data), encoding="",
        file_size=0, file_sha256="",
    )  # fmt: skip


def encode_segment(data: bytes | memoryview) -> bytes:
    """The object that holds the sealed segment ``data`` (one zstd frame, deterministic
    for a given zstandard version and level)."""
    return zstandard.ZstdCompressor(level=LEVEL, write_content_size=True).compress(data)


class _Bounded:
    """A sink for the decoded bytes: writes (and hashes, if asked) them, refusing past
    ``limit``."""

    def __init__(self, key: str, out: IO[bytes], limit: int, hashed: bool) -> None:
        self.key, self.out, self.limit = key, out, limit
        self.written = 0
        self.hash = hashlib.sha256() if hashed else None

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.limit:
            raise RemoteIntegrityError(self.key, f"decodes past the {self.limit} bytes it names")
        if self.hash is not None:
            self.hash.update(data)
        self.out.write(data)
        return len(data)


def decode_object(key: str, src: IO[bytes], out: IO[bytes], *, size: int, sha256: str) -> None:
    """Decode the object read from ``src`` into ``out``: exactly ``size`` bytes, of
    SHA-256 ``sha256`` unless that is empty (the object's own hash, which the caller
    checked, binds them), else refused.

    :raises RemoteIntegrityError: the frame does not decode, decodes to more or fewer
        bytes than ``size``, or to other bytes than ``sha256`` names.
    """
    sink = _Bounded(key, out, size, hashed=bool(sha256))
    try:
        # zstandard calls only read() and write() on them.
        zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW).copy_stream(
            src, cast(IO[bytes], sink), read_size=_CHUNK, write_size=_CHUNK
        )
    except zstandard.ZstdError as exc:
        raise RemoteIntegrityError(key, f"the zstd frame does not decode: {exc}") from None
    if sink.written != size:
        raise RemoteIntegrityError(
            key, f"decodes to {sink.written} bytes, the manifest says {size}"
        )
    if sink.hash is not None and sink.hash.hexdigest() != sha256:
        raise RemoteIntegrityError(key, "decodes to other bytes than the manifest's hash names")


def decode_to_bytes(e: Entry, obj: bytes) -> bytes:
    """The file that ``obj``, the object of encoded entry ``e``, holds.

    :raises RemoteIntegrityError: as :func:`decode_object`.
    """
    out = io.BytesIO()
    decode_object(e.key, io.BytesIO(obj), out, size=e.file_size, sha256=e.file_sha256)
    return out.getvalue()


def holds_file(path: Path, e: Entry) -> bool:
    """Whether the local file at ``path`` is the one ``e`` names: by its SHA-256, or,
    where ``e`` names none (an encoded object of manifest format 3), by encoding it
    again (deterministic for one zstandard version and level: a file encoded by
    another is taken as not held, and downloaded again).

    :raises OSError: the file cannot be read.
    """
    if not e.local_sha256:
        return hashlib.sha256(encode_segment(path.read_bytes())).hexdigest() == e.sha256
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest() == e.local_sha256
