"""The README's trainer snippets run as written: each is taken from the README as it is and run as a training
script under torchrun, 2 processes on CPU (gloo; ``tests/readme_snippet_run.py`` stands in for what the CPU lacks),
on a job laid out as the example's (``job.yaml`` is examples/example.yaml under another job name, whose rank
topics ``tests.integration_support`` writes: 2 ranks x 2 micro-batches, token ids in the example's vocabulary),
and ends with its framework's checkpoint of the job's step 10, which holds the sink's state at step 10."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.integration_support import REPO, Jobs, finish, start, write_jobs

pytestmark = pytest.mark.kafka

RUNNER = REPO / "tests" / "readme_snippet_run.py"
STEPS = 10  # what every snippet trains
SNIPPETS = {
    "huggingface": ("### The Hugging Face Trainer", "transformers"),
    "lightning": ("### Lightning", "lightning"),
    "torchtitan": ("### torchtitan", "torchtitan"),
    "megatron": ("### Megatron-Core and Megatron-LM", "megatron.core"),
}


def readme_snippet(heading: str) -> str:
    """The first Python block after ``heading`` in the README."""
    readme = (REPO / "README.md").read_text()
    at = readme.index(f"\n{heading}\n")
    block = re.search(r"```python\n(.*?)```", readme[at:], re.DOTALL)
    assert block is not None, f"no Python block after {heading!r} in the README"
    return block.group(1)


def saved_sink_step(framework: str, folder: Path) -> int:
    """The step of the sink state in the checkpoint each snippet writes at step 10 (rank 0's)."""
    if framework == "huggingface":
        saved = json.loads((folder / "runs/hf/checkpoint-10/mixflow-sink-rank0.json").read_text())["sink"]
    elif framework == "lightning":
        import torch

        checkpoint = torch.load(folder / "runs/lightning/last.ckpt", map_location="cpu", weights_only=False)
        assert checkpoint["global_step"] == STEPS
        saved = checkpoint["MixflowDataModule"]["sink"]
    elif framework == "torchtitan":
        import torch.distributed.checkpoint as dcp

        state = {"dataloader": {"dp_rank_0": "", "world_size": 0}}
        dcp.load(state, checkpoint_id=str(folder / "outputs/checkpoint/step-10"), no_dist=True)
        saved = json.loads(state["dataloader"]["dp_rank_0"])
    else:
        assert (folder / "runs/megatron/latest_checkpointed_iteration.txt").read_text() == "10\n"
        saved = json.loads((folder / "runs/megatron/iter_0000010/mixflow-sink-rank0.json").read_text())["sink"]
    assert saved["micro_batch"] == 0
    return saved["step"]


@pytest.fixture(scope="module")
def example_job(kafka_bootstrap: str) -> Jobs:
    return write_jobs(kafka_bootstrap, "readme", rank_counts=(2,))


@pytest.mark.parametrize("framework", SNIPPETS)
def test_the_readmes_snippet_trains_a_job_laid_out_as_the_examples(
    framework: str, example_job: Jobs, tmp_path: Path
) -> None:
    heading, package = SNIPPETS[framework]
    pytest.importorskip(package)
    (tmp_path / "train.py").write_text(readme_snippet(heading))
    spec = (REPO / "examples" / "example.yaml").read_text()
    spec = spec.replace("\njob: example\n", f"\njob: {example_job.names[2]}\n")
    spec = spec.replace("bootstrap_servers: localhost:9092", f"bootstrap_servers: {example_job.bootstrap}")
    (tmp_path / "job.yaml").write_text(spec)
    finish(start(RUNNER, 2, tmp_path, framework, str(tmp_path)), tmp_path)
    assert saved_sink_step(framework, tmp_path) == STEPS
