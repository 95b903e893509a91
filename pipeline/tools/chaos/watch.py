"""What a chaos run observes of its job through Kafka: when each committed state record arrives (on a
thread), where the state topic ends, and which constructor process holds the lease."""

from __future__ import annotations

import bisect
import threading
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig
from topics.kafka.offset_lookup import OffsetLookup
from topics.kafka.renewing_consumer import RenewingConsumer

# The run's own clients. Connection errors while the broker restarts are expected. Without
# metadata.recovery.strategy=none, librdkafka forgets a single broker that went away ("re-bootstrap") and
# then waits forever for its group coordinator (confluentinc/librdkafka#5511).
CLIENT_SETTINGS = {"log_level": 2, "metadata.recovery.strategy": "none"}


class StateWatch:
    """Follows ``<job>.state`` with ``read_committed``: a step's state record commits with its batches, so
    each arrival is a step written. Rides out broker restarts (the client reconnects)."""

    def __init__(self, config: KafkaConfig, job: str) -> None:
        settings = {
            **config,
            "group.id": f"mixflow-chaos-{uuid.uuid4().hex[:12]}",  # assigned, never joined or committed
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 20,  # arrival times are takeover gaps: no long fetch waits
            **CLIENT_SETTINGS,
        }
        self.partition = TopicPartition(JobTopics(job).state, 0)
        self._consumer = RenewingConsumer(settings)  # a step written is a step seen, broker restarts or not
        self._consumer.assign([TopicPartition(self.partition.topic, 0, OFFSET_BEGINNING)])
        self._ends = OffsetLookup(settings)  # for the main thread's end-offset questions
        self._offsets: list[int] = []
        self._arrivals: list[float] = []
        self._steps = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="state-watch", daemon=True)
        self._thread.start()

    @property
    def steps(self) -> int:
        """Steps committed so far (the highest step key seen, plus one)."""
        with self._lock:
            return self._steps

    def end_offset(self, timeout_s: float = 10.0) -> int:
        """Where the state topic's log ends now, open transactions included: a record committed after this
        call lies at this offset or above."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._ends.end(self.partition, timeout_s=2.0)
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)  # the broker is starting again

    def arrival_at_or_after(self, offset: int) -> float | None:
        """When the first committed record at ``offset`` or above arrived, if one has."""
        with self._lock:
            i = bisect.bisect_left(self._offsets, offset)
            return self._arrivals[i] if i < len(self._offsets) else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()
        self._ends.close()

    def _follow(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.1)
            if message is None or message.error() is not None:
                continue
            key = message.key() or b""
            with self._lock:
                self._offsets.append(message.offset())
                self._arrivals.append(time.monotonic())
                if key.isdigit():
                    self._steps = max(self._steps, int(key) + 1)


@dataclass(frozen=True)
class Lease:
    """The job's constructor lease group (``pipeline.roles.constructor.lease``) as the broker describes it: its
    state, the pids of its members and of those assigned the lease (members' client ids end with pids)."""

    state: str = "not described"
    members: frozenset[int] = frozenset()
    holders: tuple[int, ...] = ()

    @property
    def holder(self) -> int | None:
        """The one member holding the lease, once the group is stable."""
        return self.holders[0] if self.state == "STABLE" and len(self.holders) == 1 else None

    def describe(self) -> str:
        return f"lease group {self.state}, members {sorted(self.members)}, holding {list(self.holders)}"


class LeaseWatch:
    def __init__(self, config: KafkaConfig, job: str) -> None:
        self.group = f"{job}.constructor.lease"
        self.config = {**config, **CLIENT_SETTINGS}
        self._admin = AdminClient(self.config)

    def look(self, timeout_s: float = 5.0) -> Lease:
        """The group now; a ``Lease`` without members when the broker does not answer."""
        future = self._admin.describe_consumer_groups([self.group], request_timeout=timeout_s)[self.group]
        try:
            description = future.result(timeout=timeout_s + 1)
        except (KafkaException, TimeoutError) as exc:  # the next look asks with a new client
            self._admin = AdminClient(self.config)
            return Lease(state=f"not described ({exc!r})")
        members = [(_pid(m.client_id), bool(m.assignment.topic_partitions)) for m in description.members]
        return Lease(
            state=str(description.state).rpartition(".")[2],
            members=frozenset(pid for pid, _ in members if pid is not None),
            holders=tuple(pid for pid, holds in members if holds and pid is not None),
        )


def _pid(client_id: str) -> int | None:
    _, _, pid = client_id.rpartition("-")
    return int(pid) if pid.isdigit() else None
