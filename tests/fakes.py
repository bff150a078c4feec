"""Stand-ins for the services statelog's examples talk to, for tests without a network.

:func:`fake_kafka` builds an in-memory module with confluent-kafka's names
(``Consumer``, ``TopicPartition``, ``Message``, ``KafkaError``,
``KafkaException`` and the logical offsets): topics whose partitions are
lists of messages with gaps in their offsets, ``assign`` honouring the
offsets it is given (logical ones included, and ``auto.offset.reset`` when
an offset is out of range), ``poll`` returning message objects with the
same methods, auto-commit when it is enabled, and a consumer group that
rebalances eagerly with the range assignor, calling ``on_revoke`` and
``on_assign`` from ``poll`` and assigning by itself when a callback does
not. A test installs it as ``sys.modules["confluent_kafka"]`` and registers
a :class:`Cluster` in :data:`CLUSTERS` under the ``bootstrap.servers`` its
consumers name.
"""

from __future__ import annotations

import bisect
import builtins
import random
import types
from collections.abc import Callable
from typing import Any

from examples.kafka_reconciler import partition_name

OFFSET_BEGINNING, OFFSET_END, OFFSET_STORED, OFFSET_INVALID = -2, -1, -1000, -1001


class KafkaError:
    """confluent_kafka.KafkaError: a code, a reason, ``code()``, ``str()``, ``name()``."""

    _AUTO_OFFSET_RESET = -140
    _PARTITION_EOF = -191

    def __init__(self, code: int, reason: str = "") -> None:
        self._code = code
        self._reason = reason

    def code(self) -> int:
        return self._code

    def str(self) -> builtins.str:
        return self._reason

    def name(self) -> builtins.str:
        return {-140: "_AUTO_OFFSET_RESET", -191: "_PARTITION_EOF"}.get(self._code, "?")

    def fatal(self) -> bool:
        return False

    def __repr__(self) -> builtins.str:
        return f"KafkaError{{code={self.name()},val={self._code},str={self._reason!r}}}"


class KafkaException(Exception):
    """confluent_kafka.KafkaException: ``args[0]`` is the KafkaError."""


class TopicPartition:
    """confluent_kafka.TopicPartition: equal and hashed by (topic, partition), not offset."""

    def __init__(
        self,
        topic: str,
        partition: int = -1,
        offset: int = OFFSET_INVALID,
        metadata: str | None = None,
        leader_epoch: int | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.metadata = metadata
        self.leader_epoch = leader_epoch
        self.error: KafkaError | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return (self.topic, self.partition) == (other.topic, other.partition)

    def __hash__(self) -> int:
        return hash((self.topic, self.partition))

    def __lt__(self, other: TopicPartition) -> bool:
        return (self.topic, self.partition) < (other.topic, other.partition)

    def __repr__(self) -> str:
        return (
            f"TopicPartition{{topic={self.topic},partition={self.partition},offset={self.offset}}}"
        )


class Message:
    """confluent_kafka.Message: accessor methods, and ``error()`` for error events."""

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int | None,
        key: bytes | None,
        value: bytes | None,
        error: KafkaError | None = None,
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._error = key, value, error

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (0, -1)  # TIMESTAMP_NOT_AVAILABLE


class PartitionLog:
    """One partition: messages in offset order (with gaps), from ``log_start``."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.offsets = [m.offset() or 0 for m in messages]
        self.log_start = self.offsets[0] if messages else 0

    @property
    def end(self) -> int:
        """The high watermark: the last offset + 1."""
        last = self.messages[-1].offset() if self.messages else None
        return self.log_start if last is None else last + 1

    def at_or_after(self, offset: int) -> Message | None:
        """What a fetch at ``offset`` returns first (the next message at or after it)."""
        i = bisect.bisect_left(self.offsets, offset)
        return self.messages[i] if i < len(self.messages) else None

    def delete_before(self, offset: int) -> None:
        """Retention: the messages before ``offset`` are gone."""
        self.messages = [m for m in self.messages if (m.offset() or 0) >= offset]
        self.offsets = [m.offset() or 0 for m in self.messages]
        self.log_start = offset


class Group:
    """A consumer group: eager rebalancing, range assignor, join barrier."""

    def __init__(self, cluster: Cluster, group_id: str) -> None:
        self.cluster = cluster
        self.id = group_id
        self.members: list[Consumer] = []
        self.revoked: set[int] = set()
        self.assignment: dict[int, list[tuple[str, int]]] | None = {}
        self.generation = 0

    def join(self, member: Consumer) -> None:
        self.members.append(member)
        self._rebalance()

    def leave(self, member: Consumer) -> None:
        self.members.remove(member)
        self._rebalance()

    def _rebalance(self) -> None:
        self.generation += 1
        self.revoked = set()
        self.assignment = None
        for m in self.members:
            m.rebalance_pending = True
        if not self.members:
            self.assignment = {}

    def revoke_done(self, member: Consumer) -> None:
        self.revoked.add(id(member))
        if all(id(m) in self.revoked for m in self.members):
            self.assignment = self._range_assign()

    def _range_assign(self) -> dict[int, list[tuple[str, int]]]:
        members = sorted(self.members, key=lambda m: m.member_id)
        out: dict[int, list[tuple[str, int]]] = {id(m): [] for m in members}
        topics = sorted({t for m in members for t in m.topics})
        for topic in topics:
            n = self.cluster.partition_count(topic)
            per, extra = divmod(n, len(members))
            start = 0
            for i, m in enumerate(members):
                count = per + (1 if i < extra else 0)
                out[id(m)] += [(topic, p) for p in range(start, start + count)]
                start += count
        return out


class Cluster:
    """Topics, committed group offsets and groups, reachable by a bootstrap address."""

    def __init__(self, topics: dict[str, list[list[Message]]], seed: int = 0) -> None:
        self.logs = {
            (t, p): PartitionLog(ms) for t, parts in topics.items() for p, ms in enumerate(parts)
        }
        self.committed: dict[tuple[str, str, int], int] = {}
        self.groups: dict[str, Group] = {}
        self.rng = random.Random(seed)
        self.consumers = 0

    def partition_count(self, topic: str) -> int:
        return sum(1 for t, _ in self.logs if t == topic)

    def group(self, group_id: str) -> Group:
        return self.groups.setdefault(group_id, Group(self, group_id))

    def metadata(self) -> types.SimpleNamespace:
        topics = {}
        for topic in sorted({t for t, _ in self.logs}):
            parts = {p: types.SimpleNamespace(id=p, error=None) for t, p in self.logs if t == topic}
            topics[topic] = types.SimpleNamespace(topic=topic, partitions=parts, error=None)
        return types.SimpleNamespace(cluster_id="fake", topics=topics, brokers={})

    def ends(self) -> dict[str, int]:
        """The high watermark of every partition, by statelog offsets key."""
        return {partition_name(t, p): log.end for (t, p), log in self.logs.items()}


CLUSTERS: dict[str, Cluster] = {}


class Consumer:
    """confluent_kafka.Consumer over a :class:`Cluster` named by ``bootstrap.servers``."""

    def __init__(self, config: dict[str, Any]) -> None:
        if "group.id" not in config:
            raise KafkaException(KafkaError(-186, "group.id must be configured"))
        self.cluster = CLUSTERS[config["bootstrap.servers"]]
        self.config = dict(config)
        self.cluster.consumers += 1
        self.member_id = f"rdkafka-{self.cluster.consumers:04d}"
        self.positions: dict[tuple[str, int], int | None] = {}  # None: stalled by an error
        self.stored: dict[tuple[str, int], int] = {}
        self.pending_errors: list[Message] = []
        self.assigns: list[list[TopicPartition]] = []  # every assign() call, for the tests
        self.topics: list[str] = []
        self.group: Group | None = None
        self.callbacks: dict[str, Callable[[Consumer, list[TopicPartition]], None] | None] = {}
        self.rebalance_pending = False
        self.awaiting_assignment = False
        self.assigned_by_app = False
        self.closed = False
        self.current: tuple[str, int] | None = None
        self.run_left = 0
        self.rng = random.Random(self.cluster.rng.random())

    # -- settings
    def _flag(self, name: str, default: bool) -> bool:
        value = self.config.get(name, default)
        return value if isinstance(value, bool) else str(value).lower() == "true"

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("Consumer closed")

    # -- assignment
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> types.SimpleNamespace:
        self._check_open()
        return self.cluster.metadata()

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._check_open()
        self.assigned_by_app = True
        self.assigns.append(
            [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in partitions]
        )
        self.positions = {}
        for tp in partitions:
            self.positions[(tp.topic, tp.partition)] = self._resolve(tp)

    def unassign(self) -> None:
        self._check_open()
        self.assigned_by_app = True
        self.positions = {}

    def assignment(self) -> list[TopicPartition]:
        self._check_open()
        return [TopicPartition(t, p) for t, p in sorted(self.positions)]

    def _resolve(self, tp: TopicPartition) -> int | None:
        log = self.cluster.logs[(tp.topic, tp.partition)]
        offset = tp.offset
        if offset == OFFSET_BEGINNING:
            return log.log_start
        if offset == OFFSET_END:
            return log.end
        if offset in (OFFSET_STORED, OFFSET_INVALID):
            committed = self.cluster.committed.get(
                (self.config["group.id"], tp.topic, tp.partition)
            )
            if committed is None:
                return self._reset(tp, log)
            offset = committed
        if offset < log.log_start or offset > log.end:
            return self._reset(tp, log)
        return offset

    def _reset(self, tp: TopicPartition, log: PartitionLog) -> int | None:
        policy = str(self.config.get("auto.offset.reset", "latest"))
        if policy in ("smallest", "earliest", "beginning"):
            return log.log_start
        if policy in ("largest", "latest", "end"):
            return log.end
        reason = f"{tp.topic} [{tp.partition}]: fetch offset {tp.offset} is out of range"
        self.pending_errors.append(
            Message(tp.topic, tp.partition, None, None, None, KafkaError(-140, reason))
        )
        return None

    # -- groups
    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[[Consumer, list[TopicPartition]], None] | None = None,
        on_revoke: Callable[[Consumer, list[TopicPartition]], None] | None = None,
        on_lost: Callable[[Consumer, list[TopicPartition]], None] | None = None,
    ) -> None:
        self._check_open()
        self.topics = list(topics)
        self.callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        self.group = self.cluster.group(self.config["group.id"])
        self.group.join(self)

    def _serve_rebalance(self) -> bool:
        """Run the rebalance callbacks due; True while this member waits for the others."""
        group = self.group
        assert group is not None
        if self.rebalance_pending:
            self.rebalance_pending = False
            self.awaiting_assignment = True
            owned = self.assignment()
            self.assigned_by_app = False
            revoke = self.callbacks.get("revoke")
            if revoke is not None:
                revoke(self, owned)
            if not self.assigned_by_app:
                self.positions = {}
            group.revoke_done(self)
        if self.awaiting_assignment:
            if group.assignment is None:
                return True
            self.awaiting_assignment = False
            mine = [TopicPartition(t, p) for t, p in group.assignment.get(id(self), [])]
            self.assigned_by_app = False
            on_assign = self.callbacks.get("assign")
            if on_assign is not None:
                on_assign(self, mine)
            if not self.assigned_by_app:
                self.assign(mine)  # the client assigns by itself: committed offsets
        return False

    # -- consuming
    def poll(self, timeout: float | None = None) -> Message | None:
        self._check_open()
        if self._flag("enable.auto.commit", True):
            for (t, p), offset in self.stored.items():
                self.cluster.committed[(self.config["group.id"], t, p)] = offset
        if self.group is not None and self._serve_rebalance():
            return None
        if self.pending_errors:
            return self.pending_errors.pop(0)
        msg = self._next()
        if msg is not None and self._flag("enable.auto.offset.store", True):
            self.stored[(msg.topic() or "", msg.partition() or 0)] = (msg.offset() or 0) + 1
        return msg

    def _next(self) -> Message | None:
        live = []
        for tp, pos in sorted(self.positions.items()):
            if pos is not None and self.cluster.logs[tp].at_or_after(pos) is not None:
                live.append(tp)
        if not live:
            return None
        if self.current not in live or self.run_left <= 0:
            self.current = self.rng.choice(live)
            self.run_left = self.rng.randint(1, 12)  # fetches come in runs per partition
        self.run_left -= 1
        pos = self.positions[self.current]
        assert pos is not None
        msg = self.cluster.logs[self.current].at_or_after(pos)
        assert msg is not None
        self.positions[self.current] = (msg.offset() or 0) + 1
        return msg

    def commit(
        self,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> Any:  # None when asynchronous, else the committed list
        self._check_open()
        gid = self.config["group.id"]
        if message is not None:
            done = [
                TopicPartition(
                    message.topic() or "", message.partition() or 0, (message.offset() or 0) + 1
                )
            ]
        elif offsets is not None:
            done = [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in offsets]
        else:
            done = [
                TopicPartition(t, p, o) for (t, p), o in self.positions.items() if o is not None
            ]
        for tp in done:
            self.cluster.committed[(gid, tp.topic, tp.partition)] = tp.offset
        return None if asynchronous else done

    def committed(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        gid = self.config["group.id"]
        return [
            TopicPartition(
                tp.topic,
                tp.partition,
                self.cluster.committed.get((gid, tp.topic, tp.partition), OFFSET_INVALID),
            )
            for tp in partitions
        ]

    def close(self) -> None:
        if self.closed:
            return
        if self.group is not None:
            revoke = self.callbacks.get("revoke")
            if revoke is not None and self.positions:
                revoke(self, self.assignment())
            self.group.leave(self)
        if self._flag("enable.auto.commit", True):
            for (t, p), offset in self.stored.items():
                self.cluster.committed[(self.config["group.id"], t, p)] = offset
        self.positions = {}
        self.closed = True

    def crash(self) -> None:
        """The process died: no callback, no commit; the group notices at session timeout."""
        self.closed = True
        if self.group is not None:
            self.group.leave(self)


def fake_kafka() -> types.ModuleType:
    """A module that stands in for ``confluent_kafka``."""
    module = types.ModuleType("confluent_kafka")
    for name, value in {
        "Consumer": Consumer,
        "TopicPartition": TopicPartition,
        "Message": Message,
        "KafkaError": KafkaError,
        "KafkaException": KafkaException,
        "OFFSET_BEGINNING": OFFSET_BEGINNING,
        "OFFSET_END": OFFSET_END,
        "OFFSET_STORED": OFFSET_STORED,
        "OFFSET_INVALID": OFFSET_INVALID,
    }.items():
        setattr(module, name, value)
    return module
