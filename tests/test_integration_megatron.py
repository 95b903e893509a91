"""The Megatron-Core integration (``MixflowDataIterator``) in Megatron-Core's own schedule
(``get_forward_backward_func`` over the job's micro-batches of each iteration), 2 data-parallel processes on CPU
(gloo) with checkpoints in Megatron-LM's layout: the shared tests of ``tests.integration_base`` (a kill and a
resume, a resume at 1 and at 3 ranks). Also: the batch against Megatron's own types and consumers
(``PackedSeqParams``, ``get_thd_batch_on_this_cp_rank``, ``get_batch_on_this_cp_rank``), context-parallel
padding, and the iterator's checkpoint files and checks."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("megatron.core")

import torch

from tests.integration_base import TrainerIntegration
from tests.integration_support import MICRO_BATCHES, SAVE_EVERY, STEPS, Jobs, write_jobs
from topics.formats.batch import Batch
from trainer_sink.integrations.megatron_batch import megatron_batch
from trainer_sink.integrations.megatron_data import TRACKER_FILE, iteration_folder, latest_iteration
from trainer_sink.tensors import micro_batch_tensors

pytestmark = pytest.mark.kafka


class TestMegatron(TrainerIntegration):
    script = Path(__file__).resolve().parent / "integration_megatron_train.py"
    label = "megatron"

    def resumed_at(self, out: Path) -> int:
        iteration = latest_iteration(out / "checkpoints")
        assert iteration is not None, "no whole checkpoint before the kill"
        return iteration

    def copy_checkpoint(self, reference: Path, step: int, out: Path) -> tuple[str, ...]:
        shutil.copytree(iteration_folder(reference / "checkpoints", step), iteration_folder(out / "checkpoints", step))
        (out / "checkpoints" / TRACKER_FILE).write_text(f"{step}\n")
        return ()

    def check_reference_checkpoints(self, reference: Path) -> None:
        root = reference / "checkpoints"
        assert latest_iteration(root) == STEPS
        for iteration in range(SAVE_EVERY, STEPS + 1, SAVE_EVERY):
            names = {p.name for p in iteration_folder(root, iteration).iterdir()}
            assert {"mixflow-sink-rank0.json", "mixflow-sink-rank1.json", "mp_rank_00"} <= names, iteration


def _micro_batch(samples: list[list[int]]) -> dict:
    batch = Batch.from_arrays(
        step=0, rank=0, ranks=1, micro_batches=1, capacity=64, sample_ids=[f"s/{i}" for i in range(len(samples))],
        sources=["s"] * len(samples), micro_batch=[0] * len(samples), offsets=np.cumsum([0, *map(len, samples)]),
        tokens=np.array([t for s in samples for t in s], np.int32),
    )  # fmt: skip
    (micro_batch,) = micro_batch_tensors(batch)
    return micro_batch


samples_strategy = st.lists(st.lists(st.integers(1, 255), min_size=1, max_size=9), max_size=5)


@settings(max_examples=60, deadline=None)
@given(samples_strategy, st.sampled_from([1, 2, 3]), st.sampled_from([1, 8]))
def test_the_batch_is_what_megatrons_get_batch_and_thd_attention_read(
    samples: list[list[int]], context_parallel: int, multiple: int
) -> None:
    """Shapes and dtypes as ``get_batch_on_this_tp_rank`` takes them; each sample (its context-parallel padding
    included) one THD segment of ``PackedSeqParams``, as Megatron-Core's ``get_thd_batch_on_this_cp_rank``
    builds them from ``cu_seqlens``; labels the sample's next tokens under the loss mask, positions restarting."""
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.utils import get_thd_batch_on_this_cp_rank

    batch = megatron_batch(_micro_batch(samples), context_parallel=context_parallel, pad_to_multiple_of=multiple)
    tokens, labels, loss_mask, positions = (batch[k] for k in ("tokens", "labels", "loss_mask", "position_ids"))
    length = tokens.shape[1]
    assert tokens.dtype == labels.dtype == positions.dtype == torch.int64 and loss_mask.dtype == torch.float32
    assert tokens.shape == labels.shape == loss_mask.shape == positions.shape == (1, length)
    assert "attention_mask" not in batch
    unit = 2 * context_parallel if context_parallel > 1 else 1
    assert length % multiple == 0 and length % unit == 0 and length > 0
    bounds = batch["cu_seqlens"][0]
    assert batch["cu_seqlens"].dtype == torch.int32 and bounds[0] == 0 and bounds[-1] == length
    assert all(int(n) % unit == 0 for n in bounds.diff()[: len(samples)])
    assert batch["max_seqlen"].tolist() == [int(bounds.diff().max())]
    plain = {k: batch[k] for k in ("tokens", "labels", "loss_mask", "position_ids")}
    _, theirs = get_thd_batch_on_this_cp_rank(plain, bounds, bounds, batch["max_seqlen"], cp_size=1, cp_rank=0)
    ours = batch["packed_seq_params"]
    assert isinstance(ours, PackedSeqParams) and ours.qkv_format == theirs.qkv_format == "thd"
    for field in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
        assert torch.equal(getattr(ours, field), getattr(theirs, field)), field
    assert (ours.max_seqlen_q, ours.max_seqlen_kv) == (theirs.max_seqlen_q, theirs.max_seqlen_kv)
    for j, (lo, hi) in enumerate(itertools.pairwise(bounds.tolist())):
        assert positions[0, lo:hi].tolist() == list(range(hi - lo))
        sample = samples[j] if j < len(samples) else []  # the last segment may be padding only
        learnt = max(len(sample) - 1, 0)
        assert tokens[0, lo : lo + len(sample)].tolist() == sample
        assert labels[0, lo : lo + learnt].tolist() == sample[1:]
        assert loss_mask[0, lo:hi].tolist() == [1.0] * learnt + [0.0] * (hi - lo - learnt)
    assert int(loss_mask.sum()) == sum(len(s) - 1 for s in samples)


@settings(max_examples=40, deadline=None)
@given(samples_strategy, st.sampled_from([1, 2]))
def test_the_dense_mask_keeps_samples_apart_as_megatrons_context_parallel_split_reads_it(
    samples: list[list[int]], context_parallel: int
) -> None:
    """``attention_mask`` (``True`` = masked, Megatron's convention) is causal within each segment and closed
    across them; Megatron-Core's ``get_batch_on_this_cp_rank`` splits the whole batch into ``2 x cp`` chunks."""
    from megatron.core.utils import get_batch_on_this_cp_rank

    batch = megatron_batch(_micro_batch(samples), context_parallel=context_parallel, attention_mask=True)
    mask = batch["attention_mask"]
    length = batch["tokens"].shape[1]
    assert mask.dtype == torch.bool and mask.shape == (1, 1, length, length)
    bounds = batch["cu_seqlens"][0]
    segment = torch.repeat_interleave(torch.arange(bounds.numel() - 1), bounds.diff())
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(length, length, dtype=torch.bool).tril()
    assert torch.equal(mask[0, 0], ~allowed)
    if context_parallel > 1:
        keys = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
        for rank in range(context_parallel):
            part = _cp_split({k: batch[k].clone() for k in keys}, context_parallel, rank, get_batch_on_this_cp_rank)
            assert part["tokens"].shape == (1, length // context_parallel)
            assert part["attention_mask"].shape == (1, 1, length // context_parallel, length)


def _cp_split(batch: dict, size: int, rank: int, split) -> dict:
    """``split(batch)`` as context-parallel rank ``rank`` of ``size`` (no process group needed)."""
    from megatron.core import parallel_state

    saved = parallel_state.get_context_parallel_world_size, parallel_state.get_context_parallel_rank
    parallel_state.get_context_parallel_world_size = lambda: size
    parallel_state.get_context_parallel_rank = lambda: rank
    try:
        return split(batch)
    finally:
        parallel_state.get_context_parallel_world_size, parallel_state.get_context_parallel_rank = saved


def test_seq_length_gives_every_micro_batch_megatrons_fixed_shape() -> None:
    from topics.errors import MixflowError

    batch = megatron_batch(_micro_batch([[5, 6, 7], [8, 9]]), seq_length=16, context_parallel=2)
    assert batch["tokens"].shape == (1, 16)
    assert batch["cu_seqlens"][0].tolist() == [0, 4, 8, 16]
    assert batch["tokens"][0, :8].tolist() == [5, 6, 7, 0, 8, 9, 0, 0]
    assert batch["loss_mask"][0].tolist() == [1, 1, 0, 0, 1, 0, 0, 0] + [0] * 8
    empty = megatron_batch(_micro_batch([]), seq_length=16)
    assert empty["cu_seqlens"][0].tolist() == [0, 16] and int(empty["loss_mask"].sum()) == 0
    with pytest.raises(MixflowError, match="seq_length"):
        megatron_batch(_micro_batch([list(range(1, 20))]), seq_length=16)


@pytest.fixture(scope="module")
def jobs(kafka_bootstrap: str) -> Jobs:
    return write_jobs(kafka_bootstrap, "megatron-iterator")


def test_the_iterator_checkpoints_in_megatrons_iteration_folders_and_resumes_on_any_data_parallel_size(
    jobs: Jobs, tmp_path: Path
) -> None:
    """Written into ``iter_<7 digits>`` at the step boundary; read back at the tracker's iteration by a rank of
    another data-parallel size, which goes on at the same step of its own topic; refused in the middle of a
    step, on a micro-batch count that is not the job's, and on a data-parallel size that is not the job's."""
    from topics.errors import MixflowError
    from trainer_sink.integrations.megatron_data import DataRanks, MixflowDataIterator

    def iterator(ranks: int, rank: int, micro_batches: int = MICRO_BATCHES, **options) -> MixflowDataIterator:
        return MixflowDataIterator(
            job=jobs.names[ranks], bootstrap_servers=jobs.bootstrap, ranks=DataRanks(rank, ranks),
            num_microbatches=micro_batches, wait_timeout_s=60, **options,
        )  # fmt: skip

    root = tmp_path / "checkpoints"
    first = iterator(2, 1, save=root, save_interval=2)
    for _ in range(2 * MICRO_BATCHES):
        batch = next(first)
    assert set(batch) == {
        "tokens",
        "labels",
        "loss_mask",
        "position_ids",
        "cu_seqlens",
        "max_seqlen",
        "packed_seq_params",
    }
    assert first.micro_batch_info["step"] == 1 and first.iteration == 2
    assert (iteration_folder(root, 2) / "mixflow-sink-rank1.json").is_file()
    next(first)
    with pytest.raises(MixflowError, match="middle of step 2"):
        first.state_dict()
    first.close()
    assert latest_iteration(root) is None
    (root / TRACKER_FILE).write_text("2\n")
    for ranks, rank in ((1, 0), (3, 2)):
        resumed = iterator(ranks, rank)
        assert resumed.load_checkpoint(root) == 2
        next(resumed)
        assert (resumed.micro_batch_info["step"], resumed.micro_batch_info["micro_batch"]) == (2, 0)
        expected = next(r for r in jobs.topics[ranks][rank] if r[0] == 2)
        assert tuple(resumed.micro_batch_info["sample_ids"]) == expected[2], f"rank {rank} of {ranks}"
        resumed.close()
    with pytest.raises(MixflowError, match="global-batch-size"):
        next(iterator(1, 0, micro_batches=MICRO_BATCHES + 1))
    wrong_size = iterator(2, 0)
    wrong_size.ranks = DataRanks(0, 3)
    with pytest.raises(MixflowError, match="replay --ranks 3"):
        next(wrong_size)
    (root / TRACKER_FILE).write_text("release\n")
    with pytest.raises(MixflowError, match="release"):
        latest_iteration(root)


LAYOUTS = [(2, 1, 1), (1, 2, 1), (1, 1, 2)]


@pytest.fixture(scope="module")
def layouts_seen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 processes under ``parallel_state``, set up for each of ``LAYOUTS`` in turn (one launch): each layout's
    records in a folder of its own."""
    from tests.integration_support import finish, start

    out = tmp_path_factory.mktemp("megatron-ranks")
    script = Path(__file__).resolve().parent / "integration_megatron_ranks.py"
    layouts = ",".join("x".join(map(str, sizes)) for sizes in LAYOUTS)
    finish(start(script, 4, out, "--layouts", layouts, "--out", str(out)), out)
    return out


@pytest.mark.parametrize(("tensor", "context", "pipeline"), LAYOUTS)
def test_ranks_from_parallel_state_give_model_parallel_peers_one_data_parallel_rank(
    tensor: int, context: int, pipeline: int, layouts_seen: Path
) -> None:
    """4 processes under ``parallel_state``: the data-parallel rank of each is the sink's for Megatron's layout
    (``ParallelLayout``), one process of each data-parallel rank writes its sink state, and data is read on
    tensor-parallel rank 0 of the first and the last pipeline stage."""
    import json

    from trainer_sink.parallel import ParallelLayout

    layout = ParallelLayout(4, tensor=tensor, context=context, pipeline=pipeline)
    folder = layouts_seen / f"{tensor}x{context}x{pipeline}"
    seen = [json.loads((folder / f"rank{g}.json").read_text()) for g in range(4)]
    for g, record in enumerate(seen):
        assert record["data_parallel_rank"] == layout.data_parallel_rank(g), g
        assert record["data_parallel_size"] == layout.data_parallel == 2
        assert record["context_parallel"] == context
        assert record["needs_data"] == (g % tensor == 0), g  # with 2 stages, each is first or last
    writers = sorted(record["data_parallel_rank"] for record in seen if record["writes_state"])
    assert writers == [0, 1]
