"""The README's snippets run as written. Each trainer snippet is taken from the README as it is and run as a
training script under torchrun, 2 processes on CPU (gloo; ``tests/readme_snippet_run.py`` stands in for what the
CPU lacks), on a job laid out as the example's (``job.yaml`` is examples/example.yaml under another job name, whose
rank topics ``tests.integration_support`` writes: 2 ranks x 2 micro-batches, token ids in the example's
vocabulary), and ends with its framework's checkpoint of the job's step 10, which holds the sink's state at step
10. The "your own job" block's spec and commands run on a small JSONL corpus and a tokenizer trained on it, and
the sink reads what they wrote."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.autoscale_support import train_tokenizer
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


def readme_blocks(heading: str) -> list[tuple[str, str]]:
    """The fenced blocks between ``heading`` and the next heading of the README, as (language, text)."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index(f"\n{heading}\n") + len(heading) + 2 :]
    section = section[: re.search(r"^#{1,6} ", section, re.MULTILINE).start()]
    return re.findall(r"^```(\w*)\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def own_corpus(folder: Path, documents: int = 200) -> list[str]:
    """``folder/corpus/part-0.jsonl``: ``documents`` pieces of the standard library's Python files as
    ``{"text": ...}``; returns the texts."""
    texts: list[str] = []
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        source = path.read_text(encoding="utf-8", errors="replace")
        texts += [source[i : i + 700] for i in range(0, len(source) - 700, 700)]
        if len(texts) >= documents:
            break
    (folder / "corpus").mkdir(parents=True)
    lines = [json.dumps({"text": text}) for text in texts[:documents]]
    (folder / "corpus" / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    return texts[:documents]


def test_the_readmes_own_job_block_runs_as_written(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec as written (under a job name of the test's own) beside a JSONL corpus and its tokenizer, and the
    commands as written, from the repository root; the session's broker stands in for ``mixflow stack up``. Then
    each rank's sink, made from the spec, reads every step the run wrote."""
    pytest.importorskip("torch")
    (spec_language, spec), (commands_language, commands) = readme_blocks("### Your own job")
    assert (spec_language, commands_language) == ("yaml", ""), "the block is a YAML spec, then the commands"
    assert len(spec.splitlines()) == 6, "the spec is six lines"
    spec_path = tmp_path / "my-corpus.yaml"
    spec_path.write_text(re.sub(r"^job: .*$", f"job: {unique_name}", spec, count=1, flags=re.MULTILINE))
    train_tokenizer(own_corpus(tmp_path), 1024, tmp_path / "tokenizer.json")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    env = {**os.environ, "MIXFLOW_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(REPO)}
    lines = [shlex.split(line, comments=True) for line in commands.splitlines() if line.strip()]
    assert lines[0] == [".venv/bin/mixflow", "stack", "up"], "the block starts a broker first"
    for words in lines[1:]:
        command = [str(spec_path) if word == "my-corpus.yaml" else word for word in words]
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{shlex.join(words)} exited {done.returncode}:\n{output[-3000:]}"
    assert "each sample exactly once: yes" in output, output[-3000:]
    steps = re.search(r"^steps (\d+), samples", output, re.MULTILINE)
    assert steps is not None and int(steps.group(1)) > 0, output[-3000:]

    from trainer_sink import KafkaBatchDataset

    for rank in range(2):
        dataset = KafkaBatchDataset(str(spec_path), rank=rank, wait_timeout_s=30, report_progress=False)
        seen = [(mb["step"], mb["micro_batch"], int(mb["input_ids"].numel())) for mb in dataset]
        assert [(s, m) for s, m, _ in seen] == [(s, m) for s in range(int(steps.group(1))) for m in range(2)]
        assert sum(tokens for *_, tokens in seen) > 0, f"rank {rank}: empty micro-batches only"
