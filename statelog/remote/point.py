"""A remote restore to a point: which snapshot may start it, where its log ends.

:class:`Point` is the epoch (or the time) ``statelog restore URL STORE
--epoch N`` asks for. By epoch, only snapshots at or before it may start
the restore, and the log is fetched up to the segment holding it. By time,
a snapshot starts it only if the commit time its meta names (read from the
downloaded, verified file) is at or before the time; the log is fetched
segment by segment, each verified, until a record committed after the time:
the epoch before that record is the point. Either way the segment holding
the point is cut right after its record (:meth:`Point.cut`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec

from statelog.errors import EpochUnavailableError, InvalidOptionError
from statelog.format.records import decode_record
from statelog.log.reader import scan_segment
from statelog.recovery.point import record_end
from statelog.recovery.timeline import snapshot_commit_ms, to_ms
from statelog.remote.client import RemoteClient
from statelog.remote.entry import Entry
from statelog.remote.manifest import Manifest, commit
from statelog.remote.plan import plan_restore
from statelog.remote.record import load_record, update_record
from statelog.remote.staging import Staging
from statelog.storage.fileio import FileLayer

__all__ = ["Point", "apply_cut", "cut_manifest"]


@dataclass
class Point:
    """An epoch or a time to restore to (both None: the newest)."""

    epoch: int | None = None
    until_ms: int | None = None
    before: int = 0
    """By time: the last epoch the fetched log showed committed at or before it."""
    passed: bool = False
    """By time: a fetched record was committed after it (no later segment is needed)."""

    @classmethod
    def of(cls, upto: int | datetime | None) -> Point:
        """:raises InvalidOptionError: a datetime without a time zone."""
        if isinstance(upto, datetime):
            return cls(until_ms=to_ms(upto))
        if upto is not None and (not isinstance(upto, int) or isinstance(upto, bool) or upto < 1):
            raise InvalidOptionError(
                f"upto={upto!r}: a store is restored to an epoch >= 1",
                hint="epoch 0 is the empty store: start a new store instead",
            )
        return cls(epoch=upto)

    @property
    def bounded(self) -> bool:
        return self.epoch is not None or self.until_ms is not None

    def may_start(self, snap: Entry) -> bool:
        """Whether ``snap`` is not after the epoch (before any download)."""
        return self.epoch is None or snap.last_lsn <= self.epoch

    def starts(self, st: Staging, snap: Entry) -> bool:
        """Whether the downloaded ``snap`` was committed at or before the time."""
        if self.until_ms is None:
            return True
        t = snapshot_commit_ms(st.path_of(snap))
        return 0 < t <= self.until_ms  # an unknown time may be after it: an older one

    def may_want(self, e: Entry) -> bool:
        """Whether segment ``e`` may be needed, judged before any is read: not if it
        starts after the epoch asked for."""
        return self.epoch is None or e.first_lsn <= self.epoch

    def wants(self, e: Entry, epoch: int) -> bool:
        """Whether segment ``e`` (after ``epoch``) is still needed."""
        return self.may_want(e) if self.epoch is not None else not self.passed

    def seen(self, st: Staging, e: Entry) -> None:
        """By time: read the fetched segment ``e`` (the next one of the plan) up to its first
        record committed after the time; no later segment is fetched once there is one."""
        if self.until_ms is None or self.passed:
            return
        path = st.path_of(e)
        scan = scan_segment(path, path.read_bytes(), store_id=None, prev_crc=None, is_last=True)
        for r in scan.records:
            rec = decode_record(r.payload)
            if rec.commit_ms > self.until_ms:
                self.passed = True
                return
            self.before = rec.epoch

    def cut(self, st: Staging, restored: list[Entry], epoch: int, shipped: int) -> int:
        """Cut the staged segment holding the point after its record, and drop it from
        ``restored`` (its bytes are no longer the remote's); the point's epoch.

        :raises EpochUnavailableError: the restore stopped before the epoch asked.
        """
        target = self.epoch
        if self.until_ms is not None:
            target = self._drop_after(st, restored, self._by_time(restored, epoch))
        assert target is not None
        if epoch < target:
            why = "damage in the remote log stops the restore at" if epoch < shipped else "it holds"
            raise EpochUnavailableError(
                f"epoch {target} cannot be restored from the remote: {why} epoch {epoch}",
                epoch=target, oldest=None, newest=epoch,
            )  # fmt: skip
        last = restored[-1] if restored and restored[-1].kind == "wal" else None
        if last is None or last.last_lsn <= target:
            return target
        path = st.path_of(last)
        end = record_end(path, path.read_bytes(), target)
        if end is None:  # the staged segment was verified whole: a bug, not the remote's
            raise EpochUnavailableError(
                f"epoch {target} is not in {last.name} as staged",
                epoch=target, oldest=None, newest=epoch,
            )  # fmt: skip
        st.files.truncate(path, end)
        restored.pop()
        return target

    def _by_time(self, restored: list[Entry], epoch: int) -> int:
        """The last epoch committed at or before the time, as :meth:`seen` read the log
        (the plan's snapshot when no record after it was)."""
        start = next((e.last_lsn for e in reversed(restored) if e.kind == "snapshot"), 0)
        return min(max(self.before, start), epoch)

    @staticmethod
    def _drop_after(st: Staging, restored: list[Entry], found: int) -> int:
        while restored and restored[-1].kind == "wal" and restored[-1].first_lsn > found:
            st.remove(restored.pop())
        return found


def cut_manifest(m: Manifest, epoch: int) -> Manifest:
    """``m`` without the history after ``epoch``: snapshots after it, and segments that
    end after it (the one holding it was cut by the restore), moved to ``garbage``.

    A takeover from an earlier epoch publishes this before it ships: otherwise the
    discarded history's newer snapshots would stay the newest restore point, and a
    restore would bring back what the rewind discarded.
    """
    gone = [
        e for e in m.objects
        if (e.kind == "snapshot" and e.last_lsn > epoch) or (e.kind == "wal" and e.last_lsn > epoch)
    ]  # fmt: skip
    keys = {e.key for e in gone}
    kept = tuple(e for e in m.objects if e.key not in keys)
    cut = msgspec.structs.replace(m, objects=kept, garbage=tuple(sorted(set(m.garbage) | keys)))
    plan = plan_restore(cut)
    return msgspec.structs.replace(cut, last_epoch=plan.epoch if plan else 0)


def apply_cut(
    store: Path, client: RemoteClient, store_id: uuid.UUID, generation: int,
    files: FileLayer | None = None,
) -> None:  # fmt: skip
    """If ``store``'s ``remote.json`` names a cut (a restore to an earlier epoch), publish
    it in the MANIFEST as ``generation`` (:func:`cut_manifest`), then clear it from the
    record. Idempotent: a crash between the two leaves the cut to be published again.

    :raises FencedError: ``generation`` no longer owns the store; nothing was written.
    :raises RemoteError: the MANIFEST could not be written.
    :raises OSError: ``remote.json`` could not be written.
    """
    rec = load_record(store, files)
    if rec is None or not rec.cut_at:
        return
    cut = rec.cut_at
    commit(client, store_id, generation, lambda m: cut_manifest(m, cut))
    update_record(store, lambda cur: msgspec.structs.replace(cur or rec, cut_at=0), files)
