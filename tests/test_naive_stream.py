"""Naive per-rank loading as one run over a job's steps (``NaiveStream``): every sample packed exactly once over its
steps and the ones it needs after, never a micro-batch over either capacity, a rank's waiting samples first, and a
bounded backlog that counts what it drops; its first step is naive loading of that step alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.spec.cost import CostModel, VisionCostModel
from pipeline.tools.observe.naive import NaiveStream, naive_loading
from pipeline.tools.observe.vision_parts import StepVision
from tests.observe_support import LENGTH_FAMILIES

LLM = CostModel(alpha=0.0, beta=1.0)  # a rank's cost is its tokens: sums check what was packed
ENCODER = VisionCostModel(alpha=0.0, beta=1.0)


@st.composite
def job(draw: st.DrawFn) -> tuple[int, int, int, int | None, list[tuple[np.ndarray, np.ndarray]]]:
    """A shape (ranks, micro-batches, tokens and patches a micro-batch; None: text) and steps of (lengths, patches),
    every sample fitting a micro-batch alone."""
    ranks, micro_batches = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    capacity = draw(st.sampled_from([16, 256, 4096]))
    budget = draw(st.sampled_from([None, 8, 300]))
    family = draw(st.sampled_from(sorted(LENGTH_FAMILIES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        n = int(rng.integers(0, ranks * micro_batches * 4 + 1))
        lengths = np.minimum(LENGTH_FAMILIES[family](rng, n, capacity), capacity).astype(np.int64)
        patches = np.zeros(n, np.int64) if budget is None else rng.integers(0, budget + 1, n)
        steps.append((lengths, patches))
    return ranks, micro_batches, capacity, budget, steps


def vision_of(patches: np.ndarray, budget: int | None) -> StepVision | None:
    if budget is None:
        return None
    return StepVision(patches, ENCODER.costs(patches) * (patches > 0), budget, in_total=False)


@settings(max_examples=80, deadline=None)
@given(job=job(), backlog=st.sampled_from([None, 0.5, 2.0]))
def test_every_sample_is_packed_once_over_the_run_within_both_capacities(job, backlog: float | None) -> None:
    ranks, micro_batches, capacity, budget, steps = job
    stream = NaiveStream(LLM, backlog_steps=backlog)
    packed = [stream.step(lengths, ranks, micro_batches, capacity, vision_of(p, budget)) for lengths, p in steps]
    assert stream.dealt == sum(len(lengths) for lengths, _ in steps)
    packed += stream.drain()
    assert stream.waiting == 0
    tokens = sum(int(lengths.sum()) for lengths, _ in steps)
    dropped_tokens = tokens - sum(step.tokens for step in packed)
    assert (dropped_tokens == 0) == (stream.dropped == 0)  # every sample has at least one token
    if backlog is None:
        assert stream.dropped == 0
    for step in packed:
        assert step.tokens <= ranks * micro_batches * capacity
        np.testing.assert_allclose(step.rank_costs.sum(), step.tokens)  # one a token: what was packed
        assert (step.rank_costs <= micro_batches * capacity).all()
        if budget is not None:
            assert step.parts is not None and (step.parts.encoder <= micro_batches * budget).all()


@settings(max_examples=60, deadline=None)
@given(job=job())
def test_the_first_step_of_a_run_is_naive_loading_of_that_step_alone(job) -> None:
    ranks, micro_batches, capacity, budget, steps = job
    lengths, patches = steps[0]
    vision = vision_of(patches, budget)
    alone = naive_loading(lengths, ranks, micro_batches, capacity, LLM, vision)
    first = NaiveStream(LLM).step(lengths, ranks, micro_batches, capacity, vision)
    np.testing.assert_array_equal(first.rank_costs, alone.rank_costs)
    assert (first.tokens, first.left_out) == (alone.tokens, alone.left_out)


def test_a_sample_that_fits_no_micro_batch_waits_for_its_ranks_next_step_first() -> None:
    """Two ranks of one micro-batch of 10 tokens. Step 0 deals 6, 3, 6, 3 (ranks 0, 1, 0, 1): rank 0 packs one
    6 and keeps the other waiting; step 1 deals 2, 2: rank 0 packs the waiting 6 first, then the 2."""
    stream = NaiveStream(LLM)
    first = stream.step(np.array([6, 3, 6, 3]), 2, 1, 10)
    assert first.rank_costs.tolist() == [6.0, 6.0] and first.left_out == 1 and stream.waiting == 1
    second = stream.step(np.array([2, 2]), 2, 1, 10)
    assert second.rank_costs.tolist() == [8.0, 2.0] and second.left_out == 0 and stream.waiting == 0
    assert stream.drain() == []


def test_a_bounded_backlog_drops_the_newest_waiting_samples_and_counts_them() -> None:
    """One rank of one micro-batch of 10 tokens holding at most one step (10 tokens) waiting: of 10, 6, 6, 6 it
    packs the 10; of the 18 waiting it keeps 6 (the next 6 would pass 10) and drops the last 6s."""
    stream = NaiveStream(LLM, backlog_steps=1.0)
    step = stream.step(np.array([10, 6, 6, 6]), 1, 1, 10)
    assert step.tokens == 10 and stream.waiting == 1 and stream.dropped == 2
    assert [s.tokens for s in stream.drain()] == [6]
