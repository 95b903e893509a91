"""Which of a job's constructor instances is the active one: Kafka group membership decides.

Every ``mixflow construct`` of a job joins the consumer group ``<job>.constructor.lease`` on the
job's one-partition control topic; the member the group assigns that partition is active, the others
are shadows. When the active process dies its session lapses, the group rebalances and a shadow gets
the partition. The lease only elects; safety comes from the transactional id all instances share:
the new active one's ``init_transactions`` fences the old one, so an old active that comes back (a
paused process, a partitioned host) can never commit a step again.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from topics.errors import MixflowError
from topics.formats.names import JobTopics
from topics.kafka.authorization import is_authorization_error, refused
from topics.kafka.clients import KafkaConfig

log = logging.getLogger(__name__)

DEFAULT_SESSION_TIMEOUT_MS = 1000
"""How long a dead active instance holds the lease. Brokers refuse sessions shorter than their
``group.min.session.timeout.ms`` (6000 by default; the local stack allows 1000): the lease then falls
back to ``FALLBACK_SESSION_TIMEOUT_MS``."""
FALLBACK_SESSION_TIMEOUT_MS = 6000


class ConstructorLease:
    def __init__(
        self,
        config: KafkaConfig,
        topics: JobTopics,
        instance: str,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        group: str | None = None,
    ) -> None:
        self.config = config
        self.topic = topics.control
        self.group = group or f"{topics.job}.constructor.lease"  # a lane's constructors have a group of their own
        self.instance = instance
        self.session_timeout_ms = session_timeout_ms
        self._held = False
        self._assignments = 0
        self._admin: AdminClient | None = None  # asks the brokers whether this instance is a member
        self.consumer = self._join()

    def _join(self) -> Consumer:
        consumer = Consumer(
            {
                **self.config,
                "group.id": self.group,
                "client.id": self.instance,
                "enable.auto.commit": False,
                "auto.offset.reset": "latest",
                "session.timeout.ms": self.session_timeout_ms,
                "heartbeat.interval.ms": max(100, self.session_timeout_ms // 5),
                # The active member keeps the partition when another instance joins.
                "partition.assignment.strategy": "cooperative-sticky",
                "fetch.wait.max.ms": 100,
            }
        )
        consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked)
        return consumer

    @property
    def held(self) -> bool:
        return self._held

    def poll(self, timeout_s: float = 0.0) -> bool:
        """Keep the membership alive (call at least every few seconds); True while the lease is held."""
        message = self.consumer.poll(timeout_s)
        if message is not None and message.error():
            error = message.error()
            too_short = error.code() == KafkaError.INVALID_SESSION_TIMEOUT
            if too_short and self.session_timeout_ms < FALLBACK_SESSION_TIMEOUT_MS:
                log.warning(
                    "the broker refuses a %d ms lease session (group.min.session.timeout.ms is higher); using %d ms, "
                    "so a shadow takes over that much later",
                    self.session_timeout_ms,
                    FALLBACK_SESSION_TIMEOUT_MS,
                )
                self.consumer.close()
                self.session_timeout_ms = FALLBACK_SESSION_TIMEOUT_MS
                self.consumer = self._join()
            elif is_authorization_error(error):
                group = error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
                resource, name = ("group", self.group) if group else ("topic", self.topic)
                raise refused(self.config, "READ", resource, name, f"{self.instance} holding the constructor lease")
            elif error.fatal():
                msg = f"constructor lease {self.group}: {error}"
                raise MixflowError(msg)
            else:
                log.debug("constructor lease %s: %s", self.group, error)
        return self._held

    def wait_for_first_assignment(self, timeout_s: float) -> bool:
        """Poll until the group has given this member its first assignment (maybe none) or ``timeout_s``
        passed; True when it holds the lease."""
        deadline = time.monotonic() + timeout_s
        while not self._assignments and time.monotonic() < deadline:
            self.poll(0.1)
        return self._held

    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assignments += 1
        if partitions:
            self._held = True
            log.info("%s holds the constructor lease of %s: active", self.instance, self.group)

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions and self._held:
            self._held = False
            log.warning("%s lost the constructor lease of %s", self.instance, self.group)

    def in_group(self, timeout_s: float = 5.0) -> bool:
        """Whether the brokers count this instance among the group's members. After a broker restart a
        lease consumer whose session lapsed can stay outside for good, polling, while its shadow loop sees
        the job move on (the active instance writes steps) and so has nothing to wait for. True when the
        brokers cannot say (they are away: then nobody can join)."""
        member = self.consumer.memberid()
        if not member:
            return False
        if self._admin is None:
            self._admin = AdminClient({**self.config, "log_level": 0})
        future = self._admin.describe_consumer_groups([self.group], request_timeout=timeout_s)[self.group]
        try:
            description = future.result(timeout=timeout_s + 1)
        except (KafkaException, TimeoutError):
            self._admin = None  # the next question goes to a new client
            return True
        return any(m.member_id == member for m in description.members)

    def rejoin(self) -> None:
        """Leave the group and join it again as a new member: after this instance was fenced, its view of
        the lease is stale (it may not have heard yet that its session lapsed while it was paused)."""
        self.consumer.close()
        self._held = False
        self._assignments = 0
        self.consumer = self._join()

    def close(self) -> None:
        """Leave the group at once, so that a shadow takes over without waiting for the session to lapse."""
        self._held = False
        self.consumer.close()
