"""The constructor's throughput at 8 to 1,024 ranks, next to Kafka's own limits on the same broker.

    .venv/bin/python -m benchmarks.throughput_bench [--repeats 3] [--shapes 8x64x8192,...] [--tokens 40000000]
        [--steps 8] [--baseline-tree DIR] [--kafka-config KEY=VALUE ...] [--composition]
        [--steps-per-transaction N] [--data-job NAME] [--keep-data] [--profile SHAPE] [--no-kafka-tools]
        [--bootstrap-servers HOST:PORT] [--markdown]

Data: synthetic pre-tokenized samples (log-normal lengths around 1,000 tokens, at most the smallest
micro-batch capacity of the shapes; Zipf token ids below 50,257) written once, straight to four
``<job>.src.<source>`` topics in the loaders' format (``encode_sample``, lz4, transactions), shared by every
arm and repeat (``--data-job`` reuses a job written by an earlier ``--keep-data`` run). The default shapes
keep a global batch of 4.2M tokens, as a 7B model's training would at 8 to 1,024 GPUs.

Per shape (ranks x micro-batches x tokens per micro-batch) and repeat, back to back on the same broker:

- **constructor**: ``DataConstructor`` reading the data job into a fresh ``--output-job`` (its topics created
  beforehand, outside the timing), in a child process, for as many steps as the data fills (at most
  ``--steps``), the in-order draw (``composition: null``) unless ``--composition``. Timed from its first
  step's commit to its last (steady state: start-up, the lease and the first fetch are left out);
  ``cores`` = the child's CPU seconds (every thread) / its seconds in ``run()``; ``CPU-s/step`` = its CPU seconds
  from the first commit to the last, per step (in brackets its main thread's): the measure that load on a
  shared machine moves least.
- **baseline tree** (``--baseline-tree DIR``, e.g. ``git archive <rev> | tar -x -C DIR``): the same
  constructor run with that copy of the code, in the same repeat (before this tree's run in even repeats,
  after it in odd ones).
- **raw**: a tuned confluent-kafka pipeline that moves the same bytes: it consumes the same source records
  (read_committed, large fetches) and, per step, produces the constructor's step payload as one message
  per rank topic (the consumed values' bytes, cut to the rank batches' mean size), in one transaction with
  the source offsets, begun, produced and committed on a thread while the next step is read; the
  constructor's producer settings.
- **ProducerPerformance** / **ConsumerPerformance**: Kafka's own tools (``org.apache.kafka:kafka-tools``,
  the broker's version, resolved with Maven from ``benchmarks/kafka-tools/pom.xml``), ``acks=all``, no
  compression, records of the rank batches' mean size (at least 128 MB of them) into and out of a fresh
  one-partition topic. ConsumerPerformance's rate is its fetch rate (the group join left out).

Payload MB/s counts the rank batches' values (Arrow IPC, before Kafka's compression), 10^6 bytes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from benchmarks._table import add_markdown_flag, print_table
from pipeline.planning.shape import StepShape
from topics.errors import MixflowError
from topics.formats.names import JobTopics
from topics.formats.sample import Sample
from topics.formats.sample_codec import encode_sample
from topics.kafka.admin import TopicSpec, delete_job_topics, ensure_job_topics, ensure_topics
from topics.kafka.clients import (
    commit_or_abort,
    produce,
    read_committed_consumer,
    send_offsets,
    transactional_producer,
)
from topics.kafka.log_reader import read_to_end

REPO = Path(__file__).resolve().parent.parent

TOOLS_POM = Path(__file__).resolve().parent / "kafka-tools" / "pom.xml"
SOURCES = {"web": 0.5, "code": 0.25, "books": 0.15, "math": 0.1}
DEFAULT_SHAPES = "8x64x8192,64x8x8192,256x2x8192,1024x1x4096"
VOCAB = 50_257
MEAN_LENGTH = 1_000


def parse_shape(text: str) -> StepShape:
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text.strip())
    if not match:
        msg = f"a shape is RANKSxMICRO_BATCHESxTOKENS, e.g. 256x2x8192, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return StepShape(*(int(g) for g in match.groups()))


def label(shape: StepShape) -> str:
    return f"{shape.ranks}x{shape.micro_batches}x{shape.tokens_per_micro_batch}"


# -- the data ------------------------------------------------------------------------------------------


def sample_lengths(rng: np.random.Generator, tokens: int, max_length: int) -> np.ndarray:
    """Log-normal lengths around MEAN_LENGTH, in [16, max_length], until they sum to ``tokens``."""
    sigma = 1.0
    mu = np.log(MEAN_LENGTH) - sigma**2 / 2
    lengths = np.clip(rng.lognormal(mu, sigma, size=2 * tokens // MEAN_LENGTH + 16), 16, max_length).astype(np.int64)
    return lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]


def token_ids(rng: np.random.Generator, count: int) -> np.ndarray:
    """Token ids with text's skew: Zipf ranks below VOCAB (lz4 shrinks them about 1.9x; uniform ids would
    not compress, real text of a 50k vocabulary is in between, code more)."""
    ids = rng.zipf(1.2, size=2 * count + 1024)
    return (ids[ids < VOCAB][:count] - 1).astype(np.int32)


def write_data(config: dict, job: str, tokens: int, max_length: int, seed: int = 0) -> dict[str, int]:
    """Write about ``tokens`` tokens of samples to the job's source topics, split by SOURCES' shares."""
    ensure_job_topics(config, job, list(SOURCES), 1, timeout_s=600)
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}

    def samples() -> Iterator[Sample]:
        for source, share in SOURCES.items():
            lengths = sample_lengths(rng, int(tokens * share), max_length)
            ids = token_ids(rng, int(lengths.sum()))
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            for i in range(len(lengths)):
                yield Sample(f"{source}/synthetic/{i}", source, ids[offsets[i] : offsets[i + 1]])
            counts[source] = int(lengths.sum())

    write_samples(config, job, samples())
    return counts


def write_samples(config: dict, job: str, samples: Iterable[Sample], per_transaction: int = 2000) -> None:
    """Write ``samples`` to their sources' topics of ``job`` (``encode_sample``), ``per_transaction`` a
    transaction."""
    topics = JobTopics(job)
    producer = transactional_producer(config, f"{job}.bench-data")
    producer.begin_transaction()
    for i, sample in enumerate(samples):
        value, headers = encode_sample(sample)
        produce(producer, topics.src(sample.source), value, key=sample.sample_id.encode(), headers=headers)
        if i % per_transaction == per_transaction - 1:
            commit_or_abort(producer)
            producer.begin_transaction()
    commit_or_abort(producer)
    producer.flush(60)


def data_tokens(config: dict, job: str, max_length: int) -> int | None:
    """The tokens a data job written by ``write_data`` holds (from its description record), or None when it
    has none or its samples may be longer than ``max_length``."""
    found = job_description(config, job)
    if found is None or found.get("max_length", max_length + 1) > max_length:
        return None
    return int(found["tokens"])


def describe_data(config: dict, job: str, counts: dict[str, int], max_length: int) -> None:
    describe_job(config, job, {"tokens": sum(counts.values()), "sources": counts, "max_length": max_length})


def job_description(config: dict, job: str, key: bytes = b"bench-data") -> dict | None:
    """The last description a benchmark wrote of its data job under ``key`` (``describe_job``), or None."""
    try:
        records = read_to_end(config, JobTopics(job).control, timeout_s=30)
    except (KafkaException, MixflowError):  # no such topic
        return None
    found = [json.loads(m.value()) for m in records if m.key() == key]
    return found[-1] if found else None


def describe_job(config: dict, job: str, body: dict, key: bytes = b"bench-data") -> None:
    """Record what a data job holds on its control topic, for a later run to reuse it."""
    producer = transactional_producer(config, f"{job}.bench-data")
    producer.begin_transaction()
    produce(producer, JobTopics(job).control, json.dumps(body).encode(), key=key)
    commit_or_abort(producer)


def write_spec(
    folder: Path,
    job: str,
    shape: StepShape,
    composition: bool,
    kafka: dict | None = None,
    steps_per_transaction: int | None = None,
) -> Path:
    empty = folder / "no-files"
    empty.mkdir(parents=True, exist_ok=True)
    spec = {
        "job": job,
        "kafka": {"config": dict(kafka or {})},
        "sources": [
            {"name": s, "reader": "parquet", "path": str(empty), "pretokenized": True, "field": "tokens"}
            for s in SOURCES
        ],
        "mixture": {"weights": dict(SOURCES)},
        "step": {
            "ranks": shape.ranks,
            "micro_batches": shape.micro_batches,
            "tokens_per_micro_batch": shape.tokens_per_micro_batch,
        },
        "cost": {"hidden_size": 4096, "num_layers": 32},
        "on_exhausted": "stop",
        "seed": 1,
    }
    if not composition:
        spec["composition"] = None
    if steps_per_transaction is not None:
        spec["constructor"] = {"steps_per_transaction": steps_per_transaction}
    path = folder / f"spec-{label(shape)}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def steps_for(shape: StepShape, data: int, composition: bool) -> int:
    """Steps the data fills with room to spare (a draw takes 5% more than a step; composition waits for
    8 steps of every source ahead)."""
    ahead = 9 if composition else 1
    return max(2, int(data / (shape.tokens_per_step * 1.06)) - ahead)


# -- the constructor, in a child process ---------------------------------------------------------------


def child_constructor(spec_path: Path, output_job: str, max_steps: int, bootstrap: str, profile: Path | None) -> None:
    """Run the constructor in this process and print its timings as one JSON line."""
    import pipeline.roles.constructor.step_records as step_records
    from pipeline.planning.step.assemble import StepSummary
    from pipeline.roles.constructor import ConstructorOptions, DataConstructor
    from pipeline.spec import load_spec

    payload = [0]
    encode = step_records.encode_batch_buffer  # what a step's transaction encodes each rank's batch with

    def counting_encode(batch: Any) -> tuple[bytes, Any, Any]:
        key, value, headers = encode(batch)
        payload[0] += value.size
        return key, value, headers

    step_records.encode_batch_buffer = counting_encode
    committed: list[tuple[float, int]] = []
    cpu_at: list[tuple[float, float]] = []  # (the process's CPU seconds, the main thread's) at each commit
    media: list[Counter[str]] = []  # each step's images and clips, by kind

    class Timed(DataConstructor):
        def _record(self, step: StepSummary, state_bytes: int) -> None:
            super()._record(step, state_bytes)
            committed.append((time.monotonic(), step.tokens))
            cpu_at.append((time.process_time(), time.thread_time()))  # _record runs on the main thread
            media.append(Counter(step.media_by_kind))

    spec = load_spec(spec_path)
    constructor = Timed(spec, spec.kafka.client_config(bootstrap), ConstructorOptions(output_job, max_steps))
    before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.monotonic()
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.runcall(constructor.run)
        profiler.dump_stats(profile)
    else:
        constructor.run()
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    times = [t for t, _ in committed]
    result = {
        "steps": len(committed),
        "tokens": sum(n for _, n in committed),
        "payload": payload[0],
        "wall": wall,
        "cpu": cpu,
        "first": times[0] - began if times else None,
        "steady_s": times[-1] - times[0] if len(times) > 1 else None,
        # Steps committed after the first commit (with several steps a transaction, the first one's group
        # commits at the same moment, within the microseconds its bookkeeping takes).
        "steady_tokens": sum(n for t, n in committed if t > times[0] + 0.001),
        # CPU seconds between the first commit and the last: the whole process's and its main thread's.
        "steady_cpu": cpu_at[-1][0] - cpu_at[0][0] if len(cpu_at) > 1 else None,
        "steady_main_cpu": cpu_at[-1][1] - cpu_at[0][1] if len(cpu_at) > 1 else None,
        # Images and clips in the steps committed after the first, and the process's peak RSS (bytes).
        "steady_media": dict(sum(media[1:], Counter())),
        "max_rss": after.ru_maxrss * 1024,
    }
    print(json.dumps(result), flush=True)


# -- the raw pipeline: the same bytes, no mixflow work ---------------------------------------------------


def run_raw(
    config: dict,
    data_job: str,
    out_job: str,
    shape: StepShape,
    steps: int,
    step_payload: int,
    sources: Iterable[str] = tuple(SOURCES),
) -> dict:
    """Consume the data job's samples of ``sources`` and, per step, produce ``step_payload`` of their bytes as
    one message per rank topic of ``out_job`` in one transaction with the source offsets; each transaction
    produced and committed on a thread while the next step is read (as the constructor pipelines).
    ``steady_records``: the records of each source topic in the steps after the first (a record counts in the
    step that takes its last byte)."""
    from concurrent.futures import ThreadPoolExecutor

    consumer = read_committed_consumer(config, f"{out_job}.raw", **RAW_CONSUMER)
    topics = [JobTopics(data_job).src(s) for s in sources]
    consumer.assign([TopicPartition(t, 0, 0) for t in topics])
    producer = transactional_producer(config, f"{out_job}.raw")
    out = JobTopics(out_job)
    size = step_payload // shape.ranks

    def transaction(values: bytes, offsets: list[TopicPartition]) -> float:
        producer.begin_transaction()
        for r in range(shape.ranks):
            produce(producer, out.rank(r), values[r * size : (r + 1) * size], key=b"0")
        send_offsets(producer, consumer, offsets)
        commit_or_abort(producer)
        return time.monotonic()

    committed = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.monotonic()
    with ThreadPoolExecutor(1) as committer:
        in_flight = None
        next_offsets: dict[str, int] = {}
        ends: set[str] = set()  # sources read to their end and nothing since
        pending = bytearray()  # bytes read and not produced yet: a consume call can overshoot a step
        queued: deque[list] = deque()  # [topic, bytes not cut yet] of each record in ``pending``
        moved: Counter[str] = Counter()  # records cut into steps, by topic
        at_cut: list[Counter[str]] = []  # ``moved`` after each step's cut
        need = size * shape.ranks
        for _ in range(steps):
            while len(pending) < need:
                if len(ends) == len(topics):
                    raise SystemExit(f"raw pipeline: the data ran out ({len(pending)} of {need} bytes of a step)")
                for message in consumer.consume(5000, timeout=1.0):
                    if message.error():
                        if message.error().code() == KafkaError._PARTITION_EOF:
                            ends.add(message.topic())
                            continue
                        raise SystemExit(f"raw pipeline: {message.error()}")
                    ends.discard(message.topic())
                    pending += message.value()
                    queued.append([message.topic(), len(message.value())])
                    next_offsets[message.topic()] = message.offset() + 1
            values = bytes(pending[:need])
            del pending[:need]
            left = need
            while queued and queued[0][1] <= left:
                topic, size_left = queued.popleft()
                moved[topic] += 1
                left -= size_left
            if queued:
                queued[0][1] -= left
            at_cut.append(moved.copy())
            offsets = [TopicPartition(t, 0, o) for t, o in next_offsets.items()]
            if in_flight is not None:
                committed.append(in_flight.result())
            in_flight = committer.submit(transaction, values, offsets)
        committed.append(in_flight.result())
    after = resource.getrusage(resource.RUSAGE_SELF)
    consumer.close()
    wall = time.monotonic() - began
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "steady_s": committed[-1] - committed[0],
        "steady_bytes": size * shape.ranks * (steps - 1),
        "cores": cpu / wall,
        "cpu": cpu,
        "steady_records": dict(at_cut[-1] - at_cut[0]),
    }


RAW_CONSUMER = {
    "enable.partition.eof": True,
    # Large fetches: the source samples are read as fast as the broker serves them.
    "fetch.max.bytes": 64 << 20,
    "max.partition.fetch.bytes": 16 << 20,
    "queued.max.messages.kbytes": 256 << 10,
}


# -- Kafka's own tools ---------------------------------------------------------------------------------


def tools_classpath() -> str:
    from pipeline.tools.stack.jars import pom_text, resolve_jars

    text = TOOLS_POM.read_text()
    version = re.search(r"<kafka.version>([^<]+)</kafka.version>", text)
    broker = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom_text())
    if version is None or broker is None or version.group(1) != broker.group(1):
        msg = f"{TOOLS_POM} and pipeline/tools/stack/pom.xml must name the same kafka.version"
        raise SystemExit(msg)
    libs = resolve_jars(text, "kafka-tools", "kafka-tools-*.jar", "Kafka's tools (org.apache.kafka:kafka-tools)")
    return str(libs / "*")


def producer_performance(classpath: str, bootstrap: str, topic: str, records: int, size: int) -> float:
    """ProducerPerformance's bytes/s (10^6 bytes) for ``records`` of ``size`` bytes, acks=all."""
    props = [
        f"bootstrap.servers={bootstrap}",
        "acks=all",
        "linger.ms=5",
        "batch.size=1048576",
        "compression.type=none",
        "max.request.size=67108864",
        "buffer.memory=536870912",
    ]
    command = ["java", "-Xmx1g", "-cp", classpath, "org.apache.kafka.tools.ProducerPerformance"]
    command += ["--topic", topic, "--num-records", str(records), "--record-size", str(size), "--throughput", "-1"]
    result = subprocess.run([*command, "--producer-props", *props], capture_output=True, text=True, timeout=600)
    match = re.search(r"records sent, ([\d.]+) records/sec", result.stdout)
    if result.returncode != 0 or match is None:
        msg = f"ProducerPerformance failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        raise SystemExit(msg)
    return float(match.group(1)) * size


def consumer_performance(classpath: str, bootstrap: str, topic: str, records: int) -> float:
    """ConsumerPerformance's bytes/s (10^6 bytes) reading ``records`` from ``topic``, its fetch time only."""
    command = ["java", "-Xmx1g", "-cp", classpath, "org.apache.kafka.tools.ConsumerPerformance"]
    command += ["--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(records), "--timeout", "60000"]
    result = subprocess.run([*command, "--hide-header"], capture_output=True, text=True, timeout=600)
    fields = result.stdout.strip().splitlines()[-1].split(",") if result.stdout.strip() else []
    if result.returncode != 0 or len(fields) < 10:
        msg = f"ConsumerPerformance failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        raise SystemExit(msg)
    return float(fields[8]) * 1024 * 1024  # fetch.MB.sec, in MiB


# -- one shape, one repeat -----------------------------------------------------------------------------


def constructor_run(
    spec: Path, out_job: str, steps: int, bootstrap: str, profile: Path | None = None, tree: Path | None = None
) -> dict:
    """Run the constructor in a child process, with the code of ``tree`` (default: this one)."""
    command = [sys.executable, __file__, "--child", str(spec), out_job, str(steps), bootstrap]
    command += [str(profile)] if profile else []
    # This script, with mixflow imported from ``tree`` (found before the installed one) and its helpers here.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree or REPO), str(REPO)])}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tree or REPO, env=env)
    if result.returncode != 0:
        raise SystemExit(f"the constructor failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_shape(
    args: argparse.Namespace, config: dict, data: int, shape: StepShape, classpath: str | None, folder: Path
) -> list:
    spec = write_spec(folder, args.data_job, shape, args.composition, args.kafka_config, args.steps_per_transaction)
    steps = min(args.steps, steps_for(shape, data, args.composition))
    rows = []
    for repeat in range(args.repeats):
        out = f"{args.data_job}-{label(shape)}-{uuid.uuid4().hex[:6]}"
        ensure_job_topics(config, out, list(SOURCES), shape.ranks, timeout_s=600)
        try:
            base = None
            if args.baseline_tree is not None and repeat % 2:  # the two trees take turns at going first
                built = constructor_run(spec, out, steps, args.bootstrap_servers)
            if args.baseline_tree is not None:
                ensure_job_topics(config, f"{out}-base", list(SOURCES), shape.ranks, timeout_s=600)
                base = constructor_run(spec, f"{out}-base", steps, args.bootstrap_servers, tree=args.baseline_tree)
                delete_job_topics(config, f"{out}-base")
            if args.baseline_tree is None or not repeat % 2:
                built = constructor_run(spec, out, steps, args.bootstrap_servers)
            step_payload = built["payload"] // built["steps"]
            raw = run_raw({**config, **args.kafka_config}, args.data_job, out, shape, steps, step_payload)
            size = step_payload // shape.ranks
            pp = cp = None
            if classpath is not None:
                pp, cp = kafka_tools(args.bootstrap_servers, config, classpath, f"{out}.pp", built["payload"], size)
        finally:
            delete_job_topics(config, out)
        steady_payload = built["payload"] * built["steady_tokens"] / built["tokens"]
        row = {
            "shape": shape,
            "steps": built["steps"],
            "size": size,
            "step_tokens": built["tokens"] / built["steps"],
            "mbs": steady_payload / built["steady_s"],
            "tokens_s": built["steady_tokens"] / built["steady_s"],
            "cores": built["cpu"] / built["wall"],
            "raw": raw["steady_bytes"] / raw["steady_s"],
            "raw_cores": raw["cores"],
            "pp": pp,
            "cp": cp,
            "base": base["payload"] * base["steady_tokens"] / base["tokens"] / base["steady_s"] if base else None,
            "cpu_step": cpu_per_step(built),
            "base_cpu_step": cpu_per_step(base) if base else None,
        }
        rows.append(row)
        print(f"{label(shape)} repeat {repeat}: {describe_row(row)}", flush=True)
    return rows


def kafka_tools(bootstrap: str, config: dict, classpath: str, topic: str, payload: int, size: int) -> tuple:
    """ProducerPerformance's and ConsumerPerformance's bytes/s for records of ``size`` bytes, at least
    ``payload`` and 128 MB of them, into and out of a fresh one-partition ``topic``."""
    records = max(payload, 128_000_000) // size
    ensure_topics(config, [TopicSpec(topic, 1, {"max.message.bytes": str(64 << 20)})], timeout_s=600)
    try:
        return producer_performance(classpath, bootstrap, topic, records, size), consumer_performance(
            classpath, bootstrap, topic, records
        )
    finally:
        admin = AdminClient(config)  # held until the deletion is answered: a freed client drops its requests
        admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)  # not a job topic kind


def cpu_per_step(run: dict) -> tuple[float, float] | None:
    """The constructor's CPU seconds per step between its first commit and its last: (process, main thread)."""
    if run.get("steady_cpu") is None:
        return None
    steps = run["steps"] - 1
    return run["steady_cpu"] / steps, run["steady_main_cpu"] / steps


def describe_row(row: dict) -> str:
    def cpu(value: tuple[float, float] | None) -> str:
        return f"{value[0]:.3f} CPU-s/step ({value[1]:.3f} main thread)" if value else "CPU-s/step not measured"

    text = (
        f"constructor {row['mbs'] / 1e6:.1f} MB/s ({row['tokens_s'] / 1e6:.2f}M tokens/s, {row['cores']:.2f} cores, "
        f"{cpu(row['cpu_step'])})"
    )
    if row["base"] is not None:
        text += f", baseline tree {row['base'] / 1e6:.1f} MB/s ({cpu(row['base_cpu_step'])})"
    text += f", raw {row['raw'] / 1e6:.1f} MB/s (constructor / raw {row['mbs'] / row['raw']:.2f})"
    if row["pp"] is not None:
        text += f", ProducerPerformance {row['pp'] / 1e6:.1f} MB/s, ConsumerPerformance {row['cp'] / 1e6:.1f} MB/s"
    return text


def summarize(shape_rows: list[list[dict]], markdown: bool) -> None:
    with_base = shape_rows[0][0]["base"] is not None
    with_tools = shape_rows[0][0]["pp"] is not None
    table = [summary_row(rows, with_base, with_tools) for rows in shape_rows]
    headers = ["R x M x C", "tokens/step", "rank batch KB", "steps", "constructor MB/s"]
    headers += ["baseline tree MB/s"] if with_base else []
    headers += ["Mtokens/s", "cores", "CPU-s/step (main)"]
    headers += ["baseline CPU-s/step (main)"] if with_base else []
    headers += ["raw MB/s", "raw cores", "/ raw"]
    headers += ["/ PP", "raw / PP", "ProducerPerf MB/s", "ConsumerPerf MB/s"] if with_tools else []
    repeats = len(shape_rows[0])
    print_table(headers, table, title=f"medians [min-max] of {repeats} repeats; MB = 10^6 bytes", markdown=markdown)


def summary_row(rows: list[dict], with_base: bool, with_tools: bool) -> list[str]:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    def spread(values: list[float], fmt: str) -> str:
        values = sorted(values)
        return f"{statistics.median(values):{fmt}} [{values[0]:{fmt}}-{values[-1]:{fmt}}]"

    def cpu(key: str) -> str:
        return f"{statistics.median(r[key][0] for r in rows):.3f} ({statistics.median(r[key][1] for r in rows):.3f})"

    row = [
        label(rows[0]["shape"]),
        f"{med('step_tokens') / 1e6:.2f}M",
        f"{med('size') / 1e3:,.0f}",
        str(rows[0]["steps"]),
    ]
    row += [spread([r["mbs"] / 1e6 for r in rows], ".1f")]
    row += [spread([r["base"] / 1e6 for r in rows], ".1f")] if with_base else []
    row += [f"{med('tokens_s') / 1e6:.2f}", f"{med('cores'):.2f}", cpu("cpu_step")]
    row += [cpu("base_cpu_step")] if with_base else []
    row += [spread([r["raw"] / 1e6 for r in rows], ".1f"), f"{med('raw_cores'):.2f}"]
    row += [spread([r["mbs"] / r["raw"] for r in rows], ".2f")]
    if with_tools:
        row += [
            spread([r["mbs"] / r["pp"] for r in rows], ".2f"),
            f"{statistics.median(r['raw'] / r['pp'] for r in rows):.2f}",
        ]
        row += [spread([r["pp"] / 1e6 for r in rows], ".1f"), spread([r["cp"] / 1e6 for r in rows], ".1f")]
    return row


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        spec, out, steps, bootstrap, *profile = sys.argv[2:]
        child_constructor(Path(spec), out, int(steps), bootstrap, Path(profile[0]) if profile else None)
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="RANKSxMICRO_BATCHESxTOKENS, comma-separated")
    parser.add_argument("--tokens", type=int, default=40_000_000, help="tokens of data to write (a new data job)")
    parser.add_argument("--steps", type=int, default=8, help="at most this many steps per constructor run")
    parser.add_argument("--composition", action="store_true", help="step composition on (needs 8 steps of data ahead)")
    parser.add_argument(
        "--steps-per-transaction", type=int, help="the constructor's steps per transaction (default: the spec's)"
    )
    parser.add_argument("--data-job", help="reuse this data job (written by an earlier run with --keep-data)")
    parser.add_argument("--keep-data", action="store_true", help="keep the data job for a later --data-job")
    parser.add_argument("--profile", type=parse_shape, help="only profile one constructor run at this shape (cProfile)")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also run the constructor with this copy of mixflow's code (e.g. `git archive HEAD | tar -x -C DIR`)",
    )
    add_kafka_config_flag(parser)
    parser.add_argument(
        "--no-kafka-tools", action="store_true", help="leave out ProducerPerformance and ConsumerPerformance"
    )
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    add_markdown_flag(parser)
    args = parser.parse_args()
    args.kafka_config = dict(args.kafka_config)
    logging.basicConfig(level=logging.WARNING)
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    config = {"bootstrap.servers": args.bootstrap_servers}
    folder = Path(tempfile.mkdtemp(prefix="tbench-"))
    with data_job(config, args, "tbench") as fresh:
        max_length = min(s.tokens_per_micro_batch for s in shapes)
        data = None if fresh else data_tokens(config, args.data_job, max_length)
        if data is None:
            print(f"writing {args.tokens:,} tokens of samples to job {args.data_job} ...", flush=True)
            counts = write_data(config, args.data_job, args.tokens, max_length)
            describe_data(config, args.data_job, counts, max_length)
            data = sum(counts.values())
        if args.profile is not None:
            spec = write_spec(folder, args.data_job, args.profile, args.composition)
            out = f"{args.data_job}-profile-{uuid.uuid4().hex[:6]}"
            ensure_job_topics(config, out, list(SOURCES), args.profile.ranks, timeout_s=600)
            try:
                steps = min(args.steps, steps_for(args.profile, data, args.composition))
                print(constructor_run(spec, out, steps, args.bootstrap_servers, folder / "constructor.prof"))
            finally:
                delete_job_topics(config, out)
            print(f"cProfile output: {folder / 'constructor.prof'}")
            return 0
        classpath = None if args.no_kafka_tools else tools_classpath()
        shape_rows = [run_shape(args, config, data, shape, classpath, folder) for shape in shapes]
        summarize(shape_rows, args.markdown)
    return 0


@contextmanager
def data_job(config: dict, args: argparse.Namespace, prefix: str) -> Iterator[bool]:
    """The run's data job: ``args.data_job``, or a new one named after ``prefix`` (set in ``args.data_job``),
    deleted at the end unless ``args.keep_data``. Yields whether it is new."""
    fresh = args.data_job is None
    args.data_job = args.data_job or f"{prefix}-{uuid.uuid4().hex[:6]}"
    try:
        yield fresh
    finally:
        if fresh and not args.keep_data:
            delete_job_topics(config, args.data_job)


def add_kafka_config_flag(parser: argparse.ArgumentParser) -> None:
    """``--kafka-config KEY=VALUE``, repeatable: a list of (key, value) pairs (``dict(args.kafka_config)``)."""

    def setting(item: str) -> tuple[str, str]:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise argparse.ArgumentTypeError(f"{item!r} is not KEY=VALUE")
        return key, value

    parser.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        type=setting,
        metavar="KEY=VALUE",
        help="a librdkafka setting for the constructor's and the raw arm's clients, e.g. compression.type=none",
    )


if __name__ == "__main__":
    sys.exit(main())
