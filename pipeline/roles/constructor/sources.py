"""The constructor's feed of the source topics: fill the pool, detect when a source has run out."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from pipeline.kafka.work_plan import WorkPlan, plan_is_complete, read_work_plan, request_epoch
from pipeline.planning.step.pool import SamplePool
from topics.errors import DecodeError
from topics.formats.dead_letter import DeadLetter
from topics.formats.names import JobTopics, parse_topic
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.authorization import raise_if_read_refused
from topics.kafka.clients import KafkaConfig
from topics.kafka.offset_lookup import OffsetLookup
from topics.kafka.renewing_consumer import RenewingConsumer
from topics.kafka.retry import KAFKA_RETRY

log = logging.getLogger(__name__)

# A source's FIFO stops reading above this many steps of its share of tokens, plus one step, so memory
# stays bounded however far ahead the loaders are (and grows by a step per source only).
BUFFER_STEPS = 4

BATCH = 5000  # records a consume call returns at most
DRAIN_BATCHES = 4  # batches a fill reads beyond what its draw waits for, of what is fetched already

SOURCE_FETCH_SETTINGS = {
    # A step reads megabytes of every source: large fetches bring it in a few round trips (librdkafka's
    # default of 1 MB a partition took several per step at 4M-token steps, with the step's draw waiting).
    "fetch.max.bytes": 64 << 20,
    "max.partition.fetch.bytes": 16 << 20,
    # A fetch at a partition's end comes back empty after this long, and only then does the client say
    # the end is reached: librdkafka's default of 500 ms kept a draw waiting a second for a source that had
    # run out.
    "fetch.wait.max.ms": 100,
    # Fetching goes on while a step is planned and written: with librdkafka's 64 MB the client stopped
    # fetching a media step's records a fraction of the way in and the next draw waited for them
    # (benchmarks/README.md, media throughput). The raw pipeline it is measured against queues as much.
    "queued.max.messages.kbytes": 256 << 10,
}
"""Defaults of the constructor's source consumer; the spec's ``kafka.config`` wins."""


class SourceTopicFeed:
    """Assigns partition ``partition`` (the constructor's lane) of every source topic at the pool's low
    watermarks and routes records into it."""

    def __init__(
        self,
        consumer: RenewingConsumer,
        config: KafkaConfig,
        topics: JobTopics,
        pool: SamplePool,
        budget_tokens: int,
        partition: int = 0,
    ) -> None:
        self.consumer = consumer
        self.partition = partition
        self.config = config
        self.topics = topics
        self.pool = pool
        self.budget_tokens = budget_tokens
        self.buffer_steps = float(BUFFER_STEPS)
        self._weights: dict[str, float] = {}
        self._window_bytes: float | None = None
        self.eof_at: dict[str, int] = {}
        self._ended: set[str] = set()  # the sources read to their end during the current ``fill``
        self.dead_letters: list[DeadLetter] = []
        self._paused: set[str] = set()
        self._plans: dict[str, WorkPlan] = {}
        self._asked: dict[str, int] = {}  # the epoch last asked for, per source
        self._loader_groups: dict[str, OffsetLookup] = {}
        self._loaders_finished: set[str] = set()  # sources whose plan the loaders completed, as last planned
        self._source_of: dict[str, str] = {}  # topic name -> source, parsed once per topic
        positions = pool.positions()
        consumer.assign([TopicPartition(topics.src(s), partition, positions[s].low) for s in pool.sources])

    def fill(self, wanted: Collection[str], timeout_s: float = 1.0) -> int:
        """Read what is there, for at most ``timeout_s`` and until every source in ``wanted`` has new
        records or has just been read to its end, then what the client has fetched meanwhile (without
        waiting), so that the next draw sees all of it instead of finding too little and waiting again. A
        source that reaches its end ends the wait at once: the caller finds out whether it ran out for good
        (``is_exhausted``) before it asks for more. One at its end already is waited for (its loaders may
        add more). Returns the records read."""
        self._pause_full(exempt=set(wanted))
        before = {s: self.pool.fifos[s].next_offset for s in wanted}
        self._ended.clear()
        deadline = time.monotonic() + timeout_s
        read = 0
        while True:
            messages = self.consumer.consume(
                num_messages=BATCH, timeout=max(0.0, min(0.2, deadline - time.monotonic()))
            )
            for message in messages:
                read += self._route(message)
            pending = [s for s in wanted if self.pool.fifos[s].next_offset == before[s]]
            if not pending:
                return read + self._drain(len(messages), deadline)
            if time.monotonic() >= deadline or all(s in self._ended for s in pending):
                return read

    def _drain(self, last: int, deadline: float) -> int:
        """Read what the client holds already, without waiting, while its batches come back full: at most
        ``DRAIN_BATCHES`` more and until ``deadline`` (the read-ahead bound, checked at each ``fill``, is
        overshot by that much at most)."""
        read = 0
        for _ in range(DRAIN_BATCHES):
            if last < BATCH or time.monotonic() >= deadline:
                break
            messages = self.consumer.consume(num_messages=BATCH, timeout=0)
            for message in messages:
                read += self._route(message)
            last = len(messages)
        return read

    def _route(self, message: Message) -> int:
        topic = message.topic()
        source = self._source_of.get(topic) or self._source_of.setdefault(topic, parse_topic(topic).arg)
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                self.eof_at[source] = message.offset()
                self._ended.add(source)
                return 0
            raise_if_read_refused(self.config, message.error(), topic)
            raise KafkaException(message.error())
        self.eof_at.pop(source, None)
        self._ended.discard(source)
        try:
            sample = decode_sample_message(message)
        except DecodeError as exc:
            where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
            self.dead_letters.append(DeadLetter(source, where, exc.reason, payload=message.value()))
            sample = None
        self.pool.add(source, message.offset(), sample)
        return 1

    def hold(self, steps: float, weights: dict[str, float], window_bytes: float | None = None) -> None:
        """Read ahead ``steps`` steps of each source's share at ``weights`` (plus a step); with
        ``window_bytes``, stop short of that once a source holds more than its share of those bytes and two
        steps of its share of tokens (what a window bounded by bytes needs)."""
        self.buffer_steps, self._weights = max(float(BUFFER_STEPS), steps), weights
        self._window_bytes = window_bytes

    def _pause_full(self, exempt: set[str]) -> None:
        """Pause sources holding more than their read-ahead, except those a draw waits for: a
        long-context draw can need samples from deeper in a source than that."""
        tokens, held_bytes = self.pool.tokens_held(), self.pool.bytes_held()
        full = {s for s in tokens if self._full(s, tokens[s], held_bytes[s])} - exempt
        if pause := full - self._paused:
            self.consumer.pause([TopicPartition(self.topics.src(s), self.partition) for s in pause])
        if resume := self._paused - full:
            self.consumer.resume([TopicPartition(self.topics.src(s), self.partition) for s in resume])
        self._paused = full

    def _full(self, source: str, tokens: int, held_bytes: int) -> bool:
        weight = self._weights.get(source, 1.0)
        if tokens > self.budget_tokens * (self.buffer_steps * weight + 1):
            return True
        share = None if self._window_bytes is None else self._window_bytes * weight
        # Two steps of its share: the least a window holds (one step) and room for the source's credit.
        return share is not None and held_bytes > share and tokens > 2 * weight * self.budget_tokens

    def is_exhausted(self, source: str) -> bool:
        """True when the source's loaders have committed every unit and everything is read."""
        if source not in self.eof_at or not self._loaders_done(source):
            return False
        partition = TopicPartition(self.topics.src(source), self.partition)
        _, end = KAFKA_RETRY.call(
            lambda: self.consumer.get_watermark_offsets(partition, timeout=10), f"reading the end of {partition.topic}"
        )
        return self.eof_at.get(source, -1) >= end

    def ask_for_next_epoch(self, source: str, spec_epochs: int) -> None:
        """Ask the loaders of an exhausted ``source`` to plan its next epoch (once per epoch), and forget
        its plan so that the extended one is read when they publish it."""
        epoch = self._plans[source].epochs_planned(spec_epochs)
        if self._asked.get(source) != epoch:
            log.info("source %s finished epoch %d; asking its loaders for epoch %d", source, epoch - 1, epoch)
            request_epoch(self.config, self.topics, source, epoch)
            self._asked[source] = epoch
        del self._plans[source]
        self._loaders_finished.discard(source)

    def _loaders_done(self, source: str) -> bool:
        """Whether the loaders of ``source`` committed every unit of its plan. Once they have, the answer
        holds until another epoch is asked for (``ask_for_next_epoch``): a complete plan leaves no unit to
        split, and only an epoch request makes the loaders plan more."""
        if source in self._loaders_finished:
            return True
        plan = self._plans.get(source) or read_work_plan(self.config, self.topics, source)
        if plan is None:
            return False
        self._plans[source] = plan
        if source not in self._loader_groups:
            self._loader_groups[source] = OffsetLookup(self.config, group=f"{self.topics.job}.loaders.{source}")
        # Loaders may have split units since the plan was read: the plan's ends grow with them.
        done, self._plans[source] = plan_is_complete(self.config, self.topics, self._loader_groups[source], plan)
        if done:
            self._loaders_finished.add(source)
        return done

    def lag(self, source: str) -> str:
        fifo = self.pool.fifos[source]
        try:
            _, end = self.consumer.get_watermark_offsets(
                TopicPartition(self.topics.src(source), self.partition), timeout=5
            )
        except KafkaException:
            end = -1
        plan = self._plans.get(source)
        return (
            f"{len(fifo.offsets)} samples ({fifo.tokens} tokens) buffered, read up to offset "
            f"{fifo.next_offset} of {end}; work plan {'published' if plan else 'not published yet'}"
        )

    def close(self) -> None:
        for consumer in self._loader_groups.values():
            consumer.close()
