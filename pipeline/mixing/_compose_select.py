"""Which window samples make up a composed step (pure, numpy; plans with the scheduler to compare).

A step's ranks are filled to their token capacity with short samples around the long ones, so a rank
costs about ``rho * K`` (its ``K`` tokens at the short samples' cost per token) plus the *excess* of its
long samples, ``h(L) = cost(L) - rho * L``: the step is balanced when every rank holds the same excess.
Long samples are those costing at least ``LONG_FRACTION`` of a full rank at the windows' mean cost per
token.

Each option fixes a level of excess per rank and builds one group of long samples per rank up to it
(``build_groups``); the short samples of each source then fill its target in FIFO order. The options are
the seeds alone (deferred and due long samples, which every option holds), then a level set by each of
the oldest ``ANCHORS`` long candidates of sources still behind their targets in turn (that candidate
held too). Each option is planned with
``plan_step`` as the constructor will plan it (candidates in ``SamplePool.take``'s order; the deferred
ones source by source); the first (oldest anchor) whose score (mean over largest rank cost, times the
share of capacity placed) is within ``PREFER_OLDER`` of the best wins. Sums that steer a choice are exact
(``math.fsum``, ``CostModel.total``), so a restarted constructor composes the same steps on any machine.

Planning is most of the cost, so options are planned lazily (``choose_option``): an option's score is at
most the share of capacity it draws, which bounds what the options not planned yet can reach; the choice
is the one planning every option would make, usually after planning the first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.mixing._compose_groups import build_groups_kernel
from pipeline.mixing._take import EMPTY
from pipeline.scheduler import CostModel, plan_step

LONG_FRACTION = 1 / 16
"""A sample is long when it costs at least this share of a full rank."""
ANCHORS = 24
"""How many of the oldest long candidates set a level of their own."""
PREFER_OLDER = 0.003
"""An older anchor wins over the best option when its score is at most this much lower."""
SLACK = 0.005
"""A rank within this share of a short-filled rank's cost below the level takes no more long samples."""


@dataclass(frozen=True)
class SourceWindow:
    """One source's window: the head of its FIFO, the tokens before each of its samples in the FIFO,
    which samples are due (must be taken now), the source's tokens per step at its weight, and the
    tokens it is to give this step beyond its deferred samples."""

    lengths: np.ndarray
    ahead: np.ndarray
    due: np.ndarray
    unit: float
    remaining: float


@dataclass(frozen=True)
class Longs:
    """Long samples: ``excess``, ``length`` and ``source`` (an index) of each."""

    excess: np.ndarray
    length: np.ndarray
    source: np.ndarray

    def with_one(self, other: Longs, i: int) -> Longs:
        return Longs(
            np.append(self.excess, other.excess[i]),
            np.append(self.length, other.length[i]),
            np.append(self.source, other.source[i]),
        )


@dataclass(frozen=True)
class StepShape:
    ranks: int
    micro_batches: int
    capacity: int

    @property
    def tokens(self) -> int:
        return self.ranks * self.micro_batches * self.capacity


def build_groups(
    seeds: Longs,
    candidates: Longs,
    order: np.ndarray,
    allowance: np.ndarray,
    level: float,
    slack: float,
    shape: StepShape,
    anchor: int = -1,
) -> tuple[np.ndarray, np.ndarray]:
    """Groups of long samples per rank up to ``level`` of excess (``_compose_groups``): the chosen
    candidates as a bool mask and the excess per rank. ``order`` lists the candidates by decreasing
    excess, older first among equals; a candidate counts against its source's ``allowance`` (tokens).
    The candidate ``anchor`` (if >= 0) is placed first among the seeds."""
    held = np.zeros(len(candidates.length), dtype=bool)
    if anchor >= 0:
        held[anchor] = True
        seeds = seeds.with_one(candidates, anchor)
        allowance = allowance.copy()
        allowance[candidates.source[anchor]] -= candidates.length[anchor]
    return build_groups_kernel(
        seeds.excess.astype(np.float64),
        seeds.length.astype(np.int64),
        candidates.excess.astype(np.float64),
        candidates.length.astype(np.int64),
        candidates.source.astype(np.int64),
        held,
        order.astype(np.int64),
        allowance.astype(np.float64),
        float(level),
        float(slack),
        shape.ranks,
        shape.micro_batches,
        shape.capacity,
    )


def pool_order(before: Sequence[np.ndarray], drawn: Sequence[np.ndarray]) -> np.ndarray:
    """The lengths of a step's candidates in the order ``SamplePool.take`` hands them to the scheduler:
    the deferred samples first, then the drawn samples of all sources interleaved by the share of their
    source's drawn tokens before them (ties: source order, then FIFO order)."""
    fractions, source_index, values = [], [], []
    for k, lengths in enumerate(drawn):
        as_float = lengths.astype(np.float64)
        total = as_float.sum() or 1.0
        fractions.append((np.cumsum(as_float) - as_float) / total)
        source_index.append(np.full(len(lengths), k))
        values.append(lengths)
    if not values:
        return np.concatenate([EMPTY, *before]).astype(np.int64)
    fraction, source, value = np.concatenate(fractions), np.concatenate(source_index), np.concatenate(values)
    order = np.lexsort((source, fraction))  # stable, so FIFO order within a source is kept
    return np.concatenate([EMPTY, *before, value[order]]).astype(np.int64)


def score(lengths: np.ndarray, shape: StepShape, cost_model: CostModel) -> float:
    """Mean over largest rank cost of the scheduler's plan of ``lengths``, times the share of the step's
    capacity it places: 1 for a full, perfectly balanced step."""
    if not len(lengths):
        return 0.0
    plan = plan_step(lengths, shape.ranks, shape.micro_batches, shape.capacity, cost_model)
    costs = plan.rank_costs(lengths, cost_model)
    largest = float(costs.max())
    balance = math.fsum(costs) / len(costs) / largest if largest > 0 else 1.0
    return balance * float(lengths[plan.placed_mask].sum()) / shape.tokens


def choose_option(uppers: Sequence[float], score_of: Callable[[int], float], prefer_older: float) -> int:
    """The first option whose score is within ``prefer_older`` of the best score, where option ``i`` scores
    ``score_of(i)`` and no more than ``uppers[i]``; ``score_of`` is called only for the options that could
    change the answer, in order."""
    scores: dict[int, float] = {}
    best = -math.inf
    for i, upper in enumerate(uppers):
        if upper >= best - prefer_older:  # else it can be neither the choice nor the best
            scores[i] = score_of(i)
            best = max(best, scores[i])
        chosen = next(j for j, value in scores.items() if value >= best - prefer_older)
        if scores[chosen] >= max(uppers[i + 1 :], default=-math.inf) - prefer_older:
            return chosen
    return next(j for j, value in scores.items() if value >= best - prefer_older)


@dataclass(frozen=True)
class _FillOrder:
    """What every option's fill of one source shares: its due samples and their tokens, and its short
    samples that are not due (the filler, in FIFO order) with their running token total (float64: exact
    for any count of tokens below 2**53, and a float ``need`` then searches it without a cast)."""

    due: np.ndarray
    due_tokens: int
    short: np.ndarray
    short_total: np.ndarray

    @classmethod
    def of(cls, window: SourceWindow, is_long: np.ndarray) -> _FillOrder:
        short = np.flatnonzero(~window.due & ~is_long)
        total = np.cumsum(window.lengths[short]).astype(np.float64)
        return cls(np.flatnonzero(window.due), int(window.lengths[window.due].sum()), short, total)


@dataclass(frozen=True)
class _Fill:
    """One option's take from one source, by part: its chosen long samples, the first ``shorts`` of the
    filler, and other long samples (``extra``) when the filler ran out; ``tokens`` in all."""

    chosen: np.ndarray
    shorts: int
    extra: np.ndarray
    tokens: int

    def positions(self, order: _FillOrder) -> np.ndarray:
        """The positions taken, ascending (the parts are disjoint)."""
        return np.sort(np.concatenate([order.due, self.chosen, order.short[: self.shorts], self.extra]))


def _fill(window: SourceWindow, is_long: np.ndarray, chosen: np.ndarray, order: _FillOrder) -> _Fill:
    """What to take from one source: the due samples and the ``chosen`` ones (long, not due), then short
    samples in FIFO order, then other long ones in FIFO order, while the source's remaining tokens are
    not exceeded."""
    chosen_tokens = int(window.lengths[chosen].sum())
    need = window.remaining - float(order.due_tokens + chosen_tokens)
    n = 0
    if need > 0:
        n = int(np.searchsorted(order.short_total, need, side="right"))
        need -= float(order.short_total[n - 1]) if n else 0.0
    extra = EMPTY
    if need > 0:
        picked = window.due.copy()
        picked[chosen] = True
        picked[order.short[:n]] = True
        lane = np.flatnonzero(~picked & is_long)
        total = np.cumsum(window.lengths[lane])
        extra = lane[: int(np.searchsorted(total, need, side="right"))]
    shorts = int(order.short_total[n - 1]) if n else 0
    return _Fill(chosen, n, extra, order.due_tokens + chosen_tokens + shorts + int(window.lengths[extra].sum()))


def compose_takes(
    windows: Mapping[str, SourceWindow],
    before: Mapping[str, np.ndarray],
    fixed: Mapping[str, np.ndarray],
    shape: StepShape,
    cost_model: CostModel,
) -> dict[str, np.ndarray]:
    """Positions to take from each source's window (``windows``, in source order). ``before``: every
    source's deferred lengths; ``fixed``: what sources without a window give (drawn lengths)."""
    names = list(windows)
    every = np.concatenate([EMPTY, *(w.lengths for w in windows.values()), *before.values()])
    per_token = cost_model.total(every) / max(int(every.sum()), 1)
    threshold = LONG_FRACTION * per_token * shape.micro_batches * shape.capacity
    long_in = {s: cost_model.costs(w.lengths) >= threshold for s, w in windows.items()}
    short = np.concatenate([EMPTY, *(w.lengths[~long_in[s]] for s, w in windows.items())])
    rho = cost_model.total(short) / int(short.sum()) if short.sum() else per_token

    def longs(lengths: np.ndarray, source: np.ndarray) -> Longs:
        return Longs(cost_model.costs(lengths) - rho * lengths, lengths, source)

    seed_parts = [b[cost_model.costs(b) >= threshold] for b in before.values()]
    seed_src = [np.full(len(p), -1) for p in seed_parts]
    cand_pos, cand_src, cand_age = [], [], []
    allowance = np.zeros(len(names))
    for k, (s, w) in enumerate(windows.items()):
        long, due = long_in[s], w.due
        seed_parts.append(w.lengths[long & due])
        seed_src.append(np.full(int((long & due).sum()), k))
        pos = np.flatnonzero(long & ~due)
        cand_pos.append(pos)
        cand_src.append(np.full(len(pos), k))
        cand_age.append(w.ahead[pos] / w.unit)
        allowance[k] = w.remaining - float(w.lengths[due].sum())
    seeds = longs(np.concatenate([EMPTY, *seed_parts]), np.concatenate([EMPTY, *seed_src]))
    positions = np.concatenate([EMPTY, *cand_pos])
    candidates = longs(
        np.concatenate([EMPTY, *(windows[s].lengths[p] for s, p in zip(names, cand_pos, strict=True))]),
        np.concatenate([EMPTY, *cand_src]),
    )
    age = np.concatenate([np.zeros(0), *cand_age])
    order = np.lexsort((age, -candidates.excess))
    by_age = np.argsort(age, kind="stable")
    slack = SLACK * rho * shape.micro_batches * shape.capacity

    _, seeded = build_groups(seeds, candidates, order, np.zeros(len(names)), 0.0, 0.0, shape)
    seeds_level = float(seeded.max())
    options: list[tuple[float, int]] = [(seeds_level, -1)]
    # An anchor is held whatever its source's allowance, so only a source behind its target gives one.
    anchors = by_age[allowance[candidates.source[by_age]] > 0][:ANCHORS]
    options += [(max(seeds_level, float(candidates.excess[a])), a) for a in anchors.tolist()]

    deferred = list(before.values())
    fill_orders = {s: _FillOrder.of(w, long_in[s]) for s, w in windows.items()}
    built: list[dict[str, _Fill]] = []
    for level, anchor in options:
        chosen, _ = build_groups(seeds, candidates, order, allowance, level, slack, shape, anchor)
        built.append(
            {
                s: _fill(w, long_in[s], positions[chosen & (candidates.source == k)], fill_orders[s])
                for k, (s, w) in enumerate(windows.items())
            }
        )

    def takes(i: int) -> dict[str, np.ndarray]:
        return {s: fill.positions(fill_orders[s]) for s, fill in built[i].items()}

    def drawn(i: int) -> list[np.ndarray]:
        taken = takes(i)
        return [windows[s].lengths[taken[s]] if s in windows else fixed[s] for s in before]

    # A score is a balance (at most 1, give or take a rounding) times the share of capacity placed.
    fixed_tokens = sum(int(lengths.sum()) for lengths in deferred) + sum(
        int(fixed[s].sum()) for s in before if s not in windows
    )
    uppers = [
        min(fixed_tokens + sum(fill.tokens for fill in fills.values()), shape.tokens) / shape.tokens + 1e-9
        for fills in built
    ]
    winner = choose_option(uppers, lambda i: score(pool_order(deferred, drawn(i)), shape, cost_model), PREFER_OLDER)
    return takes(winner)
