"""Multi-level partitioning: draining a source that is one huge Parquet row group, with and without
``unit_target_s``.

    .venv/bin/python -m benchmarks.unit_split_bench [--rows 6000] [--loaders 2] [--repeats 3]
        [--pieces 8] [--bootstrap-servers HOST:PORT]

Baseline ("fixed units"): ``unit_target_s`` unset. The planner cannot cut inside a row group, so the file
is one unit: one loader reads it all while the others wait. "split": ``unit_target_s`` set to about
1/--pieces of what the file costs to tokenize here (measured first, like the tests do), so the loader that
takes the unit splits it into row ranges and the loaders share them.

Each run is a fresh job and ``--loaders`` ``mixflow load --until-drained`` processes started together:
wall seconds from the first start to the last exit (start-up, planning and the group join included),
the units on the work topic, the samples committed (the same in both configurations, checked), and the
loaders' busy seconds (inside transactions, summed; the most any one loader had). Medians of --repeats,
both configurations alternating, so a burst of other work on the machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.spec import load_spec
from topics.formats.names import JobTopics
from topics.kafka.admin import ensure_job_topics
from topics.kafka.log_reader import read_to_end

REPO = Path(__file__).resolve().parent.parent


def build_source(folder: Path, rows: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    (folder / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{w}" for w in rng.integers(0, 500, int(rng.integers(50, 600)))) for _ in range(rows)]
    pq.write_table(pa.table({"text": texts}), folder / "data" / "huge.parquet", row_group_size=rows)
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, **{f"w{i}": i + 1 for i in range(500)}}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))


def write_spec(folder: Path, job: str, bootstrap: str, unit_target_s: float | None) -> Path:
    source = {"name": "big", "reader": "parquet", "path": str(folder / "data"), "max_sample_length": 512}
    if unit_target_s is not None:
        source["unit_target_s"] = unit_target_s
    spec = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "tokenizer": str(folder / "tokenizer.json"),
        "sources": [source],
        "mixture": {"weights": {"big": 1}},
        "step": {"ranks": 1, "micro_batches": 1, "tokens_per_micro_batch": 512},
        "cost": {"alpha": 1.0, "beta": 100.0},
    }
    path = folder / f"{job}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_once(folder: Path, bootstrap: str, loaders: int, unit_target_s: float | None) -> dict[str, float]:
    job = f"bench-split-{uuid.uuid4().hex[:8]}"
    spec = write_spec(folder, job, bootstrap, unit_target_s)
    ensure_job_topics({"bootstrap.servers": bootstrap}, job, ["big"], 1)
    command = [sys.executable, "-m", "pipeline.cli", "load", "--spec", str(spec), "--source", "big"]
    began = time.monotonic()
    processes = [
        subprocess.Popen(
            [*command, "--instance", str(i), "--until-drained"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        for i in range(loaders)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    wall = time.monotonic() - began
    if any(p.returncode for p in processes):
        msg = f"a loader of {job} failed: exit codes {[p.returncode for p in processes]}"
        raise RuntimeError(msg)
    summaries = [json.loads(out.decode().strip().splitlines()[-1]) for out in outputs]
    units = len(read_to_end({"bootstrap.servers": bootstrap}, JobTopics(job).work("big")))
    busy = [s["busy_seconds"] for s in summaries]
    return {
        "wall": wall,
        "units": units,
        "samples": sum(s["samples"] for s in summaries),
        "busy": sum(busy),
        "busiest": max(busy),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--loaders", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pieces", type=int, default=8)
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_source(folder, args.rows)
        probe = load_spec(write_spec(folder, "probe", args.bootstrap_servers, None))
        runtime = SourceRuntime.from_spec(probe, "big")
        tokenize_s = runtime.measure_cost() * runtime.reader.layout("huge.parquet").content_bytes
        target = tokenize_s / args.pieces
        configs = {"fixed units": None, f"split (unit_target_s={target:.3f})": target}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
        for _ in range(args.repeats):
            for name, unit_target_s in configs.items():
                runs[name].append(run_once(folder, args.bootstrap_servers, args.loaders, unit_target_s))
    samples = {r["samples"] for rs in runs.values() for r in rs}
    if len(samples) != 1:
        msg = f"the configurations committed different sample counts: {samples}"
        raise RuntimeError(msg)
    print(f"one Parquet row group of {args.rows} rows ({tokenize_s:.2f} s to tokenize here), {args.loaders} loaders,")
    print(f"{samples.pop()} samples; medians of {args.repeats} runs\n")
    print("| units | drain s | units on the work topic | busy s (all loaders) | busiest loader s |")
    print("|---|---|---|---|---|")
    base = statistics.median(r["wall"] for r in runs["fixed units"])
    for name, rs in runs.items():
        wall = statistics.median(r["wall"] for r in rs)
        cells = [
            f"{wall:.2f} ({wall / base:.2f}x)",
            f"{statistics.median(r['units'] for r in rs):.0f}",
            f"{statistics.median(r['busy'] for r in rs):.2f}",
            f"{statistics.median(r['busiest'] for r in rs):.2f}",
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
