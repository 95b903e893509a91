"""A source loader's membership of its source's work group ``<job>.loaders.<source>``: the consumer that
takes the source's work units, and its replacement when the group has left it without partitions for
``rejoin_after_s`` (librdkafka can fail to rejoin after its session lapsed while the broker was away, and
would then poll forever; ``topics.kafka.group_membership``) or when its fetching stalled
(``topics.kafka.fetch_stall``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from pipeline.roles.loader.options import LoaderOptions
from pipeline.roles.loader.stats import LoaderStats
from topics.errors import MixflowError
from topics.formats.names import JobTopics
from topics.kafka.authorization import raise_if_read_refused, refused
from topics.kafka.clients import KafkaConfig, close_within, read_committed_consumer
from topics.kafka.fetch_stall import FetchStallWatch
from topics.kafka.group_membership import MembershipWatch
from topics.kafka.offset_lookup import OffsetLookup

log = logging.getLogger(__name__)


class WorkGroup:
    """The work group's consumer of one loader; ``name`` (its transactional id) names it in logs."""

    def __init__(
        self, config: KafkaConfig, topics: JobTopics, source: str, options: LoaderOptions, name: str, stats: LoaderStats
    ) -> None:
        self.config = config
        self.topic = topics.work(source)
        self.group_id = f"{topics.job}.loaders.{source}"
        self.options = options
        self.name = name
        self.stats = stats
        self.revoked = False  # set when a rebalance takes partitions away during a transaction
        self.ended_while_busy = False  # a partition's end came while units were taken without waiting (``ready``)
        self._membership = MembershipWatch(options.rejoin_after_s)
        self._consumer: Consumer | None = None  # replaced when its membership is stuck or its fetching stalled
        # Ends and the group's committed offsets, on a client of its own that never joins the group.
        self.offsets = OffsetLookup(config, group=self.group_id)
        self._fetch = FetchStallWatch(self.offsets, options.stall_after_s)  # a stalled consumer is replaced too

    @property
    def consumer(self) -> Consumer:
        assert self._consumer is not None, "join() the work group first"
        return self._consumer

    def join(self) -> Consumer:
        consumer = read_committed_consumer(
            self.config,
            self.group_id,
            **{
                "session.timeout.ms": self.options.session_timeout_ms,
                # Rebalances (a loader joining or leaving) are noticed within a second.
                "heartbeat.interval.ms": 1000,
                # Units spread evenly over the loaders of the source.
                "partition.assignment.strategy": "roundrobin",
                # A unit can take a while to tokenize; the group must not evict us for that.
                "max.poll.interval.ms": 600_000,
                # Where a partition's fetching stands at its end: a stall shows against it.
                "enable.partition.eof": True,
            },
        )
        self._membership.joining()
        self._fetch.assign([])
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke)
        self._consumer = consumer
        return consumer

    def close_consumer(self) -> None:
        """Leave the group, so that the other loaders take the units at once."""
        self.consumer.close()

    def poll(self, timeout_s: float) -> Message | None:
        """The next message of the work topic (maybe an error), or None when none came within ``timeout_s``
        or it marked a partition's end. A consumer whose membership is stuck is replaced first, while the
        brokers answer."""
        if self.consumer.memberid() is None:  # librdkafka drops the member id when its session lapses
            self._membership.lost()
        if self._membership.stuck() and self._brokers_answer():
            self._rejoin(f"no assignment for {self._membership.seconds_without():.0f} s")
        self._fetch.consuming()
        message = self.consumer.poll(timeout_s)
        if message is not None and self._fetch.saw(message):
            return None  # the end of a partition
        return message

    def rejoin_if_stalled(self) -> bool:
        """Replace a consumer whose fetching stalled while units lie past it, when the brokers answer;
        True when it did."""
        if (stall := self._fetch.stall()) is not None and self._brokers_answer():
            self._rejoin(stall.describe())
            return True
        return False

    def ready(self) -> Message | None:
        """A unit already fetched, without waiting; None when there is none (or an error, logged)."""
        message = self.consumer.poll(0)
        if message is not None and self._fetch.saw(message):
            self.ended_while_busy = True
            return None  # the end of a partition
        if message is not None and message.error():
            self.on_consumer_error(message.error())
            return None
        return message

    def on_consumer_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            raise refused(self.config, "READ", "group", self.group_id, f"loader {self.name} joining it")
        raise_if_read_refused(self.config, error, self.topic)
        if error.fatal():
            msg = f"loader {self.name}: fatal consumer error: {error}"
            raise MixflowError(msg)
        log.warning("loader %s: consumer error (will retry): %s", self.name, error)

    def rewind(self, messages: Sequence[Message]) -> None:
        """Seek every partition still ours back to its first of ``messages`` (an aborted transaction's
        units), to redo them. A partition a rebalance took away (the usual cause of the abort) resumes at
        its committed offset with its new owner instead."""
        firsts: dict[tuple[str, int], int] = {}
        for m in messages:
            firsts.setdefault((m.topic(), m.partition()), m.offset())
        assigned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        for (topic, partition), offset in firsts.items():
            if (topic, partition) in assigned:
                try:
                    self.consumer.seek(TopicPartition(topic, partition, offset))
                    self._fetch.add([TopicPartition(topic, partition, offset)])
                except KafkaException as exc:  # revoked between the two calls
                    log.info("loader %s: not rewinding %s[%d]: %s", self.name, topic, partition, exc)

    def _brokers_answer(self) -> bool:
        """Whether the cluster answers a metadata request, asked on a client of its own (the stuck consumer's
        connections may be what is wedged): while it does not, a new consumer would not join either, and
        closing the old one would only wait on the missing broker."""
        try:
            self.offsets.partitions(self.topic, timeout_s=5.0)
        except KafkaException:
            return False
        return True

    def _rejoin(self, why: str) -> None:
        """Close the consumer and join the group as a new member."""
        log.warning(
            "loader %s: %s; closing the consumer and joining as a new member of group %s", self.name, why, self.group_id
        )
        close_within(self.consumer.close, 30.0, f"loader {self.name}: closing its work consumer")
        self.stats.rejoins += 1
        self.join()

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._membership.assigned()
        self._fetch.assign(partitions)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._membership.lost()
        self._fetch.assign([])
        if partitions:
            self.revoked = True
