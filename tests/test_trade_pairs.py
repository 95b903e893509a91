"""The trade passes' pair search (``_kernels/trades.py``) finds the pair a test of every pair finds.

The search visits only a window of the partner rank's samples sorted by value, in an order of its own; the
reference here tests every pair of the two ranks in member order and keeps the first of the best, as the
definition says. Plans come from LPT with two capacities over random multimodal samples (many of equal
length, patches and cost, so that ties are common), and the passes' values, caps and rank pairs vary."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler._kernels.greedy import lpt_kernel
from pipeline.planning.scheduler._kernels.state import Candidates, Grid, Placement, at_dtype, empty_base, step_inputs
from pipeline.planning.scheduler._kernels.trades import (
    Members,
    Pass,
    _nearest_pair,
    _targets,
    by_value_of,
    even_out,
    members_of,
    sort_rank,
)
from pipeline.spec.cost import DEFAULT_COST_MODEL


def reference_pair(
    cands: Candidates, plan: Placement, grid: Grid, members: Members, ranks: tuple[int, int], balance: Pass
) -> tuple[int, int, int, int]:
    """Every pair of rank ``a``'s and rank ``b``'s samples in member order; the first of the best."""
    a, b = ranks
    gap = balance.load[a] - balance.load[b]
    best, best_score = (-1, -1, -1, -1), 0.0
    for x in range(members.begin[a], members.begin[a + 1]):
        i = int(members.member[x])
        for y in range(members.begin[b], members.begin[b + 1]):
            j = int(members.member[y])
            d = balance.value[i] - balance.value[j]
            if d <= 0.0 or d >= gap or min(d, gap - d) <= best_score:
                continue
            shift = balance.other_value[i] - balance.other_value[j]
            if balance.other[a] - shift > balance.cap or balance.other[b] + shift > balance.cap:
                continue
            shift = balance.third_value[i] - balance.third_value[j]
            if balance.third[a] - shift > balance.third_cap or balance.third[b] + shift > balance.third_cap:
                continue
            to = _targets.py_func(cands, plan, grid, np.int64(i), np.int64(j))
            if to[0] >= 0 and to[1] >= 0:
                best, best_score = (i, j, int(to[0]), int(to[1])), min(d, gap - d)
    return best


def _plan(seed: int, ranks: int, micro: int) -> tuple[Candidates, Placement, Grid, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = ranks * micro * 6
    kinds = rng.choice(3, n, p=[0.5, 0.35, 0.15])
    lengths = np.where(kinds == 0, rng.choice([64, 128, 300, 512], n), rng.choice([80, 160, 260], n)).astype(np.int64)
    patches = np.where(kinds == 0, 0, rng.choice([256, 512, 1024], n) * np.where(kinds == 2, 2, 1)).astype(np.int64)
    encoder = patches * rng.choice([1.0, 1.5], n)
    cost_model = DEFAULT_COST_MODEL
    costs = cost_model.costs(lengths) + encoder
    samples, grid = step_inputs(lengths, (ranks, micro, 1024), cost_model, costs, patches, 2048, encoder)
    scratch = np.empty(n, at_dtype(ranks, micro))
    cands, plan = lpt_kernel(samples, grid, scratch, empty_base(ranks, micro))
    return cands, plan, grid, encoder[cands.order]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    ranks=st.integers(2, 12),
    micro=st.integers(1, 4),
    by=st.sampled_from(["encoder", "total", "LLM"]),
    cap_room=st.sampled_from([0.0, 0.01, 0.1, 10.0]),
)
def test_the_indexed_search_finds_the_pair_every_pair_finds(
    seed: int, ranks: int, micro: int, by: str, cap_room: float
) -> None:
    cands, plan, grid, encoder = _plan(seed, ranks, micro)
    members = members_of(plan, grid)
    rank_of = np.where(plan.at >= 0, plan.at >> grid.shift, -1)
    total = np.bincount(rank_of[rank_of >= 0], weights=cands.cost[rank_of >= 0], minlength=ranks)
    enc = np.bincount(rank_of[rank_of >= 0], weights=encoder[rank_of >= 0], minlength=ranks)
    free = (np.zeros(ranks), np.zeros(len(encoder)), np.inf)
    if by == "encoder":
        balance = Pass(enc, encoder, total, cands.cost, float(total.max()) * (1 + cap_room), *free)
    elif by == "total":
        balance = Pass(total, cands.cost, enc, encoder, float(enc.max()) * (1 + cap_room), *free)
    else:  # the LLM's part, under caps on the total and on the encoder's part
        total_cap, encoder_cap = (float(load.max()) * (1 + cap_room) for load in (total, enc))
        balance = Pass(total - enc, cands.cost - encoder, total, cands.cost, total_cap, enc, encoder, encoder_cap)
    index = by_value_of(members, balance.value, ranks)
    rng = np.random.default_rng(seed ^ 0x5EED)
    for _ in range(6):
        a, b = (int(r) for r in rng.choice(ranks, 2, replace=False))
        if balance.load[a] < balance.load[b]:
            a, b = b, a
        found = _nearest_pair(cands, plan, grid, (members, index), (a, b), balance)
        assert tuple(int(v) for v in found) == reference_pair(cands, plan, grid, members, (a, b), balance)


def test_a_rank_sorted_again_follows_its_members() -> None:
    cands, plan, grid, _ = _plan(7, 4, 2)
    members = members_of(plan, grid)
    index = by_value_of(members, cands.cost, 4)
    lo, hi = members.begin[1], members.begin[2]
    members.member[lo], members.member[hi - 1] = members.member[hi - 1], members.member[lo]
    cands.cost[members.member[lo]] = -1.0
    sort_rank(members, cands.cost, index, 1)
    assert index.at[lo] == lo and index.value[lo] == -1.0
    assert np.all(np.diff(index.value[lo:hi]) >= 0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), ranks=st.integers(2, 12), micro=st.integers(1, 4))
def test_the_llm_pass_lowers_no_maximum_and_keeps_what_is_placed(seed: int, ranks: int, micro: int) -> None:
    """The LLM's part evened out under caps on the total and on the encoder's part: none of the three largest
    rank loads rises, both capacities hold, and the samples placed stay placed."""
    cands, plan, grid, encoder = _plan(seed, ranks, micro)
    placed = plan.at >= 0
    rank_of = np.where(placed, plan.at >> grid.shift, -1)

    def loads() -> tuple[np.ndarray, np.ndarray]:
        of = np.where(plan.at >= 0, plan.at >> grid.shift, -1)
        on = of >= 0
        total = np.bincount(of[on], weights=cands.cost[on], minlength=ranks)
        return total, np.bincount(of[on], weights=encoder[on], minlength=ranks)

    total, enc = loads()
    llm = total - enc
    capped = (total.copy(), cands.cost, total.max(), enc.copy(), encoder, enc.max())
    balance = Pass(llm.copy(), cands.cost - encoder, *capped)
    target = max(llm.sum() / ranks, float((cands.cost - encoder)[placed].max(initial=0.0)))
    even_out(cands, plan, grid, members_of(plan, grid), balance, target, (4 * ranks + 64, 32))
    after_total, after_enc = loads()
    slack = 1e-9 * max(float(total.max()), 1.0)
    assert after_total.max() <= total.max() + slack
    assert after_enc.max() <= enc.max() + slack
    assert (after_total - after_enc).max() <= llm.max() + slack
    np.testing.assert_allclose(balance.load, after_total - after_enc, rtol=1e-9, atol=slack)
    assert np.array_equal(plan.at >= 0, placed) and np.bincount(rank_of[placed], minlength=ranks).sum() == placed.sum()
    slots = np.where(plan.at >= 0, (plan.at >> grid.shift) * grid.micro + (plan.at & ((1 << grid.shift) - 1)), -1)
    on = slots >= 0
    tokens = np.bincount(slots[on], weights=cands.length[on], minlength=ranks * micro)
    patches = np.bincount(slots[on], weights=cands.patches[on], minlength=ranks * micro)
    assert tokens.max() <= grid.capacity and patches.max() <= grid.patch_capacity
