"""The torchtitan integration (``MixflowDataLoader``) in torchtitan's own ``Trainer`` (its loop, FSDP, and
``CheckpointManager`` over ``torch.distributed.checkpoint``), 2 data-parallel processes on CPU (gloo): a run
killed by SIGKILL and resumed from its checkpoint folder trains exactly the micro-batches of an uninterrupted
run, and a checkpoint taken at 2 ranks resumes on the same samples laid out for 1 and for 3 ranks with every
sample trained exactly once (torchtitan's own dataloader refuses a changed data-parallel degree). Also: the
loader against torchtitan's types and protocols, and its batches against the document masks torchtitan builds."""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torchtitan")

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

pytestmark = pytest.mark.kafka

SCRIPT = Path(__file__).resolve().parent / "integration_torchtitan_train.py"


@pytest.fixture(scope="module")
def jobs(kafka_bootstrap: str) -> Jobs:
    return write_jobs(kafka_bootstrap, "titan")


def _run(jobs: Jobs, ranks: int, out: Path):
    return start(SCRIPT, ranks, out, "--job", jobs.names[ranks], "--bootstrap", jobs.bootstrap, "--out", str(out))


def _whole_checkpoints(out: Path) -> list[int]:
    """The steps of ``OUT/checkpoints/step-<n>`` that DCP finished writing (``.metadata`` is written last): the
    ones torchtitan's ``CheckpointManager`` would load."""
    folder = out / "checkpoints"
    found = (re.fullmatch(r"step-(\d+)", p.name) for p in folder.iterdir()) if folder.is_dir() else ()
    return sorted(int(m.group(1)) for m in found if m and (folder / m.group(0) / ".metadata").is_file())


@pytest.fixture(scope="module")
def reference(jobs: Jobs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted run at 2 ranks over the job's steps."""
    out = tmp_path_factory.mktemp("titan-reference")
    finish(_run(jobs, 2, out), out)
    return out


def test_the_uninterrupted_run_trains_exactly_its_rank_topics(jobs: Jobs, reference: Path) -> None:
    for rank in range(2):
        assert received(reference / f"received-rank{rank}.jsonl") == jobs.topics[2][rank], f"rank {rank}"
    assert _whole_checkpoints(reference) == list(range(SAVE_EVERY, STEPS + 1, SAVE_EVERY))


def test_a_killed_run_resumes_with_exactly_the_micro_batches_of_an_uninterrupted_one(
    jobs: Jobs, reference: Path, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    # Killed in step 7, after the checkpoint of step 6: steps 6 and 7 were trained once already.
    kill_rank_after(_run(jobs, 2, out), out, rank=1, lines=7 * MICRO_BATCHES + 1)
    logs = [out / f"received-rank{r}.jsonl" for r in range(2)]
    sizes = [path.stat().st_size for path in logs]
    checkpoints = _whole_checkpoints(out)
    assert checkpoints, "no whole checkpoint before the kill"
    resumed_at = checkpoints[-1]
    finish(_run(jobs, 2, out), out)
    for rank in range(2):
        expected = [r for r in received(reference / f"received-rank{rank}.jsonl") if r[0] >= resumed_at]
        assert received(logs[rank], sizes[rank]) == expected, f"rank {rank} resumed at step {resumed_at} differs"


@pytest.mark.parametrize("ranks", [1, 3])
def test_a_checkpoint_at_two_ranks_resumes_on_another_number_of_ranks(
    jobs: Jobs, reference: Path, tmp_path: Path, ranks: int
) -> None:
    at = 2 * SAVE_EVERY
    out = tmp_path / f"at-{ranks}"
    shutil.copytree(reference / "checkpoints" / f"step-{at}", out / "checkpoints" / f"step-{at}")
    finish(_run(jobs, ranks, out), out)
    before = [r for rank in range(2) for r in received(reference / f"received-rank{rank}.jsonl") if r[0] < at]
    after = [r for rank in range(ranks) for r in received(out / f"received-rank{rank}.jsonl")]
    for rank in range(ranks):
        expected = [r for r in jobs.topics[ranks][rank] if r[0] >= at]
        assert received(out / f"received-rank{rank}.jsonl") == expected, f"rank {rank} of {ranks}"
    trained = [sample for record in before + after for sample in record[2]]
    every = [sample for topic in jobs.topics[1].values() for record in topic for sample in record[2]]
    assert sorted(trained) == sorted(every) and len(set(trained)) == len(trained)


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

    from topics.batch import Batch
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
