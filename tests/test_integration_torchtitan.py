"""The torchtitan integration (``MixflowDataLoader``) in torchtitan's own ``Trainer`` (its loop, FSDP, and
``CheckpointManager`` over ``torch.distributed.checkpoint``), 2 data-parallel processes on CPU (gloo): a run
killed by SIGKILL and resumed from its checkpoint folder trains exactly the micro-batches of an uninterrupted
run, and a checkpoint taken at 2 ranks resumes on the same samples laid out for 1 and for 3 ranks with every
sample trained exactly once (``tests.integration_base``; torchtitan's own dataloader refuses a changed
data-parallel degree). Also: the loader against torchtitan's types and protocols, and its batches against the
document masks torchtitan builds."""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torchtitan")

from tests.integration_base import TrainerIntegration
from tests.integration_support import MICRO_BATCHES, SAVE_EVERY, STEPS, Jobs, write_jobs

pytestmark = pytest.mark.kafka


def _whole_checkpoints(out: Path) -> list[int]:
    """The steps of ``OUT/checkpoints/step-<n>`` that DCP finished writing (``.metadata`` is written last): the
    ones torchtitan's ``CheckpointManager`` would load."""
    folder = out / "checkpoints"
    found = (re.fullmatch(r"step-(\d+)", p.name) for p in folder.iterdir()) if folder.is_dir() else ()
    return sorted(int(m.group(1)) for m in found if m and (folder / m.group(0) / ".metadata").is_file())


class TestTorchtitan(TrainerIntegration):
    script = Path(__file__).resolve().parent / "integration_torchtitan_train.py"
    label = "titan"

    def resumed_at(self, out: Path) -> int:
        checkpoints = _whole_checkpoints(out)
        assert checkpoints, "no whole checkpoint before the kill"
        return checkpoints[-1]

    def copy_checkpoint(self, reference: Path, step: int, out: Path) -> tuple[str, ...]:
        shutil.copytree(reference / "checkpoints" / f"step-{step}", out / "checkpoints" / f"step-{step}")
        return ()

    def check_reference_checkpoints(self, reference: Path) -> None:
        assert _whole_checkpoints(reference) == list(range(SAVE_EVERY, STEPS + 1, SAVE_EVERY))


@pytest.fixture(scope="module")
def jobs(kafka_bootstrap: str) -> Jobs:
    return write_jobs(kafka_bootstrap, "titan-loader")


def test_the_loader_is_what_torchtitan_builds_checkpoints_and_iterates(jobs: Jobs, tmp_path: Path) -> None:
    """Built by torchtitan's ``Config.build`` with the trainer's arguments, a ``Stateful`` ``BaseDataLoader``;
    saved and loaded by ``torch.distributed.checkpoint`` as ``CheckpointManager`` does it (the loader under
    ``"dataloader"``); a rank the checkpoint has no key for (a changed data-parallel degree) resumes from rank
    0's state at the same step on its own topic; a state in the middle of a step is refused."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.stateful import Stateful
    from torchtitan.components.checkpoint import DATALOADER
    from torchtitan.components.dataloader import BaseDataLoader

    from topics.errors import MixflowError
    from trainer_sink.integrations.torchtitan_data import MixflowDataLoader

    def build(ranks: int, rank: int) -> MixflowDataLoader:
        config = MixflowDataLoader.Config(job=jobs.names[ranks], bootstrap_servers=jobs.bootstrap, wait_timeout_s=60)
        return config.build(
            dp_rank=rank, dp_world_size=ranks, tokenizer=None, seq_len=128, local_batch_size=1,
            snapshot_every_n_steps=None,
        )  # fmt: skip

    first = build(1, 0)
    assert isinstance(first, BaseDataLoader) and isinstance(first, Stateful)
    batches = iter(first)
    for _ in range(2 * MICRO_BATCHES):
        input_dict, labels = next(batches)
        assert set(input_dict) == {"input", "positions"} and labels.shape == input_dict["input"].shape
    assert [m["step"] for m in first.step_micro_batches] == [1] * MICRO_BATCHES
    checkpoint = str(tmp_path / "step-2")
    dcp.save({DATALOADER: first}, checkpoint_id=checkpoint)
    next(batches)
    with pytest.raises(MixflowError, match="global_batch_size"):
        first.state_dict()

    for ranks, rank in ((1, 0), (3, 2)):
        resumed = build(ranks, rank)
        dcp.load({DATALOADER: resumed}, checkpoint_id=checkpoint)
        next(iter(resumed))
        (meta,) = resumed.step_micro_batches
        assert (meta["step"], meta["micro_batch"]) == (2, 0), f"rank {rank} of {ranks}"
        expected = next(r for r in jobs.topics[ranks][rank] if r[0] == 2)
        assert tuple(meta["sample_ids"]) == expected[2]

    with pytest.raises(MixflowError, match="local_batch_size"):
        MixflowDataLoader.Config(job=jobs.names[1]).build(dp_rank=0, dp_world_size=1, local_batch_size=8)
    wrong_degree = build(2, 0)
    wrong_degree.dp_world_size = 3
    with pytest.raises(MixflowError, match="replay --ranks 3"):
        next(iter(wrong_degree))


@pytest.mark.parametrize(("accumulation", "how"), [(MICRO_BATCHES + 1, "more"), (MICRO_BATCHES - 1, "fewer")])
def test_a_training_step_of_more_or_fewer_batches_than_a_step_of_the_job_is_refused(
    jobs: Jobs, accumulation: int, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As torchtitan's ``Trainer.train`` runs it: the training step set (``structured_logger.set_step``), then
    ``global_batch_size / data-parallel degree`` batches fetched. A training step over more than a step of the
    job (which would exit 0 with twice the job's steps per training step) or over less is refused at the first
    batch that crosses a step of the job, before the training step runs forward."""
    import contextvars

    from torchtitan.observability import structured_logger
    from torchtitan.observability.structured_logger import step_state

    from topics.errors import MixflowError
    from trainer_sink.integrations.torchtitan_data import MixflowDataLoader

    monkeypatch.setattr(step_state, "_STEP_GLOBAL", None)  # set_step sets it: put back after the test
    config = MixflowDataLoader.Config(job=jobs.names[1], bootstrap_servers=jobs.bootstrap, wait_timeout_s=60)
    loader = config.build(dp_rank=0, dp_world_size=1, local_batch_size=1)

    def train() -> None:
        batches = iter(loader)
        for step in range(1, 4):
            structured_logger.set_step(step)
            for _ in range(accumulation):
                next(batches)

    refusal = rf"step 1 takes {how} batches than the 2 micro-batches of step 0 of .*global_batch_size.*\(1 x 2 = 2\)"
    with pytest.raises(MixflowError, match=refusal):
        contextvars.copy_context().run(train)  # and the step's context variable with it


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=8), max_size=5),
    st.sampled_from([1, 8]),
)
def test_batches_give_torchtitan_the_sample_boundaries_as_its_document_masks(
    samples: list[list[int]], multiple: int
) -> None:
    """torchtitan's varlen metadata and Flex document mask, built from the batch's positions, are the sink's
    samples (and its padding segment), each causal; labels are each sample's next tokens."""
    import numpy as np
    import torch
    from torch.nn.attention.flex_attention import create_mask
    from torchtitan.models.common.attention import (
        create_varlen_metadata_for_document,
        get_causal_mask_mod,
        get_document_mask_mod,
    )

    from topics.formats.batch import Batch
    from trainer_sink.integrations.torchtitan_data import IGNORE_INDEX, titan_batch
    from trainer_sink.tensors import micro_batch_tensors

    batch = Batch.from_arrays(
        step=0, rank=0, ranks=1, micro_batches=1, capacity=64, sample_ids=[f"s/{i}" for i in range(len(samples))],
        sources=["s"] * len(samples), micro_batch=[0] * len(samples), offsets=np.cumsum([0, *map(len, samples)]),
        tokens=np.array([t for s in samples for t in s], np.int32),
    )  # fmt: skip
    (micro_batch,) = micro_batch_tensors(batch, pad_to_multiple_of=multiple)
    input_dict, labels = titan_batch(micro_batch, pad_to_multiple_of=multiple)
    tokens, positions = input_dict["input"], input_dict["positions"]
    assert tokens.dtype == positions.dtype == labels.dtype == torch.int64
    length = tokens.shape[1]
    assert length % multiple == 0 and tokens.shape == positions.shape == labels.shape == (1, length)
    bounds = micro_batch["cu_seqlens"].tolist() if samples else [0, length]
    assert create_varlen_metadata_for_document(positions).cu_seq_q.tolist() == bounds
    document = get_document_mask_mod(positions)
    causal = get_causal_mask_mod()
    mask = create_mask(lambda b, h, q, k: causal(b, h, q, k) & document(b, h, q, k), 1, None, length, length, "cpu")
    segment = torch.repeat_interleave(torch.arange(len(bounds) - 1), torch.tensor(bounds).diff())
    expected = (segment[:, None] == segment[None, :]) & torch.ones(length, length, dtype=torch.bool).tril()
    assert torch.equal(mask[0, 0], expected)
    for lo, hi in itertools.pairwise(bounds):
        want = [*tokens[0, lo + 1 : hi].tolist(), IGNORE_INDEX]
        if lo >= sum(map(len, samples)):
            want = [IGNORE_INDEX] * (hi - lo)  # the padding segment has no labels
        assert labels[0, lo:hi].tolist() == want
