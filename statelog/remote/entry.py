"""One entry of the MANIFEST's index: a shipped object, where it sits in the log, and
the local file it holds. Read by every module that plans, downloads or ships;
the grammar an entry must follow is :func:`statelog.remote.checks.check_entries`.
"""

from __future__ import annotations

import msgspec

__all__ = ["BOUND_FORMAT", "ENCODED_FORMAT", "FORMAT", "Entry"]

FORMAT = 1
"""The MANIFEST format whose objects are the files themselves."""
ENCODED_FORMAT = 2
"""The format of a manifest listing an encoded (compressed) object: older readers, which
would take such an object for the file itself, refuse it at the format check. Each
encoded entry names the decoded file's SHA-256."""
BOUND_FORMAT = 3
"""The format in which an encoded entry may leave ``file_sha256`` empty: decoding is a
function of the object's bytes, which ``sha256`` binds, so a second hash over the
decoded file adds no check (and cost the shipper a third of its time). Readers of
format 2, which would require that hash, refuse it at the format check."""


class Entry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One shipped object. LSNs and crcs let restore plan the chain without downloading.

    A snapshot entry also carries its place in a snapshot chain, so planning
    needs no download: ``digest`` is the snapshot's footer digest (hex), and
    a delta names its ``parent`` (file name), the parent's footer digest
    (``parent_sha256``) and its ``depth`` (1: the parent is full). All four
    default to empty or 0, which is also how a manifest written before delta
    snapshots spells a full snapshot, so such a manifest reads unchanged (and
    re-encodes to the same bytes: defaults are omitted, so a signature over
    it still verifies). ``time_ms``, a snapshot's time for retention by time,
    is read the same way: 0 (absent) is unknown, and keeps the snapshot.
    """

    key: str  # relative to the URL's prefix
    kind: str  # "wal" or "snapshot"
    name: str  # the local file name
    sha256: str
    size: int
    generation: int
    sequence: int = 0  # wal: header sequence
    first_lsn: int = 0  # wal: header first LSN
    prev_crc: int = 0  # wal: header chain value
    last_lsn: int = 0  # wal: LSN in the SEAL; snapshot: its LSN
    end_crc: int = 0  # wal: the SEAL frame's crc; snapshot: its chain
    epoch: int = 0  # snapshot: its epoch
    digest: str = ""  # snapshot: its footer digest, hex ("": not recorded, an old manifest)
    parent: str = ""  # delta snapshot: its parent's file name
    parent_sha256: str = ""  # delta snapshot: the parent's footer digest it names, hex
    depth: int = 0  # snapshot: deltas from its full snapshot (0: it is full)
    time_ms: int = 0  # snapshot: its time (statelog.compaction.window.meta_time); 0: not recorded
    encoding: str = ""  # wal: "" (the object is the file) or "zstd" (the file, compressed)
    file_size: int = 0  # encoded: the file's size once decoded
    file_sha256: str = ""  # encoded: the file's SHA-256 once decoded, hex ("": bound by sha256)

    @property
    def local_size(self) -> int:
        """The size of the local file this object holds (``size`` unless encoded)."""
        return self.file_size if self.encoding else self.size

    @property
    def local_sha256(self) -> str:
        """The SHA-256 of the local file this object holds (``sha256`` unless encoded);
        "" for an encoded object whose entry does not name it (:data:`BOUND_FORMAT`)."""
        return self.file_sha256 if self.encoding else self.sha256
