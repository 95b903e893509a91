"""Scoring composed options as the scheduler will plan them, and choosing one without planning them all."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from pipeline.planning.mixing._take import EMPTY
from pipeline.planning.order import candidate_order
from pipeline.planning.scheduler import CostModel, plan_step, plan_with_media
from pipeline.planning.shape import StepShape


def pool_permutation(before: Sequence[np.ndarray], drawn: Sequence[np.ndarray]) -> np.ndarray:
    """Where each of a step's candidates lies in ``np.concatenate([*before, *drawn])``, in the order
    ``SamplePool.take`` hands them to the scheduler (``candidate_order``)."""
    return candidate_order(sum(len(lengths) for lengths in before), drawn)


def pool_order(before: Sequence[np.ndarray], drawn: Sequence[np.ndarray]) -> np.ndarray:
    """The lengths of a step's candidates in ``SamplePool.take``'s order (``pool_permutation``)."""
    return np.concatenate([EMPTY, *before, *drawn]).astype(np.int64)[pool_permutation(before, drawn)]


def score(
    lengths: np.ndarray,
    shape: StepShape,
    cost_model: CostModel,
    start: np.ndarray | None = None,
    media: tuple[np.ndarray, np.ndarray, bool] | None = None,
) -> float:
    """Mean over largest rank cost of the scheduler's plan of ``lengths`` (from ``start`` too, where
    given), times the share of the step's capacity it places: 1 for a full, perfectly balanced step.
    ``media``: the candidates' patches and encoder costs and whether the encoder's part is evened out, for
    a plan of multimodal samples (``plan_with_media``, under ``shape``'s patch budget) and their true costs; where it
    is evened out, the score is also times the encoder part's mean over largest rank cost. (The patch
    budget can make a step's encoder part uneven whatever the plan: a text sample that fills a
    micro-batch leaves its rank one micro-batch of patches fewer. Another choice of samples, such as two
    such samples, one a rank, or fewer patches, then balances both.)"""
    if not len(lengths):
        return 0.0
    if media is None:
        plan = plan_step(
            lengths, shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch, cost_model, start=start
        )
        balance = _balance(plan.rank_costs(lengths, cost_model))
    else:
        patches, encoder, even = media
        plan = plan_with_media(lengths, shape, cost_model, start, patches, encoder, even)
        balance = _balance(plan.rank_totals(cost_model.costs(lengths) + encoder))
        if even:
            balance *= _balance(plan.rank_totals(encoder))
    return balance * float(lengths[plan.placed_mask].sum()) / shape.tokens_per_step


def _balance(costs: np.ndarray) -> float:
    """Mean over largest of ``costs`` (per rank), 1.0 where none costs anything."""
    largest = float(costs.max())
    return math.fsum(costs) / len(costs) / largest if largest > 0 else 1.0


def choose_option(
    count: int,
    upper_of: Callable[[int], float],
    score_of: Callable[[int], float],
    prefer_older: float,
    bound: float = math.inf,
) -> int:
    """The first of ``count`` options whose score is within ``prefer_older`` of the best score, where option
    ``i`` scores ``score_of(i)`` and no more than ``upper_of(i)``, and no upper is above ``bound``.
    ``score_of`` is called only for the options that could change the answer, in order; ``upper_of``
    (which may have to build the option) only where ``bound`` cannot settle the answer, once each."""
    upper = cache(upper_of)
    scores: dict[int, float] = {}
    best = -math.inf
    for i in range(count):
        if upper(i) >= best - prefer_older:  # else it can be neither the choice nor the best
            scores[i] = score_of(i)
            best = max(best, scores[i])
        chosen = next(j for j, value in scores.items() if value >= best - prefer_older)
        if scores[chosen] >= bound - prefer_older:
            return chosen
        if scores[chosen] >= max((upper(j) for j in range(i + 1, count)), default=-math.inf) - prefer_older:
            return chosen
    return next(j for j, value in scores.items() if value >= best - prefer_older)
