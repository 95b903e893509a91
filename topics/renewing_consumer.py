"""A consumer of assigned partitions that replaces its librdkafka client when fetching stalls.

After a broker restart, a librdkafka client can keep a partition's leader as unknown for good: it stops
fetching the partition and says nothing (confluentinc/librdkafka#5430; seen here as a constructor, and a
chaos run's watch, that never read another record after a single-broker restart). A new client asks the
brokers afresh. So this consumer remembers where it reads each partition, and when a partition has
delivered nothing for ``stall_after_s`` of consuming although committed records lie past that offset,
it closes its client and assigns a new one at the same offsets: nothing is skipped or read twice."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import ClusterMetadata

from topics.watermarks import EndOffsets

log = logging.getLogger("mixflow.kafka")

STALL_AFTER_S = 15.0
# A caller that stopped consuming for this long (it had other work) did not wait on its partitions then:
# their quiet time starts again.
_CONSUMING_GAP_S = 2.0

Key = tuple[str, int]


class RenewingConsumer:
    """``assign``/``consume``/``poll``/``pause``/``resume`` as on a ``Consumer``, for partitions assigned
    by the caller (no group membership). ``settings`` are the client's; end-of-partition events are
    turned on to tell a client that read everything from one that stalled, and handed on only when
    ``settings`` ask for them."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        *,
        stall_after_s: float = STALL_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = {**settings, "enable.partition.eof": True}
        self._hand_on_eof = str(settings.get("enable.partition.eof", False)).lower() == "true"
        self._ends = EndOffsets(settings, isolation=settings.get("isolation.level", "read_committed"))
        self.stall_after_s = stall_after_s
        self._clock = clock
        self._client = Consumer(self._settings)
        # The same for every client of the group (assigned partitions: no member id, no generation), and
        # asked for on a transaction's thread while this one may be replacing the client.
        self._group_metadata = self._client.consumer_group_metadata()
        self._next: dict[Key, int] = {}  # per assigned partition, the offset of the next record to hand on
        self._paused: set[Key] = set()
        self._quiet_since: dict[Key, float] = {}
        self._checked_at: dict[Key, float] = {}
        self._last_call = clock()
        self.renewals = 0

    # -- the Consumer calls its callers make ------------------------------------------------------

    def assign(self, partitions: list[TopicPartition]) -> None:
        now = self._clock()
        self._next = {(p.topic, p.partition): p.offset for p in partitions}
        self._paused &= set(self._next)
        self._quiet_since = dict.fromkeys(self._next, now)
        self._checked_at = {}
        self._client.assign(partitions)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        now = self._clock()
        for p in partitions:
            self._next[(p.topic, p.partition)] = p.offset
            self._quiet_since[(p.topic, p.partition)] = now
        self._client.incremental_assign(partitions)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        self._waited()
        messages = [m for m in self._client.consume(num_messages=num_messages, timeout=timeout) if self._saw(m)]
        self._check_stalls()
        return messages

    def poll(self, timeout: float = -1) -> Message | None:
        self._waited()
        message = self._client.poll(timeout)
        if message is not None and not self._saw(message):
            message = None
        self._check_stalls()
        return message

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._client.pause(partitions)
        self._paused |= {(p.topic, p.partition) for p in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._client.resume(partitions)
        now = self._clock()
        for p in partitions:
            key = (p.topic, p.partition)
            self._paused.discard(key)
            self._quiet_since[key] = now

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return self._client.position(partitions)

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float = 10.0) -> tuple[int, int]:
        """Asked on a client of its own (``topics.watermarks``), which is replaced when it goes stale too."""
        return self._ends.watermarks(partition, timeout)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        return self._client.list_topics(topic, timeout=timeout)

    def consumer_group_metadata(self) -> Any:
        return self._group_metadata

    def close(self) -> None:
        self._ends.close()
        self._client.close()

    # -- bookkeeping ------------------------------------------------------------------------------

    def _waited(self) -> None:
        now = self._clock()
        if now - self._last_call > _CONSUMING_GAP_S:
            self._quiet_since = dict.fromkeys(self._next, now)
        self._last_call = now

    def _saw(self, message: Message) -> bool:
        """Note what ``message`` says of where its partition is read; whether the caller gets it."""
        error = message.error()
        eof = error is not None and error.code() == KafkaError._PARTITION_EOF
        if error is not None and not eof:
            return True
        key = (message.topic(), message.partition())
        if key in self._next:
            self._next[key] = message.offset() if eof else message.offset() + 1
            self._quiet_since[key] = self._clock()
        return not eof or self._hand_on_eof

    def _check_stalls(self) -> None:
        now = self._clock()
        for key, since in self._quiet_since.items():
            if key in self._paused or now - since < self.stall_after_s:
                continue
            if now - self._checked_at.get(key, since) < self.stall_after_s:
                continue
            self._checked_at[key] = now
            try:
                low, high = self._ends.watermarks(TopicPartition(*key), timeout_s=5.0)
            except KafkaException:
                continue  # the brokers are away: nothing to tell yet
            reading = self._next[key] if self._next[key] >= 0 else low  # a logical start reads from the log's start
            if high > reading:
                self._renew(key, reading, high, now - since)
                return

    def _renew(self, stalled: Key, reading: int, end: int, quiet_s: float) -> None:
        topic, partition = stalled
        log.warning(
            "reading %s[%d] stalled at offset %d although the log ends at %d (nothing for %.0f s): replacing the "
            "Kafka client (confluentinc/librdkafka#5430)",
            topic,
            partition,
            reading,
            end,
            quiet_s,
        )
        self._client.close()
        self._client = Consumer(self._settings)
        self._client.assign([TopicPartition(t, p, offset) for (t, p), offset in self._next.items()])
        if self._paused:
            self._client.pause([TopicPartition(t, p) for t, p in self._paused])
        now = self._clock()
        self._quiet_since = dict.fromkeys(self._next, now)
        self._checked_at = {}
        self.renewals += 1
