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
``PACK_BELOW``, packed options compete: the same options built again with their holes packed by window
samples, long and short (``HoleFill``; ``_compose_groups``), and one that packs whole micro-batches best
fit and deals them to ranks (``_compose_bins``: it wins where ranks hold several micro-batches). A packed
option takes what it packed and the due samples, no filler to the target (the credit carries the
difference, as for any source below its target), and is scored from its packing; the best wins if it
scores more than ``PREFER_OLDER`` above the grouped one. Its packing goes to the scheduler as a start
(``Composed.placement``): samples chosen to fit the holes are a set that a plan from scratch packs worse.

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

from pipeline.planning.mixing._compose_bins import pack_bins_kernel
from pipeline.planning.mixing._compose_groups import build_groups_kernel
from pipeline.planning.mixing._take import EMPTY
from pipeline.planning.scheduler import CostModel, plan_step

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


@dataclass(frozen=True)
class Slots:
    """The micro-batch (``rank * micro_batches + m``, -1 for none) that a packing put each seed, candidate
    and ``HoleFill.first`` sample into."""

    seed: np.ndarray
    cand: np.ndarray
    first: np.ndarray


@dataclass(frozen=True)
class Groups:
    """What ``build_groups`` built: the chosen candidates (a bool mask), the excess per rank, the tokens per
    rank and micro-batch (``bins``), and the micro-batch (``rank * micro_batches + m``, -1 for none) each
    seed, candidate and ``HoleFill.first`` sample went into."""

    chosen: np.ndarray
    excess: np.ndarray
    bins: np.ndarray
    slots: Slots


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
) -> Groups:
    """Groups of long samples per rank up to ``level`` of excess (``_compose_groups``). ``order``
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
    chosen, excess, bins, seed_slot, cand_slot, first_slot = build_groups_kernel(
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
    if anchor >= 0:
        cand_slot[anchor], seed_slot = seed_slot[-1], seed_slot[:-1]
    return Groups(chosen, excess, bins, Slots(seed_slot, cand_slot, first_slot))


def pool_permutation(before: Sequence[np.ndarray], drawn: Sequence[np.ndarray]) -> np.ndarray:
    """Where each of a step's candidates lies in ``np.concatenate([*before, *drawn])``, in the order
    ``SamplePool.take`` hands them to the scheduler: the deferred samples first, then the drawn samples of
    all sources interleaved by the share of their source's drawn tokens before them (ties: source order,
    then FIFO order)."""
    n_before = sum(len(lengths) for lengths in before)
    fractions, source_index = [], []
    for k, lengths in enumerate(drawn):
        as_float = lengths.astype(np.float64)
        total = as_float.sum() or 1.0
        fractions.append((np.cumsum(as_float) - as_float) / total)
        source_index.append(np.full(len(lengths), k))
    if not fractions:
        return np.arange(n_before)
    order = np.lexsort((np.concatenate(source_index), np.concatenate(fractions)))  # stable: FIFO order kept
    return np.concatenate([np.arange(n_before), n_before + order])


def pool_order(before: Sequence[np.ndarray], drawn: Sequence[np.ndarray]) -> np.ndarray:
    """The lengths of a step's candidates in ``SamplePool.take``'s order (``pool_permutation``)."""
    return np.concatenate([EMPTY, *before, *drawn]).astype(np.int64)[pool_permutation(before, drawn)]


def score(lengths: np.ndarray, shape: StepShape, cost_model: CostModel, start: np.ndarray | None = None) -> float:
    """Mean over largest rank cost of the scheduler's plan of ``lengths`` (from ``start`` too, where
    given), times the share of the step's capacity it places: 1 for a full, perfectly balanced step."""
    if not len(lengths):
        return 0.0
    plan = plan_step(lengths, shape.ranks, shape.micro_batches, shape.capacity, cost_model, start=start)
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


def _fill(
    window: SourceWindow, is_long: np.ndarray, chosen: np.ndarray, order: _FillOrder, to_target: bool = True
) -> _Fill:
    """What to take from one source: the due samples and the ``chosen`` ones (long, not due), then, with
    ``to_target``, short samples in FIFO order, then other long ones in FIFO order, while the source's
    remaining tokens are not exceeded."""
    if not to_target:  # a packing: what it chose is what fits, and it goes to the scheduler whole
        return _Fill(chosen, 0, EMPTY, order.due_tokens + int(window.lengths[chosen].sum()), order)
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
) -> Composed:
    """Positions to take from each source's window (``windows``, in source order), and where a packed
    option won, its placement. ``before``: every source's deferred lengths; ``fixed``: what sources
    without a window give (drawn lengths); ``goal``: the step's tokens."""
    names = list(windows)
    every = np.concatenate([EMPTY, *(w.lengths for w in windows.values()), *before.values()])
    per_token = cost_model.total(every) / max(int(every.sum()), 1)
    threshold = LONG_FRACTION * per_token * shape.micro_batches * shape.capacity
    long_in = {s: cost_model.costs(w.lengths) >= threshold for s, w in windows.items()}
    short = np.concatenate([EMPTY, *(w.lengths[~long_in[s]] for s, w in windows.items())])
    rho = cost_model.total(short) / int(short.sum()) if short.sum() else per_token

    def longs(lengths: np.ndarray, source: np.ndarray) -> Longs:
        return Longs(cost_model.costs(lengths) - rho * lengths, lengths, source)

    homes = _Homes(before, windows, fixed)
    long_before = {s: cost_model.costs(b) >= threshold for s, b in before.items()}
    seed_parts = [b[long_before[s]] for s, b in before.items()]
    seed_src = [np.full(len(p), -1) for p in seed_parts]
    seed_home = [homes.of("before", s, np.flatnonzero(long)) for s, long in long_before.items()]
    allowance = np.zeros(len(names))
    for k, (s, w) in enumerate(windows.items()):
        long, due = long_in[s], w.due
        seed_parts.append(w.lengths[long & due])
        seed_src.append(np.full(int((long & due).sum()), k))
        seed_home.append(homes.of("window", s, np.flatnonzero(long & due)))
        allowance[k] = w.remaining - float(w.lengths[due].sum())
    seeds = longs(np.concatenate([EMPTY, *seed_parts]), np.concatenate([EMPTY, *seed_src]))
    positions, source, age = _not_due(windows, long_in)
    candidates = longs(_lengths_at(windows, positions, source), source)
    order = np.lexsort((age, -candidates.excess))
    by_age = np.argsort(age, kind="stable")
    slack = SLACK * rho * shape.micro_batches * shape.capacity

    seeds_level = float(build_groups(seeds, candidates, order, np.zeros(len(names)), 0.0, 0.0, shape).excess.max())
    options: list[tuple[float, int]] = [(seeds_level, -1)]
    # An anchor is held whatever its source's allowance, so only a source behind its target gives one.
    anchors = by_age[allowance[candidates.source[by_age]] > 0][:ANCHORS]
    options += [(max(seeds_level, float(candidates.excess[a])), a) for a in anchors.tolist()]

    deferred = list(before.values())
    fill_orders = {s: _FillOrder.of(w, long_in[s]) for s, w in windows.items()}

    def fills(chosen: np.ndarray, at: np.ndarray, of: np.ndarray, to_target: bool = True) -> dict[str, _Fill]:
        """Each source's take where ``chosen`` marks the candidates at window positions ``at`` of sources
        ``of``, filled up to its target with ``to_target``."""
        return {
            s: _fill(w, long_in[s], at[chosen & (of == k)], fill_orders[s], to_target)
            for k, (s, w) in enumerate(windows.items())
        }

    # A score is a balance (at most 1, give or take a rounding) times the share of capacity placed.
    fixed_tokens = sum(int(lengths.sum()) for lengths in deferred) + sum(
        int(fixed[s].sum()) for s in before if s not in windows
    )

    # An option takes at most its target from a source (or its due samples, where more) and one sample more.
    bound = fixed_tokens + sum(
        max(w.remaining, float(w.lengths[w.due].sum())) + float(w.lengths.max(initial=0)) for w in windows.values()
    )

    def best(
        count: int,
        build: Callable[[int], dict[str, _Fill]],
        placement_of: Callable[[int, dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
    ) -> tuple[int, dict[str, np.ndarray], float]:
        """The chosen option, its positions per source and its score; options are built only as needed. An
        option with a placement (``placement_of`` its index and positions) is planned from it too."""
        option = cache(build)
        scores: dict[int, float] = {}

        def upper_of(i: int) -> float:
            tokens = fixed_tokens + sum(fill.tokens for fill in option(i).values())
            return min(tokens, shape.tokens) / shape.tokens + 1e-9

        def score_of(i: int) -> float:
            taken = {s: fill.positions for s, fill in option(i).items()}
            drawn = [windows[s].lengths[taken[s]] if s in windows else fixed[s] for s in before]
            permutation = pool_permutation(deferred, drawn)
            lengths = np.concatenate([EMPTY, *deferred, *drawn])[permutation]
            start = None
            if placement_of is not None:
                slots = placement_of(i, taken)
                parts = [slots[s][: len(b)] for s, b in before.items()] + [
                    slots[s][len(b) :] for s, b in before.items()
                ]
                start = np.concatenate([EMPTY, *parts])[permutation]
            scores[i] = score(lengths, shape, cost_model, start)
            return scores[i]

        upper_bound = min(bound, shape.tokens) / shape.tokens + 1e-9
        winner = choose_option(count, upper_of, score_of, PREFER_OLDER, upper_bound)
        return winner, {s: fill.positions for s, fill in option(winner).items()}, scores[winner]

    @cache
    def group(i: int) -> np.ndarray:
        level, anchor = options[i]
        return build_groups(seeds, candidates, order, allowance, level, slack, shape, anchor).chosen

    _, takes, grouped_score = best(len(options), lambda i: fills(group(i), positions, source))
    if grouped_score >= PACK_BELOW:
        return Composed(takes)
    # Pack the holes instead, with short candidates too (after the long ones, so the indices hold).
    short_positions, short_source, short_age = _not_due(windows, {s: ~v for s, v in long_in.items()})
    shorts = longs(_lengths_at(windows, short_positions, short_source), short_source)
    packable = Longs(
        np.concatenate([candidates.excess, shorts.excess]),
        np.concatenate([candidates.length, shorts.length]),
        np.concatenate([source, short_source]),
    )
    at = np.concatenate([positions, short_positions])
    # The samples every option holds besides the seeds: short deferred ones, short due ones, fixed draws.
    first = [(b, "before", s, ~long_before[s]) for s, b in before.items()]
    first += [(w.lengths, "window", s, w.due & ~long_in[s]) for s, w in windows.items()]
    first += [(fixed[s], "fixed", s, np.ones(len(fixed[s]), bool)) for s in before if s not in windows]
    first_home = np.concatenate([EMPTY, *(homes.of(part, s, np.flatnonzero(mask)) for _, part, s, mask in first)])
    holes = HoleFill(
        np.lexsort((np.concatenate([age, short_age]), packable.length)),
        np.array([float(fill_orders[s].short_total[-1]) if len(fill_orders[s].short) else 0.0 for s in names]),
        np.concatenate([EMPTY, *(lengths[mask] for lengths, _, _, mask in first)]),
        goal,
        (cost_model.alpha, cost_model.beta - rho, cost_model.gamma),
    )
    packed: list[tuple[Slots, dict[str, _Fill]]] = []
    for i, (level, anchor) in enumerate(options):
        groups = build_groups(seeds, packable, order, allowance, level, slack, shape, anchor, holes)
        plain = group(i)
        if not np.array_equal(groups.chosen[: len(plain)], plain) or groups.chosen[len(plain) :].any():
            packed.append((groups.slots, fills(groups.chosen, at, packable.source, to_target=False)))
    chosen, *slots = pack_bins_kernel(
        seeds.length.astype(np.int64),
        holes.first.astype(np.int64),
        packable.length.astype(np.int64),
        packable.source.astype(np.int64),
        holes.by_length.astype(np.int64),
        allowance.astype(np.float64),
        float(goal),
        shape.ranks,
        shape.micro_batches,
        shape.capacity,
        np.array([cost_model.alpha, cost_model.beta, cost_model.gamma], dtype=np.float64),
    )
    packed.append((Slots(*slots), fills(chosen, at, packable.source, to_target=False)))
    window_start = np.array([homes.of("window", s, 0) for s in names], dtype=np.int64)
    cand_home = window_start[packable.source] + at
    seed_homes = np.concatenate([EMPTY, *seed_home])

    def placement_of(i: int, taken: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return homes.placement(packed[i][0], seed_homes, first_home, cand_home, taken)

    winner, packed_takes, packed_score = best(len(packed), lambda i: packed[i][1], placement_of)
    if packed_score <= grouped_score + PREFER_OLDER:
        return Composed(takes)
    return Composed(packed_takes, placement_of(winner, packed_takes))


@dataclass(frozen=True)
class Composed:
    """``compose_takes``' answer: the positions to take from each source's window, and where the holes were
    packed, the packing: per source, the micro-batch (``rank * micro_batches + m``, -1 for none) of each
    of its deferred samples, then of each sample taken (in FIFO order), as ``Draw.lengths`` lists them."""

    take: dict[str, np.ndarray]
    placement: dict[str, np.ndarray] | None = None


class _Homes:
    """The step's samples laid end to end, source by source: the deferred ones, then each window, then what
    the sources without a window give. The kernel's seeds, ``HoleFill.first`` samples and candidates each
    have a home here, so that the micro-batches it put them in can be read back by source."""

    def __init__(
        self, before: Mapping[str, np.ndarray], windows: Mapping[str, SourceWindow], fixed: Mapping[str, np.ndarray]
    ) -> None:
        parts = [("before", s, len(b)) for s, b in before.items()]
        parts += [("window", s, len(w.lengths)) for s, w in windows.items()]
        parts += [("fixed", s, len(fixed[s])) for s in before if s not in windows]
        ends = np.cumsum([n for _, _, n in parts], dtype=np.int64).tolist()
        self.span = {(part, s): (end - n, end) for (part, s, n), end in zip(parts, ends, strict=True)}
        self.size = ends[-1] if ends else 0

    def of(self, part: str, source: str, index: np.ndarray) -> np.ndarray:
        return self.span[part, source][0] + index

    def placement(
        self,
        slots: Slots,
        seed_home: np.ndarray,
        first_home: np.ndarray,
        cand_home: np.ndarray,
        take: Mapping[str, np.ndarray],
    ) -> dict[str, np.ndarray]:
        """``Composed.placement`` of ``slots`` where the sources take ``take`` from their windows."""
        slot = np.full(self.size, -1, np.int64)
        slot[seed_home] = slots.seed
        slot[first_home] = slots.first
        slot[cand_home] = slots.cand
        out = {}
        for (part, s), (begin, end) in self.span.items():
            if part == "before":
                out[s] = slot[begin:end]
            elif part == "window":
                out[s] = np.concatenate([out[s], slot[begin:end][take[s]]])
            else:
                out[s] = np.concatenate([out[s], slot[begin:end]])
        return out


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
