"""statelog's testing kit: one hookable fault layer and one seeded workload with its model.

The drill (``statelog drill``) and statelog's own tests are built on it; so
can the tests of a reconciler. Fault-test code that writes through a store::

    from statelog.kit import Crash, Fail, FaultyFiles, Stream

    files = FaultyFiles(store_path)             # model power loss of the store
    store = statelog.open(store_path, file_layer=files)
    files.add(Fail("sync", errno=errno.EIO))    # the next fsync fails
    ...
    files.abandon(store)
    files.crash("prefix")                       # what a disk holds after a power cut

Nothing on statelog's commit path imports this package.
"""

from __future__ import annotations

from statelog.kit.faults import CrashMode, FaultyAppendFile, FaultyFiles, sigkill
from statelog.kit.spec import DURABLE, KINDS, Crash, Fail, Fault, Kind, Pause, PowerCut, Step, Then
from statelog.kit.workload import (
    BLOB_TABLE,
    DEFAULT_SEED,
    Checkpoint,
    CommitSpec,
    Key,
    Model,
    Op,
    Stream,
    Value,
    Workload,
    make_value,
    run_commit,
    state_digest,
    store_digest,
)

__all__ = [
    "BLOB_TABLE",
    "DEFAULT_SEED",
    "DURABLE",
    "KINDS",
    "Checkpoint",
    "CommitSpec",
    "Crash",
    "CrashMode",
    "Fail",
    "Fault",
    "FaultyAppendFile",
    "FaultyFiles",
    "Key",
    "Kind",
    "Model",
    "Op",
    "Pause",
    "PowerCut",
    "Step",
    "Stream",
    "Then",
    "Value",
    "Workload",
    "make_value",
    "run_commit",
    "sigkill",
    "state_digest",
    "store_digest",
]
