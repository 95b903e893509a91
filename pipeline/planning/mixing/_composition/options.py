"""A composed step's options: which window samples make up each, how each is scored as the scheduler will
plan it, and which one is chosen (pure, numpy; plans with the scheduler to compare).

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
``PACK_BELOW``, packed options compete, each source's allowance raised by ``PACK_AHEAD`` micro-batches
(less what it is ahead of its tokens per step), so that a source of short samples can fill a hole its
share alone cannot (and take nothing in the next step): the same options built again with their holes
packed by window samples, long and short (``HoleFill``; ``packing.fill_holes``), and one that packs whole
micro-batches best fit and deals them to ranks (``packing.pack_bins``: it wins where ranks hold several
micro-batches). A packed option takes what it packed and the due samples, no filler to the target (the
credit carries the difference, as for any source below its target), and is scored from its packing; the
best wins if it scores more than ``PREFER_OLDER`` above the grouped one. Its packing goes to the
scheduler as a start (``Composed.placement``): samples chosen to fit the holes are a set that a plan from
scratch packs worse.

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
from functools import cache

import numpy as np

from pipeline.planning.mixing._composition import speculative
from pipeline.planning.mixing._composition.groups import build_groups
from pipeline.planning.mixing._composition.packing import pack_bins
from pipeline.planning.mixing._composition.values import (
    Composed,
    HoleFill,
    Longs,
    Slots,
    SourceWindow,
    StepMedia,
)
from pipeline.planning.mixing._composition.windows import Fill, FillOrder, Homes, fill, lengths_at, not_due
from pipeline.planning.mixing._take import EMPTY
from pipeline.planning.order import candidate_order
from pipeline.planning.scheduler import CostModel, plan_step, plan_with_media
from pipeline.planning.shape import StepShape

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
PACK_AHEAD = 1.0
"""Micro-batches of tokens a packed option may take from a source beyond its allowance."""


def compose_takes(
    windows: Mapping[str, SourceWindow],
    before: Mapping[str, np.ndarray],
    fixed: Mapping[str, np.ndarray],
    shape: StepShape,
    cost_model: CostModel,
    goal: float,
    media: tuple[StepMedia, Mapping[str, np.ndarray]] | None = None,
) -> Composed:
    """Positions to take from each source's window (``windows``, in source order), and where a packed
    option won, its placement. ``before``: every source's deferred lengths; ``fixed``: what sources
    without a window give (drawn lengths); ``goal``: the step's tokens. ``media``: where the samples carry
    images or clips, their patches and encoder costs, and the FIFO positions the ``fixed`` lengths are at:
    options are then scored with their true costs and both capacities."""
    step = _Composition(windows, before, fixed, shape, cost_model, media)
    _, takes, grouped_score = step.best(
        len(step.options), lambda i: step.fills(step.group(i), step.positions, step.source)
    )
    if grouped_score >= PACK_BELOW:
        return Composed(takes)
    packed, placement_of = step.packed_options(goal)
    winner, packed_takes, packed_score = step.best(len(packed), lambda i: packed[i][1], placement_of)
    if packed_score <= grouped_score + PREFER_OLDER:
        return Composed(takes)
    return Composed(packed_takes, placement_of(winner, packed_takes))


class _Composition:
    """One step's composition: the windows' long samples split into seeds (deferred or due, which every
    option holds) and candidates (window positions ``positions`` of sources ``source``), the options (a
    level of excess and an anchor, -1 for none), and how an option is filled, planned and scored (with
    ``media``, see ``compose_takes``)."""

    def __init__(
        self,
        windows: Mapping[str, SourceWindow],
        before: Mapping[str, np.ndarray],
        fixed: Mapping[str, np.ndarray],
        shape: StepShape,
        cost_model: CostModel,
        media: tuple[StepMedia, Mapping[str, np.ndarray]] | None = None,
    ) -> None:
        self.windows, self.before, self.fixed, self.shape, self.cost_model = windows, before, fixed, shape, cost_model
        self.names = list(windows)
        every = np.concatenate([EMPTY, *(w.lengths for w in windows.values()), *before.values()])
        per_token = cost_model.total(every) / max(int(every.sum()), 1)
        self.threshold = LONG_FRACTION * per_token * shape.micro_batches * shape.tokens_per_micro_batch
        self.long_in = {s: cost_model.costs(w.lengths) >= self.threshold for s, w in windows.items()}
        short = np.concatenate([EMPTY, *(w.lengths[~self.long_in[s]] for s, w in windows.items())])
        self.rho = cost_model.total(short) / int(short.sum()) if short.sum() else per_token
        self.homes = Homes(before, windows, fixed)
        self.long_before = {s: cost_model.costs(b) >= self.threshold for s, b in before.items()}
        self.seeds, self.seed_homes, self.allowance = self._seeds()
        self.positions, self.source, self.age = not_due(windows, self.long_in)
        self.candidates = self.longs(lengths_at(windows, self.positions, self.source), self.source)
        self.order = np.lexsort((self.age, -self.candidates.excess))
        self.slack = SLACK * self.rho * shape.micro_batches * shape.tokens_per_micro_batch
        self.options = self._options()
        self.deferred = list(before.values())
        self.fill_orders = {s: FillOrder.of(w, self.long_in[s]) for s, w in windows.items()}
        # A score is a balance (at most 1, give or take a rounding) times the share of capacity placed.
        self.fixed_tokens = sum(int(lengths.sum()) for lengths in self.deferred) + sum(
            int(fixed[s].sum()) for s in before if s not in windows
        )
        # An option takes at most its target from a source (or its due samples, where more) and one sample more.
        self.bound = self.fixed_tokens + sum(
            max(w.remaining, float(w.lengths[w.due].sum())) + float(w.lengths.max(initial=0)) for w in windows.values()
        )
        self.group = cache(self._group)
        self.media = media

    def longs(self, lengths: np.ndarray, source: np.ndarray) -> Longs:
        return Longs(self.cost_model.costs(lengths) - self.rho * lengths, lengths, source)

    def _seeds(self) -> tuple[Longs, np.ndarray, np.ndarray]:
        """The seeds (long samples deferred or due), where each lies (``Homes``), and each source's
        allowance: its remaining tokens beyond its due samples."""
        seed_parts = [b[self.long_before[s]] for s, b in self.before.items()]
        seed_src = [np.full(len(p), -1) for p in seed_parts]
        seed_home = [self.homes.of("before", s, np.flatnonzero(long)) for s, long in self.long_before.items()]
        allowance = np.zeros(len(self.names))
        for k, (s, w) in enumerate(self.windows.items()):
            long, due = self.long_in[s], w.due
            seed_parts.append(w.lengths[long & due])
            seed_src.append(np.full(int((long & due).sum()), k))
            seed_home.append(self.homes.of("window", s, np.flatnonzero(long & due)))
            allowance[k] = w.remaining - float(w.lengths[due].sum())
        seeds = self.longs(np.concatenate([EMPTY, *seed_parts]), np.concatenate([EMPTY, *seed_src]))
        return seeds, np.concatenate([EMPTY, *seed_home]), allowance

    def _options(self) -> list[tuple[float, int]]:
        """The seeds' own level, then the level of each of the oldest ``ANCHORS`` candidates of sources
        behind their targets (an anchor is held whatever its source's allowance)."""
        no_allowance = np.zeros(len(self.names))
        seeds_level = float(
            build_groups(self.seeds, self.candidates, self.order, no_allowance, 0.0, 0.0, self.shape).excess.max()
        )
        by_age = np.argsort(self.age, kind="stable")
        anchors = by_age[self.allowance[self.candidates.source[by_age]] > 0][:ANCHORS]
        return [(seeds_level, -1)] + [(max(seeds_level, float(self.candidates.excess[a])), a) for a in anchors.tolist()]

    def _group(self, i: int) -> np.ndarray:
        level, anchor = self.options[i]
        groups = build_groups(
            self.seeds, self.candidates, self.order, self.allowance, level, self.slack, self.shape, anchor
        )
        return groups.chosen

    def fills(self, chosen: np.ndarray, at: np.ndarray, of: np.ndarray, to_target: bool = True) -> dict[str, Fill]:
        """Each source's take where ``chosen`` marks the candidates at window positions ``at`` of sources
        ``of``, filled up to its target with ``to_target``."""
        return {
            s: fill(w, self.long_in[s], at[chosen & (of == k)], self.fill_orders[s], to_target)
            for k, (s, w) in enumerate(self.windows.items())
        }

    def best(
        self,
        count: int,
        build: Callable[[int], dict[str, Fill]],
        placement_of: Callable[[int, dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
    ) -> tuple[int, dict[str, np.ndarray], float]:
        """The chosen option, its positions per source and its score; options are built only as needed. An
        option with a placement (``placement_of`` its index and positions) is planned from it too."""
        option = cache(build)
        scores: dict[int, float] = {}
        shape = self.shape

        def upper_of(i: int) -> float:
            tokens = self.fixed_tokens + sum(fill.tokens for fill in option(i).values())
            return min(tokens, shape.tokens_per_step) / shape.tokens_per_step + 1e-9

        def score_of(i: int) -> float:
            taken = {s: fill.positions for s, fill in option(i).items()}
            drawn = [self.windows[s].lengths[taken[s]] if s in self.windows else self.fixed[s] for s in self.before]
            permutation = pool_permutation(self.deferred, drawn)
            lengths = np.concatenate([EMPTY, *self.deferred, *drawn])[permutation]
            start = None
            if placement_of is not None:
                slots = placement_of(i, taken)
                parts = [slots[s][: len(b)] for s, b in self.before.items()]
                parts += [slots[s][len(b) :] for s, b in self.before.items()]
                start = np.concatenate([EMPTY, *parts])[permutation]
            scores[i] = score(lengths, shape, self.cost_model, start, self._media_of(taken, permutation))
            return scores[i]

        upper_bound = min(self.bound, shape.tokens_per_step) / shape.tokens_per_step + 1e-9
        scorer = speculative.SpeculativeScores(score_of, count, speculative.PLANNING_THREADS)
        try:
            winner = choose_option(count, upper_of, scorer, PREFER_OLDER, upper_bound)
        finally:
            scorer.close()
        return winner, {s: fill.positions for s, fill in option(winner).items()}, scores[winner]

    def _media_of(
        self, taken: dict[str, np.ndarray], permutation: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, bool] | None:
        """``score``'s ``media`` for an option taking ``taken`` from the windows, or None for text."""
        if self.media is None:
            return None
        media, fixed_take = self.media
        positions = {s: taken[s] if s in self.windows else fixed_take[s] for s in self.before}
        patches, encoder = media.of_step(list(self.before), positions)
        return patches[permutation], encoder[permutation], media.even_encoder

    def packed_options(
        self, goal: float
    ) -> tuple[list[tuple[Slots, dict[str, Fill]]], Callable[[int, dict[str, np.ndarray]], dict[str, np.ndarray]]]:
        """The options with their holes packed by window samples, long and short (each grouped option whose
        packing chose otherwise than its grouping, then whole micro-batches packed best fit), and the
        placement of option ``i`` where the sources take what it takes."""
        shorts_at, shorts_source, shorts_age = not_due(self.windows, {s: ~v for s, v in self.long_in.items()})
        shorts = self.longs(lengths_at(self.windows, shorts_at, shorts_source), shorts_source)
        # The short candidates go after the long ones, so the indices of the long ones hold.
        packable = Longs(
            np.concatenate([self.candidates.excess, shorts.excess]),
            np.concatenate([self.candidates.length, shorts.length]),
            np.concatenate([self.source, shorts_source]),
        )
        at = np.concatenate([self.positions, shorts_at])
        holes, first_home = self._hole_fill(goal, np.concatenate([self.age, shorts_age]), packable)
        allowance = self.allowance + self._ahead_allowance()
        packed: list[tuple[Slots, dict[str, Fill]]] = []
        for i, (level, anchor) in enumerate(self.options):
            args = (self.order, allowance, level, self.slack, self.shape, anchor, holes)
            groups = build_groups(self.seeds, packable, *args)
            plain = self.group(i)
            if not np.array_equal(groups.chosen[: len(plain)], plain) or groups.chosen[len(plain) :].any():
                packed.append((groups.slots, self.fills(groups.chosen, at, packable.source, to_target=False)))
        chosen, slots = pack_bins(self.seeds, packable, holes, allowance, self.shape, self.cost_model)
        packed.append((slots, self.fills(chosen, at, packable.source, to_target=False)))
        window_start = np.array([self.homes.of("window", s, 0) for s in self.names], dtype=np.int64)
        cand_home = window_start[packable.source] + at

        def placement_of(i: int, taken: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return self.homes.placement(packed[i][0], self.seed_homes, first_home, cand_home, taken)

        return packed, placement_of

    def _ahead_allowance(self) -> np.ndarray:
        """Per source, the tokens a packed option may take beyond its allowance: ``PACK_AHEAD`` micro-batches,
        less what its target is already below its tokens per step (it is ahead by that much)."""
        ahead = np.array([max(0.0, w.unit - w.remaining) for w in self.windows.values()])
        return np.maximum(0.0, PACK_AHEAD * self.shape.tokens_per_micro_batch - ahead)

    def _hole_fill(self, goal: float, age: np.ndarray, packable: Longs) -> tuple[HoleFill, np.ndarray]:
        """What the kernels need to pack the holes, and where each of its ``first`` samples lies: the samples
        every option holds besides the seeds (short deferred ones, short due ones, fixed draws)."""
        first = [(b, "before", s, ~self.long_before[s]) for s, b in self.before.items()]
        first += [(w.lengths, "window", s, w.due & ~self.long_in[s]) for s, w in self.windows.items()]
        first += [
            (self.fixed[s], "fixed", s, np.ones(len(self.fixed[s]), bool)) for s in self.before if s not in self.windows
        ]
        homes = [self.homes.of(part, s, np.flatnonzero(mask)) for _, part, s, mask in first]
        filler = [
            float(self.fill_orders[s].short_total[-1]) if len(self.fill_orders[s].short) else 0.0 for s in self.names
        ]
        holes = HoleFill(
            np.lexsort((age, packable.length)),
            np.array(filler),
            np.concatenate([EMPTY, *(lengths[mask] for lengths, _, _, mask in first)]),
            goal,
            (self.cost_model.alpha, self.cost_model.beta - self.rho, self.cost_model.gamma),
        )
        return holes, np.concatenate([EMPTY, *homes])


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
        plan = plan_with_media(lengths, shape, cost_model, start, patches, encoder, even, near_bounds=False)
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
