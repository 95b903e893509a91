"""Where a job's topics end, and where they ended at a given time, over all their partitions (a job of
``C`` constructor lanes has ``C`` partitions per source, rank and state topic): a consumer that reads no
records but the few ``tail`` asks for."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from topics.errors import MixflowError
from topics.kafka.clients import KafkaConfig
from topics.kafka.librdkafka_log import logged
from topics.kafka.offset_lookup import OffsetLookup


class OffsetProbe:
    """End offsets, offsets by time and the latest records of a job's topics, per partition or summed."""

    def __init__(self, config: KafkaConfig, timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self.where = config.get("bootstrap.servers")
        self.ends = OffsetLookup(config, isolation="read_committed")
        self.consumer = Consumer(
            {
                **logged(config),
                "group.id": f"mixflow-observe-{uuid.uuid4().hex[:12]}",  # never joins or commits
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,  # tail() stops at the end, past any transaction markers
                "fetch.wait.max.ms": 10,  # the end is reported once a fetch comes back empty: keep that short
            }
        )

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions; none when it does not exist (yet)."""
        try:
            return self.ends.partitions(topic, self.timeout_s)
        except KafkaException:
            return []

    def partition_ends(self, topic: str) -> dict[int, int]:
        """Each partition's high watermark; empty when the topic does not exist (yet)."""
        try:
            return {p: self.ends.end(TopicPartition(topic, p), self.timeout_s) for p in self.partitions(topic)}
        except KafkaException:
            return {}

    def end(self, topic: str) -> int | None:
        """The sum of the partitions' high watermarks; None when the topic does not exist (yet)."""
        ends = self.partition_ends(topic)
        return sum(ends.values()) if ends else None

    def partitions_at_time(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        """Per partition, the records written before ``timestamp_ms``: the first offset at or after that time
        (by record timestamp), or the end offset when none is."""
        ends = self.partition_ends(topic)
        if not ends:
            return {}
        asked = [TopicPartition(topic, p, int(timestamp_ms)) for p in ends]
        try:
            found = self.consumer.offsets_for_times(asked, timeout=self.timeout_s)
        except KafkaException as exc:
            msg = f"cannot look up offsets by time of {topic} at {self.where}: {exc}"
            raise MixflowError(msg) from exc
        return {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in found}

    def at_time(self, topics: Sequence[str], timestamp_ms: int) -> dict[str, int]:
        """Per topic, the records written before ``timestamp_ms`` in all its partitions together (0 for a
        topic that does not exist yet)."""
        return {topic: sum(self.partitions_at_time(topic, timestamp_ms).values()) for topic in topics}

    def tail(self, topic: str, records: int, timeout_s: float = 2.0) -> list[Message]:
        """The committed records among the last ``records`` offsets of each partition of the topic
        (transaction markers take offsets too), in partition then offset order, read for at most
        ``timeout_s``: a transaction open at the end holds back what follows."""
        ends = {p: end for p, end in self.partition_ends(topic).items() if end}
        if not ends:
            return []
        self.consumer.assign([TopicPartition(topic, p, max(0, end - records)) for p, end in ends.items()])
        out: list[Message] = []
        reached: set[int] = set()
        deadline = time.monotonic() + timeout_s
        try:
            while len(reached) < len(ends) and time.monotonic() < deadline:
                for message in self.consumer.consume(num_messages=10_000, timeout=0.1):
                    p = message.partition()
                    if message.error() is None and message.offset() < ends[p]:
                        out.append(message)
                    elif (
                        message.error() is not None
                        and message.error().code() == KafkaError._PARTITION_EOF
                        and message.offset() >= ends[p]
                    ):
                        reached.add(p)
        finally:
            self.consumer.unassign()
        out.sort(key=lambda m: (m.partition(), m.offset()))
        return out

    def close(self) -> None:
        self.ends.close()
        self.consumer.close()

    def __enter__(self) -> OffsetProbe:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
