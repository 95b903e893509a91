"""The data constructor's metrics: what each committed step held, how well it was balanced and filled,
what the constructor reads from and holds of each source, and whether this instance is the active one."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric

from pipeline.metrics.common import (
    TRANSACTION_BUCKETS,
    SourceGaugeAtScrape,
    count_reasons,
    dead_letters_counter,
)
from pipeline.metrics.reasons import DeadLetterReason
from topics.formats.dead_letter import DeadLetter
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig
from topics.kafka.offset_lookup import OffsetLookup

if TYPE_CHECKING:
    from pipeline.planning.step.assemble import StepSummary
    from pipeline.planning.step.pool import SamplePool
    from pipeline.spec import JobSpec

log = logging.getLogger(__name__)

IMBALANCE_BUCKETS = (1.0, 1.01, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0, 3.0, 5.0)
FILL_BUCKETS = (0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 1.0)
# The pool's held tokens are summed at most this often (the consumed-tokens counter moves on every look).
POOL_LOOK_S = 0.5


@dataclass(frozen=True)
class SourceHolding:
    """One source as the constructor's pool holds it: tokens read and not delivered (deferred ones
    included), the next offset to read, and the mean tokens per sample read so far (0: none read)."""

    held_tokens: int
    next_offset: int
    mean_sample_tokens: float


def backlog_tokens(holding: SourceHolding, end_offset: int) -> float:
    """Tokens of a source not consumed yet: those held, plus the records not read times the mean sample."""
    return holding.held_tokens + max(0, end_offset - holding.next_offset) * holding.mean_sample_tokens


class _JobSeries:
    """Makes series in ``registry`` labelled with ``job`` (and, per source, with the source)."""

    def __init__(self, registry: CollectorRegistry, job: str) -> None:
        self.registry = registry
        self.job = job

    def gauge(self, name: str, help_text: str) -> Gauge:
        return Gauge(name, help_text, ["job"], registry=self.registry).labels(self.job)

    def counter(self, name: str, help_text: str) -> Counter:
        return Counter(name, help_text, ["job"], registry=self.registry).labels(self.job)

    def histogram(self, name: str, help_text: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, help_text, ["job"], buckets=buckets, registry=self.registry).labels(self.job)

    def per_source(self, name: str, help_text: str, sources: Iterable[str]) -> Counter:
        """A counter with a series per source, each there from the start, at 0."""
        counter = Counter(name, help_text, ["job", "source"], registry=self.registry)
        for source in sources:
            counter.labels(self.job, source)
        return counter


class ConstructorMetrics:
    def __init__(self, registry: CollectorRegistry, job: str, spec: JobSpec) -> None:
        self.job = job
        self.capacity = spec.step.tokens_per_step
        self.cost_model = spec.cost.cost_model()
        self.holdings: dict[str, SourceHolding] = {}  # replaced whole: read by scrapes on other threads
        self._pool: SamplePool | None = None
        self._pool_read: dict[str, int] = {}
        self._pool_look_at = -POOL_LOOK_S
        series = _JobSeries(registry, job)
        self._define_written_series(series, spec.source_names)
        self._define_balance_series(series)
        self.dead_letters = dead_letters_counter(registry)
        self.active = series.gauge(
            "mixflow_constructor_active", "1 while this instance is the active one, 0 as a shadow"
        )
        self.takeovers = series.counter("mixflow_constructor_takeovers", "Times this instance became the active one")
        self.fenced = series.counter("mixflow_constructor_fencings", "Times a newer instance fenced this one")

    def _define_written_series(self, series: _JobSeries, sources: Sequence[str]) -> None:
        """What the committed steps wrote, per source what was read, and what waits for a later step."""
        self.steps = series.counter("mixflow_constructor_steps", "Steps committed")
        self.last_step = series.gauge(
            "mixflow_constructor_last_step",
            "The last step this process committed (-1: none yet); minus a rank's mixflow_sink_step it is the "
            "constructor's lead over that rank",
        )
        self.last_step.set(-1)
        self.samples = series.per_source("mixflow_constructor_samples", "Samples written to the rank topics", sources)
        self.tokens = series.per_source("mixflow_constructor_tokens", "Tokens written to the rank topics", sources)
        self.consumed_tokens = series.per_source(
            "mixflow_constructor_consumed_tokens",
            "Tokens read from <job>.src.<source> into the constructor's pool (read again after a resume: again)",
            sources,
        )
        self.deferred = series.counter(
            "mixflow_constructor_deferred_samples",
            "Samples a step deferred to a later step (a sample deferred twice counts twice)",
        )
        self.packed = series.counter(
            "mixflow_constructor_packed_steps",
            "Steps whose composition packed the micro-batches' holes (the scheduler started from its packing)",
        )
        self.waiting_deferred = series.gauge(
            "mixflow_constructor_waiting_deferred_samples", "Deferred samples waiting for the next step"
        )

    def _define_balance_series(self, series: _JobSeries) -> None:
        """How well the steps were balanced and filled, and their transactions."""
        self.last_max_cost = series.gauge(
            "mixflow_constructor_last_step_max_rank_cost",
            "The last step's costliest rank: its sum of alpha*L^2 + beta*L (the spec's cost model) over its samples",
        )
        self.last_mean_cost = series.gauge(
            "mixflow_constructor_last_step_mean_rank_cost", "The last step's mean rank cost"
        )
        self.last_imbalance = series.gauge(
            "mixflow_constructor_last_step_imbalance_ratio", "The last step's max over mean rank cost (1: balanced)"
        )
        self.last_fill = series.gauge(
            "mixflow_constructor_last_step_fill_ratio",
            "The last step's tokens over its capacity (ranks x micro-batches x tokens per micro-batch)",
        )
        self.imbalance = series.histogram(
            "mixflow_constructor_step_imbalance_ratio",
            "Steps by max over mean rank cost (1: balanced)",
            IMBALANCE_BUCKETS,
        )
        self.fill = series.histogram(
            "mixflow_constructor_step_fill_ratio", "Steps by tokens over capacity", FILL_BUCKETS
        )
        self.transaction_seconds = series.histogram(
            "mixflow_constructor_transaction_seconds",
            "Committed step transactions: from begin (producing the step's batches and state) to the commit's answer",
            TRANSACTION_BUCKETS,
        )
        self.aborted = series.counter(
            "mixflow_constructor_aborted_transactions",
            "Step transactions aborted: the constructor resumes from its last committed step",
        )

    # -- hooks of the role ------------------------------------------------------------------------

    def became_active(self) -> None:
        self.takeovers.inc()
        self.active.set(1)

    def became_shadow(self) -> None:
        self.active.set(0)

    def look_at_pool(self, pool: SamplePool) -> None:
        """Count the tokens read since the last look, and (at most every POOL_LOOK_S) what the pool holds."""
        if pool is not self._pool:  # a resume starts a new pool, reading from its checkpoint again
            self._pool, self._pool_read = pool, {}
        for source, fifo in pool.fifos.items():
            if new := fifo.read_tokens - self._pool_read.get(source, 0):
                self.consumed_tokens.labels(self.job, source).inc(new)
                self._pool_read[source] = fifo.read_tokens
        if time.monotonic() - self._pool_look_at < POOL_LOOK_S:
            return
        self._pool_look_at = time.monotonic()
        deferred: dict[str, int] = {}
        for c in pool.deferred:
            deferred[c.ref.source] = deferred.get(c.ref.source, 0) + c.sample.length
        self.holdings = {
            source: SourceHolding(
                fifo.tokens + deferred.get(source, 0),
                fifo.next_offset,
                fifo.read_tokens / fifo.read_samples if fifo.read_samples else 0.0,
            )
            for source, fifo in pool.fifos.items()
        }

    def step_committed(self, step: StepSummary | None, letters: Iterable[DeadLetter]) -> None:
        """A step's transaction committed: what it wrote (None for the final state alone) and the dead letters
        it wrote, which are records of a source topic that did not decode."""
        count_reasons(self.dead_letters, self.job, ((d.source, DeadLetterReason.UNDECODABLE_SAMPLE) for d in letters))
        if step is None:
            return
        self.steps.inc()
        self.last_step.set(step.step)
        tokens = step.tokens_by_source
        for source, n in step.samples_by_source.items():
            self.samples.labels(self.job, source).inc(n)
            self.tokens.labels(self.job, source).inc(tokens[source])
        self.deferred.inc(step.deferred)
        self.packed.inc(int(step.started))
        self.waiting_deferred.set(step.deferred)
        costs = step.rank_costs(self.cost_model)
        max_cost, mean_cost = float(costs.max()), float(costs.mean())
        imbalance = max_cost / mean_cost if mean_cost > 0 else 1.0
        fill = sum(tokens.values()) / self.capacity
        self.last_max_cost.set(max_cost)
        self.last_mean_cost.set(mean_cost)
        self.last_imbalance.set(imbalance)
        self.last_fill.set(fill)
        self.imbalance.observe(imbalance)
        self.fill.observe(fill)

    def transaction_ended(self, committed: bool, seconds: float) -> None:
        if committed:
            self.transaction_seconds.observe(seconds)
        else:
            self.aborted.inc()


class SourceBacklog(SourceGaugeAtScrape):
    """``mixflow_constructor_backlog_tokens`` at each scrape: what the pool holds (``ConstructorMetrics
    .holdings``) plus the source topic's records not read yet, at their mean length so far; the end
    offsets are asked by a consumer of its own."""

    NAME = "mixflow_constructor_backlog_tokens"
    HELP = (
        "Tokens of the source not consumed into steps yet (approximate): those the constructor holds plus "
        "(the source topic's end offset - the next offset to read) x the mean tokens per sample read so far; "
        "transaction markers count as records"
    )

    def __init__(
        self,
        config: KafkaConfig,
        topics: JobTopics,
        sources: Sequence[str],
        metrics: ConstructorMetrics,
        partition: int = 0,
    ) -> None:
        self.config = config
        self.partition = partition  # the constructor lane's partition of each source topic
        self.topics = topics
        self.sources = list(sources)
        self.metrics = metrics
        super().__init__(OffsetLookup(config))

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        holdings = self.metrics.holdings
        with self._lock:
            for source in self.sources:
                if (holding := holdings.get(source)) is None:
                    continue
                try:
                    end = self._end_offset(source)
                except Exception as exc:  # a broker away leaves the value out of this scrape, nothing more
                    log.debug("backlog of %s not measured: %s", source, exc)
                    continue
                family.add_metric([self.metrics.job, source], backlog_tokens(holding, end))
        yield family

    def _end_offset(self, source: str) -> int:
        return self._lookup.end(TopicPartition(self.topics.src(source), self.partition), timeout_s=5)
