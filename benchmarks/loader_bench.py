"""Source loader benchmark: loader throughput (tokens/s) next to tokenization alone on the same files.

    .venv/bin/python benchmarks/loader_bench.py [--quick] [--repeats 3] [--bootstrap-servers HOST:PORT]
        [--procs 1 2 4] [--unit-seconds 0.5] [--epochs 1] [--profile]

Baselines, in this process, for each source of examples/example.yaml (same plan, same seed):
- "tokenize": read every work unit of the source's plan with the reader and build its samples with the
  builder (``SourceRuntime``); only that is timed;
- "tok+encode": the same plus ``topics.sample_codec.encode_sample`` of every sample.

Loader runs: for each source and each N in --procs, a fresh job, N ``mixflow load --until-drained``
processes (instances 0..N-1) started together; wall time from the first start to the last exit (so
process start-up, topic checks, planning with its cost measurement and the consumer-group join are in
it), the tokens committed (sum of the processes' JSON summaries) and the loader's own ``seconds`` (time
inside ``run()`` after planning, slowest instance).

Ratios (loader tokens/s over a baseline tokens/s):
- plain: over the single-process tokenize rate, whatever N;
- fair: over min(N x tokenize rate, cores x tokenize rate per CPU-second). The tokenizer's batch
  encoding already runs on several threads, so one process may use more than one core; the ceiling for
  N processes is N single-process rates, but never more than the machine's cores can tokenize;
- per-CPU-s: tokens per CPU-second of the loaders (all N, start-up included) over tokens per CPU-second
  of the tokenize baseline: how much of the CPU the loader spends on tokenizing, independent of how
  many cores there are or of what else runs on them.

``--profile`` runs one loader per source in this process under cProfile and prints where its time goes.
The benchmark's topics are deleted at the end. Nothing is asserted: a benchmark prints numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from connectors import Document
from pipeline.loader import LoaderOptions, SourceLoader
from pipeline.source_runtime import TARGET_UNIT_SECONDS, SourceRuntime
from pipeline.spec import JobSpec, load_spec
from topics.admin import delete_job_topics, ensure_job_topics
from topics.names import JobTopics
from topics.sample_codec import encode_sample

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_SPEC = REPO / "examples" / "example.yaml"
EXAMPLE_DATA = REPO / "examples" / "data"
BUILD_SCRIPT = REPO / "examples" / "build_example_data.py"
DEFAULT_BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
QUICK_LIMIT = 60
LOADER_TIMEOUT_S = 600.0


# ----------------------------------------------------------------------------------------------- data + spec


def example_data(quick: bool, scratch: Path) -> Path:
    """examples/data (built when missing), or with ``quick`` a --limit'ed build in ``scratch``."""
    if quick:
        out = scratch / "data"
        command = [sys.executable, str(BUILD_SCRIPT), "--out", str(out), "--limit", str(QUICK_LIMIT)]
    elif not all((EXAMPLE_DATA / name).exists() for name in ("code", "docstrings", "topics", "tokenizer.json")):
        out = EXAMPLE_DATA
        command = [sys.executable, str(BUILD_SCRIPT)]
    else:
        return EXAMPLE_DATA
    print(f"building example data: {' '.join(command)}", flush=True)
    subprocess.run(command, check=True, cwd=REPO, capture_output=True, timeout=900)
    return out


def write_job_spec(folder: Path, job: str, bootstrap: str, data: Path, epochs: int) -> Path:
    """examples/example.yaml with its own job name, absolute paths into ``data`` and ``epochs`` per source."""
    spec = yaml.safe_load(EXAMPLE_SPEC.read_text())
    spec["job"] = job
    spec["kafka"] = {**spec.get("kafka", {}), "bootstrap_servers": bootstrap}
    spec["tokenizer"] = str(data / "tokenizer.json")
    for source in spec["sources"]:
        source["path"] = str(data / Path(source["path"]).name)
        source["epochs"] = epochs
    path = folder / f"{job}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def new_job(tag: str) -> str:
    return f"bench-loader-{tag}-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------------------------------- baselines


@dataclass
class Baseline:
    tokens: int
    samples: int
    units: int
    tokenize_s: float  # median wall seconds: read + build
    tokenize_cpu_s: float  # median CPU seconds of this process (all threads) for read + build
    encode_s: float  # median wall seconds: read + build + encode_sample
    encode_share: float  # median share of encode_sample in that pass

    @property
    def rate(self) -> float:
        return self.tokens / self.tokenize_s

    @property
    def rate_per_cpu_s(self) -> float:
        return self.tokens / self.tokenize_cpu_s

    @property
    def encode_rate(self) -> float:
        return self.tokens / self.encode_s


@dataclass
class BaselinePass:
    tokens: int
    samples: int
    units: int
    tokenize_s: float
    tokenize_cpu_s: float
    encode_s: float
    encode_share: float  # of the read+tokenize+encode pass, the part spent in encode_sample


def baseline_pass(spec: JobSpec, source: str, unit_seconds: float) -> BaselinePass:
    """One pass of each baseline over the source's plan, each with a fresh runtime (so a fresh tokenizer
    with an empty word cache, as in a new loader process)."""
    units = SourceRuntime.from_spec(spec, source).plan(spec.seed, unit_seconds)
    timings: dict[bool, tuple[float, float]] = {}
    tokens = samples = 0
    encoding = 0.0  # seconds inside encode_sample alone
    for with_encode in (False, True):
        runtime = SourceRuntime.from_spec(spec, source)
        tokens = samples = 0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for unit in units:
            documents = [d for d in runtime.reader.read(unit) if isinstance(d, Document)]
            built = runtime.builder.build(documents, epoch=unit.epoch)
            if with_encode:
                began = time.perf_counter()
                for sample in built.samples:
                    encode_sample(sample)
                encoding += time.perf_counter() - began
            tokens += sum(sample.length for sample in built.samples)
            samples += len(built.samples)
        timings[with_encode] = (time.perf_counter() - wall0, time.process_time() - cpu0)
    encode_s = timings[True][0]
    return BaselinePass(
        tokens, samples, len(units), timings[False][0], timings[False][1], encode_s, encoding / encode_s
    )


def median_baseline(passes: list[BaselinePass]) -> Baseline:
    def med(get: Callable[[BaselinePass], float]) -> float:
        return statistics.median(get(p) for p in passes)

    last = passes[-1]
    return Baseline(
        last.tokens,
        last.samples,
        last.units,
        med(lambda p: p.tokenize_s),
        med(lambda p: p.tokenize_cpu_s),
        med(lambda p: p.encode_s),
        med(lambda p: p.encode_share),
    )


# ---------------------------------------------------------------------------------------------- loader runs


@dataclass
class LoaderRun:
    wall_s: float
    tokens: int
    units: int
    aborted: int
    run_s: float  # slowest instance's `seconds` (inside run(), after planning)
    cpu_s: float  # user + system CPU seconds of all N processes
    busy_s: float  # the busiest instance's seconds inside transactions (read, tokenize, encode, produce, commit)


@dataclass
class Row:
    source: str
    procs: int
    runs: list[LoaderRun] = field(default_factory=list)

    def median(self, get: Callable[[LoaderRun], float]) -> float:
        return statistics.median(get(run) for run in self.runs)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_loaders(spec_path: Path, source: str, procs: int, bootstrap: str, unit_seconds: float, logs: Path) -> LoaderRun:
    command = [sys.executable, "-m", "pipeline.cli", "load", "--spec", str(spec_path), "--source", source,
               "--until-drained", "--bootstrap-servers", bootstrap, "--unit-seconds", str(unit_seconds)]  # fmt: skip
    outputs = [logs / f"{spec_path.stem}-{source}-{k}.out" for k in range(procs)]
    cpu0 = _children_cpu()
    began = time.perf_counter()
    processes = []
    for k, out in enumerate(outputs):
        with out.open("wb") as stdout, (logs / f"{out.stem}.log").open("wb") as stderr:
            processes.append(subprocess.Popen([*command, "--instance", str(k)], stdout=stdout, stderr=stderr, cwd=REPO))
    deadline = began + LOADER_TIMEOUT_S
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
                other.wait()
            msg = f"loaders of {source} (N={procs}) did not finish in {LOADER_TIMEOUT_S:.0f} s; see {logs}"
            raise RuntimeError(msg) from None
    wall = time.perf_counter() - began
    cpu = _children_cpu() - cpu0
    summaries = []
    for process, out in zip(processes, outputs, strict=True):
        lines = [line for line in out.read_text().splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            log_tail = (logs / f"{out.stem}.log").read_text(errors="replace")[-2000:]
            msg = f"loader {out.stem} exited {process.returncode}; its log ends with:\n{log_tail}"
            raise RuntimeError(msg)
        summaries.append(json.loads(lines[-1]))
    return LoaderRun(
        wall_s=wall,
        tokens=sum(s["tokens"] for s in summaries),
        units=sum(s["units"] for s in summaries),
        aborted=sum(s["aborted"] for s in summaries),
        run_s=max(s["seconds"] for s in summaries),
        cpu_s=cpu,
        busy_s=max(s["busy_seconds"] for s in summaries),
    )


# ------------------------------------------------------------------------------------------------- profiling


def _profile_entries(stats: pstats.Stats, name: str, file_suffix: str = "", caller: str = "") -> tuple[int, float]:
    """(calls, cumulative seconds) of functions named ``name`` (in files ending ``file_suffix``); with
    ``caller``, only the calls made from a function of that name."""
    calls, seconds = 0, 0.0
    for (file, _line, func), (_cc, nc, _tt, ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if func != name or not file.endswith(file_suffix):
            continue
        if not caller:
            calls, seconds = calls + nc, seconds + ct
            continue
        for (_cfile, _cline, cfunc), value in callers.items():
            if cfunc == caller:
                calls, seconds = calls + value[1], seconds + value[3]
    return calls, seconds


def _method(name: str, cls: str) -> str:
    return f"<method '{name}' of 'cimpl.{cls}' objects>"


PROFILE_PARTS: list[tuple[str, str, str, str]] = [
    # (label, function name, file suffix, caller)
    ("plan: ensure_plan (total)", "ensure_plan", "loader.py", ""),
    ("  plan: measure_cost_per_byte", "measure_cost_per_byte", "cost.py", ""),
    ("  plan: publish_work_plan", "publish_work_plan", "work_plan.py", ""),
    ("producer init (init_transactions)", _method("init_transactions", "Producer"), "", "transactional_producer"),
    ("consumer.poll (join, fetch, idle)", _method("poll", "Consumer"), "", "_loop"),
    ("plan_is_done (committed offsets)", "plan_is_done", "work_plan.py", "_loop"),
    ("unit: _process (total)", "_process", "loader.py", ""),
    ("  read (reader.read)", "_batches", "loader.py", "_publish"),
    ("  tokenize (builder.build)", "build", "samples.py", "_publish"),
    ("  encode_sample", "encode_sample", "sample_codec.py", "_publish"),
    ("  produce()", "produce", "kafka_clients.py", "_publish"),
    ("  begin_transaction", _method("begin_transaction", "Producer"), "", "_process"),
    ("  send_offsets_to_transaction", _method("send_offsets_to_transaction", "Producer"), "", "_process"),
    ("  commit_transaction", _method("commit_transaction", "Producer"), "", "commit_or_abort"),
    ("close consumer + flush", _method("close", "Consumer"), "", "run"),
]


def profile_loader(spec: JobSpec, source: str, bootstrap: str, unit_seconds: float) -> None:
    """One loader of ``source`` in this process under cProfile; prints where its time goes."""
    config = spec.kafka.client_config(bootstrap)
    ensure_job_topics(config, spec.job, spec.source_names, spec.step.ranks)
    runtime = SourceRuntime.from_spec(spec, source)
    loader = SourceLoader(config, JobTopics(spec.job), runtime, spec.seed,
                          LoaderOptions(until_drained=True, unit_seconds=unit_seconds))  # fmt: skip
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.enable()
    stats = loader.run()
    profiler.disable()
    total = time.perf_counter() - began
    ps = pstats.Stats(profiler)
    print(f"\nprofile: one loader of {source!r}: {stats.units} units, {stats.samples} samples, {stats.tokens} tokens; "
          f"{total:.2f} s from run() called to return (cProfile on; its overhead inflates per-call costs)")  # fmt: skip
    print(f"  {'part':<38} {'calls':>7} {'seconds':>8} {'share':>6} {'per call':>10}")
    for label, name, suffix, caller in PROFILE_PARTS:
        calls, seconds = _profile_entries(ps, name, suffix, caller)
        per_call = f"{seconds / calls * 1e3:8.3f}ms" if calls else "-"
        print(f"  {label:<38} {calls:>7} {seconds:>8.3f} {seconds / total:>6.1%} {per_call:>10}")


def startup_seconds(repeats: int) -> float:
    """Median wall seconds for a fresh interpreter to import the loader's modules (no Kafka)."""
    code = "import pipeline.cli, pipeline.load_cli, pipeline.loader"
    walls = []
    for _ in range(repeats):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
        walls.append(time.perf_counter() - began)
    return statistics.median(walls)


# ------------------------------------------------------------------------------------------------- reporting


def fair_rate(base: Baseline, procs: int, cores: int) -> float:
    return min(procs * base.rate, cores * base.rate_per_cpu_s)


def print_tables(baselines: dict[str, Baseline], rows: list[Row], cores: int) -> None:
    print("\nBaselines (in process, median):")
    head = (f"{'source':<11} {'units':>5} {'samples':>7} {'tokens':>9} {'tokenize tok/s':>15} {'cores used':>10} "
            f"{'tok/CPU-s':>10} {'tok+encode tok/s':>17} {'encode share':>12}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for source, b in baselines.items():
        share = b.encode_share
        print(f"{source:<11} {b.units:>5} {b.samples:>7} {b.tokens:>9} {b.rate:>15,.0f} "
              f"{b.tokenize_cpu_s / b.tokenize_s:>10.2f} {b.rate_per_cpu_s:>10,.0f} {b.encode_rate:>17,.0f} "
              f"{share:>12.1%}")  # fmt: skip
    print(f"\nLoader runs (median of {len(rows[0].runs) if rows else 0}; wall = start of the first process to exit "
          f"of the last; run() = slowest instance's own `seconds`):")  # fmt: skip
    head = (
        f"{'source':<11} {'N':>2} {'wall s':>7} {'run() s':>7} {'tokens':>9} {'tok/s wall':>11} "
        f"{'tok/s run()':>11} {'plain':>6} {'fair':>6} {'fair run()':>10} {'busy s':>6} {'fair busy':>9} "
        f"{'CPU s':>6} {'per-CPU-s':>9}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        b = baselines[row.source]
        wall, run_s = row.median(lambda r: r.wall_s), row.median(lambda r: r.run_s)
        tokens = int(row.median(lambda r: r.tokens))
        cpu = row.median(lambda r: r.cpu_s)
        busy = row.median(lambda r: r.busy_s)
        rate, run_rate, busy_rate = tokens / wall, tokens / run_s, tokens / busy
        fair = fair_rate(b, row.procs, cores)
        note = "" if tokens == b.tokens else f"  (baseline has {b.tokens} tokens)"
        aborted = sum(r.aborted for r in row.runs)
        note += f"  ({aborted} aborted units)" if aborted else ""
        print(f"{row.source:<11} {row.procs:>2} {wall:>7.2f} {run_s:>7.2f} {tokens:>9} {rate:>11,.0f} "
              f"{run_rate:>11,.0f} {rate / b.rate:>6.2f} {rate / fair:>6.2f} {run_rate / fair:>10.2f} "
              f"{busy:>6.2f} {busy_rate / fair:>9.2f} {cpu:>6.2f} "
              f"{(tokens / cpu) / b.rate_per_cpu_s:>9.2f}{note}")  # fmt: skip
    print(
        f"\nplain = tok/s wall / single-process tokenize tok/s.  fair = tok/s / min(N x tokenize tok/s, "
        f"{cores} cores x tokenize tok/CPU-s): one process's tokenizer already runs on several threads, so N "
        f"processes cannot beat what {cores} cores tokenize.  fair run() = the same with run()'s seconds "
        f"(no start-up, no planning).  fair busy = the same with the busiest instance's seconds inside "
        f"transactions (reading, tokenizing, encoding, producing, committing: no start-up, planning or group "
        f"join).  per-CPU-s = (tokens / loader CPU-s, all N processes, start-up "
        f"included) / baseline tok/CPU-s.  Target: >= 0.8."
    )


# ---------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", default=DEFAULT_BOOTSTRAP, help="default: %(default)s")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; medians (default: 3)")
    parser.add_argument("--quick", action="store_true", help=f"1 repeat, data built with --limit {QUICK_LIMIT}")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4], help="loader processes per source")
    parser.add_argument("--sources", nargs="+", default=None, help="default: every source of the example")
    parser.add_argument("--unit-seconds", type=float, default=TARGET_UNIT_SECONDS,
                        help="the loaders' --unit-seconds (work per unit); default: %(default)s")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=1, help="passes over each source's files (more data)")
    parser.add_argument("--profile", action="store_true", help="also profile one in-process loader per source")
    parser.add_argument("--no-runs", action="store_true", help="skip the loader-process runs (with --profile)")
    parser.add_argument("--keep-logs", type=Path, help="write the loaders' logs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    cores = len(os.sched_getaffinity(0))
    jobs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loader-bench-") as tmp:
        scratch = Path(tmp)
        logs = args.keep_logs or scratch
        logs.mkdir(parents=True, exist_ok=True)
        data = example_data(args.quick, scratch)
        base_spec = load_spec(write_job_spec(scratch, new_job("base"), args.bootstrap_servers, data, args.epochs))
        sources = args.sources or list(base_spec.source_names)
        print(f"machine: {cores} cores, load average {os.getloadavg()[0]:.2f}; broker {args.bootstrap_servers}; "
              f"data {data}; epochs {args.epochs}; --unit-seconds {args.unit_seconds}; repeats {repeats}")  # fmt: skip
        print(f"python start-up + imports of a loader process: {startup_seconds(repeats):.2f} s", flush=True)
        passes: dict[str, list[BaselinePass]] = {s: [] for s in sources}
        rows = {(s, n): Row(s, n) for s in sources for n in args.procs}
        loads = [os.getloadavg()[0]]
        try:
            # Repeat by repeat, each source's baseline right before its loader runs: both see the same
            # load from whatever else shares the machine.
            for repeat in range(repeats):
                for source in sources:
                    passes[source].append(baseline_pass(base_spec, source, args.unit_seconds))
                    print(f"  repeat {repeat + 1} {source} baseline: {passes[source][-1]}", flush=True)
                    for procs in [] if args.no_runs else args.procs:
                        job = new_job(f"{source}-n{procs}")
                        jobs.append(job)
                        spec_path = write_job_spec(scratch, job, args.bootstrap_servers, data, args.epochs)
                        run = run_loaders(spec_path, source, procs, args.bootstrap_servers, args.unit_seconds, logs)
                        rows[(source, procs)].runs.append(run)
                        print(f"  repeat {repeat + 1} {source} N={procs}: {run}", flush=True)
                    loads.append(os.getloadavg()[0])
            baselines = {s: median_baseline(p) for s, p in passes.items()}
            print(f"\n1-minute load average during the runs: min {min(loads):.2f}, max {max(loads):.2f}")
            print_tables(baselines, [row for row in rows.values() if row.runs], cores)
            if args.profile:
                for source in sources:
                    job = new_job(f"prof-{source}")
                    jobs.append(job)
                    spec = load_spec(write_job_spec(scratch, job, args.bootstrap_servers, data, args.epochs))
                    profile_loader(spec, source, args.bootstrap_servers, args.unit_seconds)
        finally:
            deleted = 0
            for job in jobs:
                with contextlib.suppress(Exception):  # a cleanup failure must not hide the results
                    deleted += len(delete_job_topics(args.bootstrap_servers, job, timeout_s=30))
            print(f"\ndeleted {deleted} topics of {len(jobs)} benchmark jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
