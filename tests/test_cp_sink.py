"""A context-parallel job's rank topics through the sink: each rank reads only its slices, as the tensors
Megatron-Core's packed sequences take, and every sample comes back exactly from the ranks of its block."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from tests.sink_support import write_steps
from topics.formats.cp_slices import IGNORE_INDEX
from topics.formats.sample import Sample
from trainer_sink import KafkaBatchDataset
from trainer_sink.cp_tensors import cp_micro_batch_tensors
from trainer_sink.read_options import ReadOptions

RANKS, CAPACITY = 4, 64


def _steps(seed: int, mode: CPMode) -> tuple[list[list], dict[str, Sample], list[int]]:
    rng = np.random.default_rng(seed)
    steps, samples, loss_tokens = [], {}, []
    for step in range(3):
        lengths = np.clip(rng.lognormal(np.log(30), 1.0, 12), 1, RANKS * CAPACITY - 8).astype(np.int64)
        lengths[0] = 200  # spans 4 ranks
        drawn = [
            Sample(f"{step}/{i}", "web", rng.integers(0, 30000, n).astype(np.int32)) for i, n in enumerate(lengths)
        ]
        plan = plan_cp_step(lengths, CPShape(RANKS, 2, CAPACITY, mode, RANKS), ContextParallelCost())
        samples.update({s.sample_id: s for s, placed in zip(drawn, plan.placed_mask, strict=True) if placed})
        steps.append(build_cp_batches(step, plan, drawn))
        loss_tokens.append(int((lengths[plan.placed_mask] - 1).sum()))
    return steps, samples, loss_tokens


@pytest.mark.parametrize("mode", [CPMode.ALIGNED, CPMode.FREE])
def test_each_rank_reads_its_slices_and_the_blocks_give_back_every_sample(
    kafka_bootstrap: str, unique_name: str, mode: CPMode
) -> None:
    steps, samples, loss_tokens = _steps(7, mode)
    write_steps(kafka_bootstrap, unique_name, steps)
    held: dict[str, dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]] = defaultdict(dict)
    per_step_loss = defaultdict(int)
    for rank in range(RANKS):
        sink = KafkaBatchDataset(
            job=unique_name, bootstrap_servers=kafka_bootstrap, rank=rank, read=ReadOptions(wait_timeout_s=30)
        )
        seen_steps = []
        for micro in sink:
            assert micro["rank"] == rank and micro["loss_tokens"] == loss_tokens[micro["step"]]
            seen_steps.append((micro["step"], micro["micro_batch"], micro["micro_batches"]))
            ids, pos, labels = micro["input_ids"].numpy(), micro["position_ids"].numpy(), micro["labels"].numpy()
            c = micro["local_cp_size"]
            padded = np.diff(micro["cu_seqlens_padded"].numpy()) // c
            assert padded.sum() == ids.size and micro["max_seqlen"] == (padded * c).max(initial=0)
            per_step_loss[micro["step"]] += int((labels != IGNORE_INDEX).sum())
            starts = np.concatenate([[0], np.cumsum(padded)])
            for j, sample_id in enumerate(micro["sample_ids"]):
                part = slice(starts[j], starts[j + 1])
                held[sample_id][rank] = (ids[part], pos[part], labels[part])
        # Every step is seen, its micro-batches 0 .. n-1 in order.
        for step in range(3):
            mine = [(m, n) for s, m, n in seen_steps if s == step]
            assert [m for m, _ in mine] == list(range(mine[0][1])), (rank, step, mine)
    assert dict(per_step_loss) == dict(enumerate(loss_tokens))
    assert set(held) == set(samples)
    for sample_id, sample in samples.items():
        whole = np.full(sample.length + 2 * RANKS, -1, np.int64)
        for ids, pos, labels in held[sample_id].values():
            whole[pos] = ids
            inside = pos < sample.length - 1
            np.testing.assert_array_equal(labels[inside], sample.tokens[pos[inside] + 1])
        np.testing.assert_array_equal(whole[: sample.length], sample.tokens)


def test_a_rank_with_nothing_in_a_step_still_sees_the_step() -> None:
    plan = plan_cp_step(np.array([5]), CPShape(RANKS, 2, CAPACITY, CPMode.ALIGNED, RANKS), ContextParallelCost())
    batches = build_cp_batches(4, plan, [Sample("only", "s", np.arange(5, dtype=np.int32))])
    idle = [b for b in batches if b.micro_batches == 0]
    assert len(idle) == RANKS - 1
    (micro,) = cp_micro_batch_tensors(idle[0])
    assert micro["micro_batches"] == 1 and micro["input_ids"].numel() == 0 and micro["loss_tokens"] == 4
    assert micro["cu_seqlens"].tolist() == [0] and micro["step"] == 4 and micro["sample_ids"] == []
