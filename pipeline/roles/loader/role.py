"""The source loader role: work units in, tokenized samples out, each unit in one Kafka transaction.

For each unit taken from ``<job>.work.<source>`` through the source's consumer group, the loader reads
and tokenizes it and, in one transaction, produces its samples to ``<job>.src.<source>``, its bad
records to ``<job>.dlq``, and commits the unit's offset (``send_offsets_to_transaction``). A loader
killed mid-unit leaves an open transaction that the broker aborts (at once when the same loader
instance restarts, since it reuses its ``transactional.id``), and the unit is redone: every sample
reaches ``read_committed`` readers exactly once. Units already fetched may share a transaction (up to
``unit_seconds`` of work), so sources of many small files do not pay a commit per file.

The parts: the work group's consumer (``work_group.py``), the source's work plan (``work_planning.py``),
a transaction of units (``unit_transaction.py``), loading one unit (``unit_loading.py``), splitting one
that would take too long (``unit_sizing.py``), and what the loader did (``stats.py``, ``metrics.py``).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from pipeline.kafka.role_protocol import TransactionalRole, closing_unless_stuck
from pipeline.roles.loader.metrics import LoaderMetrics
from pipeline.roles.loader.options import LoaderOptions
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.roles.loader.stats import LoaderStats
from pipeline.roles.loader.unit_loading import UnitLoader
from pipeline.roles.loader.unit_transaction import UnitTransactions
from pipeline.roles.loader.work_group import WorkGroup
from pipeline.roles.loader.work_planning import SourcePlanning
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig, ProducerFencedError, ProducerUnusableError

__all__ = ["LoaderOptions", "LoaderStats", "SourceLoader"]

log = logging.getLogger(__name__)

DEFAULT_OPTIONS = LoaderOptions()
IDLE_CHECK_S = 5.0
IDLE_NOTICE_S = 30.0
"""A loader that waits for units looks every ``IDLE_CHECK_S`` whether every unit of its source is done, and
while they are, says so every ``IDLE_NOTICE_S``."""


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
        options: LoaderOptions = DEFAULT_OPTIONS,
        metrics: LoaderMetrics | None = None,
    ) -> None:
        super().__init__(config, options.transaction_timeout_ms)
        self.topics = topics
        self.runtime = runtime
        self.source = runtime.spec.name
        self.seed = seed
        self.options = options
        self.stats = LoaderStats()
        self.group = WorkGroup(config, topics, self.source, options, self.transactional_id, self.stats)
        self.metrics = metrics or LoaderMetrics(CollectorRegistry(), topics.job, self.source)
        self.planning = SourcePlanning(config, topics, runtime, seed, options, self.transactional_id)
        loader = UnitLoader(config, topics, runtime, self.metrics)
        self.transactions = UnitTransactions(self, self.group, loader, self.planning, self.stats, self.metrics, options)
        self._idle_notice_at = 0.0  # when a loader with nothing to do says so next

    @property
    def transactional_id(self) -> str:
        return f"{self.topics.job}.loader.{self.source}.{self.options.instance}"

    @property
    def group_id(self) -> str:
        return self.group.group_id

    def run(self) -> LoaderStats:
        self.stop_on_signals()
        if self.planning.ensure_plan(lambda: self.stopping) is None:
            log.info("loader %s: asked to stop while waiting for the work plan", self.transactional_id)
            return self.stats
        self.planning.start_sizing()
        producer = self.new_producer()
        self.group.join()
        began = time.monotonic()
        try:
            # Closing the consumer leaves the group, so the other loaders take the units at once.
            closes = (
                self.transactions.read_ahead.close,
                self.group.close_consumer,
                lambda: producer.flush(30),
                self.group.offsets.close,
            )
            with closing_unless_stuck(*closes):
                try:
                    self._loop(producer)
                except ProducerFencedError as exc:
                    # Also what a loader sees when the broker aborted its transaction after the timeout
                    # while it was away: a new process goes on from the committed units.
                    raise ProducerUnusableError(str(exc)) from exc
        finally:
            self.stats.seconds = time.monotonic() - began
        log.info("loader %s: %s", self.transactional_id, self.stats.describe())
        return self.stats

    def _loop(self, producer: Producer) -> None:
        while not self.stopping:
            message = self.group.poll(self.options.poll_timeout_s)
            if message is None:
                if self.group.rejoin_if_stalled():
                    continue
                if self._done_while_idle():
                    return
                continue
            if message.error():
                self.group.on_consumer_error(message.error())
                continue
            self.transactions.publish(producer, message)
            if self.options.max_units is not None and self.stats.units >= self.options.max_units:
                log.info("loader %s: did its %d units; leaving", self.transactional_id, self.stats.units)
                return
            if self.group.ended_while_busy:  # the end was read inside the transaction: no poll will say it again
                self.group.ended_while_busy = False
                if self._done_while_idle():
                    return

    def _done_while_idle(self) -> bool:
        """No unit came: instance 0 of a ``next_epoch`` job plans the epochs asked for. True when the loader
        is done: ``until_drained`` and every unit of the source is done."""
        if self.options.next_epoch:
            if self.options.instance == 0:
                self.planning.plan_requested_epochs()
            return False
        if self.options.until_drained and self.planning.drained(self.group.offsets):
            log.info("loader %s: every unit of %s is done", self.transactional_id, self.source)
            return True
        if not self.options.until_drained and time.monotonic() >= self._idle_notice_at:
            self._idle_notice_at = time.monotonic() + IDLE_CHECK_S
            if self.planning.drained(self.group.offsets):
                self._idle_notice_at = time.monotonic() + IDLE_NOTICE_S
                log.info(
                    "loader %s: every unit of %s is done; waiting for new ones, as asked without --until-drained",
                    self.transactional_id,
                    self.source,
                )
        return False
