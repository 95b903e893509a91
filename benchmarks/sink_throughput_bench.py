"""Trainer sink throughput: micro-batches/s and bytes/s into tensors through ``KafkaBatchDataset``, next to
a raw read_committed confluent-kafka consume of the same messages, on the same broker, in the same run.

    .venv/bin/python -m benchmarks.sink_throughput_bench [--repeats 5] [--bootstrap-servers HOST:PORT]
        [--sizes 2x4096,4x8192,8x32768] [--tokens 32000000] [--quick]

Per size (micro-batches x tokens per micro-batch, one rank's batch per step) it fills one rank topic
directly with a transactional producer, one transaction per step as the constructor writes them
(``Batch.from_arrays`` + ``encode_batch``, then ``encode_end_of_data``), with random samples (lengths
log-normal around 512 tokens, packed until the next one does not fit, ids like the loaders write).

Then, per repeat, three arms back to back, in an order that changes every repeat:

- **sink**: a fresh ``KafkaBatchDataset(job=..., rank=0)`` iterated to the end-of-data record, touching
  every micro-batch (its tensors' bytes are summed); the clock runs from ``iter()`` to the end.
- **raw**: a fresh ``confluent_kafka.Consumer`` with the sink's own librdkafka settings (read_committed,
  the same fetch sizes and read-ahead bound), the partition assigned from the beginning, ``poll()`` until it
  has as many messages as the sink read (batches + the end record), touching each value (``len(value)``).
  Against it the ratio isolates what the sink does with a message after ``poll()``.
- **raw, librdkafka defaults**: the same loop with a plain read_committed consumer.

The ratio is raw seconds / sink seconds for the same messages (equal to the ratio of micro-batches/s),
per repeat, over the whole read and after the first message (which excludes the consumer's start, about
0.6 s for every arm here); the target is at least 0.8. Medians over the repeats; timings are
never asserted.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from benchmarks._table import print_table
from topics.formats.batch import Batch
from topics.formats.batch_codec import encode_batch, encode_end_of_data
from topics.formats.names import JobTopics
from topics.kafka.admin import delete_job_topics, ensure_job_topics
from trainer_sink import KafkaBatchDataset, ReadOptions
from trainer_sink.reader import CONSUMER_SETTINGS
from trainer_sink.tensors import nbytes

REPO = Path(__file__).resolve().parent.parent

# The raw arm uses the sink's own librdkafka settings, so that it differs from the sink only in what
# happens to each message after poll().
SINK_CONSUMER_SETTINGS = CONSUMER_SETTINGS
# A plain read_committed consumer, everything else left to librdkafka.
DEFAULT_SETTINGS = {"enable.auto.commit": False, "isolation.level": "read_committed"}
SOURCES = [f"src{i}" for i in range(8)]


@dataclass(frozen=True)
class Size:
    micro_batches: int
    capacity: int

    @property
    def label(self) -> str:
        return f"{self.micro_batches}x{self.capacity}"

    @property
    def tokens(self) -> int:
        return self.micro_batches * self.capacity


@dataclass(frozen=True)
class Filled:
    job: str
    topic: str
    steps: int
    value_bytes: int
    tokens: int
    seconds: float


@dataclass(frozen=True)
class Run:
    seconds: float
    first_s: float
    messages: int
    value_bytes: int
    micro_batches: int = 0
    tensor_bytes: int = 0
    peak_prefetch_bytes: int = 0


def parse_sizes(text: str) -> list[Size]:
    sizes = []
    for part in text.split(","):
        m, _, c = part.strip().partition("x")
        sizes.append(Size(int(m), int(c)))
    return sizes


def random_batch(rng: np.random.Generator, step: int, size: Size) -> Batch:
    """One rank's batch: each micro-batch filled with log-normal sample lengths until the next does not fit."""
    ids: list[str] = []
    sources: list[str] = []
    micro: list[int] = []
    lengths: list[int] = []
    for m in range(size.micro_batches):
        room = size.capacity
        while True:
            n = int(np.clip(rng.lognormal(np.log(512), 1.0), 8, min(size.capacity, 8192)))
            if n > room:
                break
            source = SOURCES[int(rng.integers(len(SOURCES)))]
            ids.append(f"{source}/part-{int(rng.integers(100)):05d}.parquet/{int(rng.integers(100_000))}")
            sources.append(source)
            micro.append(m)
            lengths.append(n)
            room -= n
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    return Batch.from_arrays(
        step=step,
        rank=0,
        ranks=1,
        micro_batches=size.micro_batches,
        capacity=size.capacity,
        sample_ids=ids,
        sources=sources,
        micro_batch=micro,
        offsets=offsets,
        tokens=tokens,
    )


def fill(bootstrap: str, size: Size, steps: int, seed: int) -> Filled:
    """A fresh job whose rank topic 0 holds ``steps`` batches, one transaction each, then the end record."""
    job = f"sinkbench-{uuid.uuid4().hex[:6]}-{size.label}"
    ensure_job_topics(bootstrap, job, SOURCES[:1], 1)
    topic = JobTopics(job).rank(0)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{job}-fill",
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.max.bytes": 67_108_864,
            "queue.buffering.max.kbytes": 524_288,
        }
    )
    producer.init_transactions(30)
    rng = np.random.default_rng(seed)
    began = time.perf_counter()
    value_bytes = tokens = 0
    for step in range(steps):
        batch = random_batch(rng, step, size)
        key, value, headers = encode_batch(batch)
        producer.begin_transaction()
        producer.produce(topic, value, key=key, headers=headers)
        producer.commit_transaction(60)
        value_bytes += len(value)
        tokens += int(batch.offsets[-1])
    producer.begin_transaction()
    key, value, headers = encode_end_of_data(steps)
    producer.produce(topic, value, key=key, headers=headers)
    producer.commit_transaction(60)
    producer.flush(60)
    return Filled(job, topic, steps, value_bytes, tokens, time.perf_counter() - began)


def run_sink(bootstrap: str, filled: Filled, kafka_config: dict[str, Any] | None = None) -> Run:
    dataset = KafkaBatchDataset(
        job=filled.job,
        bootstrap_servers=bootstrap,
        kafka_config=kafka_config,
        rank=0,
        read=ReadOptions(wait_timeout_s=60),
    )
    micro_batches = tensor_bytes = 0
    first = None
    began = time.perf_counter()
    for micro_batch in dataset:
        if first is None:
            first = time.perf_counter()
        micro_batches += 1
        tensor_bytes += nbytes(micro_batch)
    end = time.perf_counter()
    first = end if first is None else first
    # The sink's messages: every batch plus the end-of-data record.
    return Run(
        end - began,
        first - began,
        filled.steps + 1,
        filled.value_bytes,
        micro_batches,
        tensor_bytes,
        dataset.peak_prefetch_bytes,
    )


def run_raw(bootstrap: str, filled: Filled, settings: dict[str, Any]) -> Run:
    began = time.perf_counter()
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"sinkbench-raw-{uuid.uuid4().hex[:8]}", **settings}
    )
    consumer.assign([TopicPartition(filled.topic, 0, OFFSET_BEGINNING)])
    wanted = filled.steps + 1
    messages = value_bytes = 0
    first = None
    deadline = time.monotonic() + 120
    while messages < wanted:
        message = consumer.poll(0.2)
        if message is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"raw consume of {filled.topic} stalled at {messages} of {wanted} messages")
            continue
        if message.error() is not None:
            continue
        if first is None:
            first = time.perf_counter()
        value_bytes += len(message.value() or b"")
        messages += 1
    end = time.perf_counter()
    consumer.close()
    return Run(end - began, (first or end) - began, messages, value_bytes)


ARMS: dict[str, Callable[[str, Filled], Run]] = {
    "sink": lambda bootstrap, filled: run_sink(bootstrap, filled),
    "raw": lambda bootstrap, filled: run_raw(bootstrap, filled, SINK_CONSUMER_SETTINGS),
    "raw, librdkafka defaults": lambda bootstrap, filled: run_raw(bootstrap, filled, DEFAULT_SETTINGS),
}
SINK_ARMS = ("sink",)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--sizes", default="2x4096,4x8192,8x32768", help="micro-batches x tokens, comma-separated")
    parser.add_argument("--tokens", type=int, default=32_000_000, help="tokens of capacity per size (>= 32 steps)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2M tokens per size, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.repeats = 2_000_000, 3
    logging.basicConfig(level=logging.WARNING)
    bootstrap = args.bootstrap_servers
    rows = []
    jobs = []
    try:
        for i, size in enumerate(parse_sizes(args.sizes)):
            steps = max(32, args.tokens // size.tokens)
            filled = fill(bootstrap, size, steps, seed=i)
            jobs.append(filled.job)
            print(
                f"{size.label}: {steps} steps, {filled.value_bytes / 1e6:.1f} MB of values, "
                f"filled in {filled.seconds:.1f} s",
                flush=True,
            )
            ARMS["raw"](bootstrap, filled)  # warm-up: the broker's page cache, the client's first connection
            runs: dict[str, list[Run]] = {name: [] for name in ARMS}
            names = list(ARMS)
            for repeat in range(args.repeats):
                # A different order each repeat: every arm goes first once every len(ARMS) repeats.
                order = names[repeat % len(names) :] + names[: repeat % len(names)]
                if repeat % 2:
                    order.reverse()
                for name in order:
                    runs[name].append(ARMS[name](bootstrap, filled))
                for name in SINK_ARMS:
                    if runs[name][-1].micro_batches != steps * size.micro_batches:
                        raise SystemExit(
                            f"{name} gave {runs[name][-1].micro_batches} micro-batches, expected "
                            f"{steps * size.micro_batches}"
                        )
                print(f"  repeat {repeat}: " + ", ".join(f"{n} {runs[n][-1].seconds:.3f} s" for n in names), flush=True)
            rows.append((size, filled, runs))
    finally:
        for job in jobs:
            delete_job_topics(bootstrap, job)
    print_tables(rows, args.repeats)
    return 0


def _med(values: Iterable[float]) -> float:
    return statistics.median(values)


def print_tables(rows: list[tuple[Size, Filled, dict[str, list[Run]]]], repeats: int) -> None:
    print()
    print(
        f"Medians of {repeats} runs. first: seconds from creating the consumer or the iterator to the first "
        "message (raw) or micro-batch (sink); total: to the last; after-first: total - first. mb/s: micro-batches "
        "per second (raw: messages x micro-batches per message); MB/s: message values or the sink's tensors."
    )
    header = (
        "size",
        "arm",
        "first s",
        "total s",
        "mb/s total",
        "values MB/s total",
        "values MB/s after-first",
        "tensors MB/s total",
        "peak prefetch MB",
    )
    lines = [header]
    for size, filled, runs in rows:
        for name, arm in runs.items():
            total, first = _med(r.seconds for r in arm), _med(r.first_s for r in arm)
            after = _med(r.seconds - r.first_s for r in arm)
            sink = name in SINK_ARMS
            lines.append(
                (
                    size.label,
                    name,
                    f"{first:.3f}",
                    f"{total:.3f}",
                    f"{filled.steps * size.micro_batches / total:,.0f}",
                    f"{filled.value_bytes / total / 1e6:,.0f}",
                    f"{filled.value_bytes / max(after, 1e-9) / 1e6:,.0f}",
                    f"{arm[0].tensor_bytes / total / 1e6:,.0f}" if sink else "",
                    f"{max(r.peak_prefetch_bytes for r in arm) / 1e6:.1f}" if sink else "",
                )
            )
    print_table(lines[0], lines[1:])

    print()
    print(
        "Ratios sink/raw = raw seconds / sink seconds, per repeat (the arms of a repeat ran back to back), "
        "median [min-max]; total and after the first message."
    )
    header = (
        "size",
        "steps",
        "MB values",
        "sink / raw (sink's settings)",
        "after-first",
        "sink / raw (librdkafka defaults)",
        "after-first",
    )
    lines = [header]
    verdicts = []
    for size, filled, runs in rows:
        cells = []
        for sink, raw in (("sink", "raw"), ("sink", "raw, librdkafka defaults")):
            total = _ratios(runs[raw], runs[sink], lambda r: r.seconds)
            after = _ratios(runs[raw], runs[sink], lambda r: r.seconds - r.first_s)
            cells += [_span(total), _span(after)]
            verdicts.append((size.label, raw, _med(total), _med(after)))
        lines.append((size.label, str(filled.steps), f"{filled.value_bytes / 1e6:.1f}", *cells))
    print_table(lines[0], lines[1:])
    print()
    for label, raw, total, after in verdicts:
        print(
            f"target sink/raw >= 0.8 at {label}, against {raw}: total {total:.2f} "
            f"({'met' if total >= 0.8 else 'not met'}), after the first message {after:.2f} "
            f"({'met' if after >= 0.8 else 'not met'})"
        )


def _ratios(raws: list[Run], sinks: list[Run], seconds: Callable[[Run], float]) -> list[float]:
    return [seconds(raw) / max(seconds(sink), 1e-9) for raw, sink in zip(raws, sinks, strict=True)]


def _span(values: list[float]) -> str:
    return f"{_med(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


if __name__ == "__main__":
    raise SystemExit(main())
