"""A context-parallel job's micro-batches for Megatron-Core: already this rank's zigzag slices, with
PackedSeqParams carrying both kinds of bounds and local_cp_size, through MixflowDataIterator and get_batch from
the rank topics; every sample comes back from the slices of its block."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from tests.sink_support import write_steps
from topics.formats.sample import Sample
from trainer_sink.cp_tensors import cp_micro_batch_tensors
from trainer_sink.integrations.megatron_cp import megatron_cp_batch
from trainer_sink.integrations.megatron_data import DataRanks, MixflowDataIterator, get_batch

RANKS, CAPACITY = 4, 48


def _steps(seed: int, steps: int = 3) -> tuple[list[list], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out, samples = [], {}
    for step in range(steps):
        lengths = np.clip(rng.lognormal(np.log(20), 1.0, 10), 1, RANKS * CAPACITY).astype(np.int64)
        lengths[step % 10] = RANKS * CAPACITY - 3  # one sample over every rank
        drawn = [Sample(f"{step}/{i}", "s", rng.integers(1, 30000, n).astype(np.int32)) for i, n in enumerate(lengths)]
        plan = plan_cp_step(lengths, CPShape(RANKS, 2, CAPACITY, CPMode.ALIGNED, RANKS), ContextParallelCost())
        samples.update({s.sample_id: s.tokens for s, p in zip(drawn, plan.placed_mask, strict=True) if p})
        out.append(build_cp_batches(step, plan, drawn))
    return out, samples


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_micro_batch_is_what_megatrons_thd_attention_takes_under_hybrid_cp(seed: int) -> None:
    steps, _ = _steps(seed, 1)
    for batch in steps[0]:
        for micro in cp_micro_batch_tensors(batch):
            got = megatron_cp_batch(micro, pad_token_id=7)
            params = got["packed_seq_params"]
            c = micro["local_cp_size"]
            assert params.qkv_format == "thd" and params.local_cp_size == c == got["local_cp_size"]
            assert torch.equal(params.cu_seqlens_q, micro["cu_seqlens"]) and torch.equal(
                params.cu_seqlens_kv_padded, micro["cu_seqlens_padded"]
            )
            assert (
                params.max_seqlen_q == micro["max_seqlen"] == int(micro["cu_seqlens_padded"].diff().max(0)[0])
                if (micro["sample_ids"])
                else True
            )
            assert got["tokens"].shape == (1, micro["input_ids"].numel()) and got["tokens"].dtype == torch.int64
            assert int(micro["cu_seqlens_padded"][-1]) == got["tokens"].shape[1] * c
            no_loss = micro["labels"] == -100
            assert torch.equal(got["loss_mask"][0] == 0, no_loss)
            assert (got["labels"][0][no_loss] == 7).all()
            assert got["loss_tokens"] == batch.loss_tokens


def test_the_iterator_gives_each_rank_its_slices_and_counts_its_own_micro_batches(
    kafka_bootstrap: str, unique_name: str
) -> None:
    steps, samples = _steps(5)
    write_steps(kafka_bootstrap, unique_name, steps)
    held: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = defaultdict(dict)
    for rank in range(RANKS):
        data = MixflowDataIterator(
            job=unique_name, bootstrap_servers=kafka_bootstrap, ranks=DataRanks(rank, RANKS), wait_timeout_s=30
        )
        for step in range(3):
            first = True
            while first or data.micro_batch_info["micro_batch"] + 1 < data.micro_batch_info["micro_batches"]:
                first = False
                tokens, _labels, _loss_mask, mask, positions, params = get_batch(data)
                assert mask is None and data.micro_batch_info["step"] == step
                bounds = params.cu_seqlens_q_padded // params.local_cp_size
                for j, sample_id in enumerate(data.micro_batch_info["sample_ids"]):
                    part = slice(int(bounds[j]), int(bounds[j + 1]))
                    held[sample_id][rank] = (tokens[0, part].numpy(), positions[0, part].numpy())
            assert data.iteration == step + 1
        data.close()
    assert sorted(held) == sorted(samples)
    for sample_id, tokens in samples.items():
        whole = np.full(tokens.size + 2 * RANKS, -1, np.int64)
        for part, positions in held[sample_id].values():
            whole[positions] = part
        np.testing.assert_array_equal(whole[: tokens.size], tokens)


def test_reading_a_context_parallel_job_as_static_cp_peers_is_refused(kafka_bootstrap: str, unique_name: str) -> None:
    steps, _ = _steps(9, 1)
    write_steps(kafka_bootstrap, unique_name, steps)
    data = MixflowDataIterator(
        job=unique_name, bootstrap_servers=kafka_bootstrap, ranks=DataRanks(0, 2, context_parallel=2), wait_timeout_s=30
    )
    with pytest.raises(Exception, match="one topic per rank of the data x context mesh"):
        next(data)
