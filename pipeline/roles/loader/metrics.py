"""The source loader's metrics: what its committed transactions held, and its source's work-unit lag."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping

from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import Metric

from pipeline.kafka.work_plan import WorkPlan, read_work_plan
from pipeline.metrics.common import (
    TRANSACTION_BUCKETS,
    SourceGaugeAtScrape,
    count_reasons,
    dead_letters_counter,
)
from pipeline.metrics.reasons import DeadLetterReason, reason_class
from topics.formats.dead_letter import DeadLetter
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig
from topics.kafka.offset_lookup import OffsetLookup

log = logging.getLogger(__name__)

# A scrape reads the work plan again at most this often (it is the merge of records on the control topic).
PLAN_REFRESH_S = 5.0


class LoaderMetrics:
    """One loader process of one source. Dead letters are held until their transaction ends, so an
    aborted (and redone) unit is counted once."""

    def __init__(self, registry: CollectorRegistry, job: str, source: str) -> None:
        labels = ["job", "source"]
        self.job, self.source = job, source

        def counter(name: str, help_text: str) -> Counter:
            return Counter(name, help_text, labels, registry=registry).labels(job, source)

        self.samples = counter("mixflow_loader_samples", "Samples committed to <job>.src.<source>")
        self.tokens = counter("mixflow_loader_tokens", "Tokens of the samples committed to <job>.src.<source>")
        self.work_units = counter("mixflow_loader_work_units", "Work units done (their offsets committed)")
        self.aborted = counter(
            "mixflow_loader_aborted_transactions",
            "Transactions aborted and rewound: their units are redone (a rebalance or a retriable Kafka error)",
        )
        self.transaction_seconds = Histogram(
            "mixflow_loader_transaction_seconds",
            "Committed transactions: from begin to commit, reading, tokenizing and producing their units",
            labels,
            buckets=TRANSACTION_BUCKETS,
            registry=registry,
        ).labels(job, source)
        self.dead_letters = dead_letters_counter(registry)
        self._pending_reasons: list[DeadLetterReason] = []

    def letters_produced(self, letters: Iterable[DeadLetter]) -> None:
        """Dead letters produced in the open transaction."""
        self._pending_reasons.extend(reason_class(letter.reason) for letter in letters)

    def unit_committed(self, samples: int, tokens: int) -> None:
        self.work_units.inc()
        self.samples.inc(samples)
        self.tokens.inc(tokens)

    def transaction_ended(self, committed: bool, seconds: float) -> None:
        if committed:
            self.transaction_seconds.observe(seconds)
            count_reasons(self.dead_letters, self.job, ((self.source, r) for r in self._pending_reasons))
        else:
            self.aborted.inc()
        self._pending_reasons.clear()


def work_unit_lag(ends: Mapping[int, int], committed: Mapping[int, int]) -> int:
    """Offsets of a work plan its group has not committed: per partition the plan's end minus the
    committed offset (a partition without one counts from 0)."""
    return sum(max(0, end - max(committed.get(p, 0), 0)) for p, end in ends.items())


class WorkUnitLag(SourceGaugeAtScrape):
    """``mixflow_loader_work_units_lag`` at each scrape: the source's work plan against its loader
    group's committed offsets, asked by a consumer of its own that never joins the group."""

    NAME = "mixflow_loader_work_units_lag"
    HELP = (
        "Work units of the source not done yet: its work plan's end offsets minus its loader group's committed "
        "offsets, over the work topic's partitions (the same for every loader of the source)"
    )

    def __init__(self, config: KafkaConfig, topics: JobTopics, source: str) -> None:
        self.config = config
        self.topics = topics
        self.source = source
        super().__init__(OffsetLookup(config, group=f"{topics.job}.loaders.{source}"))
        self._plan: WorkPlan | None = None
        self._plan_read_at = -PLAN_REFRESH_S

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            try:
                lag = self._lag()
            except Exception as exc:  # a broker away leaves the value out of this scrape, nothing more
                log.debug("work-unit lag of %s not measured: %s", self.source, exc)
                return
        family = self._family()
        if lag is not None:
            family.add_metric([self.topics.job, self.source], lag)
        yield family

    def _lag(self) -> int | None:
        if time.monotonic() - self._plan_read_at > PLAN_REFRESH_S:
            self._plan = read_work_plan(self.config, self.topics, self.source)
            self._plan_read_at = time.monotonic()
        if self._plan is None:
            return None
        work = self.topics.work(self.source)
        asked = [TopicPartition(work, p) for p in sorted(self._plan.ends)]
        committed = {tp.partition: tp.offset for tp in self._lookup.committed(asked, timeout_s=5)}
        return work_unit_lag(self._plan.ends, committed)
