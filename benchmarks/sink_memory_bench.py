"""Trainer-side memory for one data-parallel rank with 1, 8 and 32 sources: mixflow's sink against per-rank
multi-source loading (a DataLoader per rank whose workers each open every source).

    .venv/bin/python -m benchmarks.sink_memory_bench [--sources 1,8,32] [--repeats 3]
        [--bootstrap-servers HOST:PORT] [--quick] [--multimodal [--epochs 1] [--documents N]]

Memory is PSS (proportional set size, /proc/<pid>/smaps_rollup) summed over the measured process and all
its descendants, sampled every ``--interval-s`` while it runs, reported as the peak. PSS splits a page
shared by k processes into k parts, so forked DataLoader workers that share the parent's pages are not
double-counted (the sum of RSS, printed next to it, does double-count them). The file-backed part of PSS
(torch's shared libraries) is also divided with unrelated processes on the machine that map the same files,
so a second table counts anonymous and shared-memory pages only, which nothing outside the tree moves.

Data: the example data set (``examples/build_example_data.py``: code as Parquet, docstrings as JSONL,
topics as text files) split into N source folders. Source i has the format of kind ``i % 3`` (code ->
Parquet, docstrings -> JSONL, topics -> text) and gets an equal contiguous share of that kind's
documents; a kind with no source of its own (N < 3) goes into source 0 as Parquet rows. So every N holds
the same documents, about 3.9M tokens.

Per N the benchmark first runs the real pipeline, ``mixflow run --spec SPEC --job NAME`` (N loaders and
the constructor; 2 ranks x 2 micro-batches x 4096 tokens), which fills the rank topics. Then, per repeat,
in alternating order, two fresh subprocesses, both of which import torch first (a trainer always has it):

- **mixflow**: ``KafkaBatchDataset(spec, rank=0)`` iterated over the whole rank-0 topic, up to the
  end-of-data record, with its default ``prefetch_bytes`` (``--sink-step-ms`` sleeps per micro-batch
  to play a trainer slower than the reader, which lets the prefetch buffer fill).
- **baseline**: ``DataLoader(dataset, num_workers=4, batch_size=None)`` for rank 0 of 2, whose
  IterableDataset opens, in every worker, every one of the N sources with mixflow's readers
  (``connectors.readers``) over the same files, builds samples with ``SampleBuilder`` and one Hugging
  Face tokenizer (``connectors.tokenizer``, loaded once in the main process and inherited by the
  forked workers), keeps a shuffle buffer of ``--shuffle-buffer`` samples per source, draws sources by
  the same weights as the job and packs 4096-token micro-batches with the same tensors as the sink.
  Worker w of rank r keeps the documents at positions r * 4 + w modulo 8 (2 ranks x 4 workers) of each
  pass over a source, and cycles over its files as an epoch loop does, so the buffers fill as they would
  on a real corpus. To keep a run within minutes on 2 cores, each worker tokenizes a document once and
  reuses its token ids on later passes (the cache holds one copy of the worker's share, about 2 MB);
  every buffered sample is still its own array, as re-tokenized samples would be. It stops after
  ``--baseline-micro-batches`` micro-batches.

Two more subprocesses per repeat, to tell the parts apart: the baseline with one-sample shuffle buffers
(its workers, readers and tokenizer without the buffered samples), and one that only imports torch (the
floor both arms share).
Timings are printed for orientation only; nothing is asserted.

**Multimodal mode** (``--multimodal``, sources 1,2,4,8 by default): the same question for sources of images and
clips. Data: every document of the multimodal example's media sources (``examples/build_multimodal_data.py``:
image-text pairs, interleaved documents, clips), shuffled once and dealt round-robin to N WebDataset sources,
each document a sample whose ``.json`` segments name its media members, so every N holds the same samples.
Per N the pipeline runs once (``mixflow run``: N loaders decode and resize the media with the example's
``vision`` section, JPEG frames on the topics; 2 ranks x 2 micro-batches x 4096 tokens and at most 8192 patches
a micro-batch); then, per repeat, one sink process per rank (``KafkaBatchDataset(spec, rank=r)``, which decodes
the frames into ``pixel_values`` on its reading thread) and the torch-only floor are measured as above. There is
no baseline arm: the table is each rank's sink memory against N.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._table import print_table

REPO = Path(__file__).resolve().parent.parent

# Kinds of the example data, the reader each is written for, and the field holding the text.
KINDS = ("code", "docstrings", "topics")
FORMATS = {"code": "parquet", "docstrings": "jsonl", "topics": "text"}
RANKS, MICRO_BATCHES, CAPACITY, MAX_LENGTH, EOD = 2, 2, 4096, 2048, 0
WORKERS = 4
KIB = 1024


# -- PSS sampling ---------------------------------------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: the ppid is the 2nd field after ')'.
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(root: int) -> list[int]:
    children = _children_map()
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def memory_kb(pid: int) -> dict[str, int] | None:
    """kB values of /proc/<pid>/smaps_rollup (Rss, Pss, Pss_Anon, Pss_File, Pss_Shmem, ...); None once the
    process is gone."""
    values = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            rollup = f.read().splitlines()[1:]
    except OSError:
        return None
    for line in rollup:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[name] = int(parts[0])
    return values if "Pss" in values else None


@dataclass
class Peak:
    """Peaks over the samples of one process tree, each metric on its own.

    ``pss_kb``: PSS summed over the tree (what the benchmark reports first). A file-backed page (torch's
    shared libraries) is split among every process on the machine that maps it, and how many such pages
    a process maps depends on what the page cache holds, so this part moves with unrelated processes.
    ``anon_kb``: PSS of anonymous and shared-memory pages summed: the memory the tree allocated itself
    (such pages are shared only between the tree's forked processes), which nothing outside it moves.
    ``rss_kb``: RSS summed, counting shared pages once per process."""

    pss_kb: int = 0
    anon_kb: int = 0
    rss_kb: int = 0
    processes: int = 0
    per_process_kb: list[int] = field(default_factory=list)  # PSS of each process at the PSS peak
    samples: int = 0


class TreeSampler:
    """Samples the memory of a process and its descendants on a thread until stopped; keeps the peaks."""

    def __init__(self, pid: int, interval_s: float) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak = Peak()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        tree = [m for m in (memory_kb(pid) for pid in process_tree(self.pid)) if m is not None]
        peak = self.peak
        peak.samples += 1
        if not tree:
            return
        pss = sum(m["Pss"] for m in tree)
        anon = sum(m.get("Pss_Anon", 0) + m.get("Pss_Shmem", 0) for m in tree)
        if pss > peak.pss_kb:
            peak.pss_kb, peak.processes = pss, len(tree)
            peak.per_process_kb = sorted((m["Pss"] for m in tree), reverse=True)
        peak.anon_kb = max(peak.anon_kb, anon)
        peak.rss_kb = max(peak.rss_kb, sum(m.get("Rss", 0) for m in tree))


@dataclass
class Measured:
    peak: Peak
    seconds: float
    result: dict[str, Any]


def measure(command: list[str], interval_s: float, timeout_s: float = 600) -> Measured:
    """Run ``command`` (a child mode of this script), sampling its tree's PSS; its last stdout line is JSON."""
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, text=True)
    with TreeSampler(process.pid, interval_s) as sampler:
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            raise SystemExit(f"{command} ran past {timeout_s} s:\n{err[-3000:]}") from None
    seconds = time.perf_counter() - began
    if process.returncode != 0:
        raise SystemExit(f"{command} exited {process.returncode}:\n{err[-3000:]}")
    return Measured(sampler.peak, seconds, json.loads(out.strip().splitlines()[-1]))


# -- data and the pipeline run --------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceDir:
    name: str
    reader: str
    root: Path
    weight: int  # bytes of text: the job's mixture weight and the baseline's


def split_example_data(data: Path, out: Path, n: int) -> list[SourceDir]:
    """The example data spread over ``n`` source folders under ``out`` (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    code = [text for f in sorted((data / "code").glob("*.parquet")) for text in pq.read_table(f)["text"].to_pylist()]
    lines = [line for f in sorted((data / "docstrings").glob("*.jsonl")) for line in f.read_bytes().splitlines()]
    docstrings = [line for line in lines if line.strip()]
    topics = [(f.name, f.read_text()) for f in sorted((data / "topics").glob("*.txt"))]
    pool: dict[str, list[Any]] = {"code": code, "docstrings": docstrings, "topics": topics}
    kinds = [KINDS[i % len(KINDS)] for i in range(n)]
    texts: list[list[str]] = [[] for _ in range(n)]  # what goes into each source, as text
    raw: list[list[Any]] = [[] for _ in range(n)]  # ... in the source's own format
    for kind in KINDS:
        targets = [i for i in range(n) if kinds[i] == kind] or [0]
        docs = pool[kind]
        for t, target in enumerate(targets):
            share = docs[t * len(docs) // len(targets) : (t + 1) * len(docs) // len(targets)]
            for doc in share:
                text = doc if kind == "code" else json.loads(doc)["text"] if kind == "docstrings" else doc[1]
                texts[target].append(text)
                raw[target].append(doc if kinds[target] == kind else text)
    sources = []
    for i in range(n):
        name, reader = f"s{i:02d}", FORMATS[kinds[i]]
        root = out / name
        root.mkdir(parents=True)
        if reader == "parquet":
            pq.write_table(
                pa.table({"text": pa.array(raw[i], pa.string())}), root / "part-00000.parquet", row_group_size=64
            )
        elif reader == "jsonl":
            (root / "part-00000.jsonl").write_bytes(b"".join(line + b"\n" for line in raw[i]))
        else:
            for file_name, text in raw[i]:
                (root / file_name).write_text(text)
        sources.append(SourceDir(name, reader, root, sum(len(t.encode()) for t in texts[i])))
    return sources


def write_spec(path: Path, job: str, bootstrap: str, tokenizer: Path, sources: list[SourceDir]) -> None:
    import yaml

    entries = []
    for s in sources:
        entry: dict[str, Any] = {"name": s.name, "reader": s.reader, "path": str(s.root)}
        if s.reader != "text":
            entry["field"] = "text"
        entries.append({**entry, "max_sample_length": MAX_LENGTH, "eod_token_id": EOD})
    spec = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "tokenizer": str(tokenizer),
        "sources": entries,
        "mixture": {"weights": {s.name: s.weight for s in sources}},
        "step": {"ranks": RANKS, "micro_batches": MICRO_BATCHES, "tokens_per_micro_batch": CAPACITY},
        "cost": {"hidden_size": 1024, "num_layers": 16},
        "on_exhausted": "renormalize",
        "seed": 1234,
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


def run_pipeline(spec: Path, job: str, bootstrap: str, state_dir: Path) -> tuple[float, list[str]]:
    mixflow = Path(sys.executable).with_name("mixflow")
    head = [str(mixflow)] if mixflow.exists() else [sys.executable, "-m", "pipeline.cli"]
    command = [
        *head,
        "run",
        "--spec",
        str(spec),
        "--job",
        job,
        "--bootstrap-servers",
        bootstrap,
        "--state-dir",
        str(state_dir),
    ]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"mixflow run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    report = [line for line in done.stdout.splitlines() if line.startswith(("steps ", "each sample"))]
    return time.perf_counter() - began, report


# -- the child processes --------------------------------------------------------------------------------


def child_torch(_: argparse.Namespace) -> dict[str, Any]:
    import torch

    time.sleep(1.0)  # a few samples of the sampler
    return {"torch": torch.__version__}


def child_sink(args: argparse.Namespace) -> dict[str, Any]:
    import torch  # noqa: F401  (a trainer process has it; imported first in both arms)

    from trainer_sink import KafkaBatchDataset, ReadOptions

    dataset = KafkaBatchDataset(args.spec, rank=args.rank, read=ReadOptions(wait_timeout_s=120))
    micro_batches = tokens = 0
    media = {"images": 0, "clips": 0, "pixel_bytes": 0}  # what the vision inputs held, in a job with media
    began = time.perf_counter()
    for micro_batch in dataset:
        micro_batches += 1
        tokens += micro_batch["input_ids"].numel()
        if "pixel_values" in micro_batch:
            media["images"] += len(micro_batch["image_grid_thw"])
            media["clips"] += len(micro_batch["video_grid_thw"])
            for key in ("pixel_values", "pixel_values_videos"):
                media["pixel_bytes"] += micro_batch[key].numel() * micro_batch[key].element_size()
        if args.sink_step_ms:
            time.sleep(args.sink_step_ms / 1000)
    return {
        "micro_batches": micro_batches,
        "tokens": tokens,
        "seconds": time.perf_counter() - began,
        "peak_prefetch_bytes": dataset.peak_prefetch_bytes,
        "prefetch_bytes": dataset.options.prefetch_bytes,
        **media,
    }


class CachingTokenizer:
    """A ``TextTokenizer`` that tokenizes each distinct text once per process (see the module docstring)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[str, Any] = {}

    def encode_batch(self, texts: list[str]) -> list[Any]:
        missing = list(dict.fromkeys(t for t in texts if t not in self.cache))
        for text, ids in zip(missing, self.tokenizer.encode_batch(missing), strict=True):
            self.cache[text] = ids
        return [self.cache[t] for t in texts]


class PerRankBlendedDataset:
    """Per-rank multi-source loading as Megatron-style blended datasets and per-rank DataLoaders do it:
    each DataLoader worker reads every source itself, shuffles each through a buffer, and mixes by weight.

    Made a torch ``IterableDataset`` subclass in ``child_baseline`` (torch is imported there)."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        from connectors import TextTokenizer, make_reader

        self.manifest = manifest
        self.readers = [make_reader(s["reader"], s["name"], s["root"], None, "text") for s in manifest["sources"]]
        self.files = [reader.files() for reader in self.readers]  # listed once, in the main process
        # One tokenizer, loaded in the main process and inherited by the forked workers.
        self.tokenizer = TextTokenizer.from_file(manifest["tokenizer"])

    def _stream(self, k: int, builder: Any, shard: int, shards: int, rng: Any) -> Iterator[tuple[str, Any]]:
        """Source k's samples for this worker, cycling over its files (one epoch after another)."""
        import numpy as np

        from connectors import Document, WorkUnit

        reader, files = self.readers[k], self.files[k]
        rows = {path: reader.layout(path).num_rows for path in files}
        epoch = 0
        while True:
            index = 0
            yielded = False
            for f in rng.permutation(len(files)).tolist():
                unit = WorkUnit(reader.source, files[f], "file", 0, rows[files[f]], epoch=epoch)
                documents = []
                for item in reader.read(unit):
                    if isinstance(item, Document) and index % shards == shard:
                        documents.append(item)
                    index += 1
                for sample in builder.build(documents, epoch=epoch).samples:
                    yielded = True
                    # Its own array: a sample is a view of its unit's tokens, which it would keep alive.
                    yield sample.sample_id, np.array(sample.tokens)
            if not yielded:
                shards, shard = 1, 0  # fewer documents than shards: this worker reads them all
            epoch += 1

    def iterate(self, worker: int, workers: int) -> Iterator[dict[str, Any]]:
        import numpy as np
        import torch

        from connectors import SampleBuilder

        m = self.manifest
        shards, shard = m["ranks"] * workers, m["rank"] * workers + worker
        rng = np.random.default_rng([m["seed"], shard])
        builder = SampleBuilder(CachingTokenizer(self.tokenizer), max_length=m["max_length"], eod_id=m["eod"])
        streams = [self._stream(k, builder, shard, shards, rng) for k in range(len(self.readers))]
        buffers = [[next(stream) for _ in range(m["buffer"])] for stream in streams]
        buffer_bytes = sum(tokens.nbytes for buffer in buffers for _, tokens in buffer)
        weights = np.array([s["weight"] for s in m["sources"]], dtype=np.float64)
        cumulative = np.cumsum(weights / weights.sum())
        step = micro_batch = 0
        ids: list[str] = []
        arrays: list[Any] = []
        used = 0
        while True:
            k = min(int(np.searchsorted(cumulative, rng.random(), side="right")), len(streams) - 1)
            buffer = buffers[k]
            i = int(rng.integers(len(buffer)))
            sample_id, tokens = buffer[i]
            buffer[i] = replacement = next(streams[k])
            buffer_bytes += replacement[1].nbytes - tokens.nbytes
            if used + tokens.size > m["capacity"] and arrays:
                yield _packed(ids, arrays, step, micro_batch, m, worker, buffer_bytes, torch, np)
                micro_batch += 1
                if micro_batch == m["micro_batches"]:
                    step, micro_batch = step + 1, 0
                ids, arrays, used = [], [], 0
            ids.append(sample_id)
            arrays.append(tokens)
            used += tokens.size


def _packed(
    ids: list[str],
    arrays: list[Any],
    step: int,
    micro_batch: int,
    m: dict[str, Any],
    worker: int,
    buffer_bytes: int,
    torch: Any,
    np: Any,
) -> dict[str, Any]:
    """The same tensors as the sink's packed layout (``trainer_sink.tensors``)."""
    lengths = np.array([a.size for a in arrays], dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.concatenate(arrays).astype(np.int32, copy=False)
    labels = np.empty(tokens.size, np.int64)
    labels[:-1] = tokens[1:]
    labels[cu[1:] - 1] = -100
    positions = (np.arange(tokens.size) - np.repeat(cu[:-1], lengths)).astype(np.int32)
    return {
        "input_ids": torch.from_numpy(tokens),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(positions),
        "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
        "max_seqlen": int(lengths.max()),
        "step": step,
        "micro_batch": micro_batch,
        "micro_batches": m["micro_batches"],
        "rank": m["rank"],
        "sample_ids": ids,
        "worker": worker,
        "buffer_bytes": buffer_bytes,
    }


def child_baseline(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class Blended(PerRankBlendedDataset, IterableDataset):
        def __iter__(self) -> Iterator[dict[str, Any]]:
            info = get_worker_info()
            return self.iterate(info.id, info.num_workers) if info else self.iterate(0, 1)

    manifest = json.loads(Path(args.manifest).read_text())
    dataset = Blended(manifest)
    loader = DataLoader(dataset, num_workers=manifest["workers"], batch_size=None)
    micro_batches = tokens = 0
    buffer_bytes: dict[int, int] = {}
    began = time.perf_counter()
    first = None
    for micro_batch in loader:
        first = first or time.perf_counter()
        micro_batches += 1
        tokens += micro_batch["input_ids"].numel()
        worker = micro_batch["worker"]
        buffer_bytes[worker] = max(buffer_bytes.get(worker, 0), micro_batch["buffer_bytes"])
        if micro_batches >= manifest["micro_batches_to_read"]:
            break
    seconds = time.perf_counter() - began
    del loader
    assert torch.is_tensor(micro_batch["input_ids"])
    return {
        "micro_batches": micro_batches,
        "tokens": tokens,
        "seconds": seconds,
        "first_s": (first or time.perf_counter()) - began,
        "buffer_bytes": sum(buffer_bytes.values()),
        "workers_seen": len(buffer_bytes),
    }


# -- the benchmark --------------------------------------------------------------------------------------


@dataclass
class Config:
    n: int
    job: str
    spec: Path
    manifest: Path
    pipeline_s: float
    report: list[str]
    manifest_unbuffered: Path
    sink: list[Measured] = field(default_factory=list)
    baseline: list[Measured] = field(default_factory=list)
    unbuffered: list[Measured] = field(default_factory=list)
    torch: list[Measured] = field(default_factory=list)


def prepare(n: int, args: argparse.Namespace, work: Path, data: Path) -> Config:
    folder = work / f"n{n}"
    sources = split_example_data(data, folder / "data", n)
    job = f"sinkmem-{uuid.uuid4().hex[:6]}-n{n}"
    spec = folder / "spec.yaml"
    write_spec(spec, job, args.bootstrap_servers, data / "tokenizer.json", sources)
    body = {
        "sources": [{"name": s.name, "reader": s.reader, "root": str(s.root), "weight": s.weight} for s in sources],
        "tokenizer": str(data / "tokenizer.json"),
        "rank": 0,
        "ranks": RANKS,
        "micro_batches": MICRO_BATCHES,
        "capacity": CAPACITY,
        "max_length": MAX_LENGTH,
        "eod": EOD,
        "buffer": args.shuffle_buffer,
        "workers": WORKERS,
        "seed": 1234,
        "micro_batches_to_read": args.baseline_micro_batches,
    }
    manifest, unbuffered = folder / "baseline.json", folder / "baseline-unbuffered.json"
    manifest.write_text(json.dumps(body))
    unbuffered.write_text(json.dumps({**body, "buffer": 1}))
    print(f"{n} sources: running the pipeline (mixflow run, job {job}) ...", flush=True)
    try:
        seconds, report = run_pipeline(spec, job, args.bootstrap_servers, folder / "state")
    except SystemExit as exc:  # a shared machine: another job may restart the broker under this one
        print(f"  {exc}\n  the pipeline failed; once more under a fresh job name", flush=True)
        from topics.kafka.admin import delete_job_topics

        delete_job_topics(args.bootstrap_servers, job)
        job = f"sinkmem-{uuid.uuid4().hex[:6]}-n{n}"
        write_spec(spec, job, args.bootstrap_servers, data / "tokenizer.json", sources)
        seconds, report = run_pipeline(spec, job, args.bootstrap_servers, folder / "state")
    print(f"  done in {seconds:.0f} s: {'; '.join(report)}", flush=True)
    return Config(n, job, spec, manifest, seconds, report, unbuffered)


def run_repeat(config: Config, repeat: int, args: argparse.Namespace) -> None:
    me = [sys.executable, str(Path(__file__).resolve())]
    sink = [*me, "--child", "sink", "--spec", str(config.spec), "--sink-step-ms", str(args.sink_step_ms)]
    baseline = [*me, "--child", "baseline", "--manifest", str(config.manifest)]
    unbuffered = [*me, "--child", "baseline", "--manifest", str(config.manifest_unbuffered)]
    arms = [("sink", sink), ("baseline", baseline), ("unbuffered", unbuffered), ("torch", [*me, "--child", "torch"])]
    if repeat % 2:
        arms = [arms[1], arms[0], *arms[2:]]
    for name, command in arms:
        measured = measure(command, args.interval_s)
        getattr(config, name).append(measured)
        extra = ""
        if name != "torch":
            extra = f", {measured.result['micro_batches']} micro-batches in {measured.result['seconds']:.1f} s"
        print(
            f"  {config.n} sources, repeat {repeat}, {name}: peak PSS {measured.peak.pss_kb / KIB:.0f} MiB "
            f"over {measured.peak.processes} processes{extra}",
            flush=True,
        )


# -- the multimodal mode --------------------------------------------------------------------------------

MM_PER_SHARD = 100  # samples per WebDataset shard
MM_PATCHES = 8192  # the vision encoder's patches per micro-batch: 2 per token, as in examples/multimodal.yaml


def multimodal_documents(spec_path: Path) -> list[list[tuple[str, Any]]]:
    """Every document of the multimodal example's media sources (image-text pairs, interleaved documents,
    clips), as parts: text, or ``(kind, extension, bytes)``; in a fixed shuffled order."""
    import random

    from connectors import Document, make_reader
    from connectors.planning import split_file
    from connectors.readers import MediaRef
    from pipeline.spec import load_spec

    spec = load_spec(spec_path)
    documents = []
    for source in (s for s in spec.sources if s.vision is not None):
        reader = make_reader(source.reader.value, source.name, source.path, source.glob, "text", content="media")
        for layout in reader.layouts():
            for unit in split_file(source.name, layout, 1 << 40):
                for item in reader.read(unit):
                    if not isinstance(item, Document):
                        continue
                    parts: list[tuple[str, Any]] = []
                    for part in item.parts or ():
                        if not isinstance(part, MediaRef):
                            parts.append(("text", part))
                        elif part.data is not None:
                            parts.append((part.kind, part.where.rpartition(".")[2], part.data))
                        else:
                            media = Path(source.path) / str(part.path)
                            parts.append((part.kind, media.suffix[1:], media.read_bytes()))
                    documents.append(parts)
    random.Random(1234).shuffle(documents)
    return documents


def write_multimodal_sources(documents: list[list[tuple[str, Any]]], out: Path, n: int) -> list[SourceDir]:
    """Source i gets documents i, i + n, ...: each a WebDataset sample whose ``.json`` segments name its
    media members (``<key>.<k>.<ext>``), the parts in their order, so a sample's tokens and media are the
    same whichever source holds it."""
    import tarfile
    from io import BytesIO

    sources = []
    for i in range(n):
        root = out / f"m{i:02d}"
        root.mkdir(parents=True)
        mine = documents[i::n]
        size = 0
        for start in range(0, len(mine), MM_PER_SHARD):
            with tarfile.open(root / f"shard-{start // MM_PER_SHARD:04d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
                for j, parts in enumerate(mine[start : start + MM_PER_SHARD], start=start):
                    key, segments = f"{j:06d}", []
                    members: list[tuple[str, bytes]] = []
                    for k, part in enumerate(parts):
                        if part[0] == "text":
                            segments.append({"text": part[1]})
                            continue
                        kind, extension, data = part
                        segments.append({kind: f"{k}.{extension}"})
                        members.append((f"{key}.{k}.{extension}", data))
                    members.append((f"{key}.json", json.dumps({"segments": segments}).encode()))
                    for name, payload in members:
                        info = tarfile.TarInfo(name)
                        info.size, info.mtime = len(payload), 0
                        tar.addfile(info, BytesIO(payload))
                        size += len(payload)
        sources.append(SourceDir(f"m{i:02d}", "webdataset", root, size))
    return sources


def write_multimodal_spec(
    path: Path, job: str, bootstrap: str, example: Path, sources: list[SourceDir], epochs: int
) -> None:
    """N WebDataset sources of equal weight, each read ``epochs`` times, with the multimodal example's
    tokenizer and vision section."""
    import yaml

    from pipeline.spec import load_spec

    base = load_spec(example)
    vision = next(s.vision for s in base.sources if s.vision is not None).model_dump(mode="json")  # type: ignore[union-attr]
    entry = {"reader": "webdataset", "epochs": epochs, "max_sample_length": MAX_LENGTH, "eod_token_id": EOD}
    entry["vision"] = vision
    spec = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "tokenizer": str(base.tokenizer),
        "sources": [{"name": s.name, "path": str(s.root), **entry} for s in sources],
        "mixture": {"weights": {s.name: 1 for s in sources}},
        "step": {
            "ranks": RANKS,
            "micro_batches": MICRO_BATCHES,
            "tokens_per_micro_batch": CAPACITY,
            "patches_per_micro_batch": MM_PATCHES,
        },
        "cost": {"hidden_size": 1024, "num_layers": 16, "vision": {"hidden_size": 1024, "num_layers": 24}},
        "on_exhausted": "renormalize",
        "seed": 1234,
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


@dataclass
class MultimodalConfig:
    n: int
    job: str
    spec: Path
    pipeline_s: float
    report: list[str]
    sink: dict[int, list[Measured]] = field(default_factory=dict)  # by rank
    torch: list[Measured] = field(default_factory=list)


def prepare_multimodal(n: int, args: argparse.Namespace, work: Path, documents: list[Any]) -> MultimodalConfig:
    folder = work / f"n{n}"
    sources = write_multimodal_sources(documents, folder / "data", n)
    example = REPO / "examples" / "multimodal.yaml"
    for attempt in range(2):  # a shared machine: another job may restart the broker under this one
        job = f"sinkmem-mm-{uuid.uuid4().hex[:6]}-n{n}"
        spec = folder / "spec.yaml"
        write_multimodal_spec(spec, job, args.bootstrap_servers, example, sources, args.epochs)
        print(f"{n} multimodal sources: running the pipeline (mixflow run, job {job}) ...", flush=True)
        try:
            seconds, report = run_pipeline(spec, job, args.bootstrap_servers, folder / f"state{attempt}")
            break
        except SystemExit as exc:
            if attempt:
                raise
            print(f"  {exc}\n  the pipeline failed; once more under a fresh job name", flush=True)
            from topics.kafka.admin import delete_job_topics

            delete_job_topics(args.bootstrap_servers, job)
    print(f"  done in {seconds:.0f} s: {'; '.join(report)}", flush=True)
    return MultimodalConfig(n, job, spec, seconds, report)


def run_multimodal_repeat(config: MultimodalConfig, repeat: int, args: argparse.Namespace) -> None:
    me = [sys.executable, str(Path(__file__).resolve())]
    ranks = list(range(RANKS)) if repeat % 2 == 0 else list(reversed(range(RANKS)))
    for rank in ranks:
        command = [*me, "--child", "sink", "--spec", str(config.spec), "--rank", str(rank)]
        measured = measure([*command, "--sink-step-ms", str(args.sink_step_ms)], args.interval_s)
        config.sink.setdefault(rank, []).append(measured)
        r = measured.result
        print(
            f"  {config.n} sources, repeat {repeat}, sink rank {rank}: peak PSS {measured.peak.pss_kb / KIB:.0f} MiB, "
            f"{r['micro_batches']} micro-batches, {r['images']} images, {r['clips']} clips in {r['seconds']:.1f} s",
            flush=True,
        )
    config.torch.append(measure([*me, "--child", "torch"], args.interval_s))


def run_multimodal(args: argparse.Namespace) -> int:
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "build_multimodal_data.py"), "--out", str(REPO / "examples" / "data")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    documents = multimodal_documents(REPO / "examples" / "multimodal.yaml")[: args.documents]
    media = sum(part[0] != "text" for parts in documents for part in parts)
    print(f"multimodal data: {len(documents)} documents with {media} images and clips", flush=True)
    work = Path(tempfile.mkdtemp(prefix="sinkmem-mm-"))
    configs: list[MultimodalConfig] = []
    try:
        for n in [int(x) for x in args.sources.split(",")]:
            config = prepare_multimodal(n, args, work, documents)
            configs.append(config)
            for repeat in range(args.repeats):
                run_multimodal_repeat(config, repeat, args)
    finally:
        if not args.keep:
            from topics.kafka.admin import delete_job_topics

            for config in configs:
                delete_job_topics(args.bootstrap_servers, config.job)
            shutil.rmtree(work, ignore_errors=True)
    print_multimodal_tables(configs, args)
    return 0


def print_multimodal_tables(configs: list[MultimodalConfig], args: argparse.Namespace) -> None:
    def med(runs: list[Measured], key: str) -> float:
        return statistics.median(getattr(r.peak, key) for r in runs)

    print()
    print(
        f"Multimodal sources: each rank's sink (KafkaBatchDataset, vision inputs decoded on its reading thread), "
        f"peak PSS and anonymous PSS of its process, MiB, median of {args.repeats} runs sampled every "
        f"{args.interval_s} s; 'over torch' subtracts the torch-only process's anonymous PSS."
    )
    header = (
        "sources",
        "rank",
        "sink PSS",
        "sink anon",
        "anon over torch",
        "torch-only PSS / anon",
        "micro-batches",
        "images + clips",
        "pixel MiB yielded",
        "peak_prefetch_bytes",
        "sink s",
        "pipeline s",
    )
    lines = []
    for c in configs:
        torch_anon = med(c.torch, "anon_kb")
        for rank, runs in sorted(c.sink.items()):
            r = runs[-1].result
            lines.append(
                (
                    str(c.n),
                    str(rank),
                    _mib(med(runs, "pss_kb")),
                    _mib(med(runs, "anon_kb")),
                    _mib(med(runs, "anon_kb") - torch_anon),
                    f"{_mib(med(c.torch, 'pss_kb'))} / {_mib(torch_anon)}",
                    str(r["micro_batches"]),
                    f"{r['images']} + {r['clips']}",
                    f"{r['pixel_bytes'] / KIB / KIB:,.0f}",
                    f"{max(m.result['peak_prefetch_bytes'] for m in runs):,} of {r['prefetch_bytes']:,}",
                    f"{statistics.median(m.result['seconds'] for m in runs):.1f}",
                    f"{c.pipeline_s:.0f}",
                )
            )
    print_table(header, lines)
    if configs:
        for key, what in (("pss_kb", "PSS"), ("anon_kb", "anonymous PSS")):
            values = [med(runs, key) / KIB for c in configs for runs in c.sink.values()]
            print(
                f"sink {what} per rank from {min(values):,.0f} to {max(values):,.0f} MiB over "
                f"{', '.join(str(c.n) for c in configs)} multimodal sources "
                f"(spread {max(values) - min(values):,.0f} MiB)"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", help="numbers of sources, comma-separated (default 1,8,32; multimodal 1,2,4,8)")
    parser.add_argument(
        "--multimodal", action="store_true", help="the multimodal mode: N sources of images and clips, per rank"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--shuffle-buffer", type=int, default=1024, help="baseline: samples per source per worker")
    parser.add_argument("--baseline-micro-batches", type=int, default=400)
    parser.add_argument("--sink-step-ms", type=float, default=0.0, help="mixflow: sleep per micro-batch")
    parser.add_argument("--interval-s", type=float, default=0.05, help="PSS sampling interval")
    parser.add_argument("--quick", action="store_true", help="1 and 8 sources, 1 repeat, 100 baseline micro-batches")
    parser.add_argument("--keep", action="store_true", help="keep the data, specs and the job's topics")
    parser.add_argument("--child", choices=["sink", "baseline", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--documents", type=int, help="multimodal: only this many documents (default: all)")
    parser.add_argument("--epochs", type=int, default=1, help="multimodal: passes over the data (a longer job)")
    parser.add_argument("--manifest", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = {"sink": child_sink, "baseline": child_baseline, "torch": child_torch}[args.child](args)
        print(json.dumps(result), flush=True)
        return 0
    if args.quick:
        args.sources, args.repeats, args.baseline_micro_batches = "1,8", 1, 100
    if args.multimodal:
        args.sources = args.sources or "1,2,4,8"
        return run_multimodal(args)
    args.sources = args.sources or "1,8,32"

    subprocess.run(
        [sys.executable, str(REPO / "examples" / "build_example_data.py"), "--out", str(REPO / "examples" / "data")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    data = REPO / "examples" / "data"
    work = Path(tempfile.mkdtemp(prefix="sinkmem-"))
    configs = []
    try:
        for n in [int(x) for x in args.sources.split(",")]:
            config = prepare(n, args, work, data)
            configs.append(config)
            for repeat in range(args.repeats):
                run_repeat(config, repeat, args)
    finally:
        if not args.keep:
            from topics.kafka.admin import delete_job_topics

            for config in configs:
                delete_job_topics(args.bootstrap_servers, config.job)
            shutil.rmtree(work, ignore_errors=True)
    print_tables(configs, args)
    return 0


def _mib(kb: float) -> str:
    return f"{kb / KIB:,.0f}"


def print_tables(configs: list[Config], args: argparse.Namespace) -> None:
    def med(runs: list[Measured], key: str) -> float:
        return statistics.median(getattr(r.peak, key) for r in runs)

    def ratios(c: Config, key: str) -> str:
        values = [getattr(b.peak, key) / getattr(s.peak, key) for s, b in zip(c.sink, c.baseline, strict=True)]
        return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"

    print()
    print(
        f"Peak PSS summed over the process tree, MiB; median of {args.repeats} runs, sampled every "
        f"{args.interval_s} s. baseline per process: PSS of each process at the baseline's peak (main "
        "first). RSS sum counts pages shared by the forked workers once per process."
    )
    header = (
        "sources",
        "mixflow PSS",
        "baseline PSS",
        "ratio [min-max]",
        "torch-only PSS",
        "baseline, 1-sample buffers PSS",
        "mixflow RSS sum",
        "baseline RSS sum",
        "baseline per process",
    )
    lines = [header]
    for c in configs:
        lines.append(
            (
                str(c.n),
                _mib(med(c.sink, "pss_kb")),
                _mib(med(c.baseline, "pss_kb")),
                ratios(c, "pss_kb"),
                _mib(med(c.torch, "pss_kb")),
                _mib(med(c.unbuffered, "pss_kb")),
                _mib(med(c.sink, "rss_kb")),
                _mib(med(c.baseline, "rss_kb")),
                "+".join(_mib(kb) for kb in c.baseline[-1].peak.per_process_kb),
            )
        )
    print_table(lines[0], lines[1:])

    print()
    print(
        "The same runs, anonymous PSS only (anonymous + shared-memory pages: what the tree allocated itself, "
        "which other processes on the machine do not move); 'over torch' subtracts the torch-only process. "
        "MiB, medians."
    )
    header = (
        "sources",
        "mixflow anon",
        "baseline anon",
        "ratio [min-max]",
        "torch-only anon",
        "mixflow over torch",
        "baseline over torch",
        "ratio over torch",
        "baseline, 1-sample buffers anon",
    )
    lines = [header]
    for c in configs:
        torch_anon = med(c.torch, "anon_kb")
        sink_over, base_over = med(c.sink, "anon_kb") - torch_anon, med(c.baseline, "anon_kb") - torch_anon
        lines.append(
            (
                str(c.n),
                _mib(med(c.sink, "anon_kb")),
                _mib(med(c.baseline, "anon_kb")),
                ratios(c, "anon_kb"),
                _mib(torch_anon),
                _mib(sink_over),
                _mib(base_over),
                f"{base_over / max(sink_over, 1):.1f}x",
                _mib(med(c.unbuffered, "anon_kb")),
            )
        )
    print_table(lines[0], lines[1:])

    print()
    print(
        "What each arm read: the pipeline fill (mixflow run, once per N), the sink's peak_prefetch_bytes, the "
        "baseline's shuffle buffers (token bytes summed over its workers); seconds: medians, for orientation"
    )
    header = (
        "sources",
        "pipeline s",
        "mixflow micro-batches",
        "mixflow tokens",
        "mixflow s",
        "peak_prefetch_bytes",
        "baseline micro-batches",
        "baseline s (to first)",
        "baseline buffers MiB",
    )
    lines = [header]
    for c in configs:
        s, b = c.sink[-1].result, c.baseline[-1].result
        lines.append(
            (
                str(c.n),
                f"{c.pipeline_s:.0f}",
                str(s["micro_batches"]),
                f"{s['tokens']:,}",
                f"{statistics.median(r.result['seconds'] for r in c.sink):.1f}",
                f"{max(r.result['peak_prefetch_bytes'] for r in c.sink):,} of {s['prefetch_bytes']:,}",
                str(b["micro_batches"]),
                f"{statistics.median(r.result['seconds'] for r in c.baseline):.1f} "
                f"({statistics.median(r.result['first_s'] for r in c.baseline):.1f})",
                f"{b['buffer_bytes'] / KIB / KIB:,.0f} ({b['workers_seen']} workers)",
            )
        )
    print_table(lines[0], lines[1:])

    if configs:
        last = configs[-1]
        print()
        torch_anon = med(last.torch, "anon_kb")
        over = (med(last.baseline, "anon_kb") - torch_anon) / max(med(last.sink, "anon_kb") - torch_anon, 1)
        for key, what in (("pss_kb", "PSS"), ("anon_kb", "anonymous PSS")):
            ratio = med(last.baseline, key) / med(last.sink, key)
            values = [med(c.sink, key) / KIB for c in configs]
            print(
                f"{what}: target >= 13.5x less for mixflow at {last.n} sources: "
                f"{'met' if ratio >= 13.5 else 'not met'} ({ratio:.2f}x); mixflow from {min(values):,.0f} to "
                f"{max(values):,.0f} MiB over {', '.join(str(c.n) for c in configs)} sources "
                f"(spread {max(values) - min(values):,.0f} MiB)"
            )
        print(
            f"anonymous PSS over the torch-only process at {last.n} sources: {over:.1f}x less for mixflow "
            f"({'at least' if over >= 13.5 else 'below'} 13.5x)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
