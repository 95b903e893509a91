"""What a `mixflow` process costs to start: wall seconds and memory of command-line helps and of a real
loader of a pre-tokenized Parquet source, here and at a baseline revision, side by side.

    python -m benchmarks.startup_bench --baseline 5811e23 --repeats 5

Each case runs ``python -m pipeline.cli ...`` in a fresh interpreter, once per tree per repeat, the two
trees alternating, after one untimed run of each help that writes the trees' bytecode caches; the tables
give medians. The baseline is ``git archive REV`` unpacked in a temporary
folder and run with the same interpreter (``PYTHONPATH`` set to it). The loader case publishes a source of
pre-tokenized documents (random token ids, written once per run) under a fresh job per run to the broker
at ``$KAFKA_BOOTSTRAP_SERVERS`` and runs ``mixflow load --until-drained`` on it; its job's topics are
deleted afterwards. Memory is the process's own VmHWM (peak RSS) and VmRSS, read from
``/proc/self/status`` as it exits.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._table import add_markdown_flag, print_table
from topics.kafka.admin import delete_job_topics

REPO = Path(__file__).resolve().parent.parent
HELP_CASES: dict[str, tuple[str, ...]] = {
    "mixflow --help": ("--help",),
    "load --help": ("load", "--help"),
    "construct --help": ("construct", "--help"),
    "top --help": ("top", "--help"),
}
LOADER_CASE = "load (pre-tokenized, until drained)"
SOURCE = "tokens"


# The child runs `mixflow` as `python -m pipeline.cli` would, and at exit writes its own VmHWM and VmRSS:
# the ``ru_maxrss`` a parent gets from ``wait4`` counts the parent's memory before the exec as well.
_CHILD = """
import atexit, os, runpy, sys
def _memory():
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    with open(os.environ["STARTUP_BENCH_OUT"], "w") as out:
        out.write(status["VmHWM"].split()[0] + " " + status["VmRSS"].split()[0])
atexit.register(_memory)
sys.argv[0] = "mixflow"
runpy.run_module("pipeline.cli", run_name="__main__", alter_sys=True)
"""


@dataclass(frozen=True)
class Sample:
    wall_s: float
    peak_rss_mb: float  # VmHWM
    exit_rss_mb: float  # VmRSS at exit


def _run(tree: Path, args: Sequence[str], work: Path) -> Sample:
    out = work / "memory.txt"
    env = {**os.environ, "PYTHONPATH": str(tree), "STARTUP_BENCH_OUT": str(out)}
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - began
    if done.returncode != 0:
        msg = f"mixflow {' '.join(args)} in {tree} exited {done.returncode}:\n{done.stderr[-2000:]}"
        raise RuntimeError(msg)
    peak_kb, exit_kb = map(int, out.read_text().split())
    return Sample(wall, peak_kb / 1024, exit_kb / 1024)


def _write_source(folder: Path, files: int, documents: int, seed: int) -> None:
    """Parquet files of ``documents`` rows each: a list<int32> column of 64 to 2,048 token ids."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(files):
        lengths = rng.integers(64, 2048, documents)
        ids = [rng.integers(1, 50_000, n, dtype=np.int32) for n in lengths]
        table = pa.table({"ids": pa.array(ids, type=pa.list_(pa.int32()))})
        pq.write_table(table, folder / f"part-{i:03d}.parquet", row_group_size=max(documents // 4, 1))


def _write_spec(path: Path, job: str, data: Path, bootstrap: str) -> None:
    spec = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "sources": [
            {
                "name": SOURCE,
                "reader": "parquet",
                "path": str(data),
                "field": "ids",
                "pretokenized": True,
                "max_sample_length": 1024,
                "eod_token_id": 0,
            }
        ],
        "mixture": {"schedule": [{"step": 0, "weights": {SOURCE: 1.0}}]},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 1024},
        "cost": {"hidden_size": 1024, "num_layers": 16},
        "on_exhausted": "stop",
        "seed": 1,
    }
    path.write_text(json.dumps(spec))  # JSON is YAML


def _baseline_tree(revision: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", revision], cwd=REPO, capture_output=True, check=True).stdout
    tree = into / f"baseline-{revision}"
    tree.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def measure(
    trees: dict[str, Path], repeats: int, bootstrap: str | None, work: Path
) -> dict[tuple[str, str], list[Sample]]:
    samples: dict[tuple[str, str], list[Sample]] = {}
    data = work / "data"
    if bootstrap:
        _write_source(data, files=4, documents=2_000, seed=7)
    for tree in trees.values():  # untimed: writes each tree's bytecode caches, as an installed tree has them
        for args in HELP_CASES.values():
            _run(tree, args, work)
    for _ in range(repeats):
        for label, tree in trees.items():
            for case, args in HELP_CASES.items():
                samples.setdefault((case, label), []).append(_run(tree, args, work))
            if bootstrap:
                job = f"startup-{uuid.uuid4().hex[:8]}"
                spec = work / f"{job}.yaml"
                _write_spec(spec, job, data, bootstrap)
                args = ("load", "--spec", str(spec), "--source", SOURCE, "--until-drained")
                try:
                    samples.setdefault((LOADER_CASE, label), []).append(_run(tree, args, work))
                finally:
                    delete_job_topics({"bootstrap.servers": bootstrap}, job)
    return samples


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def report(samples: dict[tuple[str, str], list[Sample]], labels: Sequence[str], markdown: bool, title: str) -> None:
    current, baseline = labels
    rows = []
    for case in [*HELP_CASES, LOADER_CASE]:
        if (case, current) not in samples:
            continue
        now, then = samples[(case, current)], samples[(case, baseline)]
        row: list[object] = [case]
        for attr in ("wall_s", "peak_rss_mb", "exit_rss_mb"):
            a, b = _median([getattr(s, attr) for s in now]), _median([getattr(s, attr) for s in then])
            unit = "s" if attr == "wall_s" else "MB"
            fmt = "{:.2f} " + unit if attr == "wall_s" else "{:.0f} " + unit
            row += [fmt.format(b), fmt.format(a), f"{a / b:.2f}"]
        rows.append(row)
    headers = ["command"]
    for what in ("wall", "peak RSS (VmHWM)", "VmRSS at exit"):
        headers += [f"{what} {baseline}", f"{what} {current}", "ratio"]
    print_table(headers, rows, title=title, markdown=markdown)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="the git revision to compare with, e.g. main or 5811e23")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each case per tree (default: %(default)s)")
    parser.add_argument(
        "--no-loader", action="store_true", help="only the helps: no broker needed (default: also the loader)"
    )
    add_markdown_flag(parser)
    args = parser.parse_args(argv)
    bootstrap = None if args.no_loader else os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        work = Path(tmp)
        baseline = _baseline_tree(args.baseline, work)
        trees = {"this tree": REPO, args.baseline: baseline}
        samples = measure(trees, args.repeats, bootstrap, work)
    title = (
        f"startup: medians of {args.repeats} runs, {sys.executable} (Python {sys.version.split()[0]}), "
        f"{os.cpu_count()} CPUs; baseline {args.baseline}, ratio = this tree / baseline"
    )
    report(samples, ["this tree", args.baseline], args.markdown, title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
