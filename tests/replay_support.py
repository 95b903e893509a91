"""Jobs for the replay tests: samples written straight into the source topics (no files, no loaders),
then mixed by a constructor in this process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml
from confluent_kafka import Producer

from pipeline.kafka.work_plan import publish_work_plan
from pipeline.roles.constructor import ConstructorOptions, ConstructorStats, DataConstructor
from pipeline.spec import JobSpec, load_spec
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_batch_message, end_of_data_steps
from topics.formats.names import JobTopics
from topics.formats.sample import Sample
from topics.formats.sample_codec import encode_sample
from topics.kafka.admin import ensure_job_topics
from topics.kafka.log_reader import read_to_end

SOURCES = ("a", "b", "c")
Lengths = Callable[[np.random.Generator, int], np.ndarray]


def write_replay_spec(folder: Path, job: str, bootstrap: str, **overrides: object) -> Path:
    """A spec of three pretokenized sources; ``overrides`` replace top-level sections."""
    body = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "sources": [{"name": s, "reader": "jsonl", "path": str(folder), "pretokenized": True} for s in SOURCES],
        "mixture": {"weights": {"a": 2, "b": 1, "c": 1}},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 256},
        "cost": {"alpha": 1.0, "beta": 100.0},
        "seed": 3,
        "on_exhausted": "renormalize",
        **overrides,
    }
    path = folder / f"{job}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def fill_sources(spec: JobSpec, samples_per_source: int, lengths: Lengths, seed: int = 0) -> None:
    """Write each source's samples, of ``lengths(rng, n)`` tokens, and an empty work plan (the source is
    complete as written)."""
    config = spec.kafka.client_config()
    topics = JobTopics(spec.job)
    ensure_job_topics(config, spec.job, spec.source_names, spec.step.ranks)
    rng = np.random.default_rng(seed)
    producer = Producer(config)
    for source in spec.source_names:
        publish_work_plan(config, topics, source, [], partitions=8)
        for row, n in enumerate(lengths(rng, samples_per_source).tolist()):
            sample = Sample(f"{source}/file/{row}", source, rng.integers(0, 50_000, n, dtype=np.int32))
            value, headers = encode_sample(sample)
            producer.produce(topics.src(source), value, key=sample.sample_id.encode(), headers=headers)
    assert producer.flush(30) == 0


def construct(spec: JobSpec, **options: object) -> ConstructorStats:
    """Run the constructor of ``spec`` here until it stops (``max_steps``) or the job ends."""
    return DataConstructor(
        spec, spec.kafka.client_config(), ConstructorOptions(transaction_timeout_ms=10_000, **options)
    ).run()


def make_job(folder: Path, job: str, bootstrap: str, samples: int, lengths: Lengths, **spec: object) -> JobSpec:
    """A job whose constructor has run to its end."""
    loaded = load_spec(write_replay_spec(folder, job, bootstrap, **spec))
    fill_sources(loaded, samples, lengths)
    assert construct(loaded).finished
    return loaded


def steps_of(bootstrap: str, job: str, ranks: int) -> tuple[list[list[Batch]], int | None]:
    """Per step, each rank's batch; and the step count of the end-of-data record (None if none)."""
    per_rank, ends = [], set()
    for rank in range(ranks):
        records = read_to_end({"bootstrap.servers": bootstrap}, JobTopics(job).rank(rank))
        ends.add(end_of_data_steps(records[-1].headers()) if records else None)
        batches = [decode_batch_message(r) for r in records if end_of_data_steps(r.headers()) is None]
        assert [b.step for b in batches] == list(range(batches[0].step, batches[0].step + len(batches)))
        per_rank.append(batches)
    assert len(ends) == 1 and len({len(b) for b in per_rank}) == 1
    return [list(step) for step in zip(*per_rank, strict=True)], ends.pop()
