"""Memory over time: a constructor and its loaders streaming 100,000+ steps, their RSS sampled as they go.

    PYTHONPATH=. .venv/bin/python benchmarks/memory_soak_bench.py [--steps 100000] [--baseline-rev REV]
        [--bootstrap-servers HOST:PORT] [--markdown]

A ``next_epoch`` job over two small pre-tokenized Parquet sources (``--samples`` rows each, lengths
lognormal around 48 tokens), so it never runs out: each source's loaders plan another pass when the
constructor asks. Small steps (2 ranks x 1 micro-batch x 256 tokens, 64 steps a transaction, default
composition) so that 100,000 steps take minutes. ``mixflow construct --max-steps N`` and one
``mixflow load`` per source run as processes; every ``--sample-s`` seconds their VmRSS is read from
``/proc/<pid>/status`` and the constructor's last step from its metrics endpoint.

With ``--baseline-rev`` the same job runs first on ``git archive REV`` (the package as of that commit,
unpacked into a temporary folder), then on this working tree, each on topics of its own. Each tree first
runs ``--warm-cache-steps`` of a job of its own, unmeasured, so that both measured runs load their numba
kernels from the cache (a tree compiling them in the measured process holds about 150 MB more). Reported: RSS of
each process at every tenth of the run, and the slope after ``--warm-up-steps`` (least squares over the
samples, MB per 10,000 steps), side by side.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from topics.kafka.admin import delete_job_topics

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "topics", "connectors", "trainer_sink")
SOURCES = ("a", "b")
CAPACITY = 256


@dataclass
class Sample:
    seconds: float
    step: int
    rss_mb: dict[str, float]  # per process name


@dataclass
class Run:
    label: str
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    summary: str = ""


def write_source(folder: Path, source: str, rows: int, seed: int) -> Path:
    """One Parquet file of ``rows`` token lists (lognormal lengths around 48, 8 to ``CAPACITY``)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(48), 0.6, rows)), 8, CAPACITY).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(1, 50_000, int(lengths.sum()), dtype=np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    path = folder / source
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"tokens": tokens}), path / "part-0.parquet", row_group_size=max(1, rows // 8))
    return path


def write_spec(folder: Path, job: str, data: Path, bootstrap: str) -> Path:
    spec = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "sources": [
            {"name": s, "reader": "parquet", "path": str(data / s), "pretokenized": True, "field": "tokens"}
            for s in SOURCES
        ],
        "mixture": {"weights": {"a": 0.6, "b": 0.4}},
        "step": {"ranks": 2, "micro_batches": 1, "tokens_per_micro_batch": CAPACITY},
        "cost": {"hidden_size": 1024, "num_layers": 16},
        "constructor": {"steps_per_transaction": 64},
        "composition": None,  # in-order draws: the cheapest step, so 100k steps take minutes
        "on_exhausted": "next_epoch",
        "seed": 7,
    }
    path = folder / f"{job}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` in MB (0 once it has exited)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) / 1024 if match else 0.0


def last_step(port: int) -> int | None:
    """``mixflow_constructor_last_step`` from the constructor's metrics endpoint (None: not answering)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    match = re.search(r"^mixflow_constructor_last_step\{[^}]*\} (\S+)$", text, re.MULTILINE)
    return int(float(match.group(1))) if match else None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(label: str, tree: Path, spec: Path, steps: int, folder: Path, sample_s: float, timeout_s: float) -> Run:
    """Loaders and the constructor of ``spec`` with the package of ``tree``; RSS sampled until
    ``steps`` are written."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    port = free_port()
    slug = re.sub(r"\W+", "-", label)

    def start(name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (folder / f"{slug}-{name}.log").open("wb")
        command = [sys.executable, "-m", "pipeline.cli", *args, "--spec", str(spec)]
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=tree, env=env)

    loaders = {f"loader {s}": start(f"load-{s}", "load", "--source", s) for s in SOURCES}
    constructor = start("construct", "construct", "--max-steps", str(steps), "--metrics-port", str(port))
    processes = {"constructor": constructor, **loaders}
    run = Run(label)
    began = time.monotonic()
    step = -1
    try:
        while constructor.poll() is None:
            if time.monotonic() - began > timeout_s:
                msg = f"{label}: {step + 1} of {steps} steps after {timeout_s:.0f} s; see {folder}"
                raise SystemExit(msg)
            for name, process in loaders.items():
                if process.poll() is not None:
                    msg = f"{label}: {name} exited with {process.returncode}; see {folder}"
                    raise SystemExit(msg)
            if (seen := last_step(port)) is not None:
                step = seen
                rss = {name: rss_mb(p.pid) for name, p in processes.items()}
                run.samples.append(Sample(time.monotonic() - began, step, rss))
                print(
                    f"{label}: step {step:,} at {run.samples[-1].seconds:.0f} s, "
                    + ", ".join(f"{n} {v:.1f} MB" for n, v in rss.items()),
                    flush=True,
                )
            time.sleep(sample_s)  # sampling interval: nothing to wait on
        run.seconds = time.monotonic() - began
        if constructor.returncode != 0:
            msg = f"{label}: the constructor exited with {constructor.returncode}; see {folder}"
            raise SystemExit(msg)
        run.summary = (folder / f"{slug}-construct.log").read_text().strip().splitlines()[-1]
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    return run


def slope_mb_per_10k(run: Run, name: str, warm_up: int) -> float:
    points = [(s.step, s.rss_mb[name]) for s in run.samples if s.step >= warm_up and s.rss_mb[name] > 0]
    if len(points) < 2:
        return float("nan")
    x, y = np.array(points, dtype=np.float64).T
    return float(np.polyfit(x, y, 1)[0] * 10_000)


def at_step(run: Run, step: int) -> Sample | None:
    """The first sample at or after ``step`` (the last one if none)."""
    return next((s for s in run.samples if s.step >= step), run.samples[-1] if run.samples else None)


def report(runs: list[Run], steps: int, warm_up: int, markdown: bool) -> None:
    names = ["constructor", *(f"loader {s}" for s in SOURCES)]
    header = ["step", *(f"{name} MB ({run.label})" for name in names for run in runs)]
    rows = []
    for k in range(11):
        target = steps * k // 10 if k else 0
        cells = [f"{target:,}"]
        for name in names:
            for run in runs:
                sample = at_step(run, target)
                cells.append(f"{sample.rss_mb[name]:.1f}" if sample is not None else "-")
        rows.append(cells)
    rows.append(
        [
            f"slope after {warm_up:,}, MB / 10k steps",
            *(f"{slope_mb_per_10k(run, n, warm_up):+.2f}" for n in names for run in runs),
        ]
    )
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))
    for run in runs:
        print(f"{run.label}: {run.seconds:.0f} s, {len(run.samples)} samples; constructor summary {run.summary}")


def archive(rev: str, into: Path) -> Path:
    """The package as of ``rev``, unpacked into ``into`` (no git worktree: nothing is added to the repo)."""
    into.mkdir(parents=True, exist_ok=True)
    listing = subprocess.run(["git", "archive", rev, *PACKAGES], cwd=REPO, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=listing.stdout, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=50_000, help="rows of each source (one epoch)")
    parser.add_argument("--baseline-rev", help="also run the package as of this git revision, first")
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--warm-up-steps", type=int, help="steps left out of the slope (default: a tenth)")
    parser.add_argument("--timeout-s", type=float, default=4 * 3600.0, help="give up on a run after this long")
    parser.add_argument(
        "--warm-cache-steps",
        type=int,
        default=200,
        help="steps of a job run first with each tree, unmeasured (0: none)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the topics and the folder")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    warm_up = args.warm_up_steps if args.warm_up_steps is not None else args.steps // 10
    folder = Path(tempfile.mkdtemp(prefix="memory-soak-"))
    data = folder / "data"
    for k, source in enumerate(SOURCES):
        write_source(data, source, args.samples, seed=k)
    trees = [("working tree", REPO)]
    if args.baseline_rev:
        trees.insert(0, (f"baseline {args.baseline_rev}", archive(args.baseline_rev, folder / "baseline")))
    print(f"folder {folder}; {args.steps:,} steps per run; trees: {', '.join(label for label, _ in trees)}", flush=True)
    runs = []
    for label, tree in trees:
        # A short job first, so that every tree's compiled kernels are cached (numba) before the measured run:
        # compiling in the measured process would add hundreds of MB that the other tree does not pay.
        for warm, steps in ((True, args.warm_cache_steps), (False, args.steps)):
            if warm and not steps:
                continue
            job = f"soak-{uuid.uuid4().hex[:8]}"
            spec = write_spec(folder, job, data, args.bootstrap_servers)
            try:
                run = run_job(
                    label + (" warm-up" if warm else ""), tree, spec, steps, folder, args.sample_s, args.timeout_s
                )
            finally:
                if not args.keep:
                    delete_job_topics(args.bootstrap_servers, job)
            if not warm:
                runs.append(run)
    report(runs, args.steps, warm_up, args.markdown)


if __name__ == "__main__":
    main()
