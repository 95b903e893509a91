"""Source loader benchmark: loader throughput (tokens/s) next to tokenization alone on the same files.

    .venv/bin/python -m benchmarks.loader_bench [--quick] [--repeats 3] [--bootstrap-servers HOST:PORT]
        [--procs 1 2 4] [--unit-seconds 0.5] [--epochs 1] [--profile] [--markdown]

Baselines, for each source of examples/example.yaml (same seed), each pass in a fresh process set up as a
loader instance 0 is (one ``SourceRuntime`` that plans the source, then does its units):
- "tokenize": read every work unit of the source's plan with the reader and build its samples with the
  builder, in the loader's batches of ``DOCUMENTS_PER_BATCH`` documents; only that is timed;
- "tok+encode": the same plus ``topics.formats.sample_codec.encode_sample`` of every sample.
The baseline does the loader's work under the loader's conditions: in one long-lived process every new
tokenizer is slower than the one before (memory growing pass after pass), while every loader is a fresh
process with one tokenizer.

Loader runs: for each source and each N in --procs, a fresh job, N ``mixflow load --until-drained``
processes (instances 0..N-1) started together; wall time from the first start to the last exit (so
process start-up, topic checks, planning with its cost measurement and the consumer-group join are in
it), the tokens committed (sum of the processes' JSON summaries), the loader's own ``seconds`` (time
inside ``run()`` after planning, slowest instance) and ``busy_seconds`` (time inside transactions, summed
over the N instances).

Every time (wall and CPU seconds, of the baselines and the loaders) is the fastest of the --repeats: other
work on a shared machine only ever slows a run down, and by whole-seconds bursts, so the fastest run is the
least disturbed one (a ratio of medians taken at different moments could read above 1).

Ratios (loader tokens/s over a baseline tokens/s):
- plain: over the single-process tokenize rate, whatever N;
- fair: over min(N x tokenize rate, cores x tokenize rate per CPU-second). The tokenizer's batch
  encoding already runs on several threads, so one process may use more than one core; the ceiling for
  N processes is N single-process rates, but never more than the machine's cores can tokenize;
- busy: tokens per second inside transactions, per loader (tokens / busy seconds summed over the N
  instances), over the single-process tokenize rate: what a loader's own work (read, tokenize, encode,
  produce, commit) costs next to tokenizing alone. At most 1 but for noise (a loader does that work and
  more); with N loaders sharing the cores it also holds their contention. (Tokens over the busiest
  instance's seconds would assume the N instances were busy at the same moments; they are not, so that
  ratio could read above 1.)
- per-CPU-s: tokens per CPU-second of the loaders (all N, start-up included) over tokens per CPU-second
  of the tokenize baseline: how much of the CPU the loader spends on tokenizing, independent of how
  many cores there are or of what else runs on them.

``--profile`` runs one loader per source in this process under cProfile and prints where its time goes.
Tables are rich tables on a terminal and Markdown otherwise (or with ``--markdown``).
The benchmark's topics are deleted at the end. Nothing is asserted: a benchmark prints numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import inspect
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

from benchmarks._table import add_markdown_flag, print_table
from pipeline.roles.loader.role import LoaderOptions, SourceLoader
from pipeline.roles.loader.source_runtime import TARGET_UNIT_SECONDS, SourceRuntime
from pipeline.roles.loader.unit_loading import DOCUMENTS_PER_BATCH, batches
from pipeline.spec import JobSpec, load_spec
from topics.formats.names import JobTopics
from topics.formats.sample_codec import encode_sample
from topics.kafka.admin import delete_job_topics, ensure_job_topics

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
    tokenize_s: float  # fastest wall seconds: read + build
    tokenize_cpu_s: float  # fewest CPU seconds of the baseline's process (all threads) for read + build
    encode_s: float  # fastest wall seconds: read + build + encode_sample
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


def timed_pass(spec_path: Path, source: str, unit_seconds: float, encode: bool) -> dict[str, float]:
    """One baseline pass, run in a fresh process (``--baseline-pass``) set up as loader instance 0 is: one
    runtime, which plans the source (measuring its cost on a sample of the data), then reads every unit and
    tokenizes it in the loader's batches of documents, with ``encode`` encoding every sample too. Only the
    reading, tokenizing (and encoding) is timed."""
    spec = load_spec(spec_path)
    runtime = SourceRuntime.from_spec(spec, source)
    units = runtime.plan(spec.seed, unit_seconds)
    tokens = samples = 0
    encoding = 0.0  # seconds inside encode_sample alone
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for unit in units:
        for documents, _ in batches(runtime.reader.read(unit), DOCUMENTS_PER_BATCH):
            if not documents:
                continue
            built = runtime.builder.build(documents, epoch=unit.epoch)
            if encode:
                began = time.perf_counter()
                for sample in built.samples:
                    encode_sample(sample)
                encoding += time.perf_counter() - began
            tokens += sum(sample.length for sample in built.samples)
            samples += len(built.samples)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "tokens": tokens,
        "samples": samples,
        "units": len(units),
        "wall_s": wall,
        "cpu_s": cpu,
        "encode_s": encoding,
    }


def baseline_pass(spec_path: Path, source: str, unit_seconds: float) -> BaselinePass:
    """One pass of each baseline over the source, each in a fresh process, as every loader is. (In one
    long-lived process each new tokenizer tokenizes slower than the one before, its memory growing pass
    after pass: a baseline measured in this process after a few passes was slower than the loaders.)"""

    def child(encode: bool) -> dict[str, float]:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--baseline-pass",
            str(spec_path),
            source,
            "--unit-seconds",
            str(unit_seconds),
            *(["--encode"] if encode else []),
        ]
        result = subprocess.run(
            command, capture_output=True, text=True, cwd=REPO, timeout=LOADER_TIMEOUT_S, check=False
        )
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        if result.returncode != 0 or not lines:
            msg = f"baseline pass of {source} exited {result.returncode}; its log ends with:\n{result.stderr[-2000:]}"
            raise RuntimeError(msg)
        return json.loads(lines[-1])

    plain, encoded = child(encode=False), child(encode=True)
    return BaselinePass(
        int(plain["tokens"]),
        int(plain["samples"]),
        int(plain["units"]),
        plain["wall_s"],
        plain["cpu_s"],
        encoded["wall_s"],
        encoded["encode_s"] / encoded["wall_s"],
    )


def fastest_baseline(passes: list[BaselinePass]) -> Baseline:
    last = passes[-1]
    return Baseline(
        last.tokens,
        last.samples,
        last.units,
        min(p.tokenize_s for p in passes),
        min(p.tokenize_cpu_s for p in passes),
        min(p.encode_s for p in passes),
        statistics.median(p.encode_share for p in passes),
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
    busy_s: float  # seconds inside transactions (read, tokenize, encode, produce, commit), summed over the N


@dataclass
class Row:
    source: str
    procs: int
    runs: list[LoaderRun] = field(default_factory=list)

    def fastest(self, get: Callable[[LoaderRun], float]) -> float:
        return min(get(run) for run in self.runs)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_loaders(spec_path: Path, source: str, procs: int, bootstrap: str, unit_seconds: float, logs: Path) -> LoaderRun:
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "load",
        "--spec",
        str(spec_path),
        "--source",
        source,
        "--until-drained",
        "--bootstrap-servers",
        bootstrap,
        "--unit-seconds",
        str(unit_seconds),
    ]
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
        busy_s=sum(s["busy_seconds"] for s in summaries),
    )


# ------------------------------------------------------------------------------------------------- profiling


# (label, function, caller): the function's calls, or with a caller only those made from it. Functions are
# named by where they are defined ("module.Class.method"; a C method as "confluent_kafka.Consumer.poll") and
# looked up before profiling, so a row naming a function that does not exist stops the profile with its
# name instead of printing zeros.
LOADER = "pipeline.roles.loader.role.SourceLoader"
PLANNING = "pipeline.roles.loader.work_planning.SourcePlanning"
GROUP = "pipeline.roles.loader.work_group.WorkGroup"
TRANSACTIONS = "pipeline.roles.loader.unit_transaction.UnitTransactions"
LOAD = "pipeline.roles.loader.unit_loading.UnitLoader.load"
PROFILE_PARTS: list[tuple[str, str, str]] = [
    ("plan: ensure_plan (total)", f"{PLANNING}.ensure_plan", ""),
    ("  plan: measure_cost_per_byte", "connectors.cost.measure_cost_per_byte", ""),
    ("  plan: publish_work_plan", "pipeline.kafka.work_plan.publish_work_plan", ""),
    ("producer: new_producer (init_transactions)", f"{LOADER}.new_producer", ""),
    ("consumer.poll in WorkGroup.poll (join, fetch, idle)", "confluent_kafka.Consumer.poll", f"{GROUP}.poll"),
    ("plan_is_complete (committed offsets)", "pipeline.kafka.work_plan.plan_is_complete", f"{PLANNING}.drained"),
    ("transactions: UnitTransactions.publish (total, = busy)", f"{TRANSACTIONS}.publish", ""),
    ("  begin_transaction", "confluent_kafka.Producer.begin_transaction", f"{LOADER}.open_transaction"),
    ("  units: UnitLoader.load (total)", LOAD, ""),
    ("    read (reader.read, batching)", "pipeline.roles.loader.unit_loading.batches", LOAD),
    ("    tokenize (SampleBuilder.build)", "connectors.samples.SampleBuilder.build", LOAD),
    ("    encode_sample", "topics.formats.sample_codec.encode_sample", LOAD),
    ("    produce()", "topics.kafka.clients.produce", LOAD),
    ("  next unit ready (_next_ready)", f"{TRANSACTIONS}._next_ready", ""),
    ("  send_offsets", "topics.kafka.clients.send_offsets", f"{LOADER}.open_transaction"),
    ("  commit_or_abort (commit)", "topics.kafka.clients.commit_or_abort", f"{LOADER}.transaction"),
    ("close: consumer.close, producer.flush", "pipeline.kafka.role_protocol.closing_unless_stuck", ""),
]


def _resolve(dotted: str) -> object:
    """The function or method ``dotted`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for name in parts[split:]:
            target = getattr(target, name)
        return target
    raise ModuleNotFoundError(dotted)


def _profile_key(dotted: str) -> tuple[str, int, str]:
    """cProfile's key of the function ``dotted`` names: (file, first line, name), or for a method of a C
    extension type ("~", 0, its repr)."""
    target = inspect.unwrap(_resolve(dotted))  # a @contextmanager's own function, not its wrapper
    code = getattr(target, "__code__", None)
    if code is None:
        return ("~", 0, repr(target))
    return (code.co_filename, code.co_firstlineno, code.co_name)


def profile_keys() -> list[tuple[str, tuple[str, int, str], tuple[str, int, str] | None]]:
    """PROFILE_PARTS with their functions looked up; names every row whose function does not exist."""
    keys, stale = [], []
    for label, name, caller in PROFILE_PARTS:
        try:
            keys.append((label, _profile_key(name), _profile_key(caller) if caller else None))
        except (AttributeError, ModuleNotFoundError) as exc:
            stale.append(f"{label.strip()!r} names {name}{f' called from {caller}' if caller else ''}: {exc}")
    if stale:
        raise SystemExit("PROFILE_PARTS names functions that do not exist; update them:\n  " + "\n  ".join(stale))
    return keys


def _calls_and_seconds(stats: pstats.Stats, key: tuple, caller: tuple | None) -> tuple[int, float]:
    """(calls, cumulative seconds) of the function ``key``; with ``caller``, only its calls from there."""
    entry = stats.stats.get(key)  # type: ignore[attr-defined]
    if entry is None:
        return 0, 0.0
    _cc, calls, _tt, cumulative, callers = entry
    if caller is None:
        return calls, cumulative
    from_caller = callers.get(caller)  # (calls, primitive calls, own seconds, cumulative seconds)
    return (from_caller[0], from_caller[3]) if from_caller else (0, 0.0)


def profile_loader(spec: JobSpec, source: str, bootstrap: str, unit_seconds: float, markdown: bool) -> None:
    """One loader of ``source`` in this process under cProfile; prints where its time goes."""
    keys = profile_keys()
    config = spec.kafka.client_config(bootstrap)
    ensure_job_topics(config, spec.job, spec.source_names, spec.step.ranks)
    runtime = SourceRuntime.from_spec(spec, source)
    loader = SourceLoader(
        config, JobTopics(spec.job), runtime, spec.seed, LoaderOptions(until_drained=True, unit_seconds=unit_seconds)
    )
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.enable()
    stats = loader.run()
    profiler.disable()
    total = time.perf_counter() - began
    ps = pstats.Stats(profiler)
    rows = []
    for label, key, caller in keys:
        calls, seconds = _calls_and_seconds(ps, key, caller)
        per_call = f"{seconds / calls * 1e3:.3f} ms" if calls else "-"
        rows.append([label, calls, f"{seconds:.3f}", f"{seconds / total:.1%}", per_call])
    title = (
        f"profile: one loader of {source!r}: {stats.units} units, {stats.samples} samples, {stats.tokens} tokens; "
        f"{total:.2f} s from run() called to return, {stats.busy_seconds:.2f} s in transactions (cProfile on; "
        f"its overhead inflates per-call costs; 0 calls: not called in this run)"
    )
    print_table(["part", "calls", "seconds", "share", "per call"], rows, title=title, markdown=markdown)


def startup_seconds(repeats: int) -> float:
    """Median wall seconds for a fresh interpreter to import the loader's modules (no Kafka)."""
    code = "import pipeline.cli, pipeline.cli.load, pipeline.roles.loader.role"
    walls = []
    for _ in range(repeats):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
        walls.append(time.perf_counter() - began)
    return statistics.median(walls)


# ------------------------------------------------------------------------------------------------- reporting


def fair_rate(base: Baseline, procs: int, cores: int) -> float:
    return min(procs * base.rate, cores * base.rate_per_cpu_s)


def print_tables(baselines: dict[str, Baseline], rows: list[Row], cores: int, repeats: int, markdown: bool) -> None:
    print_table(
        [
            "source",
            "units",
            "samples",
            "tokens",
            "tokenize tok/s",
            "cores used",
            "tok/CPU-s",
            "tok+encode tok/s",
            "encode share",
        ],
        [
            [
                source,
                b.units,
                b.samples,
                f"{b.tokens:,}",
                f"{b.rate:,.0f}",
                f"{b.tokenize_cpu_s / b.tokenize_s:.2f}",
                f"{b.rate_per_cpu_s:,.0f}",
                f"{b.encode_rate:,.0f}",
                f"{b.encode_share:.1%}",
            ]
            for source, b in baselines.items()
        ],
        title=f"Baselines (a fresh process per pass, the loader's batches of documents; fastest of {repeats}):",
        markdown=markdown,
    )
    table, notes = [], []
    for row in rows:
        b = baselines[row.source]
        wall, run_s = row.fastest(lambda r: r.wall_s), row.fastest(lambda r: r.run_s)
        tokens = int(statistics.median(r.tokens for r in row.runs))
        cpu = row.fastest(lambda r: r.cpu_s)
        busy = row.fastest(lambda r: r.busy_s)
        rate, run_rate = tokens / wall, tokens / run_s
        fair = fair_rate(b, row.procs, cores)
        table.append(
            [
                row.source,
                row.procs,
                f"{wall:.2f}",
                f"{run_s:.2f}",
                f"{busy:.2f}",
                f"{rate:,.0f}",
                f"{rate / b.rate:.2f}",
                f"{rate / fair:.2f}",
                f"{run_rate / fair:.2f}",
                f"{tokens / busy / b.rate:.2f}",
                f"{cpu:.2f}",
                f"{(tokens / cpu) / b.rate_per_cpu_s:.2f}",
            ]
        )
        if tokens != b.tokens:
            notes.append(f"{row.source} N={row.procs}: {tokens} tokens committed, the baseline has {b.tokens}")
        if aborted := sum(r.aborted for r in row.runs):
            notes.append(f"{row.source} N={row.procs}: {aborted} aborted units")
    print_table(
        [
            "source",
            "N",
            "wall s",
            "run() s",
            "busy s",
            "tok/s wall",
            "plain",
            "fair",
            "fair run()",
            "busy",
            "CPU s",
            "per-CPU-s",
        ],
        table,
        title=f"Loader runs (fastest of {repeats}):",
        markdown=markdown,
    )
    for note in notes:
        print(f"note: {note}")
    print(
        f"\nwall = start of the first process to exit of the last.  run() = the slowest instance's own seconds "
        f"(no start-up, no planning).  busy s = seconds inside transactions (reading, tokenizing, encoding, "
        f"producing, committing), summed over the N instances.  plain = tok/s wall / single-process tokenize "
        f"tok/s.  fair = tok/s / min(N x tokenize tok/s, {cores} cores x tokenize tok/CPU-s): one process's "
        f"tokenizer already runs on several threads, so N processes cannot beat what {cores} cores tokenize.  "
        f"fair run() = the same with run()'s seconds.  busy = (tokens / busy s) / tokenize tok/s: a loader's "
        f"rate while it works, next to tokenizing alone (at most 1 but for noise; lower with N loaders sharing "
        f"the cores).  per-CPU-s = (tokens / loader CPU-s, all N processes, start-up included) / baseline "
        f"tok/CPU-s.  Target: >= 0.8."
    )


# ---------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", default=DEFAULT_BOOTSTRAP, help="default: %(default)s")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the fastest counts (default: 3)")
    parser.add_argument("--quick", action="store_true", help=f"1 repeat, data built with --limit {QUICK_LIMIT}")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4], help="loader processes per source")
    parser.add_argument("--sources", nargs="+", default=None, help="default: every source of the example")
    parser.add_argument(
        "--unit-seconds",
        type=float,
        default=TARGET_UNIT_SECONDS,
        help="the loaders' --unit-seconds (work per unit); default: %(default)s",
    )
    parser.add_argument("--epochs", type=int, default=1, help="passes over each source's files (more data)")
    parser.add_argument("--profile", action="store_true", help="also profile one in-process loader per source")
    parser.add_argument("--no-runs", action="store_true", help="skip the loader-process runs (with --profile)")
    parser.add_argument("--keep-logs", type=Path, help="write the loaders' logs here (default: a temporary folder)")
    add_markdown_flag(parser)
    parser.add_argument("--baseline-pass", nargs=2, metavar=("SPEC", "SOURCE"), help=argparse.SUPPRESS)
    parser.add_argument("--encode", action="store_true", help=argparse.SUPPRESS)  # with --baseline-pass
    args = parser.parse_args(argv)
    if args.baseline_pass:  # one baseline pass, in the fresh process baseline_pass() started
        spec_path, source = args.baseline_pass
        print(json.dumps(timed_pass(Path(spec_path), source, args.unit_seconds, args.encode)))
        return 0
    repeats = 1 if args.quick else args.repeats
    cores = len(os.sched_getaffinity(0))
    jobs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loader-bench-") as tmp:
        scratch = Path(tmp)
        logs = args.keep_logs or scratch
        logs.mkdir(parents=True, exist_ok=True)
        data = example_data(args.quick, scratch)
        base_spec_path = write_job_spec(scratch, new_job("base"), args.bootstrap_servers, data, args.epochs)
        base_spec = load_spec(base_spec_path)
        sources = args.sources or list(base_spec.source_names)
        print(
            f"machine: {cores} cores, load average {os.getloadavg()[0]:.2f}; broker {args.bootstrap_servers}; "
            f"data {data}; epochs {args.epochs}; --unit-seconds {args.unit_seconds}; repeats {repeats}"
        )
        print(f"python start-up + imports of a loader process: {startup_seconds(repeats):.2f} s", flush=True)
        passes: dict[str, list[BaselinePass]] = {s: [] for s in sources}
        rows = {(s, n): Row(s, n) for s in sources for n in args.procs}
        loads = [os.getloadavg()[0]]
        try:
            # Repeat by repeat, each source's baseline right before its loader runs: both see the same
            # load from whatever else shares the machine.
            for repeat in range(repeats):
                for source in sources:
                    passes[source].append(baseline_pass(base_spec_path, source, args.unit_seconds))
                    print(f"  repeat {repeat + 1} {source} baseline: {passes[source][-1]}", flush=True)
                    for procs in [] if args.no_runs else args.procs:
                        job = new_job(f"{source}-n{procs}")
                        jobs.append(job)
                        spec_path = write_job_spec(scratch, job, args.bootstrap_servers, data, args.epochs)
                        run = run_loaders(spec_path, source, procs, args.bootstrap_servers, args.unit_seconds, logs)
                        rows[(source, procs)].runs.append(run)
                        print(f"  repeat {repeat + 1} {source} N={procs}: {run}", flush=True)
                    loads.append(os.getloadavg()[0])
            baselines = {s: fastest_baseline(p) for s, p in passes.items()}
            print(f"\n1-minute load average during the runs: min {min(loads):.2f}, max {max(loads):.2f}")
            print_tables(baselines, [row for row in rows.values() if row.runs], cores, repeats, args.markdown)
            if args.profile:
                for source in sources:
                    job = new_job(f"prof-{source}")
                    jobs.append(job)
                    spec = load_spec(write_job_spec(scratch, job, args.bootstrap_servers, data, args.epochs))
                    profile_loader(spec, source, args.bootstrap_servers, args.unit_seconds, args.markdown)
        finally:
            deleted = 0
            for job in jobs:
                with contextlib.suppress(Exception):  # a cleanup failure must not hide the results
                    deleted += len(delete_job_topics(args.bootstrap_servers, job, timeout_s=30))
            print(f"\ndeleted {deleted} topics of {len(jobs)} benchmark jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
