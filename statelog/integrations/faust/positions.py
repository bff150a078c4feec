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

A source partition of an active table partition that the store names no
offset for (its state came from the changelog another worker wrote) is
sought to its earliest offset when the reset policy is ``earliest``. The
consumer's position there cannot be trusted: while recovery runs, Faust
fetches the partition's records and drops them (it is paused), and its
seek to the committed offset, which would take the position back, does
nothing where Kafka holds no commit; processing would resume past events
nobody processed. From the earliest offset, the events the changelog's state
holds come again (at least once) and none is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from faust.types import TP, AppT

__all__ = ["event_position", "offset_name", "resume_points", "seek_sources"]


def offset_name(tp: TP) -> str:
    """The statelog offset of a topic partition: ``"app-counts-changelog-3"``, ``"orders-0"``."""
    return f"{tp.topic}-{tp.partition}"


def event_position(event: Any) -> tuple[str, int] | None:
    """The statelog offset an event's write advances: ``("<topic>-<partition>", offset + 1)``."""
    if event is None:
        return None
    msg = event.message
    return offset_name(msg.tp), int(msg.offset) + 1


def resume_points(offsets: Mapping[str, int], assigned: Iterable[TP], skip: str) -> dict[TP, int]:
    """The assigned source partitions a store's ``offsets`` name, with the offset to
    resume at; ``skip`` is the store's changelog offset name."""
    by_name = {offset_name(tp): tp for tp in assigned}
    return {by_name[name]: off for name, off in offsets.items() if name != skip and name in by_name}


async def seek_sources(app: AppT, active: Mapping[TP, Mapping[str, int]]) -> None:
    """Seek the source partitions of the active changelog partitions ``active`` (each
    with its store's offsets) where processing must resume (module docstring).

    The source partitions are the assigned ones of the same partition number in
    the topics Faust commits offsets for (its agents' topics). Faust seeks
    where Kafka holds a commit afterwards, in the consumer's own thread, as
    this does: a seek from the event loop would race the fetcher there.
    """
    consumer = app.consumer
    assigned = consumer.assignment()
    seeks: dict[TP, int] = {}
    for changelog, offsets in active.items():
        seeks.update(resume_points(offsets, assigned, offset_name(changelog)))
    numbers = {tp.partition for tp in active}
    unnamed = [
        tp for tp in assigned
        if tp.partition in numbers and tp not in seeks and app.topics.acks_enabled_for(tp.topic)
    ]  # fmt: skip
    if unnamed and str(app.conf.consumer_auto_offset_reset) == "earliest":
        earliest = await consumer.earliest_offsets(*unnamed)
        seeks.update({tp: offset for tp, offset in earliest.items() if offset is not None})
    if seeks:
        await consumer.seek_wait(seeks)
