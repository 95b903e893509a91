"""Definitions more than one role shares."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pipeline.metrics.reasons import DeadLetterReason
from topics.kafka.offset_lookup import OffsetLookup

# Seconds of one transaction: from a few milliseconds (a constructor step) to minutes (a big work unit).
TRANSACTION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def dead_letters_counter(registry: CollectorRegistry) -> Counter:
    return Counter(
        "mixflow_dead_letters",
        "Records sent to <job>.dlq, committed, by source and reason class (the reason text is in the record)",
        ["job", "source", "reason"],
        registry=registry,
    )


def count_reasons(counter: Counter, job: str, source_reasons: Iterable[tuple[str, DeadLetterReason]]) -> None:
    for source, reason in source_reasons:
        counter.labels(job, source, reason.value).inc()


class SourceGaugeAtScrape(Collector):
    """A gauge per ``{job, source}`` measured when scraped, with an offset lookup of its own (closed by
    ``close``); scrapes may come on several threads."""

    NAME = ""
    HELP = ""

    def __init__(self, lookup: OffsetLookup) -> None:
        self._lock = threading.Lock()
        self._lookup = lookup

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def close(self) -> None:
        with self._lock:
            self._lookup.close()

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.NAME, self.HELP, labels=["job", "source"])
