"""The cost of security: the same small job on a secured local broker (`mixflow stack up --secure`: TLS and
SASL/SCRAM-SHA-512, ACLs enforced, the admin's credentials in the spec's ``kafka.config``) and on a plaintext
one, started side by side by this run on free ports, with the same JVM options.

    .venv/bin/python -m benchmarks.security_bench [--repeats 5] [--tokens 4000000] [--shape 4x2x8192]
        [--connects 10] [--markdown]

Data: synthetic pre-tokenized samples written once to each broker (``throughput_bench.write_data``: four
sources, log-normal lengths around 1,000 tokens). Per repeat, on each broker in turn (the order alternates
every repeat; a warm-up round on each first, not counted), into a fresh output job:

- **connect and list metadata**: a fresh ``AdminClient`` asking for the cluster's topics, ``--connects``
  times (TCP, plus the TLS handshake and the SCRAM exchange on the secured broker);
- **constructor**: ``DataConstructor`` in a child process (``throughput_bench.constructor_run``, the in-order
  draw) for every step the data fills: *up* is the time from ``run()`` to its first committed step (the lease,
  topic checks, the first fetch, the first transaction), *steps/s* the steady state from the first commit to
  the last;
- **sink**: a fresh ``KafkaBatchDataset`` of rank 0 reading every micro-batch the constructor wrote: *first
  micro-batch* from ``iter()``, *tokens/s* over the whole read (the tokens of its packed micro-batches).

Medians over the repeats (connect: over every connect); ratio = secured / plaintext.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from benchmarks._table import add_markdown_flag, print_table
from benchmarks.throughput_bench import SOURCES, Shape, steps_for, write_data, write_spec
from pipeline.tools.stack.local_broker import LocalBroker, free_port_block
from pipeline.tools.stack.secure import broker_security, ensure_secrets
from topics.kafka.admin import delete_job_topics, ensure_job_topics
from trainer_sink import KafkaBatchDataset, ReadOptions

STACKS = ("plaintext", "TLS + SCRAM")
REPO = Path(__file__).resolve().parent.parent


def start_stacks(folder: Path) -> dict[str, tuple[LocalBroker, dict[str, Any]]]:
    """A plaintext and a secured broker in ``folder``, on free ports: each with its clients' settings."""
    plain = LocalBroker(folder / "plaintext", port=free_port_block(2))
    secured_port = free_port_block(3)  # its mTLS listener: port + 2
    secured = LocalBroker(folder / "secured", port=secured_port)
    secrets = ensure_secrets(secured.state_dir, [secured.host], secured.bootstrap)
    secured.security = broker_security(secrets, secured.bootstrap)
    plain.up()
    secured.up()
    return {
        STACKS[0]: (plain, {"bootstrap.servers": plain.bootstrap}),
        STACKS[1]: (secured, dict(secrets.admin_client_config(secured.bootstrap))),
    }


def child_constructor(spec_path: Path, output_job: str, max_steps: int, bootstrap: str) -> None:
    """Run the constructor in this process; print when its run began and each step's commit, as one JSON line."""
    from pipeline.roles.constructor import ConstructorOptions, DataConstructor
    from pipeline.spec import load_spec

    committed: list[float] = []

    class Timed(DataConstructor):
        def _record(self, step: Any, state_bytes: int) -> None:  # a StepSummary
            super()._record(step, state_bytes)
            committed.append(time.monotonic())

    spec = load_spec(spec_path)
    constructor = Timed(spec, spec.kafka.client_config(bootstrap), ConstructorOptions(output_job, max_steps))
    began = time.monotonic()
    constructor.run()
    steady = committed[-1] - committed[0] if len(committed) > 1 else None
    print(json.dumps({"steps": len(committed), "first": committed[0] - began, "steady_s": steady}), flush=True)


def constructor_run(spec: Path, out_job: str, steps: int, bootstrap: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.security_bench", "--child", str(spec), out_job, str(steps), bootstrap]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the constructor failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def connect_seconds(config: dict[str, Any]) -> float:
    started = time.perf_counter()
    AdminClient({**config, "log_level": 0}).list_topics(timeout=30)
    return time.perf_counter() - started


def sink_read(config: dict[str, Any], job: str, micro_batches: int) -> dict[str, float]:
    """Read ``micro_batches`` of rank 0 of ``job`` with the trainer sink: seconds, to the first, and tokens."""
    security = {key: value for key, value in config.items() if key != "bootstrap.servers"}
    dataset = KafkaBatchDataset(
        job=job,
        bootstrap_servers=config["bootstrap.servers"],
        kafka_config=security,
        rank=0,
        read=ReadOptions(attention_mask=False, wait_timeout_s=120),
    )
    tokens, first = 0, None
    began = time.perf_counter()
    for read, micro_batch in enumerate(dataset, 1):
        first = first or time.perf_counter() - began
        tokens += micro_batch["input_ids"].numel()  # packed, unpadded: its tokens
        if read == micro_batches:
            break
    return {"seconds": time.perf_counter() - began, "first": first or 0.0, "tokens": tokens}


def one_round(stack: str, config: dict[str, Any], spec: Path, shape: Shape, steps: int, connects: int) -> dict:
    out = f"secbench-{uuid.uuid4().hex[:6]}"
    ensure_job_topics(config, out, list(SOURCES), shape.ranks, timeout_s=300)
    try:
        connect = [connect_seconds(config) for _ in range(connects)]
        built = constructor_run(spec, out, steps, config["bootstrap.servers"])
        sink = sink_read(config, out, built["steps"] * shape.micro_batches)
    finally:
        delete_job_topics(config, out)
    row = {
        "connect": connect,
        "up": built["first"],
        "steps_s": (built["steps"] - 1) / built["steady_s"],
        "sink_first": sink["first"],
        "sink_tokens_s": sink["tokens"] / sink["seconds"],
    }
    print(
        f"{stack}: connect {statistics.median(connect) * 1e3:.0f} ms, constructor up {row['up']:.2f} s, "
        f"{row['steps_s']:.1f} steps/s, sink first {row['sink_first']:.2f} s, "
        f"{row['sink_tokens_s'] / 1e6:.2f}M tokens/s",
        file=sys.stderr,
        flush=True,
    )
    return row


METRICS: tuple[tuple[str, str, Callable[[list[dict]], float], str], ...] = (
    (
        "client: connect and list metadata",
        "ms",
        lambda rows: statistics.median(_all_connects(rows)) * 1e3,
        ".0f",
    ),
    ("constructor: run() to first step committed", "s", lambda rows: statistics.median(r["up"] for r in rows), ".2f"),
    ("constructor: steps/s (steady)", "steps/s", lambda rows: statistics.median(r["steps_s"] for r in rows), ".1f"),
    ("sink: iter() to first micro-batch", "s", lambda rows: statistics.median(r["sink_first"] for r in rows), ".2f"),
    ("sink: tokens/s", "M tokens/s", lambda rows: statistics.median(r["sink_tokens_s"] for r in rows) / 1e6, ".2f"),
)


def _all_connects(rows: list[dict]) -> list[float]:
    return [seconds for row in rows for seconds in row["connect"]]


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        spec, out, steps, bootstrap = sys.argv[2:]
        child_constructor(Path(spec), out, int(steps), bootstrap)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=4_000_000, help="tokens of data written to each broker")
    parser.add_argument("--shape", type=Shape.parse, default=Shape.parse("4x2x8192"), help="RANKSxMICROxTOKENS")
    parser.add_argument("--connects", type=int, default=10, help="connects per repeat")
    add_markdown_flag(parser)
    args = parser.parse_args()
    rows: dict[str, list[dict]] = {stack: [] for stack in STACKS}
    with tempfile.TemporaryDirectory(prefix="mixflow-security-bench-") as tmp:
        folder = Path(tmp)
        stacks = start_stacks(folder)
        try:
            data_job = f"secbench-data-{uuid.uuid4().hex[:6]}"
            specs, steps = {}, 0
            for stack, (_, config) in stacks.items():
                counts = write_data(config, data_job, args.tokens, args.shape.capacity)
                steps = steps_for(args.shape, sum(counts.values()), composition=False)
                security = {key: value for key, value in config.items() if key != "bootstrap.servers"}
                specs[stack] = write_spec(folder / stack, data_job, args.shape, False, security)
            for stack in STACKS:  # warm-up, not counted: internal topics made, page cache and JIT warm
                one_round(f"{stack} (warm-up)", stacks[stack][1], specs[stack], args.shape, steps, args.connects)
            for repeat in range(args.repeats):
                order = STACKS if repeat % 2 == 0 else STACKS[::-1]
                for stack in order:
                    config = stacks[stack][1]
                    rows[stack].append(one_round(stack, config, specs[stack], args.shape, steps, args.connects))
        finally:
            for broker, _ in stacks.values():
                broker.down()
    table = []
    for name, unit, median, fmt in METRICS:
        plain, secured = median(rows[STACKS[0]]), median(rows[STACKS[1]])
        table.append([name, unit, format(plain, fmt), format(secured, fmt), f"{secured / plain:.2f}"])
    title = f"{args.shape}, {steps} steps, medians of {args.repeats} repeats"
    print_table(["", "unit", *STACKS, "ratio"], table, title=title, markdown=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
