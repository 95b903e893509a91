"""Micro-batch swaps (``_kernels/swaps.py``): two ranks exchange a micro-batch's whole contents each. Both
capacities and what is placed hold, no capped maximum rises, and samples that fill their micro-batches, piled on
one rank where no single exchange can part them, are spread."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler._kernels.greedy import lpt_kernel
from pipeline.planning.scheduler._kernels.state import Pass, at_dtype, empty_base, flat_slot, step_inputs
from pipeline.planning.scheduler._kernels.swaps import swap_micro_batches
from pipeline.spec.cost import DEFAULT_COST_MODEL
from tests.test_trade_pairs import _plan


def rank_loads(plan, grid, values: np.ndarray) -> np.ndarray:
    placed = plan.at >= 0
    return np.bincount((plan.at[placed] >> grid.shift).astype(np.int64), weights=values[placed], minlength=grid.ranks)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    ranks=st.integers(2, 10),
    micro=st.integers(1, 4),
    by=st.sampled_from(["encoder", "LLM"]),
)
def test_swaps_keep_both_capacities_and_what_is_placed_and_lift_no_capped_maximum(
    seed: int, ranks: int, micro: int, by: str
) -> None:
    cands, plan, grid, encoder = _plan(seed, ranks, micro)
    placed = (plan.at >= 0).copy()
    llm_values = cands.cost - encoder
    total, enc = rank_loads(plan, grid, cands.cost), rank_loads(plan, grid, encoder)
    llm = total - enc
    before = {"total": total.max(), "encoder": enc.max(), "LLM": llm.max()}
    if by == "encoder":
        balance = Pass(enc, encoder, total, cands.cost, total.max(), llm, llm_values, llm.max())
    else:
        balance = Pass(llm, llm_values, total, cands.cost, total.max(), enc, encoder, enc.max())
    swap_micro_batches(cands, plan, grid, balance, 0.0, (4 * ranks + 64, 32))
    assert np.array_equal(plan.at >= 0, placed)
    after = {"total": rank_loads(plan, grid, cands.cost), "encoder": rank_loads(plan, grid, encoder)}
    after["LLM"] = after["total"] - after["encoder"]
    for name, loads in after.items():
        assert loads.max() <= before[name] * (1 + 1e-9) + 1e-9, name
    np.testing.assert_allclose(plan.rank_cost, after["total"], rtol=1e-9, atol=1e-6)
    slots = np.array([flat_slot(grid, a) for a in plan.at[placed]], np.int64)
    tokens = np.bincount(slots, weights=cands.length[placed], minlength=ranks * micro)
    patches = np.bincount(slots, weights=cands.patches[placed], minlength=ranks * micro)
    np.testing.assert_array_equal(tokens, plan.tokens)
    np.testing.assert_array_equal(patches, plan.patches)
    assert tokens.max() <= grid.capacity and patches.max() <= grid.patch_capacity


def test_texts_that_fill_their_micro_batches_are_spread_over_the_ranks() -> None:
    """Two ranks of two micro-batches of 10 tokens and 10 patches: two texts of 10 tokens (LLM 10 each) on rank 0,
    four images of 5 tokens and 5 patches (LLM 1, encoder 4 each) on rank 1, even in total (20 and 20) but not in
    either part. No exchange of single samples fits (a text for an image leaves 15 tokens in a micro-batch); an
    exchange of micro-batches evens both parts: a text and two images a rank."""
    lengths = np.array([10, 10, 5, 5, 5, 5])
    patches = np.array([0, 0, 5, 5, 5, 5])
    encoder = np.array([0.0, 0.0, 4.0, 4.0, 4.0, 4.0])
    costs = np.array([10.0, 10.0, 1.0, 1.0, 1.0, 1.0]) + encoder
    samples, grid = step_inputs(lengths, (2, 2, 10), DEFAULT_COST_MODEL, costs, patches, 10, encoder)
    cands, plan = lpt_kernel(samples, grid, np.empty(6, at_dtype(2, 2)), empty_base(2, 2))
    where = {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 0), 4: (1, 1), 5: (1, 1)}  # sample -> rank, micro-batch
    for k, sample in enumerate(cands.order.tolist()):
        rank, micro = where[sample]
        plan.at[k] = (rank << grid.shift) | micro
    slots = np.array([flat_slot(grid, a) for a in plan.at], np.int64)
    plan.tokens[:] = np.bincount(slots, weights=cands.length, minlength=4)
    plan.patches[:] = np.bincount(slots, weights=cands.patches, minlength=4)
    plan.micro_cost[:] = np.bincount(slots, weights=cands.cost, minlength=4)
    plan.rank_cost[:] = plan.micro_cost.reshape(2, 2).sum(axis=1)
    sample_encoder = cands.encoder
    total, enc = rank_loads(plan, grid, cands.cost), rank_loads(plan, grid, sample_encoder)
    llm = total - enc
    assert total.tolist() == [20.0, 20.0] and enc.tolist() == [0.0, 16.0]
    balance = Pass(enc, sample_encoder, total, cands.cost, total.max(), llm, cands.cost - sample_encoder, llm.max())
    assert swap_micro_batches(cands, plan, grid, balance, 0.0, (8, 2)) == 1
    assert rank_loads(plan, grid, sample_encoder).tolist() == [8.0, 8.0]
    assert rank_loads(plan, grid, cands.cost).tolist() == [20.0, 20.0]
    text_ranks = sorted(int(plan.at[k] >> grid.shift) for k, s in enumerate(cands.order.tolist()) if s < 2)
    assert text_ranks == [0, 1]
