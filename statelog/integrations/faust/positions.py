"""Where a partition's source events were processed up to, kept with the state they made.

Each table write made while processing an event also advances, in the same
commit, the statelog offset ``<source topic>-<partition>`` to the event's
offset plus one: the next event the store has not seen. When recovery
completes, every source partition of the worker's assignment is sought to
that offset before Faust seeks to Kafka's committed offsets, which it does
only where the group has committed one. Where Kafka holds a commit, Faust's
at-least-once resume point stands (the events after it come again); where
it holds none (a worker killed before its first commit, or offsets the
broker expired), processing resumes after the last event whose effects the
store holds, instead of at the consumer's reset policy, which would either
replay the whole topic or skip to its end past events never processed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from faust.types import TP

__all__ = ["event_position", "resume_points"]


def event_position(event: Any) -> tuple[str, int] | None:
    """The statelog offset an event's write advances: ``("<topic>-<partition>", offset + 1)``."""
    if event is None:
        return None
    msg = event.message
    return f"{msg.topic}-{msg.partition}", int(msg.offset) + 1


def resume_points(offsets: Mapping[str, int], assigned: Iterable[TP], skip: str) -> dict[TP, int]:
    """The assigned source partitions a store's ``offsets`` name, with the offset to
    resume at; ``skip`` is the store's changelog offset name."""
    by_name = {f"{tp.topic}-{tp.partition}": tp for tp in assigned}
    return {by_name[name]: off for name, off in offsets.items() if name != skip and name in by_name}
