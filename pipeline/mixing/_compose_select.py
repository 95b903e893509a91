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
held too). Each option is planned with ``plan_step`` as the constructor will plan it (candidates in
``SamplePool.take``'s order; the deferred ones source by source); the first (oldest anchor) whose score
(mean over largest rank cost, times the share of capacity placed) is within ``PREFER_OLDER`` of the best
wins. Sums that steer a choice are exact (``math.fsum``, ``CostModel.total``), so a restarted
constructor composes the same steps on any machine.

**Packed options.** Where short samples are too few to fill around the groups (a window of mostly long
samples), the best option scores low: holes stay in the micro-batches. When it scores below
``PACK_BELOW``, the same options are built again with their holes packed by window samples, long and
short (``HoleFill``; ``_compose_groups``), and the best packed option wins if it scores more than
``PREFER_OLDER`` above.

Planning is most of the cost, so options are planned lazily (``choose_option``): an option's score is at
most the share of capacity it draws, which bounds what the options not planned yet can reach; the choice
is the one planning every option would make, usually after planning the first. No option draws more
than each source's target (or its due samples) and one sample, so where the first option scores within
``PREFER_OLDER`` of that, the others are not even built (at 10k ranks, building them cost more than the
plan).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property

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
PACK_BELOW = 0.97
"""Where the best option scores below this, options whose holes are packed with window samples compete."""


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


@dataclass(frozen=True)
class HoleFill:
    """What the grouping kernel needs to pack the holes with window samples where short samples are too
    few: the candidates (long, then short) by increasing length (``by_length``), each source's short
    filler tokens (``filler``: nothing is packed where they cover every allowance), the samples every
    option holds that are not seeds (``first``), the step's ``goal`` in tokens, and the excess of a sample
    of ``L`` tokens as ``(a, b, g)``: ``a*L*L + b*L + g``."""

    by_length: np.ndarray
    filler: np.ndarray
    first: np.ndarray
    goal: float
    excess: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @classmethod
    def none(cls, sources: int) -> HoleFill:
        return cls(EMPTY, np.zeros(sources), EMPTY, 0.0)


def build_groups(
    seeds: Longs,
    candidates: Longs,
    order: np.ndarray,
    allowance: np.ndarray,
    level: float,
    slack: float,
    shape: StepShape,
    anchor: int = -1,
    holes: HoleFill | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Groups of long samples per rank up to ``level`` of excess (``_compose_groups``): the chosen
    candidates as a bool mask, the excess per rank and the tokens per rank and micro-batch. ``order``
    lists the candidates by decreasing excess, older first among equals (only those it lists are
    grouped); a candidate counts against its source's ``allowance`` (tokens). The candidate ``anchor``
    (if >= 0) is placed first among the seeds. With ``holes``, where a source's short samples cannot
    fill its allowance, the candidates then pack the micro-batches' holes (``_fill_holes``)."""
    holes = holes or HoleFill.none(len(allowance))
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
        holes.by_length.astype(np.int64),
        holes.filler.astype(np.float64),
        holes.first.astype(np.int64),
        float(holes.goal),
        np.array(holes.excess, dtype=np.float64),
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


@dataclass(frozen=True)
class _FillOrder:
    """What every option's fill of one source shares: its due samples and their tokens, and its short
    samples that are not due (the filler, in FIFO order) with their running token total (float64: exact
    for any count of tokens below 2**53, and a float ``need`` then searches it without a cast)."""

    due: np.ndarray
    due_tokens: int
    short: np.ndarray
    short_total: np.ndarray
    size: int  # samples in the window

    @classmethod
    def of(cls, window: SourceWindow, is_long: np.ndarray) -> _FillOrder:
        short = np.flatnonzero(~window.due & ~is_long)
        total = np.cumsum(window.lengths[short]).astype(np.float64)
        due_tokens = int(window.lengths[window.due].sum())
        return cls(np.flatnonzero(window.due), due_tokens, short, total, len(window.lengths))


@dataclass(frozen=True)
class _Fill:
    """One option's take from one source, by part: its chosen long samples, the first ``shorts`` of the
    filler, and other long samples (``extra``) when the filler ran out; ``tokens`` in all."""

    chosen: np.ndarray
    shorts: int
    extra: np.ndarray
    tokens: int
    order: _FillOrder

    @cached_property
    def positions(self) -> np.ndarray:
        """The positions taken, ascending (a mask over the window: at 10k ranks a sort of the parts took
        60 ms)."""
        taken = np.zeros(self.order.size, dtype=bool)
        for part in (self.order.due, self.chosen, self.order.short[: self.shorts], self.extra):
            taken[part] = True
        return np.flatnonzero(taken)


def _fill(window: SourceWindow, is_long: np.ndarray, chosen: np.ndarray, order: _FillOrder) -> _Fill:
    """What to take from one source: the due samples and the ``chosen`` ones (long, not due), then short
    samples in FIFO order, then other long ones in FIFO order, while the source's remaining tokens are
    not exceeded."""
    if not is_long[chosen].all():  # the hole fill chose short samples: the filler is the others
        taken = is_long.copy()
        taken[chosen] = True
        order = _FillOrder.of(window, taken)
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
    return _Fill(chosen, n, extra, order.due_tokens + chosen_tokens + shorts + int(window.lengths[extra].sum()), order)


def compose_takes(
    windows: Mapping[str, SourceWindow],
    before: Mapping[str, np.ndarray],
    fixed: Mapping[str, np.ndarray],
    shape: StepShape,
    cost_model: CostModel,
    goal: float,
) -> dict[str, np.ndarray]:
    """Positions to take from each source's window (``windows``, in source order). ``before``: every
    source's deferred lengths; ``fixed``: what sources without a window give (drawn lengths); ``goal``:
    the step's tokens."""
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
    allowance = np.zeros(len(names))
    for k, (s, w) in enumerate(windows.items()):
        long, due = long_in[s], w.due
        seed_parts.append(w.lengths[long & due])
        seed_src.append(np.full(int((long & due).sum()), k))
        allowance[k] = w.remaining - float(w.lengths[due].sum())
    seeds = longs(np.concatenate([EMPTY, *seed_parts]), np.concatenate([EMPTY, *seed_src]))
    positions, source, age = _not_due(windows, long_in)
    candidates = longs(_lengths_at(windows, positions, source), source)
    order = np.lexsort((age, -candidates.excess))
    by_age = np.argsort(age, kind="stable")
    slack = SLACK * rho * shape.micro_batches * shape.capacity

    _, seeded, _ = build_groups(seeds, candidates, order, np.zeros(len(names)), 0.0, 0.0, shape)
    seeds_level = float(seeded.max())
    options: list[tuple[float, int]] = [(seeds_level, -1)]
    # An anchor is held whatever its source's allowance, so only a source behind its target gives one.
    anchors = by_age[allowance[candidates.source[by_age]] > 0][:ANCHORS]
    options += [(max(seeds_level, float(candidates.excess[a])), a) for a in anchors.tolist()]

    deferred = list(before.values())
    fill_orders = {s: _FillOrder.of(w, long_in[s]) for s, w in windows.items()}

    def fills(chosen: np.ndarray, at: np.ndarray, of: np.ndarray) -> dict[str, _Fill]:
        """Each source's take where ``chosen`` marks the candidates at window positions ``at`` of sources ``of``."""
        return {
            s: _fill(w, long_in[s], at[chosen & (of == k)], fill_orders[s]) for k, (s, w) in enumerate(windows.items())
        }

    # A score is a balance (at most 1, give or take a rounding) times the share of capacity placed.
    fixed_tokens = sum(int(lengths.sum()) for lengths in deferred) + sum(
        int(fixed[s].sum()) for s in before if s not in windows
    )

    # An option takes at most its target from a source (or its due samples, where more) and one sample more.
    bound = fixed_tokens + sum(
        max(w.remaining, float(w.lengths[w.due].sum())) + float(w.lengths.max(initial=0)) for w in windows.values()
    )

    def best(count: int, build: Callable[[int], dict[str, _Fill]]) -> tuple[dict[str, np.ndarray], float]:
        """The chosen option's positions per source, and its score; options are built only as needed."""
        option = cache(build)
        scores: dict[int, float] = {}

        def upper_of(i: int) -> float:
            tokens = fixed_tokens + sum(fill.tokens for fill in option(i).values())
            return min(tokens, shape.tokens) / shape.tokens + 1e-9

        def score_of(i: int) -> float:
            taken = {s: fill.positions for s, fill in option(i).items()}
            drawn = [windows[s].lengths[taken[s]] if s in windows else fixed[s] for s in before]
            scores[i] = score(pool_order(deferred, drawn), shape, cost_model)
            return scores[i]

        upper_bound = min(bound, shape.tokens) / shape.tokens + 1e-9
        winner = choose_option(count, upper_of, score_of, PREFER_OLDER, upper_bound)
        return {s: fill.positions for s, fill in option(winner).items()}, scores[winner]

    @cache
    def group(i: int) -> np.ndarray:
        level, anchor = options[i]
        return build_groups(seeds, candidates, order, allowance, level, slack, shape, anchor)[0]

    takes, grouped_score = best(len(options), lambda i: fills(group(i), positions, source))
    if grouped_score >= PACK_BELOW:
        return takes
    # Pack the holes instead, with short candidates too (after the long ones, so the indices hold).
    short_positions, short_source, short_age = _not_due(windows, {s: ~v for s, v in long_in.items()})
    shorts = longs(_lengths_at(windows, short_positions, short_source), short_source)
    packable = Longs(
        np.concatenate([candidates.excess, shorts.excess]),
        np.concatenate([candidates.length, shorts.length]),
        np.concatenate([source, short_source]),
    )
    at = np.concatenate([positions, short_positions])
    holes = HoleFill(
        np.lexsort((np.concatenate([age, short_age]), packable.length)),
        np.array([float(fill_orders[s].short_total[-1]) if len(fill_orders[s].short) else 0.0 for s in names]),
        np.concatenate(
            [
                EMPTY,
                *(b[cost_model.costs(b) < threshold] for b in before.values()),
                *(w.lengths[w.due & ~long_in[s]] for s, w in windows.items()),
                *(fixed[s] for s in before if s not in windows),
            ]
        ),
        goal,
        (cost_model.alpha, cost_model.beta - rho, cost_model.gamma),
    )
    packed = []
    for i, (level, anchor) in enumerate(options):
        chosen, _, _ = build_groups(seeds, packable, order, allowance, level, slack, shape, anchor, holes)
        plain = group(i)
        if not np.array_equal(chosen[: len(plain)], plain) or chosen[len(plain) :].any():
            packed.append(fills(chosen, at, packable.source))
    if not packed:
        return takes
    packed_takes, packed_score = best(len(packed), packed.__getitem__)
    return packed_takes if packed_score > grouped_score + PREFER_OLDER else takes


def _not_due(
    windows: Mapping[str, SourceWindow], kind: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The window positions of every source's samples of ``kind`` that are not due, source by source, with
    their source's index and their age (tokens before them in the FIFO over the source's tokens per step)."""
    parts = [np.flatnonzero(kind[s] & ~w.due) for s, w in windows.items()]
    ages = [w.ahead[p] / w.unit for p, w in zip(parts, windows.values(), strict=True)]
    sources = [np.full(len(p), k) for k, p in enumerate(parts)]
    return np.concatenate([EMPTY, *parts]), np.concatenate([EMPTY, *sources]), np.concatenate([np.zeros(0), *ages])


def _lengths_at(windows: Mapping[str, SourceWindow], positions: np.ndarray, source: np.ndarray) -> np.ndarray:
    lengths = [w.lengths[positions[source == k]] for k, w in enumerate(windows.values())]
    return np.concatenate([EMPTY, *lengths])
