"""The multimodal example at a small size: images, interleaved documents, clips and text rendered offline,
loaded, mixed under both capacities and trained on by the example VLM with DDP; the run's report checks
every sample exactly once (media bytes included) and the trainer's micro-batches."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.loader_support import REPO

EXAMPLES = REPO / "examples"
TRAINER = (
    "{python} -m torch.distributed.run --standalone --nproc_per_node 2 examples/train.py --spec {spec} "
    "--out {out} --checkpoint-every 5 --resume --threads 1 --vision --d-model 32 --layers 1 --heads 2 "
    "--vocab-size 8196 --vision-width 32 --vision-depth 1"
)


def _builder():
    sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location("build_multimodal_data", EXAMPLES / "build_multimodal_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spec(tmp_path: Path, data: Path, job: str, bootstrap: str) -> Path:
    body = yaml.safe_load((EXAMPLES / "multimodal.yaml").read_text())
    body["job"] = job
    body["kafka"]["bootstrap_servers"] = bootstrap
    body["tokenizer"] = str(data / "mm-tokenizer.json")
    for source in body["sources"]:
        source["path"] = str(data / Path(source["path"]).name)
    body["step"]["tokens_per_micro_batch"] = 512
    body["step"]["patches_per_micro_batch"] = 1024
    path = tmp_path / "multimodal.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.mark.kafka
def test_the_multimodal_example_runs_end_to_end(kafka_bootstrap: str, unique_name: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    _builder().build(data, pairs=60, documents=12, clips=8, limit=12)
    spec = _spec(tmp_path, data, unique_name, kafka_bootstrap)
    command = [sys.executable, "-m", "pipeline.cli", "run", "--spec", str(spec), "--job", unique_name]
    command += ["--state-dir", str(tmp_path / "state"), "--trainer", TRAINER]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=420)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "each sample exactly once: yes" in run.stdout, run.stdout
    assert "every committed source sample reached a rank topic: yes" in run.stdout, run.stdout
    assert "the trainer received every micro-batch exactly as written: yes" in run.stdout, run.stdout
    assert "dead_letters': 0" in run.stdout and "training loss" in run.stdout, run.stdout
