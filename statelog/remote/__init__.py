"""The remote tier: ship sealed segments and snapshots to object storage, restore, fence.

See ``docs/remote.md``. The entry points::

    from statelog.remote import ship, restore, acquire, check, lag

    ship(Path("state/"), "s3://bucket/shard-07")          # the compactor daemon does this
    restore("s3://bucket/shard-07", Path("/new/state"))   # on a fresh host
"""

from statelog.remote.attach import acquire, check, claim, restore_if_empty, take_over
from statelog.remote.client import RemoteClient, RetryPolicy
from statelog.remote.directory import DirectoryClient
from statelog.remote.errors import (
    ConditionFailedError,
    ObjectExistsError,
    RemoteConfigError,
    RemoteIntegrityError,
    RemoteNotFoundError,
    RemoteUnavailableError,
)
from statelog.remote.lag import Lag, LagCollector, lag
from statelog.remote.manifest import Manifest, read_manifest
from statelog.remote.record import load_record
from statelog.remote.restore import RestoreResult, find_store, restore
from statelog.remote.retention import RemoteRetentionResult, apply_remote_retention
from statelog.remote.ship import ShipResult, ship
from statelog.remote.url import RemoteConfig, parse_remote_url

__all__ = [
    "ConditionFailedError",
    "DirectoryClient",
    "Lag",
    "LagCollector",
    "Manifest",
    "ObjectExistsError",
    "RemoteClient",
    "RemoteConfig",
    "RemoteConfigError",
    "RemoteIntegrityError",
    "RemoteNotFoundError",
    "RemoteRetentionResult",
    "RemoteUnavailableError",
    "RestoreResult",
    "RetryPolicy",
    "ShipResult",
    "acquire",
    "apply_remote_retention",
    "check",
    "claim",
    "find_store",
    "lag",
    "load_record",
    "parse_remote_url",
    "read_manifest",
    "restore",
    "restore_if_empty",
    "ship",
    "take_over",
]
