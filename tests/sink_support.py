"""Rank topics written directly, for sink tests: batches of random samples, committed in transactions."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from confluent_kafka import Producer

from topics.formats.batch import Batch
from topics.formats.batch_codec import encode_batch, encode_end_of_data
from topics.formats.names import JobTopics
from topics.kafka.admin import ensure_job_topics
from topics.kafka.admin_client import client_config


def random_batch(
    rng: np.random.Generator, step: int, rank: int, ranks: int, micro_batches: int, capacity: int
) -> Batch:
    """A batch whose micro-batches hold random samples (some empty micro-batches, some one-token samples)."""
    ids, sources, micro, lengths = [], [], [], []
    for m in range(micro_batches):
        room = int(rng.integers(0, capacity + 1))
        while room > 0:
            n = int(min(room, rng.choice([1, rng.integers(1, 64), rng.integers(1, capacity + 1)])))
            ids.append(f"s{rng.integers(3)}/file/{step}-{rank}-{m}-{len(ids)}")
            sources.append(f"s{rng.integers(3)}")
            micro.append(m)
            lengths.append(n)
            room -= n
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    return Batch.from_arrays(
        step=step,
        rank=rank,
        ranks=ranks,
        micro_batches=micro_batches,
        capacity=capacity,
        sample_ids=ids,
        sources=sources,
        micro_batch=micro,
        offsets=offsets,
        tokens=tokens,
    )


def write_steps(
    bootstrap: str | Mapping[str, Any],
    job: str,
    batches: list[list[Batch]],
    *,
    end: bool = True,
    aborted_every: int = 0,
    end_steps: int | None = None,
) -> None:
    """Write ``batches[step][rank]`` to the job's rank topics, one transaction per step, as the
    constructor does; with ``aborted_every`` k, every k-th step is first written in a transaction that is
    aborted (readers must never see it); with ``end``, close with the end-of-data record. ``bootstrap``: the
    servers, or a client's settings (a secured cluster's admin)."""
    ranks = batches[0][0].ranks
    ensure_job_topics(bootstrap, job, ["s0"], ranks)
    topics = JobTopics(job)
    producer = Producer(client_config(bootstrap, {"transactional.id": f"{job}-{uuid.uuid4().hex[:6]}"}))
    producer.init_transactions(30)
    for i, step_batches in enumerate(batches):
        attempts = [False, True] if aborted_every and i % aborted_every == 0 else [True]
        for commit in attempts:
            producer.begin_transaction()
            for batch in step_batches:
                key, value, headers = encode_batch(batch)
                producer.produce(topics.rank(batch.rank), value, key=key, headers=headers)
            if commit:
                producer.commit_transaction(30)
            else:
                producer.flush(30)  # the records reach the log, then are aborted
                producer.abort_transaction(30)
    if end:
        producer.begin_transaction()
        key, value, headers = encode_end_of_data(end_steps if end_steps is not None else batches[-1][0].step + 1)
        for rank in range(ranks):
            producer.produce(topics.rank(rank), value, key=key, headers=headers)
        producer.commit_transaction(30)
    producer.flush(30)


def write_sink_spec(folder: Path, job: str, bootstrap: str, ranks: int, micro_batches: int, capacity: int) -> Path:
    """The part of a job spec the sink reads."""
    path = folder / f"{job}.yaml"
    body = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "step": {"ranks": ranks, "micro_batches": micro_batches, "tokens_per_micro_batch": capacity},
    }
    path.write_text(yaml.safe_dump(body))
    return path
