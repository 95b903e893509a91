"""Where a job's topics end, and where they ended at a given time: a consumer that reads no records."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from pipeline.kafka_clients import KafkaConfig
from topics.errors import MixflowError


class OffsetProbe:
    """End offsets and offsets by time of single-partition topics (partition 0), for views of a job."""

    def __init__(self, config: KafkaConfig, timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self.where = config.get("bootstrap.servers")
        self.consumer = Consumer(
            {
                **config,
                "group.id": f"mixflow-observe-{uuid.uuid4().hex[:12]}",  # never joins or commits
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,  # tail() stops at the end, past any transaction markers
                "fetch.wait.max.ms": 10,  # the end is reported once a fetch comes back empty: keep that short
            }
        )

    def end(self, topic: str) -> int | None:
        """The topic's high watermark; None when the topic does not exist (yet)."""
        try:
            return self.consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=self.timeout_s)[1]
        except KafkaException:
            return None

    def ends(self, topics: Sequence[str]) -> dict[str, int | None]:
        return {topic: self.end(topic) for topic in topics}

    def at_time(self, topics: Sequence[str], timestamp_ms: int) -> dict[str, int]:
        """Per topic, the records written before ``timestamp_ms``: the first offset at or after that time
        (by record timestamp), or the end offset when none is."""
        asked = [TopicPartition(topic, 0, int(timestamp_ms)) for topic in topics]
        try:
            found = self.consumer.offsets_for_times(asked, timeout=self.timeout_s)
        except KafkaException as exc:
            msg = f"cannot look up offsets by time of {list(topics)} at {self.where}: {exc}"
            raise MixflowError(msg) from exc
        out = {}
        for tp in found:
            out[tp.topic] = tp.offset if tp.offset >= 0 else (self.end(tp.topic) or 0)
        return out

    def tail(self, topic: str, records: int, timeout_s: float = 2.0) -> list[Message]:
        """The committed records among the last ``records`` offsets of the topic (transaction markers take
        offsets too), read for at most ``timeout_s``: a transaction open at the end holds back what follows."""
        end = self.end(topic)
        if not end:
            return []
        start = max(0, end - records)
        self.consumer.assign([TopicPartition(topic, 0, start)])
        out: list[Message] = []
        deadline = time.monotonic() + timeout_s
        try:
            reached = False
            while not reached and time.monotonic() < deadline:
                for message in self.consumer.consume(num_messages=10_000, timeout=0.1):
                    if message.error() is None and message.offset() < end:
                        out.append(message)
                    elif message.error() is not None and message.error().code() == KafkaError._PARTITION_EOF:
                        reached = reached or message.offset() >= end
        finally:
            self.consumer.unassign()
        return out

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> OffsetProbe:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
