"""A consumer of assigned partitions that replaces its librdkafka client when fetching stalls
(``topics.kafka.fetch_stall``): the new client is assigned where the old one stood, so nothing is skipped or
read twice."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import ClusterMetadata

from topics.kafka.fetch_stall import STALL_AFTER_S, FetchStallWatch, is_end_of_partition
from topics.kafka.librdkafka_log import logged
from topics.kafka.offset_lookup import OffsetLookup

log = logging.getLogger("mixflow.kafka")


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
        self._settings = {**logged(settings), "enable.partition.eof": True}
        self._hand_on_eof = str(settings.get("enable.partition.eof", False)).lower() == "true"
        ends = OffsetLookup(settings, isolation=settings.get("isolation.level", "read_committed"))
        self._watch = FetchStallWatch(ends, stall_after_s, clock)
        self._client = Consumer(self._settings)
        # The same for every client of the group (assigned partitions: no member id, no generation), and
        # asked for on a transaction's thread while this one may be replacing the client.
        self._group_metadata = self._client.consumer_group_metadata()
        self.renewals = 0

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._watch.assign(partitions)
        self._client.assign(partitions)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._watch.add(partitions)
        self._client.incremental_assign(partitions)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        self._watch.consuming()
        messages = self._client.consume(num_messages=num_messages, timeout=timeout)
        self._watch.saw_all(messages)
        if not self._hand_on_eof:
            messages = [m for m in messages if not is_end_of_partition(m)]
        self._renew_if_stalled()
        return messages

    def poll(self, timeout: float = -1) -> Message | None:
        self._watch.consuming()
        message = self._client.poll(timeout)
        if message is not None and self._watch.saw(message) and not self._hand_on_eof:
            message = None
        self._renew_if_stalled()
        return message

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._client.pause(partitions)
        self._watch.pause(partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._client.resume(partitions)
        self._watch.resume(partitions)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return self._client.position(partitions)

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float = 10.0) -> tuple[int, int]:
        """Asked on a client of its own (``topics.kafka.offset_lookup``), which is replaced when it goes stale too."""
        return self._watch.ends.watermarks(partition, timeout)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        return self._client.list_topics(topic, timeout=timeout)

    def consumer_group_metadata(self) -> Any:
        return self._group_metadata

    def close(self) -> None:
        self._watch.ends.close()
        self._client.close()

    def _renew_if_stalled(self) -> None:
        if (stall := self._watch.stall()) is None:
            return
        log.warning("%s: replacing the Kafka client", stall.describe())
        self._client.close()
        self._client = Consumer(self._settings)
        self._client.assign([TopicPartition(t, p, offset) for (t, p), offset in self._watch.next.items()])
        if self._watch.paused:
            self._client.pause([TopicPartition(t, p) for t, p in self._watch.paused])
        self._watch.restart()
        self.renewals += 1
