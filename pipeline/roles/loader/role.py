"""The source loader role: work units in, tokenized samples out, each unit in one Kafka transaction.

For each unit taken from ``<job>.work.<source>`` through the source's consumer group, the loader reads
and tokenizes it and, in one transaction, produces its samples to ``<job>.src.<source>``, its bad
records to ``<job>.dlq``, and commits the unit's offset (``send_offsets_to_transaction``). A loader
killed mid-unit leaves an open transaction that the broker aborts (at once when the same loader
instance restarts, since it reuses its ``transactional.id``), and the unit is redone: every sample
reaches ``read_committed`` readers exactly once. Units already fetched may share a transaction (up to
``unit_seconds`` of work), so sources of many small files do not pay a commit per file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from connectors import Document, WorkUnit
from pipeline.kafka.clients import (
    KafkaConfig,
    ProducerFencedError,
    ProducerUnusableError,
    close_within,
    produce,
    read_committed_consumer,
)
from pipeline.kafka.control import UnitCost, read_unit_cost
from pipeline.kafka.group_membership import DEFAULT_REJOIN_AFTER_S, MembershipWatch
from pipeline.kafka.role_protocol import TransactionalRole, closing_unless_stuck
from pipeline.kafka.work_plan import (
    WorkPlan,
    extend_work_plan,
    plan_is_complete,
    publish_work_plan,
    read_work_plan,
    requested_epoch,
)
from pipeline.roles.loader.metrics import LoaderMetrics
from pipeline.roles.loader.source_runtime import COST_SAMPLE_BYTES, TARGET_UNIT_SECONDS, SourceRuntime
from pipeline.roles.loader.unit_sizing import UnitSizer
from topics.dead_letter import DeadLetter, encode_dead_letter
from topics.errors import DecodeError, MixflowError
from topics.fetch_stall import STALL_AFTER_S, FetchStallWatch
from topics.lanes import unit_partition
from topics.names import JobTopics
from topics.offset_lookup import OffsetLookup
from topics.retry import KAFKA_RETRY, KafkaUnavailableError
from topics.sample_codec import encode_sample

log = logging.getLogger(__name__)

# Documents tokenized together: big enough for the tokenizer's parallel batch encoding to pay off.
DOCUMENTS_PER_BATCH = 256
EPOCHS_KEPT = 16


@dataclass
class LoaderStats:
    units: int = 0
    samples: int = 0
    tokens: int = 0
    dead_letters: int = 0
    aborted: int = 0
    seconds: float = 0.0
    busy_seconds: float = 0.0  # inside transactions: reading, tokenizing, encoding, producing, committing
    rejoins: int = 0  # consumers replaced after the group left this loader without partitions too long
    by_epoch: dict[int, int] = field(default_factory=dict)  # samples of the last EPOCHS_KEPT epochs loaded

    def count_epoch(self, epoch: int, samples: int) -> None:
        """Under ``next_epoch`` a loader runs for ever: only the latest epochs are kept."""
        self.by_epoch[epoch] = self.by_epoch.get(epoch, 0) + samples
        while len(self.by_epoch) > EPOCHS_KEPT:
            del self.by_epoch[min(self.by_epoch)]

    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class LoaderOptions:
    instance: int = 0
    until_drained: bool = False
    transaction_timeout_ms: int = 60_000
    # A dead loader's units move to the others after this long. (Static membership would hand them
    # back to a restarted instance at once, but a static member cannot leave the group when it exits,
    # so every clean exit would stall the others for this long, and a broker restart fences it.)
    session_timeout_ms: int = 10_000
    # A loader without an assignment this long replaces its consumer (see pipeline.kafka.group_membership).
    rejoin_after_s: float = DEFAULT_REJOIN_AFTER_S
    # A loader whose work partition delivers nothing this long while units lie past it rejoins (topics.fetch_stall).
    stall_after_s: float = STALL_AFTER_S
    poll_timeout_s: float = 1.0
    plan_wait_s: float = 600.0
    unit_seconds: float = TARGET_UNIT_SECONDS
    # Leave the group after this many units (to recycle or scale down a loader); None: no limit.
    max_units: int | None = None
    # The job's policy is next_epoch: stay when the plan is done (until_drained does not end the loader),
    # and instance 0 plans the epochs the constructor asks for.
    next_epoch: bool = False


class SourceLoader(TransactionalRole):
    """One loader process of one source. ``run()`` until SIGTERM/SIGINT, or until the source's work
    plan is done with ``until_drained``."""

    kind = "loader"
    work_unit = "unit"

    def __init__(
        self,
        config: KafkaConfig,
        topics: JobTopics,
        runtime: SourceRuntime,
        seed: int,
        options: LoaderOptions = LoaderOptions(),
        metrics: LoaderMetrics | None = None,
    ) -> None:
        super().__init__(config, options.transaction_timeout_ms)
        self.topics = topics
        self.runtime = runtime
        self.source = runtime.spec.name
        self.seed = seed
        self.options = options
        self.stats = LoaderStats()
        self._revoked = False  # set when a rebalance takes partitions away during a transaction
        self._membership = MembershipWatch(options.rejoin_after_s)
        self._consumer: Consumer | None = None  # the work group's consumer; replaced when its membership is stuck
        # Ends and the group's committed offsets, on a client of its own that never joins the group.
        self._offsets = OffsetLookup(config, group=self.group_id)
        self._fetch = FetchStallWatch(self._offsets, options.stall_after_s)  # a stalled consumer is replaced too
        self.metrics = metrics or LoaderMetrics(CollectorRegistry(), topics.job, self.source)
        self._lanes: int | None = None  # partitions of the source topic, read at the first unit
        self._plan = WorkPlan(self.source, 0, {})  # the source's plan as last read or extended
        self.sizer: UnitSizer | None = None  # with the source's unit_target_s: splits units by measured cost

    @property
    def transactional_id(self) -> str:
        return f"{self.topics.job}.loader.{self.source}.{self.options.instance}"

    @property
    def group_id(self) -> str:
        return f"{self.topics.job}.loaders.{self.source}"

    def ensure_plan(self) -> WorkPlan | None:
        """The source's work plan. Instance 0 publishes it when there is none yet; the other instances
        wait for it, so two planners never race. None when asked to stop while waiting."""
        deadline = time.monotonic() + self.options.plan_wait_s
        backoff = 0.05
        while (plan := read_work_plan(self.config, self.topics, self.source)) is None:
            if self.options.instance == 0:
                return self._publish_plan()
            if self.stopping:
                return None
            if time.monotonic() > deadline:
                msg = (
                    f"loader {self.transactional_id}: no work plan for {self.source} on {self.topics.control} "
                    f"after {self.options.plan_wait_s:.0f} s; loader instance 0 of the source publishes it"
                )
                raise MixflowError(msg)
            log.info("loader %s: waiting for instance 0 to publish the work plan", self.transactional_id)
            time.sleep(backoff)  # polling a topic that has no record to wait on yet
            backoff = min(2 * backoff, 1.0)
        return plan

    def _publish_plan(self) -> WorkPlan:
        target = self.runtime.spec.unit_target_s
        if target is None:
            units = self.runtime.plan(self.seed, self.options.unit_seconds)
            return publish_work_plan(self.config, self.topics, self.source, units, self._work_partitions())
        # The planner's measurement is the source's first recorded cost, so loaders can split from the start.
        per_byte = self.runtime.measure_cost()
        cost = UnitCost(self.source, COST_SAMPLE_BYTES, per_byte * COST_SAMPLE_BYTES, 0, "planner")
        units = self.runtime.plan(self.seed, target, cost_per_byte=per_byte)
        return publish_work_plan(self.config, self.topics, self.source, units, self._work_partitions(), cost)

    def run(self) -> LoaderStats:
        self.stop_on_signals()
        if (plan := self.ensure_plan()) is None:
            log.info("loader %s: asked to stop while waiting for the work plan", self.transactional_id)
            return self.stats
        self._plan = plan
        if (target := self.runtime.spec.unit_target_s) is not None:
            cost = read_unit_cost(self.config, self.topics, self.source)
            self.sizer = UnitSizer(self.runtime.reader, target, cost, self.transactional_id)
        producer = self.new_producer()
        self._join_work_group()
        began = time.monotonic()
        try:
            # Closing the consumer leaves the group, so the other loaders take the units at once.
            closes = (lambda: self._work_consumer().close(), lambda: producer.flush(30), self._offsets.close)
            with closing_unless_stuck(*closes):
                try:
                    self._loop(producer)
                except ProducerFencedError as exc:
                    # Also what a loader sees when the broker aborted its transaction after the timeout
                    # while it was away: a new process goes on from the committed units.
                    raise ProducerUnusableError(str(exc)) from exc
        finally:
            self.stats.seconds = time.monotonic() - began
        log.info(
            "loader %s: %d units, %d samples, %d tokens (%.0f tokens/s), %d dead letters, %d aborted, %d rejoins",
            self.transactional_id,
            self.stats.units,
            self.stats.samples,
            self.stats.tokens,
            self.stats.tokens_per_second(),
            self.stats.dead_letters,
            self.stats.aborted,
            self.stats.rejoins,
        )
        return self.stats

    def _join_work_group(self) -> Consumer:
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
        consumer.subscribe(
            [self.topics.work(self.source)],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        self._consumer = consumer
        return consumer

    def _work_consumer(self) -> Consumer:
        assert self._consumer is not None, "run() joins the work group first"
        return self._consumer

    def _brokers_answer(self) -> bool:
        """Whether the cluster answers a metadata request, asked on a client of its own (the stuck consumer's
        connections may be what is wedged): while it does not, a new consumer would not join either, and
        closing the old one would only wait on the missing broker."""
        try:
            self._offsets.partitions(self.topics.work(self.source), timeout_s=5.0)
        except KafkaException:
            return False
        return True

    def _rejoin_work_group(self, why: str) -> Consumer:
        """Replace a consumer that has been without partitions for ``rejoin_after_s`` (librdkafka can fail to
        rejoin after its session lapsed while the broker was away, and would then poll forever), or whose
        fetching stalled (``topics.fetch_stall``)."""
        log.warning(
            "loader %s: %s; closing the consumer and joining as a new member of group %s",
            self.transactional_id,
            why,
            self.group_id,
        )
        close_within(self._work_consumer().close, 30.0, f"loader {self.transactional_id}: closing its work consumer")
        self.stats.rejoins += 1
        return self._join_work_group()

    def _loop(self, producer: Producer) -> None:
        consumer = self._work_consumer()
        while not self.stopping:
            if consumer.memberid() is None:  # librdkafka drops the member id when its session lapses
                self._membership.lost()
            if self._membership.stuck() and self._brokers_answer():
                consumer = self._rejoin_work_group(f"no assignment for {self._membership.seconds_without():.0f} s")
            self._fetch.consuming()
            message = consumer.poll(self.options.poll_timeout_s)
            if message is not None and self._fetch.saw(message):
                message = None  # the end of a partition
            if message is None:
                if (stall := self._fetch.stall()) is not None and self._brokers_answer():
                    consumer = self._rejoin_work_group(stall.describe())
                    continue
                if self.options.next_epoch:
                    if self.options.instance == 0:
                        try:
                            self._plan = self._plan_requested_epochs(self._plan)
                        except KafkaUnavailableError as exc:  # the brokers are away: look again later
                            log.warning("loader %s: cannot read the epochs asked for: %s", self.transactional_id, exc)
                    continue
                if self.options.until_drained and self._drained():
                    log.info("loader %s: every unit of %s is done", self.transactional_id, self.source)
                    return
                continue
            if message.error():
                self._on_consumer_error(message.error())
                continue
            self._transaction(consumer, producer, message)
            if self.options.max_units is not None and self.stats.units >= self.options.max_units:
                log.info("loader %s: did its %d units; leaving", self.transactional_id, self.stats.units)
                return

    def _drained(self) -> bool:
        """Every unit of the source is done, finer units split off by any loader included."""
        done, self._plan = plan_is_complete(self.config, self.topics, self._offsets, self._plan)
        return done

    def _plan_requested_epochs(self, plan: WorkPlan) -> WorkPlan:
        """Plan and publish the epochs the constructor asked for that are not planned yet."""
        wanted = requested_epoch(self.config, self.topics, self.source)
        if wanted is None or wanted < plan.epochs_planned(self.runtime.spec.epochs):
            return plan
        log.info("loader %s: planning %s up to epoch %d, as asked", self.transactional_id, self.source, wanted)
        return extend_work_plan(
            self.config,
            self.topics,
            self.source,
            self.runtime.spec.epochs,
            wanted,
            self._plan_epoch,
            self._work_partitions(),
        )

    def _plan_epoch(self, epoch: int) -> list[WorkUnit]:
        """The units of ``epoch``; with a unit target, sized by the source's recorded cost, not measured again."""
        if self.sizer is None:
            return self.runtime.plan(self.seed, self.options.unit_seconds, epochs=[epoch])
        per_byte = self.sizer.cost.seconds_per_byte if self.sizer.cost else None
        return self.runtime.plan(self.seed, self.sizer.target_s, epochs=[epoch], cost_per_byte=per_byte)

    def _on_consumer_error(self, error: KafkaError) -> None:
        if error.fatal():
            msg = f"loader {self.transactional_id}: fatal consumer error: {error}"
            raise MixflowError(msg)
        log.warning("loader %s: consumer error (will retry): %s", self.transactional_id, error)

    def _transaction(self, consumer: Consumer, producer: Producer, first: Message) -> None:
        """Publish ``first`` and, while the transaction is younger than ``unit_seconds``, the units that are
        already fetched after it, in one transaction: each unit is all in or all out, and small units
        (a short text file) do not pay a commit each. On abort every partition is rewound to its first
        unit of the transaction."""
        began = time.monotonic()
        done: list[tuple[Message, WorkUnit | None, tuple[int, int, int]]] = []
        try:
            committed = self.transaction(
                producer,
                consumer,
                lambda: self._publish_units(consumer, producer, first, done, began),
                f"units from {_where(first)}",
            )
        finally:
            self.stats.busy_seconds += time.monotonic() - began
        self.metrics.transaction_ended(committed, time.monotonic() - began)
        if not committed:
            self._rewind(consumer, done or [(first, None, (0, 0, 0))])
            return
        if self.sizer is not None:
            self._plan = self.sizer.committed(self._plan)
        for _, unit, counts in done:
            self._count(unit, *counts)

    def _publish_units(
        self,
        consumer: Consumer,
        producer: Producer,
        first: Message,
        done: list[tuple[Message, WorkUnit | None, tuple[int, int, int]]],
        began: float,
    ) -> list[TopicPartition]:
        """Produce ``first`` and the units ready after it (appended to ``done``); their offsets to commit."""
        self._revoked = False
        if self.sizer is not None:
            self.sizer.begin()
        message: Message | None = first
        while message is not None:
            unit, letters = _decode_unit(message, self.source)
            counts = (
                self._publish_unit(producer, unit, message.partition() + message.offset())
                if unit
                else self._publish_letters(producer, letters)
            )
            done.append((message, unit, counts))
            message = self._next_ready(consumer, began, len(done))
        if self.sizer is not None:
            self.sizer.produce(producer, self.topics, self._plan, self._work_partitions)
        if self._revoked:
            # Another loader may already be redoing these units from the committed offsets.
            msg = "partitions were revoked during the transaction"
            raise KafkaException(KafkaError(KafkaError._STATE, msg, txn_requires_abort=True))
        ends: dict[tuple[str, int], int] = {}
        for m, _, _ in done:
            ends[(m.topic(), m.partition())] = m.offset() + 1
        return [TopicPartition(topic, partition, end) for (topic, partition), end in ends.items()]

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._membership.assigned()
        self._fetch.assign(partitions)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._membership.lost()
        self._fetch.assign([])
        if partitions:
            self._revoked = True

    def _next_ready(self, consumer: Consumer, began: float, units: int) -> Message | None:
        """The next unit if it is already fetched and the transaction may take one more; else None."""
        if self.stopping or self._revoked or time.monotonic() - began >= self.options.unit_seconds:
            return None
        if self.options.max_units is not None and self.stats.units + units >= self.options.max_units:
            return None
        message = consumer.poll(0)
        if message is not None and self._fetch.saw(message):
            return None  # the end of a partition
        if message is not None and message.error():
            self._on_consumer_error(message.error())
            return None
        return message

    def _rewind(self, consumer: Consumer, done: list[tuple[Message, WorkUnit | None, tuple[int, int, int]]]) -> None:
        """Seek every partition still ours back to its first unit of an aborted transaction, to redo them.
        A partition a rebalance took away (the usual cause of the abort) resumes at its committed offset
        with its new owner instead."""
        firsts: dict[tuple[str, int], int] = {}
        for m, _, _ in done:
            firsts.setdefault((m.topic(), m.partition()), m.offset())
        assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        for (topic, partition), offset in firsts.items():
            if (topic, partition) in assigned:
                try:
                    consumer.seek(TopicPartition(topic, partition, offset))
                    self._fetch.add([TopicPartition(topic, partition, offset)])
                except KafkaException as exc:  # revoked between the two calls
                    log.info("loader %s: not rewinding %s[%d]: %s", self.transactional_id, topic, partition, exc)
        self._aborted()

    def _publish_unit(self, producer: Producer, unit: WorkUnit, place: int) -> tuple[int, int, int]:
        """Load ``unit``, or with a unit target, split it when it would take too long (the finer units are
        produced with the transaction's other records by ``UnitSizer.produce``). ``place``: the unit's
        work partition plus its offset there, which spreads a source's units over the lanes."""
        if self.sizer is None:
            return self._publish(producer, unit, place)
        if (children := self.sizer.split(unit)) is not None:
            self.sizer.add_split(children)
            return 0, 0, 0
        began = time.perf_counter()
        counts = self._publish(producer, unit, place)
        self.sizer.add_measurement(unit, time.perf_counter() - began)
        return counts

    def _publish(self, producer: Producer, unit: WorkUnit, place: int) -> tuple[int, int, int]:
        samples = tokens = letters = 0
        src_topic = self.topics.src(self.source)
        # Each constructor lane reads one partition: a unit's samples go together, in order, to one of them.
        partition = unit_partition(place, self._src_partitions())
        for documents, bad in _batches(self.runtime.reader.read(unit), DOCUMENTS_PER_BATCH):
            built = self.runtime.builder.build(documents, epoch=unit.epoch) if documents else None
            for sample in built.samples if built else ():
                value, headers = encode_sample(sample)
                produce(producer, src_topic, value, key=sample.sample_id.encode(), headers=headers, partition=partition)
                samples += 1
                tokens += sample.length
            letters += self._publish_letters(producer, bad + (built.dead_letters if built else []))[2]
        return samples, tokens, letters

    def _publish_letters(self, producer: Producer, letters: list[DeadLetter]) -> tuple[int, int, int]:
        self.metrics.letters_produced(letters)
        for letter in letters:
            key, value, headers = encode_dead_letter(letter)
            produce(producer, self.topics.dlq, value, key=key, headers=headers)
            log.warning("dead letter from %s at %s: %s", letter.source, letter.location, letter.reason)
        return 0, 0, len(letters)

    def _count(self, unit: WorkUnit | None, samples: int, tokens: int, letters: int) -> None:
        self.stats.units += 1
        self.stats.samples += samples
        self.stats.tokens += tokens
        self.stats.dead_letters += letters
        if unit is not None:
            self.stats.count_epoch(unit.epoch, samples)
        self.metrics.unit_committed(samples, tokens)

    def _aborted(self) -> None:
        self.stats.aborted += 1

    def _src_partitions(self) -> int:
        """The partitions of the source topic: the job's constructor lanes (read once)."""
        if self._lanes is None:
            src_topic = self.topics.src(self.source)
            admin = AdminClient(dict(self.config))
            metadata = KAFKA_RETRY.call(lambda: admin.list_topics(src_topic, timeout=30), f"describing {src_topic}")
            self._lanes = len(metadata.topics[src_topic].partitions)
        return self._lanes

    def _work_partitions(self) -> int:
        work_topic = self.topics.work(self.source)
        admin = AdminClient(dict(self.config))
        metadata = KAFKA_RETRY.call(lambda: admin.list_topics(work_topic, timeout=30), f"describing {work_topic}")
        return len(metadata.topics[work_topic].partitions)


def _batches(items: Iterator[Document | DeadLetter], size: int) -> Iterator[tuple[list[Document], list[DeadLetter]]]:
    documents: list[Document] = []
    letters: list[DeadLetter] = []
    for item in items:
        (documents if isinstance(item, Document) else letters).append(item)  # type: ignore[arg-type]
        if len(documents) >= size:
            yield documents, letters
            documents, letters = [], []
    if documents or letters:
        yield documents, letters


def _decode_unit(message: Message, source: str) -> tuple[WorkUnit | None, list[DeadLetter]]:
    try:
        return WorkUnit.from_json(message.value()), []
    except DecodeError as exc:
        reason = f"undecodable work unit: {exc.reason}"
        return None, [DeadLetter(source, _where(message), reason, payload=message.value())]


def _where(message: Message) -> str:
    return f"{message.topic()}[{message.partition()}]@{message.offset()}"
