"""The constructor on media-heavy sources, next to a raw pipeline moving the same records, in one run.

    .venv/bin/python -m benchmarks.media_throughput_bench [--images 4000] [--megapixels 0.25,1,4]
        [--shapes 16x4x8192,256x4x8192] [--windows 2,8,16] [--window-mb 0] [--steps 6] [--repeats 3] [--data-job NAME]
        [--keep-data] [--kafka-config KEY=VALUE ...] [--bootstrap-servers HOST:PORT] [--markdown]

Data (``benchmarks/_media_data.py``): written once, straight to ``<job>.src.<source>`` topics in the loaders'
media format (``sample_media.avsc``: each image or clip a ``MediaItem`` with its grid and JPEG frames), and
shared by every arm and repeat (``--data-job`` reuses a job written by an earlier ``--keep-data`` run):

- ``images_<N>mp`` per ``--megapixels``: ``--images`` captioned images of about N megapixels (crops of real
  photographs, smart-resized to patch 14, merge 2: an image of P patches has P/4 placeholder tokens);
- ``clips``: clips of 8 frames of 0.15 megapixels (4 temporal patches, 768 placeholders), captioned;
- ``text``: pre-tokenized text (log-normal lengths around 1,000 tokens).

Clips and text are written in step with the largest images' tokens, at the shares the specs mix them in
(``SHARES``: images 0.6, clips 0.2, text 0.2 of each step's tokens, placeholders included).

Per image size, step shape (ranks x micro-batches x tokens a micro-batch; ``--patches-ratio`` patches a token
of micro-batch budget: 32,768 patches at 8,192 tokens), ``window_steps`` and repeat, back to back:

- **constructor**: ``DataConstructor`` with composition at that ``window_steps``, over that size's images,
  the clips and the text, into a fresh output job, in a child process (``throughput_bench.constructor_run``),
  for as many steps as the data fills (at most ``--steps``); timed from its first step's commit to its last.
- **raw**: ``throughput_bench.run_raw`` in a child process: it consumes the same source topics and produces
  per step the constructor's mean step payload as one message per rank topic, one transaction a step.

Counted: payload MB/s (the rank batches' values, Arrow IPC before Kafka's compression, 10^6 bytes) and the
ratio constructor / raw; images/s and clips/s (the constructor: the media items of the steps committed after
the first; raw: the image and clip records it consumed between its first step's cut and its last);
``CPU-s/step``: the constructor child's CPU seconds from its first commit to its last, per step (its main
thread's in brackets; ``throughput_bench.cpu_per_step``), and the raw child's CPU seconds over the whole run
per step; peak RSS: each child's ``ru_maxrss``. Medians of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from benchmarks import _media_data as media
from benchmarks._table import add_markdown_flag, print_table
from benchmarks.throughput_bench import (
    add_kafka_config_flag,
    constructor_run,
    cpu_per_step,
    data_job,
    describe_job,
    job_description,
    label,
    parse_shape,
    run_raw,
    sample_lengths,
    token_ids,
    write_samples,
    write_spec,
)
from pipeline.planning.shape import StepShape
from topics.formats.names import JobTopics
from topics.formats.sample import Sample
from topics.kafka.admin import delete_job_topics, ensure_job_topics

SHARES = {"images": 0.6, "clips": 0.2, "text": 0.2}
"""Each step's tokens by kind of source (the image source of the run's size takes ``images``)."""
DESCRIPTION = b"media-bench-data"
PER_TRANSACTION = 200
"""Media records a transaction while writing the data (a 4-megapixel image is about 0.5 MB)."""


# -- the data ------------------------------------------------------------------------------------------


def write_media_data(
    config: dict, job: str, images: int, megapixels: list[float], max_text: int, seed: int = 0
) -> dict:
    """Write the data job: ``images`` images of each size, clips and text (at most ``max_text`` tokens a sample)
    in step with the largest images; returns its description (each source's records and tokens)."""
    rng = np.random.default_rng(seed)
    bases = media.base_pictures()
    pools = {media.image_source(mp): media.image_items(rng, bases, mp) for mp in megapixels}
    clips = media.clip_items(rng, bases)
    image_tokens = max(images * statistics.mean(map(media.sample_tokens, items)) for items in pools.values())
    clip_count = math.ceil(image_tokens * SHARES["clips"] / SHARES["images"] / media.sample_tokens(clips[0]))
    lengths = sample_lengths(rng, int(image_tokens * SHARES["text"] / SHARES["images"]), max_text)
    sources: dict[str, dict[str, int]] = {}

    def samples() -> Iterator[Sample]:
        for source, items in [*pools.items(), ("clips", clips)]:
            written = list(media.media_samples(rng, source, items, clip_count if source == "clips" else images))
            sources[source] = {"records": len(written), "tokens": sum(s.length for s in written)}
            yield from written
        ids = token_ids(rng, int(lengths.sum()))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for i in range(len(lengths)):
            yield Sample(f"text/synthetic/{i}", "text", ids[offsets[i] : offsets[i + 1]])
        sources["text"] = {"records": len(lengths), "tokens": int(lengths.sum())}

    ensure_job_topics(config, job, [*pools, "clips", "text"], 1, timeout_s=600)
    write_samples(config, job, samples(), PER_TRANSACTION)
    body = {"sources": sources, "max_sample_tokens": max_sample_tokens(pools, clips, max_text)}
    describe_job(config, job, body, DESCRIPTION)
    return body


def max_sample_tokens(pools: dict[str, list], clips: list, text: int) -> dict[str, int]:
    """Each source's longest sample in tokens (an image's or clip's caption at its longest)."""
    longest = {source: max(item.tokens for item in items) + 2 + media.CAPTION[1] for source, items in pools.items()}
    return {**longest, "clips": clips[0].tokens + 2 + media.CAPTION[1], "text": text}


def check_fits(description: dict, sources: list[str], shape: StepShape) -> None:
    """Refuse a run whose samples a micro-batch cannot hold (in tokens; an image's patches are 4 times its
    placeholders, which the patch budget holds at ``--patches-ratio`` 4 or more)."""
    missing = [s for s in sources if s not in description["sources"]]
    if missing:
        raise SystemExit(f"the data job has no source {', '.join(missing)}: write a new one (leave out --data-job)")
    longest = max(description["max_sample_tokens"][s] for s in sources)
    if longest > shape.tokens_per_micro_batch:
        msg = f"{label(shape)}: a sample of up to {longest} tokens does not fit a micro-batch; use smaller images"
        raise SystemExit(msg)


def steps_filled(description: dict, sources: dict[str, float], shape: StepShape, window: float) -> int:
    """Steps the data fills: each source's tokens over its share of a step (5% spare), less the window that
    composition holds ahead of every source (the constructor waits for it: the data job has no end). Refuses
    fewer than 2."""
    tokens = description["sources"]
    fills = [tokens[s]["tokens"] / (share * shape.tokens_per_step * 1.06) for s, share in sources.items()]
    steps = int(min(fills)) - math.ceil(window) - 1
    if steps < 2:
        msg = f"{label(shape)} at window {window:g}: the data fills {steps} steps, not 2; write more (--images)"
        raise SystemExit(msg)
    return steps


# -- the arms ------------------------------------------------------------------------------------------


def media_spec(
    folder: Path,
    job: str,
    shape: StepShape,
    weights: dict[str, float],
    window: float,
    window_mb: int = 0,
    kafka: dict | None = None,
) -> Path:
    """``throughput_bench.write_spec``'s job over these sources: the image and clip sources multimodal (their
    records are read as written, the vision section only makes the batches carry media), the patch budget
    ``shape``'s, Qwen2-VL's encoder in the cost, composition at ``window`` (and ``window_bytes`` of
    ``window_mb`` MiB where above 0), ``kafka`` the clients' settings."""
    path = write_spec(folder, job, shape, composition=True, kafka=kafka)
    body = yaml.safe_load(path.read_text())
    empty, text = body["sources"][0]["path"], {**body["sources"][0], "name": "text"}
    vision = [s for s in weights if s != "text"]
    multimodal = [{"name": s, "reader": "jsonl", "path": empty, "vision": media.VISION_IDS} for s in vision]
    body["sources"] = [*multimodal, text]
    body["tokenizer"] = str(folder / "tokenizer.json")  # a multimodal source's; the constructor reads none
    body["mixture"] = {"weights": weights}
    body["step"]["patches_per_micro_batch"] = shape.patches_per_micro_batch
    body["cost"]["vision"] = {"hidden_size": 1280, "num_layers": 32}
    body["composition"] = {"window_steps": window, **({"window_bytes": window_mb << 20} if window_mb else {})}
    out = folder / f"spec-{label(shape)}-{'-'.join(weights)}-w{window:g}-{window_mb}.yaml"
    out.write_text(yaml.safe_dump(body, sort_keys=False))
    return out


def raw_child(arguments: dict) -> None:
    """Run ``run_raw`` in this process and print its result and this process's peak RSS as one JSON line."""
    shape = StepShape(*arguments.pop("shape"))
    result = run_raw(shape=shape, **arguments)
    result["max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(result), flush=True)


def raw_run(config: dict, data_job: str, out: str, shape: StepShape, built: dict, sources: list[str]) -> dict:
    arguments = {
        "config": config,
        "data_job": data_job,
        "out_job": out,
        "shape": [shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch, shape.patches_per_micro_batch],
        "steps": built["steps"],
        "step_payload": built["payload"] // built["steps"],
        "sources": sources,
    }
    command = [sys.executable, __file__, "--child-raw", json.dumps(arguments)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    if result.returncode != 0:
        raise SystemExit(f"the raw pipeline failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_case(args: argparse.Namespace, config: dict, description: dict, case: tuple, folder: Path) -> list[dict]:
    """Every repeat of one (megapixels, shape, window): the constructor, then the raw pipeline."""
    megapixels, shape, window = case
    images = media.image_source(megapixels)
    weights = {images: SHARES["images"], "clips": SHARES["clips"], "text": SHARES["text"]}
    check_fits(description, list(weights), shape)
    spec = media_spec(folder, args.data_job, shape, weights, window, args.window_mb, args.kafka_config)
    steps = min(args.steps, steps_filled(description, weights, shape, window))
    rows = []
    for repeat in range(args.repeats):
        out = f"{args.data_job}-{label(shape)}-{uuid.uuid4().hex[:6]}"
        ensure_job_topics(config, out, list(weights), shape.ranks, timeout_s=600)
        try:
            built = constructor_run(spec, out, steps, args.bootstrap_servers)
            raw = raw_run({**config, **args.kafka_config}, args.data_job, out, shape, built, list(weights))
        finally:
            delete_job_topics(config, out)
        row = measures(built, raw, JobTopics(args.data_job), images)
        rows.append(row)
        print(f"{megapixels:g} MP {label(shape)} window {window:g} repeat {repeat}: {json.dumps(row)}", flush=True)
    return rows


def measures(built: dict, raw: dict, data: JobTopics, images: str) -> dict:
    steady = built["payload"] * built["steady_tokens"] / built["tokens"]
    records = raw["steady_records"]
    return {
        "steps": built["steps"],
        "step_mb": built["payload"] / built["steps"] / 1e6,
        "mbs": steady / built["steady_s"] / 1e6,
        "raw_mbs": raw["steady_bytes"] / raw["steady_s"] / 1e6,
        "images_s": built["steady_media"].get("image", 0) / built["steady_s"],
        "clips_s": built["steady_media"].get("video", 0) / built["steady_s"],
        "raw_images_s": records.get(data.src(images), 0) / raw["steady_s"],
        "raw_clips_s": records.get(data.src("clips"), 0) / raw["steady_s"],
        "cpu_step": cpu_per_step(built),
        "raw_cpu_step": raw["cpu"] / built["steps"],
        "rss_mb": built["max_rss"] / 1e6,
        "raw_rss_mb": raw["max_rss"] / 1e6,
    }


# -- the report ----------------------------------------------------------------------------------------

HEADERS = [
    "images",
    "R x M x C",
    "window",
    "window MiB",
    "steps",
    "step MB",
    "constructor MB/s",
    "raw MB/s",
    "/ raw",
    "images/s (raw)",
    "clips/s (raw)",
    "CPU-s/step (main)",
    "raw CPU-s/step",
    "peak RSS MB",
    "raw peak RSS MB",
]


def summary_row(case: tuple, rows: list[dict], window_mb: int) -> list[str]:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    def spread(values: list[float]) -> str:
        values = sorted(values)
        return f"{statistics.median(values):.1f} [{values[0]:.1f}-{values[-1]:.1f}]"

    megapixels, shape, window = case
    cpu = [r["cpu_step"] for r in rows if r["cpu_step"] is not None]
    return [
        f"{megapixels:g} MP",
        label(shape),
        f"{window:g}",
        f"{window_mb:,}" if window_mb else "-",
        str(rows[0]["steps"]),
        f"{med('step_mb'):.1f}",
        spread([r["mbs"] for r in rows]),
        spread([r["raw_mbs"] for r in rows]),
        f"{statistics.median(r['mbs'] / r['raw_mbs'] for r in rows):.2f}",
        f"{med('images_s'):,.0f} ({med('raw_images_s'):,.0f})",
        f"{med('clips_s'):,.0f} ({med('raw_clips_s'):,.0f})",
        f"{statistics.median(c[0] for c in cpu):.3f} ({statistics.median(c[1] for c in cpu):.3f})" if cpu else "-",
        f"{med('raw_cpu_step'):.3f}",
        f"{med('rss_mb'):,.0f}",
        f"{med('raw_rss_mb'):,.0f}",
    ]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4000, help="images of each size to write (a new data job)")
    parser.add_argument("--megapixels", default="0.25,1,4", help="image sizes, comma-separated")
    parser.add_argument("--shapes", default="16x4x8192,256x4x8192", help="RANKSxMICRO_BATCHESxTOKENS, comma-separated")
    parser.add_argument("--patches-ratio", type=int, default=4, help="patch budget of a micro-batch per token")
    parser.add_argument("--windows", default="2,8,16", help="composition window_steps, comma-separated")
    parser.add_argument("--steps", type=int, default=6, help="at most this many steps per run")
    parser.add_argument(
        "--window-mb", type=int, default=0, help="composition window_bytes in MiB, every case (0: no byte limit)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-job", help="reuse this data job (written by an earlier run with --keep-data)")
    parser.add_argument("--keep-data", action="store_true", help="keep the data job for a later --data-job")
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    add_kafka_config_flag(parser)
    add_markdown_flag(parser)
    args = parser.parse_args()
    args.kafka_config = dict(args.kafka_config)
    return args


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-raw":
        raw_child(json.loads(sys.argv[2]))
        return 0
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    megapixels = [float(m) for m in args.megapixels.split(",")]
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    shapes = [replace(s, patches_per_micro_batch=args.patches_ratio * s.tokens_per_micro_batch) for s in shapes]
    windows = [float(w) for w in args.windows.split(",")]
    config = {"bootstrap.servers": args.bootstrap_servers}
    folder = Path(tempfile.mkdtemp(prefix="mbench-"))
    with data_job(config, args, "mbench") as fresh:
        description = None if fresh else job_description(config, args.data_job, DESCRIPTION)
        if description is None:
            print(f"writing {args.images:,} images of {args.megapixels} MP, clips and text to {args.data_job} ...")
            max_text = min(s.tokens_per_micro_batch for s in shapes)
            description = write_media_data(config, args.data_job, args.images, megapixels, max_text)
        print(f"data job {args.data_job}: {json.dumps(description['sources'])}", flush=True)
        cases = [(mp, shape, window) for mp in megapixels for shape in shapes for window in windows]
        table = [summary_row(case, run_case(args, config, description, case, folder), args.window_mb) for case in cases]
        title = f"medians [min-max] of {args.repeats} repeats; MB = 10^6 bytes; images/s and clips/s: constructor (raw)"
        print_table(HEADERS, table, title=title, markdown=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
