"""Which changelog records are a partition store's own: the journal of writes not yet confirmed.

Every table write reaches statelog when it is made, and its changelog record
reaches Kafka later, when Faust's producer sends it; Faust confirms each
delivered record, in order, with ``set_persisted_offset``. Faust commits the
source topic's offsets after a producer flush that gives up when nothing is
sent within 0.1 s, so after a crash the source can resume past events whose
changelog records never arrived, while statelog holds their writes. Replaying
the changelog over such a store from its persisted offset would roll keys
back to older copies of the store's own writes, and the events that made the
newer ones never come again: their effect would be lost.

So each write also puts one journal entry in the same commit: its sequence
number and a digest of the record Faust sends for it (key and value). A
confirmation removes the oldest entry, with the persisted offset, in the
partition's next commit; the durable persisted offset and the journal thus
always agree: the records after that offset are, in order, those the journal
names, as far as they were delivered. When a restarted worker recovers the
partition, each replayed record that matches the journal (its next entry, or
a later one when earlier records never arrived) is the store's own and is not
applied over the newer state; the first record that matches none is another
writer's, and it and every record after it are applied as Faust sends them.
What is left of the crashed run's entries once recovery completes was never
delivered and is dropped (the writes of this run, which may start before
recovery ends, keep theirs until Faust confirms them); a revoked partition
drops every entry, since its next owner writes the changelog too.

The effect for an agent: after a crash, the events since Faust's last source
commit come again (at least once), and the table already holds the effects
of those that statelog committed: the agent must recognise an event it has
applied (by a sequence number or an event id, as in the example).
"""

from __future__ import annotations

import hashlib
import struct
from collections import deque

from statelog.store.store import StateStore
from statelog.store.transaction import Transaction

__all__ = ["JOURNAL", "SentJournal", "record_digest"]

JOURNAL = "faust.sent"
"""The statelog table of a partition store's writes whose changelog records are unconfirmed."""

_SEQ = struct.Struct(">Q")


def record_digest(key: bytes, value: bytes | None) -> bytes:
    """16 bytes naming one changelog record: its key and value (None: a tombstone)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(_SEQ.pack(len(key)))
    h.update(key)
    h.update(b"\x00" if value is None else b"\x01" + value)
    return h.digest()


class SentJournal:
    """One partition store's journal (module docstring); read from the store at open."""

    def __init__(self, store: StateStore) -> None:
        # Entries from before this open (a crashed run's), which only a replay's matches
        # or settle() remove, apart from this run's, which Faust's confirmations remove:
        # a write made while recovery runs must not be taken for an older one.
        self._old: deque[tuple[int, bytes]] = deque()
        for raw, digest in store.items(JOURNAL):
            assert isinstance(raw, bytes)  # this table's keys are sequence numbers
            self._old.append((_SEQ.unpack(raw)[0], bytes(digest)))
        self._entries: deque[tuple[int, bytes]] = deque()
        self._next = self._old[-1][0] + 1 if self._old else 1
        self._done: list[int] = []  # removed from memory, deleted with the next commit
        self.matching = bool(self._old)  # a recovery may still meet the store's own records

    def __len__(self) -> int:
        return len(self._old) + len(self._entries)

    def wrote(self, tx: Transaction, key: bytes, value: bytes | None) -> None:
        """Journal a write in its commit ``tx`` (with any removals due)."""
        self._entries.append((self._next, record_digest(key, value)))
        tx.put(_SEQ.pack(self._next), self._entries[-1][1], table=JOURNAL)
        self._next += 1
        self.removals(tx)

    def delivered(self) -> None:
        """Faust confirmed the oldest unconfirmed record (removed with the next commit)."""
        if self._entries:
            self._done.append(self._entries.popleft()[0])

    def pending(self) -> bool:
        """Whether removals wait for a commit."""
        return bool(self._done)

    def removals(self, tx: Transaction) -> None:
        """Delete the confirmed or dropped entries in the commit ``tx``."""
        for seq in self._done:
            tx.delete(_SEQ.pack(seq), table=JOURNAL)
        self._done.clear()

    def own(self, key: bytes, value: bytes | None) -> bool:
        """Whether a replayed record is this store's own write (then it is not applied).

        A match on a later entry drops the entries before it: records that never
        arrived. A record that matches none ends the matching for this recovery.
        """
        if not self.matching:
            return False
        digest = record_digest(key, value)
        for i, (_, d) in enumerate(self._old):
            if d == digest:
                for _ in range(i + 1):
                    self._done.append(self._old.popleft()[0])
                return True
        self.matching = False
        return False

    def settle(self) -> None:
        """Drop the entries left from before this open: records never delivered
        (removed with the next commit)."""
        while self._old:
            self._done.append(self._old.popleft()[0])
        self.matching = False

    def clear(self) -> None:
        """Drop every entry (a partition revoked: its next owner writes the changelog too)."""
        self.settle()
        while self._entries:
            self.delivered()
