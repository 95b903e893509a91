"""The README's main path at a small size: `mixflow run` with a DDP training command beside the pipeline,
and a report whose exactly-once checks cover the sources, the rank topics and what the trainer received."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.loader_support import REPO, build_example_data, write_spec

TRAINER = (
    "{python} -m torch.distributed.run --standalone --nproc_per_node 2 examples/train.py --spec {spec} "
    "--out {out} --steps 12 --checkpoint-every 5 --threads 1 --d-model 32 --layers 1 --heads 2 --vocab-size 1024"
)


@pytest.mark.kafka
def test_run_with_a_trainer_reports_exactly_once_end_to_end(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    data = build_example_data(tmp_path / "data", limit=12)
    spec = write_spec(tmp_path, unique_name, kafka_bootstrap, data, on_exhausted="renormalize",
                      step={"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512})  # fmt: skip
    command = [
        sys.executable, "-m", "pipeline.cli", "run", "--spec", str(spec), "--job", unique_name,
        "--state-dir", str(tmp_path / "state"), "--trainer", TRAINER,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = done.stdout
    assert "each sample exactly once: yes" in report, report
    assert "every committed source sample reached a rank topic: yes" in report
    trained = "the trainer received every micro-batch exactly as written: yes (48 micro-batches on 2 ranks, steps 0-11"
    assert trained in report, report
    assert "tokens into the ranks:" in report and "trainer-side memory per rank" in report
