"""The multimodal example at a small size: images, interleaved documents, clips and text rendered offline,
loaded, mixed under both capacities and trained on by the example VLM with DDP; the run's report checks
every sample exactly once (media bytes included) and the trainer's micro-batches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.loader_support import REPO
from tests.multimodal_example_support import multimodal_data_builder, multimodal_spec

TRAINER = (
    "{python} -m torch.distributed.run --standalone --nproc_per_node 2 examples/train.py --spec {spec} "
    "--out {out} --checkpoint-every 5 --resume --threads 1 --vision --d-model 32 --layers 1 --heads 2 "
    "--vocab-size 8196 --vision-width 32 --vision-depth 1"
)


@pytest.mark.kafka
def test_the_multimodal_example_runs_end_to_end(kafka_bootstrap: str, unique_name: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    multimodal_data_builder().build(data, pairs=60, documents=12, clips=8, limit=12)
    spec = multimodal_spec(tmp_path, data, unique_name, kafka_bootstrap)
    command = [sys.executable, "-m", "pipeline.cli", "run", "--spec", str(spec), "--job", unique_name]
    command += ["--state-dir", str(tmp_path / "state"), "--trainer", TRAINER]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=420)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "each sample exactly once: yes" in run.stdout, run.stdout
    assert "every committed source sample reached a rank topic: yes" in run.stdout, run.stdout
    assert "the trainer received every micro-batch exactly as written: yes" in run.stdout, run.stdout
    assert "dead_letters': 0" in run.stdout and "training loss" in run.stdout, run.stdout
