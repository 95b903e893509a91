"""A look-ahead that holds its records' bytes against one that holds their offsets and fetches the bytes again
when it writes a step: the two ways of keeping a constructor's look-ahead of media, as raw pipelines of the
constructor's shape on the same data, in one run.

    .venv/bin/python -m benchmarks.refetch_bench [--images 16000] [--megapixels 0.25] [--ranks 16]
        [--step-mb 80] [--windows 2,8] [--repeats 3] [--data-job NAME] [--keep-data] [--markdown]

Data: ``media_throughput_bench``'s data job (captioned images of ``--megapixels``, clips and text, each a
record of the loaders' media format; ``--data-job`` reuses one written with ``--keep-data`` by either
benchmark). Each arm, in a child process, reads the image, clip and text topics from their start, cuts steps of
``--step-mb`` of records as they come, holds ``--window`` steps ahead of the one it writes (what composition
chooses from), and writes each step as one message per rank topic with the source offsets in one transaction,
committed on a thread while the next step is read (as the constructor pipelines):

- **held**: the look-ahead holds each record's bytes (the constructor holds its frames as views of the records);
- **re-fetched**: the look-ahead holds each record's topic, offset and size; a second consumer, kept at the
  oldest step's first offsets, reads the step's records again when it is written (the best case for fetching
  again: a step's records follow each other, as composition's mostly do).

Counted: payload MB/s from the first step's commit to the last written while the sources are still read (the
steps column; 10^6 bytes), CPU-s a step over the whole run,
peak RSS (``ru_maxrss``), and bytes read from Kafka over bytes written. Medians of ``--repeats``, the arms
alternating.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition

from benchmarks._table import add_markdown_flag, print_table
from benchmarks.media_throughput_bench import DESCRIPTION, write_media_data
from benchmarks.throughput_bench import RAW_CONSUMER, data_job, job_description
from topics.formats.names import JobTopics
from topics.kafka.admin import delete_job_topics, ensure_job_topics
from topics.kafka.clients import (
    commit_or_abort,
    produce,
    read_committed_consumer,
    send_offsets,
    transactional_producer,
)

REFETCH_QUEUE_KB = 64 << 10
"""librdkafka's fetch queue of the re-fetching consumer: about a step of this data, so that it does not hold a
second look-ahead of bytes."""


@dataclass
class Step:
    """A step's records: each one's topic, offset and bytes (None where only the offsets are held)."""

    topics: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    size: int = 0

    def last_offsets(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for topic, offset in zip(self.topics, self.offsets, strict=True):
            last[topic] = max(offset, last.get(topic, -1))
        return last


class SourceReader:
    """The source topics read from their start, ``batch`` records a call; raises where the data runs out."""

    def __init__(self, consumer: Consumer, topics: list[str]) -> None:
        consumer.assign([TopicPartition(t, 0, 0) for t in topics])
        self.consumer, self.topics = consumer, topics
        self.ended: set[str] = set()
        self.bytes_read = 0

    def read(self) -> list:
        if len(self.ended) == len(self.topics):
            raise EOFError("the data ran out")
        messages = []
        for message in self.consumer.consume(5000, timeout=1.0):
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    self.ended.add(message.topic())
                    continue
                raise SystemExit(f"refetch bench: {message.error()}")
            self.ended.discard(message.topic())
            self.bytes_read += len(message.value())
            messages.append(message)
        return messages


class Refetcher:
    """A second reader of the source topics that hands over each step's records again, in the order they come."""

    def __init__(self, config: dict, group: str, topics: list[str]) -> None:
        consumer = read_committed_consumer(
            config, group, **{**RAW_CONSUMER, "queued.max.messages.kbytes": REFETCH_QUEUE_KB}
        )
        self.reader = SourceReader(consumer, topics)
        self.early: list = []  # records read for a later step

    def values_of(self, step: Step) -> list[bytes]:
        wanted = step.last_offsets()
        values: list[bytes] = []
        left = self.early
        self.early = []
        while True:
            for message in left:
                if message.offset() <= wanted.get(message.topic(), -1):
                    values.append(message.value())
                else:
                    self.early.append(message)
            if len(values) == len(step.offsets):
                return values
            left = self.reader.read()

    def close(self) -> None:
        self.reader.consumer.close()


def run_arm(config: dict, data_job: str, out_job: str, ranks: int, step_bytes: int, window: int, refetch: bool) -> dict:
    """Every step of the data through a look-ahead of ``window`` steps, held or re-fetched; its measures."""
    sources = JobTopics(data_job)
    topics = [sources.src(s) for s in source_names(data_job, config)]
    reader = SourceReader(read_committed_consumer(config, f"{out_job}.read", **RAW_CONSUMER), topics)
    refetcher = Refetcher(config, f"{out_job}.refetch", topics) if refetch else None
    producer = transactional_producer(config, f"{out_job}.raw")
    out = JobTopics(out_job)
    size = step_bytes // ranks

    def transaction(values: bytes, offsets: list[TopicPartition]) -> float:
        producer.begin_transaction()
        for r in range(ranks):
            produce(producer, out.rank(r), values[r * size : (r + 1) * size], key=b"0")
        send_offsets(producer, reader.consumer, offsets)
        commit_or_abort(producer)
        return time.monotonic()

    look_ahead: deque[Step] = deque([Step()])
    next_offsets: dict[str, int] = {}
    committed: list[float] = []
    steps = written = 0
    before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.monotonic()
    with ThreadPoolExecutor(1) as committer:
        in_flight: Future[float] | None = None

        def write(step: Step) -> None:
            nonlocal in_flight, steps, written
            values = refetcher.values_of(step) if refetcher else step.values
            payload = b"".join(v for v in values if v is not None)[: size * ranks]
            offsets = [TopicPartition(t, 0, o + 1) for t, o in step.last_offsets().items()]
            if in_flight is not None:
                committed.append(in_flight.result())
            in_flight = committer.submit(transaction, payload, offsets)
            steps, written = steps + 1, written + len(payload)

        try:
            while True:
                for message in reader.read():
                    step = look_ahead[-1]
                    step.topics.append(message.topic())
                    step.offsets.append(message.offset())
                    step.values.append(None if refetch else message.value())
                    step.size += len(message.value())
                    next_offsets[message.topic()] = message.offset() + 1
                    if step.size >= step_bytes:
                        look_ahead.append(Step())
                    while len(look_ahead) > window + 1:
                        write(look_ahead.popleft())
        except EOFError:
            pass
        steady = steps  # the steps written while the sources were still read
        while len(look_ahead) > 1:  # the last (partial) step is left unwritten
            write(look_ahead.popleft())
        if in_flight is not None:
            committed.append(in_flight.result())
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    read = reader.bytes_read + (refetcher.reader.bytes_read if refetcher else 0)
    reader.consumer.close()
    if refetcher:
        refetcher.close()
    return {
        "steps": steady,
        "mbs": size * ranks * (steady - 1) / (committed[steady - 1] - committed[0]) / 1e6,
        "cpu_step": cpu / steps,
        "read_over_written": read / written,
        "wall": time.monotonic() - began,
        "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def source_names(job: str, config: dict) -> list[str]:
    description = job_description(config, job, DESCRIPTION)
    if description is None:
        raise SystemExit(f"{job} holds no media data: leave out --data-job to write one")
    return list(description["sources"])


def child(arguments: dict) -> None:
    print(json.dumps(run_arm(**arguments)), flush=True)


def arm_in_child(config: dict, data_job: str, ranks: int, step_bytes: int, window: int, refetch: bool) -> dict:
    out_job = f"{data_job}-refetch-{uuid.uuid4().hex[:6]}"
    ensure_job_topics(config, out_job, ["out"], ranks, timeout_s=600)
    arguments = {
        "config": config,
        "data_job": data_job,
        "out_job": out_job,
        "ranks": ranks,
        "step_bytes": step_bytes,
        "window": window,
        "refetch": refetch,
    }
    command = [sys.executable, __file__, "--child", json.dumps(arguments)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    finally:
        delete_job_topics(config, out_job)
    if result.returncode != 0:
        raise SystemExit(f"an arm failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


HEADERS = ["window", "look-ahead", "steps", "MB/s", "/ held", "CPU-s/step", "peak RSS MB", "read / written"]


def rows_of(window: int, held: list[dict], refetched: list[dict]) -> list[list[str]]:
    def med(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    def spread(runs: list[dict]) -> str:
        values = sorted(r["mbs"] for r in runs)
        return f"{statistics.median(values):.1f} [{values[0]:.1f}-{values[-1]:.1f}]"

    ratio = statistics.median(r["mbs"] / h["mbs"] for r, h in zip(refetched, held, strict=True))
    rows = []
    for name, runs, over in (("held", held, "1.00"), ("re-fetched", refetched, f"{ratio:.2f}")):
        rows.append(
            [
                str(window),
                name,
                str(runs[0]["steps"]),
                spread(runs),
                over,
                f"{med(runs, 'cpu_step'):.3f}",
                f"{med(runs, 'max_rss') / 1e6:,.0f}",
                f"{med(runs, 'read_over_written'):.2f}",
            ]
        )
    return rows


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=16000, help="images to write (a new data job)")
    parser.add_argument("--megapixels", type=float, default=0.25)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--step-mb", type=float, default=80.0, help="a step's records, in 10^6 bytes")
    parser.add_argument("--windows", default="2,8", help="steps held ahead, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-job", help="reuse this data job (written by an earlier run with --keep-data)")
    parser.add_argument("--keep-data", action="store_true", help="keep the data job for a later --data-job")
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    add_markdown_flag(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = {"bootstrap.servers": args.bootstrap_servers}
    step_bytes = int(args.step_mb * 1e6)
    with data_job(config, args, "rbench") as fresh:
        description = None if fresh else job_description(config, args.data_job, DESCRIPTION)
        if description is None:
            print(f"writing {args.images:,} images of {args.megapixels:g} MP, clips and text to {args.data_job} ...")
            description = write_media_data(config, args.data_job, args.images, [args.megapixels], 8192)
        print(f"data job {args.data_job}: {json.dumps(description['sources'])}", flush=True)
        table = []
        for window in (int(w) for w in args.windows.split(",")):
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for repeat in range(args.repeats):
                for refetch in (False, True):
                    result = arm_in_child(config, args.data_job, args.ranks, step_bytes, window, refetch)
                    runs[refetch].append(result)
                    name = "re-fetched" if refetch else "held"
                    print(f"window {window} {name} repeat {repeat}: {json.dumps(result)}", flush=True)
            table += rows_of(window, runs[False], runs[True])
        title = f"{args.ranks} rank topics, steps of {args.step_mb:g} MB; medians [min-max] of {args.repeats} repeats"
        print_table(HEADERS, table, title=title, markdown=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
