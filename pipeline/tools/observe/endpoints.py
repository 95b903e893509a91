"""The step each rank's sink is at, scraped from the sinks' Prometheus endpoints that ``mixflow run`` lists
in ``<run folder>/metrics.json`` (``pipeline/metrics/endpoints.py``). Sinks read their rank topic without a
consumer group, so nothing on the broker says where they are."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pipeline.metrics.endpoints import METRICS_FILE, Endpoint, read_endpoints

# The sink's gauge of the step of the last micro-batch it handed out (trainer_sink/metrics.py), per rank.
SINK_STEP_METRIC = "mixflow_sink_step"
SCRAPE_TIMEOUT_S = 1.0


def run_endpoints(folder: Path) -> list[Endpoint]:
    """The endpoints listed in ``folder/metrics.json``; none when the file does not exist."""
    path = folder / METRICS_FILE
    return read_endpoints(path) if path.exists() else []


def sink_steps_in(text: str) -> list[int]:
    """The values of the sink step gauges in a Prometheus text exposition."""
    steps = []
    for family in text_string_to_metric_families(text):
        if family.name == SINK_STEP_METRIC:
            steps += [int(s.value) for s in family.samples if s.name == family.name]
    return steps


def scrape_sink_steps(endpoints: Iterable[Endpoint]) -> list[int] | None:
    """The step of every sink that answered; None when none did (the lead is then unknown)."""
    steps: list[int] = []
    answered = False
    for endpoint in endpoints:
        if endpoint.role != "sink":
            continue
        try:
            with urllib.request.urlopen(endpoint.url, timeout=SCRAPE_TIMEOUT_S) as response:
                text = response.read().decode()
        except (urllib.error.URLError, OSError, ValueError):
            continue  # a sink that has not started or has ended
        found = sink_steps_in(text)
        answered = answered or bool(found)
        steps += found
    return steps if answered else None
