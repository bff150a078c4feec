"""The statelog compaction daemon (``statelog-compactor``).

It folds sealed WAL segments into full snapshots, in its own process, reading
only immutable files. The daemon itself lands with the snapshot issue; until
then this package only reserves the name, and nothing imports it.
"""

__all__: list[str] = []
