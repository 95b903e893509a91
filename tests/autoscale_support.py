"""Shared by the autoscaling test and benchmark: a job of three text sources of many small files (each file
one work unit, so that several loaders can share a source), in which ``code`` is tokenized with a tokenizer
that takes 500 us more per token (``tests/expensive_tokenizer``): its loaders make about 10x fewer tokens per
second than the others'. Jobs run with ``mixflow run`` in processes that load that
tokenizer wrapper."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
WRAPPER = REPO / "tests" / "expensive_tokenizer"
# A cheap loader spends about 50 us per token here: 500 us more makes ``code`` about 10x as expensive, in time
# that does not depend on how busy the machine's 2 cores are.
COSTS = {"code": "wait500"}
SOURCES = ("code", "docs", "notes")


def build_job_data(out: Path, files: dict[str, int], bytes_per_file: int = 4096) -> Path:
    """``files[source]`` text files of ``bytes_per_file`` characters per source, cut from the standard
    library's Python files (the same every time), and the example tokenizer."""
    stdlib = Path(os.__file__).parent
    pieces: list[str] = []
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        pieces += [text[i : i + bytes_per_file] for i in range(0, len(text) - bytes_per_file, bytes_per_file)]
        if len(pieces) >= sum(files.values()):
            break
    for source, count in files.items():
        folder = out / source
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (folder / f"part-{i:05d}.txt").write_text(pieces.pop(), encoding="utf-8")
    train_tokenizer(_stdlib_texts(stdlib, 2_000_000), 8192, out / "tokenizer.json")  # no examples/data/ needed
    return out


def _stdlib_texts(stdlib: Path, size: int) -> list[str]:
    texts: list[str] = []
    for path in sorted(stdlib.glob("*.py")):
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
        size -= len(texts[-1])
        if size <= 0:
            break
    return texts


def train_tokenizer(texts: list[str], vocab_size: int, path: Path) -> None:
    """The example's byte-level BPE tokenizer (``examples/build_example_data.py``), trained on ``texts``."""
    spec = importlib.util.spec_from_file_location("build_example_data", REPO / "examples" / "build_example_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.train_tokenizer(texts, vocab_size, path)


def expensive_tokenizer(data: Path, cost: str) -> Path:
    """A copy of the data's tokenizer named for the wrapper: ``cost`` ``costly<N>`` tokenizes every batch N
    times over, ``wait<U>`` sleeps U microseconds per token."""
    path = data / f"tokenizer.{cost}.json"
    if not path.exists():
        shutil.copyfile(data / "tokenizer.json", path)
    return path


def wrapper_env() -> dict[str, str]:
    """The environment of a job whose processes load the tokenizer wrapper at start-up."""
    paths = [str(WRAPPER), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def write_job_spec(
    folder: Path,
    job: str,
    bootstrap: str,
    data: Path,
    loaders: dict[str, int],
    autoscaling: dict | None = None,
    bounds: dict[str, tuple[int, int]] | None = None,
    weights: dict[str, float] | None = None,
    costs: dict[str, str] | None = None,
    on_exhausted: str = "stop",
    constructor: dict | None = None,
) -> Path:
    """The heterogeneous job: ``loaders`` to start per source, autoscaled within ``bounds`` when
    ``autoscaling`` (the spec's section) is given; a source in ``costs`` (default ``COSTS``) is tokenized
    that many times over."""
    sources: list[dict] = []
    for name in SOURCES:
        source = {"name": name, "reader": "text", "path": str(data / name), "loaders": loaders[name]}
        source.update(max_sample_length=512, eod_token_id=0)
        if cost := (COSTS if costs is None else costs).get(name):
            source["tokenizer"] = str(expensive_tokenizer(data, cost))
        if bounds and name in bounds:
            source["autoscale"] = {"min": bounds[name][0], "max": bounds[name][1]}
        sources.append(source)
    spec: dict = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "tokenizer": str(data / "tokenizer.json"),
        "sources": sources,
        "mixture": {"weights": weights or dict.fromkeys(SOURCES, 1.0)},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512},
        "cost": {"alpha": 1.0, "beta": 100.0},
        "seed": 7,
        "on_exhausted": on_exhausted,
    }
    if autoscaling is not None:
        spec["autoscaling"] = {"enabled": True, **autoscaling}
    if constructor is not None:
        spec["constructor"] = constructor
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_job(spec: Path, state_dir: Path, timeout_s: float, trainer: str | None = None) -> subprocess.CompletedProcess:
    """``mixflow run`` of ``spec`` (its own job name), with the tokenizer wrapper loaded; ``trainer`` is
    its ``--trainer`` command."""
    command = [sys.executable, "-m", "pipeline.cli", "run", "--spec", str(spec), "--state-dir", str(state_dir)]
    command += ["--trainer", trainer] if trainer else []
    return subprocess.run(
        command, cwd=REPO, env=wrapper_env(), capture_output=True, text=True, timeout=timeout_s, check=False
    )


def job_folder(state_dir: Path) -> Path:
    """The folder of the one job ``mixflow run`` ran under ``state_dir`` (``jobs/<job>/``)."""
    folders = [p for p in (state_dir / "jobs").iterdir() if p.is_dir()]
    assert len(folders) == 1, f"expected one job folder under {state_dir / 'jobs'}, found {folders}"
    return folders[0]


def decisions(state_dir: Path) -> list[dict]:
    """The autoscaler's decisions of a ``mixflow run`` (``autoscale.jsonl`` in its job folder)."""
    path = job_folder(state_dir) / "autoscale.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
