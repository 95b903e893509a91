"""The Hugging Face ``Trainer`` integration (``MixflowTrainer``) with transformers' own loop and checkpoints,
2 data-parallel processes on CPU (gloo): a run killed by SIGKILL and resumed with ``resume_from_checkpoint``
trains exactly the micro-batches of an uninterrupted run, and a checkpoint taken at 2 ranks resumes on the
same samples laid out for 1 and for 3 ranks with every sample trained exactly once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.integration_support import (
    MICRO_BATCHES,
    SAVE_EVERY,
    STEPS,
    Jobs,
    finish,
    kill_rank_after,
    received,
    start,
    write_jobs,
)
from trainer_sink.integrations.hf_trainer import last_complete_checkpoint, padding_free_batch

pytestmark = pytest.mark.kafka

SCRIPT = Path(__file__).resolve().parent / "integration_hf_train.py"


@pytest.fixture(scope="module")
def jobs(kafka_bootstrap: str) -> Jobs:
    return write_jobs(kafka_bootstrap, "hf")


@pytest.fixture(scope="module")
def reference(jobs: Jobs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted run at 2 ranks to the end of the data."""
    out = tmp_path_factory.mktemp("hf-reference")
    finish(start(SCRIPT, 2, out, "--job", jobs.names[2], "--bootstrap", jobs.bootstrap, "--out", str(out)), out)
    return out


def _run(jobs: Jobs, ranks: int, processes: int, out: Path, *extra: str):
    job = ("--job", jobs.names[ranks], "--bootstrap", jobs.bootstrap)
    return start(SCRIPT, processes, out, *job, "--out", str(out), *extra)


def test_the_uninterrupted_run_trains_exactly_its_rank_topics(jobs: Jobs, reference: Path) -> None:
    for rank in range(2):
        assert received(reference / f"received-rank{rank}.jsonl") == jobs.topics[2][rank], f"rank {rank}"
    checkpoints = reference / "checkpoints"
    assert last_complete_checkpoint(checkpoints) == str(checkpoints / f"checkpoint-{STEPS}")
    assert {p.name for p in (checkpoints / f"checkpoint-{SAVE_EVERY}").glob("mixflow-sink-rank*.json")} == {
        "mixflow-sink-rank0.json",
        "mixflow-sink-rank1.json",
    }


def test_a_killed_run_resumes_with_exactly_the_micro_batches_of_an_uninterrupted_one(
    jobs: Jobs, reference: Path, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    # Killed in step 7, after the checkpoint of step 6: steps 6 and 7 were trained once already.
    kill_rank_after(_run(jobs, 2, 2, out), out, rank=1, lines=7 * MICRO_BATCHES + 1)
    logs = [out / f"received-rank{r}.jsonl" for r in range(2)]
    sizes = [path.stat().st_size for path in logs]
    checkpoint = last_complete_checkpoint(out / "checkpoints")
    assert checkpoint is not None, "no whole checkpoint before the kill"
    resumed_at = int(checkpoint.rsplit("-", 1)[1])
    finish(_run(jobs, 2, 2, out, "--resume"), out)
    for rank in range(2):
        expected = [r for r in received(reference / f"received-rank{rank}.jsonl") if r[0] >= resumed_at]
        assert received(logs[rank], sizes[rank]) == expected, f"rank {rank} resumed at step {resumed_at} differs"


@pytest.mark.parametrize("ranks", [1, 3])
def test_a_checkpoint_at_two_ranks_resumes_on_another_number_of_ranks(
    jobs: Jobs, reference: Path, tmp_path: Path, ranks: int
) -> None:
    at = 2 * SAVE_EVERY
    out = tmp_path / f"at-{ranks}"
    saved = out / "checkpoints" / f"checkpoint-{at}"
    shutil.copytree(reference / "checkpoints" / f"checkpoint-{at}", saved)
    finish(_run(jobs, ranks, ranks, out, "--resume-from", str(saved)), out)
    before = [r for rank in range(2) for r in received(reference / f"received-rank{rank}.jsonl") if r[0] < at]
    after = [r for rank in range(ranks) for r in received(out / f"received-rank{rank}.jsonl")]
    for rank in range(ranks):
        expected = [r for r in jobs.topics[ranks][rank] if r[0] >= at]
        assert received(out / f"received-rank{rank}.jsonl") == expected, f"rank {rank} of {ranks}"
    trained = [sample for record in before + after for sample in record[2]]
    every = [sample for topic in jobs.topics[1].values() for record in topic for sample in record[2]]
    assert sorted(trained) == sorted(every) and len(set(trained)) == len(trained)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=8), min_size=1, max_size=5))
def test_padding_free_batches_are_what_transformers_flattening_collator_makes(samples: list[list[int]]) -> None:
    import numpy as np
    import torch
    from transformers import DataCollatorWithFlattening

    from topics.batch import Batch
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
