"""A loader run until drained leaves as soon as its last transaction has read its partition's end, even when it
read that end while taking units without waiting (inside the transaction, as a loader reading small objects
from a bucket does): no poll says it a second time, and the loader must not wait one out."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipeline.roles.loader.role import LoaderOptions, SourceLoader
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.spec import load_spec
from tests.loader_support import build_example_data, committed_sample_ids, expected_sample_ids
from tests.s3_support import S3Server, running_server, storage_section, upload
from topics.formats.names import JobTopics
from topics.kafka.admin import ensure_job_topics

POLL_S = 30.0  # a poll the loader must not wait out; loading the objects takes a few seconds
OBJECTS = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_server(tmp_path_factory.mktemp("s3")) as running:
        yield running


@pytest.mark.kafka
def test_a_drained_loader_leaves_without_waiting_out_a_poll(
    kafka_bootstrap: str, server: S3Server, tmp_path: Path, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = build_example_data(tmp_path / "example", limit=2) / "tokenizer.json"
    local = tmp_path / "small"
    local.mkdir()
    for i in range(OBJECTS):
        lines = (json.dumps({"text": f"object {i} line {j} " * (5 + i % 7)}) for j in range(3 + i % 5))
        (local / f"part-{i:03d}.jsonl").write_text("\n".join(lines) + "\n")
    root = upload(server, local, unique_name)
    monkeypatch.setenv("MIXFLOW_TEST_S3_KEY", server.access_key)
    monkeypatch.setenv("MIXFLOW_TEST_S3_SECRET", server.secret_key)
    body = {
        "job": unique_name,
        "kafka": {"bootstrap_servers": kafka_bootstrap},
        "tokenizer": str(tokenizer),
        "storage": storage_section(server, retry_deadline_s=30),
        "sources": [{"name": "small", "reader": "jsonl", "path": root, "field": "text", "max_sample_length": 512}],
        "mixture": {"weights": {"small": 1}},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 1024},
        "cost": {"alpha": 1.0, "beta": 100.0},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    spec = load_spec(tmp_path / "spec.yaml")
    config = spec.kafka.client_config(kafka_bootstrap)
    topics = JobTopics(spec.job)
    # One work partition: its one end-of-partition event is the one the last transaction reads.
    ensure_job_topics(config, spec.job, spec.source_names, spec.step.ranks, work_partitions=1)
    # One long transaction takes every unit; units slowed a little let the partition's end be fetched meanwhile,
    # so the transaction reads it (``WorkGroup.ready``) and no poll after it says it again.
    options = LoaderOptions(until_drained=True, poll_timeout_s=POLL_S, unit_seconds=POLL_S)
    loader = SourceLoader(config, topics, SourceRuntime.from_spec(spec, "small"), spec.seed, options)
    load = loader.transactions.loader.load

    def slow_load(*arguments: object) -> object:
        time.sleep(0.05)  # a slower tokenizer: the partition's end is fetched while units are still taken
        return load(*arguments)  # type: ignore[arg-type]

    loader.transactions.loader.load = slow_load  # type: ignore[method-assign]
    began = time.monotonic()
    stats = loader.run()  # on the main thread: it takes SIGTERM and SIGINT
    took = time.monotonic() - began
    assert stats.units == OBJECTS
    assert took < POLL_S, f"the drained loader left after {took:.0f} s: it waited out its {POLL_S:.0f} s poll"
    got = committed_sample_ids(kafka_bootstrap, topics, "small")
    assert Counter(got) == expected_sample_ids(spec, kafka_bootstrap, "small")
