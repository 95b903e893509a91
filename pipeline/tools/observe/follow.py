"""Reading topics from the beginning, a bit more at each look: the part of ``mixflow top`` that follows the
rank topics and the dead-letter topic as they grow."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from topics.kafka.clients import KafkaConfig
from topics.kafka.renewing_consumer import RenewingConsumer


class TopicFollower:
    """Hands every committed record of ``topics`` (all partitions) to ``on_record``, in offset order per
    partition; ``catch_up`` reads what was added since the last call. Topics not created yet are picked up
    by a later call."""

    def __init__(self, config: KafkaConfig, topics: Sequence[str], on_record: Callable[[Message], None]) -> None:
        self.topics = list(topics)
        self.on_record = on_record
        self.consumer = RenewingConsumer(
            {
                **config,
                "group.id": f"mixflow-top-{uuid.uuid4().hex[:12]}",  # assigned, never joins or commits
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                # Reaching a partition's end is an event: past the last record there may be transaction
                # markers, which the position does not move past until more is fetched.
                "enable.partition.eof": True,
                # The end is reported once a fetch comes back empty: do not let the broker hold it 500 ms.
                "fetch.wait.max.ms": 10,
            }
        )
        self.assigned: set[tuple[str, int]] = set()
        self.eof_at: dict[tuple[str, int], int] = {}  # the end offset a partition was last read to

    def _assign_new(self, timeout_s: float) -> None:
        new = []
        for topic in self.topics:
            if any(t == topic for t, _ in self.assigned):
                continue
            described = self.consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
            if described is None or described.error is not None:
                continue
            new += [(topic, p) for p in described.partitions]
        if new:
            self.consumer.incremental_assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in new])
            self.assigned.update(new)

    def _ends(self, timeout_s: float) -> dict[tuple[str, int], int]:
        return {
            (t, p): self.consumer.get_watermark_offsets(TopicPartition(t, p), timeout=timeout_s)[1]
            for t, p in self.assigned
        }

    def _caught_up(self, ends: dict[tuple[str, int], int]) -> bool:
        return all(end == 0 or self.eof_at.get(tp, -1) >= end for tp, end in ends.items())

    def catch_up(self, budget_s: float, settle_s: float = 1.0) -> bool:
        """Read until every partition is at the end it had when the call began, or ``budget_s`` passed, or
        nothing came for ``settle_s`` (an open transaction holds read_committed readers back). True when
        caught up."""
        start = time.monotonic()
        self._assign_new(timeout_s=max(1.0, budget_s))
        if not self.assigned:
            return True
        ends = self._ends(timeout_s=max(1.0, budget_s))
        quiet_since = time.monotonic()
        while not self._caught_up(ends):
            now = time.monotonic()
            if now - start > budget_s or now - quiet_since > settle_s:
                return False
            messages = self.consumer.consume(num_messages=10_000, timeout=0.2)
            for message in messages:
                where = (message.topic(), message.partition())
                if message.error() is None:
                    self.eof_at.pop(where, None)
                    self.on_record(message)
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    self.eof_at[where] = message.offset()
                else:
                    raise KafkaException(message.error())
            if messages:
                quiet_since = time.monotonic()
        return True

    def close(self) -> None:
        self.consumer.close()
