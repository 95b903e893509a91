"""Options scored on several threads: the choice is the one scoring them one by one makes, each option scored at
most once, and a composed multimodal stream plans the same steps whatever the threads."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import multimodal_balance_bench as bench
from pipeline.planning.mixing._composition import speculative
from pipeline.planning.mixing._composition.options import choose_option
from pipeline.planning.mixing._composition.speculative import SpeculativeScores


@settings(deadline=None, max_examples=150)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5))
def test_scoring_ahead_chooses_what_scoring_in_order_chooses(seed: int, threads: int) -> None:
    rng = np.random.default_rng(seed)
    n, prefer_older = int(rng.integers(1, 30)), float(rng.choice([0.0, 0.003, 0.05]))
    uppers = rng.choice([0.95, 0.97, 0.99, 1.0], n) if rng.random() < 0.5 else rng.uniform(0.5, 1.0, n)
    scores = uppers - rng.choice([0.0, 0.001, 0.002, 0.004, 0.1], n) * rng.random(n)
    bound = float(rng.choice([math.inf, uppers.max(), 1.0 + 1e-9]))
    scored: list[int] = []

    def score_of(i: int) -> float:
        scored.append(i)
        return float(scores[i])

    plain = choose_option(n, lambda i: float(uppers[i]), lambda i: float(scores[i]), prefer_older, bound)
    ahead = SpeculativeScores(score_of, n, threads)
    try:
        assert choose_option(n, lambda i: float(uppers[i]), ahead, prefer_older, bound) == plain
    finally:
        ahead.close()
    assert len(scored) == len(set(scored)), "each option scored at most once"


def test_an_error_scoring_ahead_is_raised_when_that_option_is_asked_for() -> None:
    def score_of(i: int) -> float:
        if i == 2:
            raise ValueError("option 2")
        return 0.5

    ahead = SpeculativeScores(score_of, 4, threads=3)
    try:
        assert ahead(0) == 0.5 and ahead(1) == 0.5
        with pytest.raises(ValueError, match="option 2"):
            ahead(2)
    finally:
        ahead.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_composed_stream_plans_the_same_steps_on_one_thread_and_on_three(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    micro_batches, capacity, patches = bench.VLM_SHAPE["4 x 8k / 32k patches"]
    ranks, steps = 6, 5
    count = int((steps + 2 + 12) * ranks * micro_batches * capacity / 700 * 1.3)
    stream = bench.make_vlm_stream(np.random.default_rng([seed, capacity]), count, capacity, patches)
    results = []
    for threads in (1, 3):
        monkeypatch.setattr(speculative, "PLANNING_THREADS", threads)
        result = bench.mixflow(stream, (micro_batches, capacity, patches), steps, 2, True, True, ranks)
        results.append((result.ratios, result.tokens, result.patches, result.waiting))
    assert results[0] == results[1]
