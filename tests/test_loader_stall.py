"""A loader whose work consumer stops fetching (as a librdkafka client left stale by a broker restart does,
confluentinc/librdkafka#5430) notices that units lie past where it reads, rejoins its group with a new
consumer, and loads them, each once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from pipeline.kafka.work_plan import read_work_plan, request_epoch
from pipeline.roles.loader.role import LoaderOptions, SourceLoader
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.spec import load_spec
from tests.loader_support import build_example_data, committed_sample_ids, expected_sample_ids, write_spec
from topics.formats.names import JobTopics
from topics.kafka.admin import ensure_job_topics

TIMEOUT_S = 120.0


@pytest.mark.kafka
def test_a_loader_whose_work_consumer_stalls_rejoins_and_loads_what_lies_past_it(
    kafka_bootstrap: str, tmp_path: Path, unique_name: str
) -> None:
    data = build_example_data(tmp_path / "data", limit=8)
    spec = load_spec(write_spec(tmp_path, unique_name, kafka_bootstrap, data, on_exhausted="next_epoch"))
    config = spec.kafka.client_config(kafka_bootstrap)
    topics = JobTopics(spec.job)
    ensure_job_topics(config, spec.job, spec.source_names, spec.step.ranks, lanes=spec.constructor.lanes)
    options = LoaderOptions(next_epoch=True, transaction_timeout_ms=10_000, unit_seconds=0.01, stall_after_s=3.0)
    loader = SourceLoader(config, topics, SourceRuntime.from_spec(spec, "code"), spec.seed, options)
    outcome: dict[str, object] = {}

    def loaded(epochs: int) -> bool:
        plan = read_work_plan(config, topics, "code")
        if plan is None or plan.epochs_planned(1) < epochs:
            return False
        got = committed_sample_ids(kafka_bootstrap, topics, "code")
        return Counter(got) == expected_sample_ids(spec, kafka_bootstrap, "code")

    def drive() -> None:
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while not loaded(epochs=1):
                assert time.monotonic() < deadline, "epoch 0 was not loaded"
                time.sleep(0.2)  # a topic watched from outside: nothing to block on
            consumer = loader.group.consumer
            consumer.pause(consumer.assignment())  # it fetches no more, and nothing tells the loader
            request_epoch(config, topics, "code", 1)
            while not loaded(epochs=2):
                assert time.monotonic() < deadline, "epoch 1 was not loaded after the consumer stalled"
                time.sleep(0.2)  # a topic watched from outside: nothing to block on
        except BaseException as exc:  # reported by the test's thread
            outcome["error"] = exc
        finally:
            loader.request_stop()

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    stats = loader.run()  # on the main thread: it takes SIGTERM and SIGINT
    thread.join(timeout=30)
    assert "error" not in outcome, f"{outcome['error']!r}"
    assert stats.rejoins == 1, "the loader did not replace its stalled consumer"
    got = committed_sample_ids(kafka_bootstrap, topics, "code")
    assert len(got) == len(set(got)), "a sample was delivered twice"
