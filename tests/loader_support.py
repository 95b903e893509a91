"""Shared by the loader tests: example data, a spec for it, loader processes, what reached the topics."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import yaml

from connectors import Document, WorkUnit
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.spec import JobSpec
from tests.kafka_support import TopicGrowth
from topics.formats.dead_letter import DeadLetter, decode_dead_letter_message
from topics.formats.names import JobTopics
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.log_reader import read_to_end

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("code", "docstrings", "topics")


def build_example_data(out: Path, limit: int) -> Path:
    command = [
        sys.executable,
        str(REPO / "examples" / "build_example_data.py"),
        "--out",
        str(out),
        "--limit",
        str(limit),
        "--vocab-size",
        "1024",
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    return out


def write_spec(folder: Path, job: str, bootstrap: str, data: Path, *, epochs: int = 1, **overrides: object) -> Path:
    """A spec of the three example sources under ``data``; ``overrides`` replace top-level sections."""
    source = {"max_sample_length": 512, "eod_token_id": 0}
    spec = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "tokenizer": str(data / "tokenizer.json"),
        "sources": [
            {"name": "code", "reader": "parquet", "path": str(data / "code"), "epochs": epochs, **source},
            {"name": "docstrings", "reader": "jsonl", "path": str(data / "docstrings"), "field": "text", **source},
            {"name": "topics", "reader": "text", "path": str(data / "topics"), **source},
        ],
        "mixture": {"weights": {"code": 1, "docstrings": 1, "topics": 1}},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 1024},
        "cost": {"alpha": 1.0, "beta": 100.0},
        "seed": 7,
        **overrides,
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def start_loader(spec: Path, source: str, instance: int, log_dir: Path, *extra: str) -> subprocess.Popen:
    log = (log_dir / f"loader-{source}-{instance}.log").open("ab")
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "load",
        "--spec",
        str(spec),
        "--source",
        source,
        "--instance",
        str(instance),
        "--until-drained",
        "--transaction-timeout-ms",
        "10000",
        *extra,
    ]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


TAKE_OVER_EXIT = 3
"""The exit code of a role whose Kafka client hit a fatal error: it exits so that a new process takes over,
as `mixflow run` (and any supervisor) starts one."""


def wait_all_restarting(
    running: dict[tuple[str, int], subprocess.Popen],
    restart: Callable[[tuple[str, int]], subprocess.Popen],
    timeout_s: float,
    log_dir: Path,
    restarts: int = 3,
) -> None:
    """``wait_all``, but a loader that exits for a successor (``TAKE_OVER_EXIT``) is started again, as a
    supervisor would, ``restarts`` times in all at most."""
    deadline = time.monotonic() + timeout_s
    while True:
        wait_all(
            [p for p in running.values() if p.poll() != TAKE_OVER_EXIT],
            max(0.1, deadline - time.monotonic()),
            log_dir,
            allowed=(0, TAKE_OVER_EXIT),
        )
        successors = [key for key, p in running.items() if p.returncode == TAKE_OVER_EXIT]
        if not successors:
            return
        assert restarts >= len(successors), f"loaders {successors} kept exiting for a successor"
        restarts -= len(successors)
        for key in successors:
            running[key] = restart(key)


def wait_all(
    processes: list[subprocess.Popen], timeout_s: float, log_dir: Path, allowed: tuple[int, ...] = (0,)
) -> None:
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            msg = f"loaders did not finish within {timeout_s} s; their logs end with:\n{_log_tails(log_dir)}"
            raise AssertionError(msg) from None
        if process.returncode not in allowed:
            msg = f"loader {process.args} exited {process.returncode}; logs end with:\n{_log_tails(log_dir)}"
            raise AssertionError(msg)


def _log_tails(log_dir: Path) -> str:
    return "\n".join(f"{p.name}:\n{p.read_text()[-3000:]}" for p in sorted(log_dir.glob("loader-*.log")))


def committed_sample_ids(bootstrap: str, topics: JobTopics, source: str) -> list[str]:
    records = read_to_end({"bootstrap.servers": bootstrap}, topics.src(source), timeout_s=60)
    return [decode_sample_message(m).sample_id for m in records]


def dead_letters(bootstrap: str, topics: JobTopics) -> list[DeadLetter]:
    return [decode_dead_letter_message(m) for m in read_to_end({"bootstrap.servers": bootstrap}, topics.dlq)]


def source_topic_growth(bootstrap: str, topics: JobTopics) -> TopicGrowth:
    """Records in the job's source topics so far, committed or not."""
    return TopicGrowth(bootstrap, [topics.src(s) for s in SOURCES])


def expected_sample_ids(spec: JobSpec, bootstrap: str, source: str) -> Counter[str]:
    """The ids the source's committed work units yield when read and tokenized here, without Kafka."""
    runtime = SourceRuntime.from_spec(spec, source)
    units = read_to_end({"bootstrap.servers": bootstrap}, JobTopics(spec.job).work(source))
    ids: Counter[str] = Counter()
    for record in units:
        unit = WorkUnit.from_json(record.value())
        documents = [d for d in runtime.reader.read(unit) if isinstance(d, Document)]
        ids.update(s.sample_id for s in runtime.builder.build(documents, epoch=unit.epoch).samples)
    return ids


def load_sources(spec: Path, log_dir: Path, timeout_s: float = 240) -> None:
    """Run one loader per source until every source is drained."""
    wait_all([start_loader(spec, source, 0, log_dir) for source in SOURCES], timeout_s, log_dir)


def start_constructor(spec: Path, output_job: str, *extra: str, log: Path | None = None) -> subprocess.Popen:
    """A ``mixflow construct`` process writing ``spec``'s steps under ``output_job``; its output to ``log``
    or to pipes."""
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "construct",
        "--spec",
        str(spec),
        "--output-job",
        output_job,
        "--transaction-timeout-ms",
        "10000",
        *extra,
    ]
    out = log.open("ab") if log else subprocess.PIPE
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT if log else subprocess.PIPE, cwd=REPO)


def example_body(example: str, data: Path, job: str, bootstrap: str, tokenizer: str) -> dict:
    """``examples/<example>`` as a dict, run as ``job`` on ``bootstrap`` over ``data`` (each source's folder of
    the same name there, the ``tokenizer`` file there)."""
    body = yaml.safe_load((REPO / "examples" / example).read_text())
    body["job"] = job
    body["kafka"]["bootstrap_servers"] = bootstrap
    body["tokenizer"] = str(data / tokenizer)
    for source in body["sources"]:
        source["path"] = str(data / Path(source["path"]).name)
    return body
