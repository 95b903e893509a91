"""The README's main path at a small size: `mixflow run` with a DDP training command beside the pipeline,
a report whose exactly-once checks cover the sources, the rank topics and what the trainer received, and a
supervisor that starts a killed role again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kafka_support import TopicGrowth
from tests.loader_support import REPO, build_example_data, write_spec
from topics.names import JobTopics

TRAINER = (
    "{python} -m torch.distributed.run --standalone --nproc_per_node 2 examples/train.py --spec {spec} "
    "--out {out} --steps 12 --checkpoint-every 5 --resume --threads 1 --d-model 32 --layers 1 --heads 2 "
    "--vocab-size 1024"
)


def _run(spec: Path, job: str, state: Path) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "run",
        "--spec",
        str(spec),
        "--job",
        job,
        "--state-dir",
        str(state),
        "--trainer",
        TRAINER,
    ]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.kafka
def test_run_with_a_trainer_reports_exactly_once_end_to_end(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    data = build_example_data(tmp_path / "data", limit=12)
    spec = write_spec(
        tmp_path,
        unique_name,
        kafka_bootstrap,
        data,
        on_exhausted="renormalize",
        step={"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512},
    )
    run = _run(spec, unique_name, tmp_path / "state")
    # The supervisor names each role's pid as it starts it; the constructor is killed once it has written
    # a few steps, and must be started again and finish the job with nothing lost or repeated.
    pid = None
    for line in run.stderr:  # a pipe: _run asks for one
        if found := re.search(r"started construct \(pid (\d+)\)", line):
            pid = int(found.group(1))
            break
    assert pid is not None, "the supervisor did not start the constructor"
    growth = TopicGrowth(kafka_bootstrap, [JobTopics(unique_name).state])
    growth.wait_for(6, lambda: run.poll() is None, timeout_s=120)
    growth.close()
    os.kill(pid, signal.SIGKILL)
    stdout, stderr = run.communicate(timeout=280)
    assert run.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "roles restarted after dying: construct 1" in stdout, stdout + stderr[-3000:]
    assert "each sample exactly once: yes" in stdout, stdout
    assert "every committed source sample reached a rank topic: yes" in stdout
    trained = "the trainer received every micro-batch exactly as written: yes (48 micro-batches on 2 ranks, steps 0-11"
    assert trained in stdout, stdout
    assert "tokens into the ranks:" in stdout and "trainer-side memory per rank" in stdout
