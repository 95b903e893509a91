"""Constructor lanes benchmark: the constructor's throughput with C = 1, 2, 4 lanes on the same data.

    .venv/bin/python -m benchmarks.lanes_bench [--lanes 1,2,4] [--repeats 3] [--ranks R]
        [--micro-batches M] [--tokens-per-micro-batch T] [--spec SPEC] [--bootstrap-servers HOST:PORT]

For each lane count C the example job's sources are loaded once, under a job of their own whose source
topics have C partitions (the same files, the same work units; each unit's samples in one partition).
Then, per repeat, C ``mixflow construct --lane j --output-job NAME`` processes run side by side into a
fresh output job, as ``mixflow run`` starts them. C = 1 is the baseline: a single constructor.

Reported per C (medians over the repeats): tokens per second over the wall time of the whole run (process
start, imports and the scheduler's warm-up included), tokens per second over the lanes' own run time
(the longest lane's ``seconds``: from the lease to the end-of-data record), the speedup of the latter over
C = 1, and the CPU cores the lane processes used (their user + system time over the wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks._table import add_markdown_flag, print_table
from benchmarks.constructor_bench import load_sources
from pipeline.spec import load_spec
from topics.kafka.admin import delete_job_topics

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class LaneRun:
    lanes: int
    wall_s: float
    lane_s: float  # the longest lane's own run time
    cpu_s: float  # user + system time of the lane processes
    tokens: int
    steps: int


def lanes_spec(base: Path, job: str, lanes: int, step: dict[str, int], folder: Path) -> Path:
    """``base`` (paths made absolute) as job ``job`` of ``lanes`` lanes, with ``step`` overriding its shape."""
    body = load_spec(base).model_dump(mode="json", exclude_none=True)
    body["job"] = job
    body["constructor"] = {"lanes": lanes}
    body["step"] = {**body["step"], **step}
    for source in body["sources"]:
        source["max_sample_length"] = min(source["max_sample_length"], body["step"]["tokens_per_micro_batch"])
    path = folder / f"{job}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def run_lanes(spec: Path, lanes: int, output_job: str, bootstrap: str, folder: Path) -> LaneRun:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    processes = []
    for lane in range(lanes):
        command = [sys.executable, "-m", "pipeline.cli", "construct", "--spec", str(spec), "--lane", str(lane)]
        command += ["--output-job", output_job, "--bootstrap-servers", bootstrap]
        log = (folder / f"{output_job}-lane{lane}.log").open("wb")
        processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, cwd=REPO))
    summaries = []
    for lane, process in enumerate(processes):
        out, _ = process.communicate(timeout=1800)
        if process.returncode != 0:
            raise SystemExit(f"lane {lane} of {output_job} failed; see {folder}")
        summaries.append(json.loads(out.decode().strip().splitlines()[-1]))
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return LaneRun(
        lanes=lanes,
        wall_s=wall,
        lane_s=max(s["seconds"] for s in summaries),
        cpu_s=cpu,
        tokens=sum(s["tokens"] for s in summaries),
        steps=sum(s["steps"] for s in summaries),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", default="1,2,4", help="lane counts to measure; the first is the baseline")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, help="override the spec's step.ranks")
    parser.add_argument("--micro-batches", type=int, help="override the spec's step.micro_batches")
    parser.add_argument("--tokens-per-micro-batch", type=int, help="override the spec's step.tokens_per_micro_batch")
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--spec", type=Path, default=REPO / "examples" / "example.yaml")
    add_markdown_flag(parser)
    args = parser.parse_args()
    counts = [int(c) for c in args.lanes.split(",")]
    step = {
        k: v
        for k, v in (
            ("ranks", args.ranks),
            ("micro_batches", args.micro_batches),
            ("tokens_per_micro_batch", args.tokens_per_micro_batch),
        )
        if v is not None
    }
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "build_example_data.py")], check=True, stdout=subprocess.DEVNULL
    )
    folder = Path(tempfile.mkdtemp(prefix="lbench-"))
    tag = uuid.uuid4().hex[:6]
    specs = {c: lanes_spec(args.spec, f"lbench-{tag}-c{c}", c, step, folder) for c in counts}
    config = load_spec(specs[counts[0]]).kafka.client_config(args.bootstrap_servers)
    jobs = [f"lbench-{tag}-c{c}" for c in counts]
    runs: dict[int, list[LaneRun]] = {c: [] for c in counts}
    try:
        for c in counts:
            print(f"loading the example sources into {c} partitions (job lbench-{tag}-c{c}) ...", flush=True)
            load_sources(specs[c], args.bootstrap_servers, folder)
        for repeat in range(args.repeats):
            for c in counts:  # interleaved, so that a change in the machine's load touches every C alike
                output = f"lbench-{tag}-c{c}-out{repeat}"
                jobs.append(output)
                run = run_lanes(specs[c], c, output, args.bootstrap_servers, folder)
                runs[c].append(run)
                print(
                    f"repeat {repeat}, {c} lanes: {run.tokens:,} tokens in {run.steps} steps, wall {run.wall_s:.2f} s, "
                    f"longest lane {run.lane_s:.2f} s, {run.cpu_s:.1f} CPU s",
                    flush=True,
                )
        report(runs, counts[0], args.markdown)
    finally:
        for job in jobs:
            delete_job_topics(config, job)
    return 0


def report(runs: dict[int, list[LaneRun]], baseline: int, markdown: bool) -> None:
    def rate(c: int, seconds: str) -> float:
        return statistics.median(r.tokens / getattr(r, seconds) for r in runs[c])

    rows = []
    for c in runs:
        tokens = runs[c][-1].tokens
        rows.append(
            [
                str(c),
                f"{tokens:,} / {runs[c][-1].steps}",
                f"{rate(c, 'lane_s'):,.0f}",
                f"{rate(c, 'lane_s') / rate(baseline, 'lane_s'):.2f}",
                f"{rate(c, 'wall_s'):,.0f}",
                f"{rate(c, 'wall_s') / rate(baseline, 'wall_s'):.2f}",
                f"{statistics.median(r.cpu_s / r.wall_s for r in runs[c]):.2f}",
            ]
        )
    print()
    n = len(next(iter(runs.values())))
    print_table(
        [
            "lanes",
            "tokens / steps",
            f"tokens/s, lanes' run time (median of {n})",
            f"vs {baseline} lane",
            "tokens/s, wall incl. start",
            f"vs {baseline} lane",
            "CPU cores used",
        ],
        rows,
        markdown=markdown,
    )


if __name__ == "__main__":
    sys.exit(main())
