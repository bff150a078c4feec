"""statelog: a changelog-backed state store for streaming and CDC reconcilers.

Offsets, the low watermark and the in-flight buffer commit together as one
checksummed record in a write-ahead log; recovery replays the verified
prefix and never returns a mix of two commits::

    import statelog

    with statelog.open("state/") as store:
        epoch = store.commit(
            offsets={"orders-0": 1042},
            low_watermark_ms=1_700_000_000_000,
            put={"order:17": {"src": 99.5}},
            delete=["order:3"],
        )

See ``docs/architecture.md`` for the design and ``docs/format.md`` for the files.
"""

import logging as _logging

from statelog.errors import (
    AuditError,
    AuditWarning,
    ChangesUnavailableError,
    CompactorLockedError,
    CorruptionError,
    DataLossWarning,
    EpochNotCommittedError,
    EpochUnavailableError,
    FencedError,
    FormatVersionError,
    IntegrationError,
    InvalidCommitError,
    InvalidOptionError,
    NotAStoreError,
    PromotionLostError,
    PromotionRefusedError,
    ReadOnlyStoreError,
    RemoteError,
    ResnapshotRequired,
    SinkError,
    StandbyCopyError,
    StatelogError,
    StatelogWarning,
    StorageError,
    StoreClosedError,
    StoreLockedError,
    StoreNotFoundError,
    StorePromotedError,
    UnknownTableError,
    WriteStallError,
)
from statelog.log.changes import Change, TableChange
from statelog.ops import audit as _audit
from statelog.recovery.report import Outcome, RecoveryReport, Rejection
from statelog.replica.standby import Lag
from statelog.sharding.partition import ShardMismatchError
from statelog.sharding.sharded import ShardCommitError, ShardedStore, ShardOpenError
from statelog.store.options import StoreOptions
from statelog.store.standby_role import Promotion
from statelog.store.store import Durability, StateStore, open
from statelog.store.transaction import Transaction

__version__ = "0.1.0"

# A library never prints: records reach the host application's handlers only.
_logging.getLogger("statelog").addHandler(_logging.NullHandler())

# Every process that links statelog records what happens to its stores in
# their audit trails: a writer's recoveries, a compactor's passes and deletions.
_audit.install()

__all__ = [
    "AuditError",
    "AuditWarning",
    "Change",
    "ChangesUnavailableError",
    "CompactorLockedError",
    "CorruptionError",
    "DataLossWarning",
    "Durability",
    "EpochNotCommittedError",
    "EpochUnavailableError",
    "FencedError",
    "FormatVersionError",
    "IntegrationError",
    "InvalidCommitError",
    "InvalidOptionError",
    "Lag",
    "NotAStoreError",
    "Outcome",
    "Promotion",
    "PromotionLostError",
    "PromotionRefusedError",
    "ReadOnlyStoreError",
    "RecoveryReport",
    "Rejection",
    "RemoteError",
    "ResnapshotRequired",
    "ShardCommitError",
    "ShardMismatchError",
    "ShardOpenError",
    "ShardedStore",
    "SinkError",
    "StandbyCopyError",
    "StateStore",
    "StatelogError",
    "StatelogWarning",
    "StorageError",
    "StoreClosedError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StoreOptions",
    "StorePromotedError",
    "TableChange",
    "Transaction",
    "UnknownTableError",
    "WriteStallError",
    "__version__",
    "open",
]
