"""The Hugging Face ``Trainer`` integration (``MixflowTrainer``) with transformers' own loop and checkpoints,
2 data-parallel processes on CPU (gloo): a run killed by SIGKILL and resumed with ``resume_from_checkpoint``
trains exactly the micro-batches of an uninterrupted run, and a checkpoint taken at 2 ranks resumes on the
same samples laid out for 1 and for 3 ranks with every sample trained exactly once (``tests.integration_base``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.integration_base import TrainerIntegration
from tests.integration_support import MICRO_BATCHES, SAVE_EVERY, STEPS, Jobs, write_jobs
from trainer_sink.integrations.hf_trainer import last_complete_checkpoint, padding_free_batch

pytestmark = pytest.mark.kafka


class TestHuggingFace(TrainerIntegration):
    script = Path(__file__).resolve().parent / "integration_hf_train.py"
    label = "hf"
    resume_args = ("--resume",)

    def resumed_at(self, out: Path) -> int:
        checkpoint = last_complete_checkpoint(out / "checkpoints")
        assert checkpoint is not None, "no whole checkpoint before the kill"
        return int(checkpoint.rsplit("-", 1)[1])

    def copy_checkpoint(self, reference: Path, step: int, out: Path) -> tuple[str, ...]:
        saved = out / "checkpoints" / f"checkpoint-{step}"
        shutil.copytree(reference / "checkpoints" / f"checkpoint-{step}", saved)
        return ("--resume-from", str(saved))

    def check_reference_checkpoints(self, reference: Path) -> None:
        checkpoints = reference / "checkpoints"
        assert last_complete_checkpoint(checkpoints) == str(checkpoints / f"checkpoint-{STEPS}")
        assert {p.name for p in (checkpoints / f"checkpoint-{SAVE_EVERY}").glob("mixflow-sink-rank*.json")} == {
            "mixflow-sink-rank0.json",
            "mixflow-sink-rank1.json",
        }


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=8), min_size=1, max_size=5))
def test_padding_free_batches_are_what_transformers_flattening_collator_makes(samples: list[list[int]]) -> None:
    import numpy as np
    import torch
    from transformers import DataCollatorWithFlattening

    from topics.formats.batch import Batch
    from trainer_sink.tensors import micro_batch_tensors

    ids = [f"s/{i}" for i in range(len(samples))]
    batch = Batch.from_arrays(
        step=0, rank=0, ranks=1, micro_batches=2, capacity=64, sample_ids=ids, sources=["s"] * len(samples),
        micro_batch=[0] * len(samples), offsets=np.cumsum([0, *map(len, samples)]),
        tokens=np.array([t for s in samples for t in s], np.int32),
    )  # fmt: skip
    full, empty = micro_batch_tensors(batch)
    ours = padding_free_batch(full)
    theirs = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": s} for s in samples])
    for key in ("input_ids", "labels", "position_ids"):
        assert torch.equal(ours[key], theirs[key]), key
    assert ours["mixflow"]["sample_ids"] == ids
    flash = padding_free_batch(full, flash_attn_kwargs=True)
    assert flash["cu_seq_lens_q"].tolist() == np.cumsum([0, *map(len, samples)]).tolist()
    assert flash["max_length_q"] == max(map(len, samples))
    lone = padding_free_batch(empty, pad_token_id=1)
    assert lone["input_ids"].tolist() == [[1]] and lone["labels"].tolist() == [[-100]]


@pytest.fixture(scope="module")
def two_rank_job(kafka_bootstrap: str) -> Jobs:
    return write_jobs(kafka_bootstrap, "hf-ranks", rank_counts=(2,))


def test_a_run_of_fewer_data_parallel_ranks_than_the_job_is_refused_before_a_batch_trains(
    two_rank_job: Jobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process (as ``torchrun --nproc_per_node 1`` runs it) on a job of two ranks would train rank 0's half
    of each step and exit 0; refused at the first micro-batch, naming the replay that fits the run, whether the
    sink's rank comes from the environment or is given."""
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from topics.errors import MixflowError
    from trainer_sink import KafkaBatchDataset
    from trainer_sink.integrations.hf_trainer import MixflowTrainer

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    config = LlamaConfig(
        vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=256,
    )  # fmt: skip
    for rank in (None, 0):
        args = TrainingArguments(
            output_dir=str(tmp_path / f"rank-{rank}"), max_steps=2, gradient_accumulation_steps=MICRO_BATCHES,
            report_to=[], use_cpu=True, disable_tqdm=True,
        )  # fmt: skip
        sink = KafkaBatchDataset(job=two_rank_job.names[2], bootstrap_servers=two_rank_job.bootstrap, rank=rank)
        trainer = MixflowTrainer(model=LlamaForCausalLM(config), args=args, sink=sink)
        with pytest.raises(MixflowError, match=r"holds steps for 2 data-parallel ranks.*replay --ranks 1\)"):
            trainer.train()
        assert trainer.state.global_step == 0 and trainer.current_micro_batch is None
