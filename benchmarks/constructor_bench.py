"""Data constructor benchmark: throughput next to a raw consume-and-produce of the same bytes, token
shares against the schedule, rank imbalance against naive per-rank loading, and state record sizes.

    .venv/bin/python benchmarks/constructor_bench.py [--repeats 3] [--bootstrap-servers HOST:PORT]

Loads the example job's sources once (under a fresh job name), then, per repeat, runs the constructor
in this process into a fresh output job, and a raw pipeline with the same confluent-kafka client that
consumes the same source records (read_committed) and produces their bytes unchanged, one transaction
per step-sized chunk. Both read from the same topics on the same broker in the same run.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from confluent_kafka import TopicPartition

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _table import add_markdown_flag, print_table  # noqa: E402

from pipeline.constructor import ConstructorOptions, DataConstructor  # noqa: E402
from pipeline.kafka_clients import (  # noqa: E402
    commit_or_abort,
    produce,
    read_committed_consumer,
    transactional_producer,
)
from pipeline.local_job import job_spec_file  # noqa: E402
from pipeline.mixing import Schedule  # noqa: E402
from pipeline.report import job_report, read_steps  # noqa: E402
from pipeline.spec import JobSpec  # noqa: E402
from topics.admin import TopicSpec, delete_job_topics, ensure_topics  # noqa: E402
from topics.names import JobTopics  # noqa: E402


def load_sources(spec_path: Path, bootstrap: str, folder: Path) -> None:
    spec, _ = job_spec_file(spec_path, None, folder)
    processes = []
    for source in spec.sources:
        for i in range(source.loaders):
            command = [
                sys.executable,
                "-m",
                "pipeline.cli",
                "load",
                "--spec",
                str(spec_path),
                "--source",
                source.name,
                "--instance",
                str(i),
                "--until-drained",
                "--bootstrap-servers",
                bootstrap,
            ]
            log = (folder / f"load-{source.name}-{i}.log").open("wb")
            processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, cwd=REPO))
    for process in processes:
        if process.wait(timeout=900) != 0:
            raise SystemExit(f"a loader failed; see {folder}")


def run_constructor(spec: JobSpec, config: dict, output_job: str) -> tuple[float, DataConstructor]:
    constructor = DataConstructor(spec, config, ConstructorOptions(output_job=output_job))
    began = time.perf_counter()
    constructor.run()
    return time.perf_counter() - began, constructor


def run_raw(spec: JobSpec, config: dict, steps: int) -> tuple[float, int]:
    """Consume every source record and produce its bytes unchanged, one transaction per step-sized chunk."""
    sources = JobTopics(spec.job)
    out_topic = f"{spec.job}.rawbench.{uuid.uuid4().hex[:8]}"
    ensure_topics(config, [TopicSpec(out_topic, 1, {"max.message.bytes": str(64 << 20)})])
    consumer = read_committed_consumer(config, f"{out_topic}.group", **{"enable.partition.eof": True})
    producer = transactional_producer(config, f"{out_topic}.producer")
    ends = {}
    for s in spec.source_names:
        ends[s] = consumer.get_watermark_offsets(TopicPartition(sources.src(s), 0), timeout=10)[1]
    consumer.assign([TopicPartition(sources.src(s), 0, 0) for s in spec.source_names])
    total_bytes = 0
    began = time.perf_counter()
    eof: set[str] = set()
    records = []
    while len(eof) < len(spec.source_names):
        for message in consumer.consume(5000, timeout=0.5):
            if message.error():
                eof.add(message.topic())
                continue
            records.append(message)
    records_per_step = max(1, len(records) // max(steps, 1))
    for i in range(0, len(records), records_per_step):
        chunk = records[i : i + records_per_step]
        producer.begin_transaction()
        for message in chunk:
            produce(producer, out_topic, message.value(), headers=message.headers())
            total_bytes += len(message.value())
        offsets = [TopicPartition(m.topic(), 0, m.offset() + 1) for m in chunk[-1:]]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
        commit_or_abort(producer)
    seconds = time.perf_counter() - began
    consumer.close()
    return seconds, total_bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--spec", type=Path, default=REPO / "examples" / "example.yaml")
    add_markdown_flag(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "build_example_data.py")], check=True, stdout=subprocess.DEVNULL
    )

    job = f"cbench-{uuid.uuid4().hex[:6]}"
    folder = Path(tempfile.mkdtemp(prefix="cbench-"))
    spec, spec_path = job_spec_file(args.spec, job, folder)
    config = spec.kafka.client_config(args.bootstrap_servers)
    print(f"loading the example sources into job {job} ...", flush=True)
    load_sources(spec_path, args.bootstrap_servers, folder)

    rows = []
    outputs = []
    try:
        for repeat in range(args.repeats):
            output_job = f"{job}-out{repeat}"
            outputs.append(output_job)
            seconds, constructor = run_constructor(spec, config, output_job)
            stats = constructor.stats
            raw_seconds, raw_bytes = run_raw(spec, config, len(stats.steps))
            rows.append((seconds, stats, raw_seconds, raw_bytes))
            print(f"repeat {repeat}: constructor {seconds:.2f} s, raw {raw_seconds:.2f} s", flush=True)
        report_table(spec, config, rows, outputs[-1], args.markdown)
    finally:
        for name in [job, *outputs]:
            delete_job_topics(config, name)
    return 0


def report_table(spec: JobSpec, config: dict, rows: list, output_job: str, markdown: bool = False) -> None:
    seconds = statistics.median(r[0] for r in rows)
    raw_seconds = statistics.median(r[2] for r in rows)
    stats = rows[-1][1]
    tokens = stats.tokens
    steps = len(stats.steps)
    sizes = np.array([s.state_bytes for s in stats.steps])
    report = job_report(config, spec, output_job)
    batches = read_steps(config, output_job, spec.step.ranks)
    sources = spec.source_names
    per_step = np.zeros((len(batches), len(sources)))
    for k, step_batches in enumerate(batches):
        for b in step_batches:
            for s, n in zip(b.sources, b.lengths.tolist(), strict=True):
                per_step[k, sources.index(s)] += n
    full = report.steps_with_all_sources
    weights = Schedule.from_spec(spec.mixture, sources).weights_array(np.arange(full))
    share = per_step[:full] / per_step[:full].sum(axis=1, keepdims=True)
    step_error = np.abs(share - weights)  # (full, S)
    table = [
        [
            f"throughput, tokens/s (median of {len(rows)})",
            f"{tokens / seconds:,.0f}",
            f"{tokens / raw_seconds:,.0f} (raw consume+produce, same bytes)",
            f"{raw_seconds / seconds:.2f}",
        ],
        ["steps/s", f"{steps / seconds:.1f}", f"{steps / raw_seconds:.1f}", ""],
        [
            "largest rank cost / mean, median over steps",
            f"{np.median(report.imbalance):.3f}",
            f"{np.median(report.naive_imbalance):.3f} (naive per-rank loading)",
            f"{np.median(report.naive_imbalance / report.imbalance):.2f}x step-time speedup",
        ],
        ["same, worst step", f"{report.imbalance.max():.3f}", f"{report.naive_imbalance.max():.3f}", ""],
        ["state record bytes per step (median / max)", f"{np.median(sizes):.0f} / {sizes.max()}", "", ""],
        [
            "steps, tokens, fill of capacity",
            f"{steps}, {tokens:,}, {tokens / (steps * spec.step.tokens_per_step):.1%}",
            "",
            "",
        ],
    ]
    for i, s in enumerate(sources):
        table.append(
            [
                f"share of {s}: per-step error median / max, cumulative drift (tokens) over {full} steps",
                f"{np.median(step_error[:, i]):.3f} / {step_error[:, i].max():.3f}, {report.share_error[i]:.0f}",
                "",
                "",
            ]
        )
    print()
    print_table(["metric", "value", "baseline", "ratio"], table, markdown=markdown)


if __name__ == "__main__":
    sys.exit(main())
