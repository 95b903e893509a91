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
from topics.formats.names import JobTopics

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


@pytest.mark.kafka
def test_run_states_dead_letters_per_source_and_fails_a_source_that_lost_more_than_allowed(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    from pipeline.spec import load_spec
    from pipeline.tools.observe.rank_topics import job_report

    data = build_example_data(tmp_path / "data", limit=3)
    docstrings = sorted((data / "docstrings").glob("*.jsonl"))[0]
    good = len(docstrings.read_text().splitlines())
    with docstrings.open("a") as out:  # records that are no JSON: each a dead letter, the rest goes on
        out.writelines(f"not json {k}\n" for k in range(4))
    spec = write_spec(tmp_path, unique_name, kafka_bootstrap, data, on_exhausted="renormalize")
    command = [sys.executable, "-m", "pipeline.cli", "run", "--spec", str(spec), "--state-dir", str(tmp_path / "s")]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=280)
    lines = run.stdout.splitlines()
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "each sample exactly once: yes" in lines, run.stdout
    share = f"{4 / (good + 4):.1%}"
    assert "dead letters: 4 of " in run.stdout and f"docstrings 4 of {good + 4} records ({share})" in run.stdout
    assert "  docstrings: 4 x invalid JSON: Expecting value: line 1 column 1 (char 0)" in lines, run.stdout
    assert lines[-1] == (
        f"each source lost at most 1.0% of its records to dead letters: NO (source docstrings 4 of {good + 4} "
        f"records ({share}): 4 x invalid JSON: Expecting value: line 1 column 1 (char 0)); --allow-dead-letters "
        "SHARE allows more"
    ), run.stdout
    # The same job judged with a larger allowance: what `--allow-dead-letters 50%` gives.
    config = load_spec(spec).kafka.client_config(kafka_bootstrap, role="operator")
    report = job_report(config, load_spec(spec), allowed_dead_letters=0.5)
    assert report.ok and report.lines()[-1] == "each source lost at most 50.0% of its records to dead letters: yes"
