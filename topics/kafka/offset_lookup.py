"""Where partitions end and what a group has committed, asked on a client of its own that is replaced
when it goes stale.

After a broker restart, a librdkafka client can keep a partition's leader as unknown for good and then
answer "Local: Unknown partition" to every question about it, however often it is asked and however
healthy the broker is again (confluentinc/librdkafka#5430; seen here after single-broker restarts); a
group member's questions to its coordinator can time out for good the same way. A new client asks the
brokers afresh, so a failed question drops the client and the next one builds another.

A partition just created, or one whose leader moved, answers "not leader" or "unknown partition" for a
moment; such a question is asked again, on a new client, until its timeout is spent."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from topics.kafka.authorization import is_authorization_error, refused
from topics.kafka.librdkafka_log import logged
from topics.kafka.retry import is_retriable

log = logging.getLogger("mixflow.kafka")

Isolation = Literal["read_committed", "read_uncommitted"]
T = TypeVar("T")

FIRST_RETRY_S = 0.05


class OffsetLookup:
    """``end()`` is a partition's high watermark, or its last stable offset under read_committed: the
    offset a consumer with that isolation stands at once it has read everything there is. ``committed()``
    is what ``group`` has committed; the lookup never joins the group."""

    def __init__(
        self, config: Mapping[str, Any], isolation: Isolation = "read_committed", group: str | None = None
    ) -> None:
        self._config = logged(config)
        self._settings = {
            **self._config,
            "group.id": group or f"mixflow-ends-{uuid.uuid4().hex[:12]}",  # asked, never joined
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
        self._client: Consumer | None = None
        self.replaced = 0  # clients dropped after a failed question

    def end(self, partition: TopicPartition, timeout_s: float) -> int:
        return self.watermarks(partition, timeout_s)[1]

    def watermarks(self, partition: TopicPartition, timeout_s: float) -> tuple[int, int]:
        """Where the partition's log starts and where it ends."""
        return self._ask(lambda c, left_s: c.get_watermark_offsets(partition, timeout=left_s), timeout_s)

    def committed(self, partitions: list[TopicPartition], timeout_s: float) -> list[TopicPartition]:
        try:
            return self._ask(lambda c, left_s: c.committed(partitions, timeout=left_s), timeout_s)
        except KafkaException as exc:
            if exc.args and isinstance(exc.args[0], KafkaError) and exc.args[0].code() == KafkaError._TIMED_OUT:
                self._raise_if_group_refused(partitions)
            raise

    def _raise_if_group_refused(self, partitions: list[TopicPartition]) -> None:
        """A consumer asking a group it may not read waits for its coordinator until it times out, saying
        nothing more; an admin client's request for the same offsets is answered with the refusal."""
        group = str(self._settings["group.id"])
        asked = [ConsumerGroupTopicPartitions(group, partitions)]
        admin = AdminClient(self._config)  # held while its answer is awaited: a freed client drops its requests
        try:
            admin.list_consumer_group_offsets(asked, request_timeout=10)[group].result(10)
        except KafkaException as exc:
            if exc.args and is_authorization_error(exc.args[0]):
                raise refused(self._config, "READ", "group", group, "reading what it committed") from exc
        except TimeoutError:
            pass  # unanswered as well: the timeout stands

    def partitions(self, topic: str, timeout_s: float) -> list[int]:
        """The topic's partitions; none while it does not exist."""

        def described(client: Consumer, left_s: float) -> list[int]:
            found = client.list_topics(topic, timeout=left_s).topics.get(topic)
            return sorted(found.partitions) if found is not None and found.error is None else []

        return self._ask(described, timeout_s)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _ask(self, question: Callable[[Consumer, float], T], timeout_s: float) -> T:
        deadline = time.monotonic() + timeout_s
        pause_s = FIRST_RETRY_S
        while True:
            if self._client is None:
                self._client = Consumer(self._settings)
            try:
                return question(self._client, max(0.1, deadline - time.monotonic()))
            except KafkaException as exc:
                self.close()
                self.replaced += 1
                error = exc.args[0] if exc.args else None
                passing = isinstance(error, KafkaError) and (
                    is_retriable(error) or error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                )
                if not passing or deadline - time.monotonic() < pause_s:
                    raise
                log.debug("asking again on a new client after %s", exc)
            time.sleep(pause_s)
            pause_s = min(2 * pause_s, 1.0)
