"""Data constructor benchmark on the example job: token shares against the schedule, rank imbalance
against naive per-rank loading, and state record sizes.

    .venv/bin/python -m benchmarks.constructor_bench [--repeats 3] [--bootstrap-servers HOST:PORT]

Loads the example job's sources once (under a fresh job name), then, per repeat, runs the constructor
in this process into a fresh output job. Its time is printed for reference; throughput at scale, against
Kafka's own tools and a raw pipeline of the same bytes, is ``benchmarks/throughput_bench.py``'s job.
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

from benchmarks._table import add_markdown_flag, print_table
from pipeline.planning.mixing import Schedule
from pipeline.roles.constructor import ConstructorOptions, DataConstructor
from pipeline.spec import JobSpec
from pipeline.tools.observe.rank_topics import job_report, read_steps
from pipeline.tools.run.job import job_spec_file
from topics.kafka.admin import delete_job_topics

REPO = Path(__file__).resolve().parent.parent


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
    constructor = DataConstructor(spec, config, ConstructorOptions(output_job=output_job, recent_steps=None))
    began = time.perf_counter()
    constructor.run()
    return time.perf_counter() - began, constructor


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
            rows.append((seconds, constructor.stats))
            print(f"repeat {repeat}: constructor {seconds:.2f} s", flush=True)
        report_table(spec, config, rows, outputs[-1], args.markdown)
    finally:
        for name in [job, *outputs]:
            delete_job_topics(config, name)
    return 0


def report_table(spec: JobSpec, config: dict, rows: list, output_job: str, markdown: bool = False) -> None:
    seconds = statistics.median(r[0] for r in rows)
    stats = rows[-1][1]
    tokens = stats.tokens
    steps = stats.steps_written
    sizes = np.array([s.state_bytes for s in stats.recent])  # every step: recent_steps=None
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
            f"tokens/s, steps/s (median of {len(rows)}; throughput at scale: throughput_bench.py)",
            f"{tokens / seconds:,.0f}, {steps / seconds:.1f}",
            "",
            "",
        ],
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
