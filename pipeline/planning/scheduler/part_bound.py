"""``largest_rank_bound``: how low the costliest rank of a step can go. For the samples a step holds and one part of
their cost (the vision encoder's, the LLM's, or both together), a lower bound of the largest rank's sum of that
part over every plan that puts each sample whole on one rank and keeps both capacities of a micro-batch. Pure.

Each argument below holds for every such plan, so their largest does too:

- the mean: the ranks hold every sample between them, so the costliest holds at least the total over ``R``;
- pigeonhole: of the ``k*R + 1`` costliest samples (any ``k >= 0``) some rank holds ``k + 1``, which cost at least
  the ``k + 1`` cheapest of them (``k = 0``: the costliest sample alone; ``k = 1``: the R-th and (R+1)-th);
- room: the other ``R - 1`` ranks hold at most ``micro_batches * tokens_per_micro_batch`` tokens each (and
  ``micro_batches * patches_per_micro_batch`` patches, under a patch budget), so the rank of sample ``h`` holds,
  besides ``h``, the tokens (patches) that do not fit there; whichever samples bring them, they cost at least the
  least that samples taken in any fractions can (the fractional covering, taken cheapest per token first), so
  that rank costs at least ``cost(h)`` plus it;
- a cramped rank: the micro-batch of sample ``j`` has ``tokens_per_micro_batch - tokens(j)`` tokens and
  ``patches_per_micro_batch - patches(j)`` patches left for the others, and its rank's other micro-batches a
  micro-batch's each, so that rank holds at most what samples taken in any fractions can bring within that room
  (the fractional knapsack, by tokens and by patches: the lesser); the other ``R - 1`` ranks hold the rest, and
  the costliest of them at least its mean. A text sample that fills its micro-batch leaves its rank a
  micro-batch's patches fewer: the encoder's work it cannot take goes to the other ranks.
- crowded ranks: samples over half a micro-batch's tokens (or patches) cannot share one, so ``k`` of them take
  ``k`` micro-batches, each left with at most the room the roomiest of them leaves (tokens and patches that the
  other samples can bring in both limits, as for a cramped rank); a rank holding ``c`` of them
  holds at most ``c`` times the costliest of them plus what samples taken in fractions bring within its room
  (``cap(c)``, concave in ``c``). Every rank holds at most its cap and all of them the whole step, so the largest
  holds at least the level ``x`` where ``sum(min(x, cap(c_r)))`` reaches the step's total; of every way to
  spread the ``k`` over the ranks, spreading them evenly gives the lowest level (the sum is Schur-concave in the
  counts), which is the bound. Several long texts in a step leave several ranks a micro-batch of patches each,
  and the images crowd the others.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.shape import StepShape

ROOM_CANDIDATES = 8
"""How many samples the room and cramped rank arguments are each tried for: the costliest and those that fill
their micro-batch the most (any sample gives a sound bound; those give the highest)."""


def largest_rank_bound(values: np.ndarray, lengths: np.ndarray, patches: np.ndarray, shape: StepShape) -> float:
    """A lower bound of the largest rank's sum of ``values`` (one per sample, >= 0: a part of each sample's
    cost) over every plan of these samples (``lengths`` tokens and ``patches`` patches each) on ``shape``'s
    ranks and micro-batches: the largest of the mean, pigeonhole, room and cramped rank arguments (the module
    docstring); 0 for no samples."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if not values.size:
        return 0.0
    lengths = np.asarray(lengths, dtype=np.float64).reshape(-1)
    patches = np.asarray(patches, dtype=np.float64).reshape(-1)
    if not values.size == lengths.size == patches.size:
        msg = f"one value, length and patch count a sample: got {values.size}, {lengths.size}, {patches.size}"
        raise ValueError(msg)
    ranks = shape.ranks
    bound = max(float(values.sum()) / ranks, pigeonhole_bound(values, ranks))
    room = [(lengths, shape.micro_batches * shape.tokens_per_micro_batch)]
    if shape.patches_per_micro_batch > 0:
        room.append((patches, shape.micro_batches * shape.patches_per_micro_batch))
    for weights, per_rank in room:
        bound = max(bound, room_bound(values, weights, (ranks - 1) * per_rank))
    return max(bound, cramped_bound(values, lengths, patches, shape), crowded_bound(values, lengths, patches, shape))


def pigeonhole_bound(values: np.ndarray, ranks: int) -> float:
    """The largest over ``k >= 0`` of the sum of the ``k + 1`` smallest of the ``k*ranks + 1`` largest
    ``values``: some rank holds ``k + 1`` of those samples."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))[::-1]  # costliest first
    sums = np.concatenate([[0.0], np.cumsum(ordered)])
    k = np.arange((ordered.size - 1) // ranks + 1)
    top = k * ranks + 1  # the k*R + 1 costliest samples
    return float((sums[top] - sums[top - k - 1]).max())


def room_bound(values: np.ndarray, weights: np.ndarray, others_hold: float) -> float:
    """The largest over the ``ROOM_CANDIDATES`` costliest samples ``h`` of ``values[h]`` plus the least
    ``values`` the other samples bring to ``h``'s rank: ``weights`` (tokens or patches) that the other
    ranks, holding at most ``others_hold`` of them, leave there."""
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    left = float(weights.sum()) - others_hold
    if left <= 0:
        return 0.0
    cheapest = Fractions(values, weights, cheapest_first=True)
    best = 0.0
    for h in np.argsort(-values, kind="stable")[:ROOM_CANDIDATES].tolist():
        need = left - weights[h]
        best = max(best, float(values[h]) + cheapest.cover(need, without=_one(values.size, h)))
    return best


class Fractions:
    """Samples of ``values`` and ``weights`` taken in fractions, sorted once by value per unit of weight (the
    most first, or with ``cheapest_first`` the least): the fractional knapsack and covering, over all of them or
    all but some (``without``, a mask), without sorting again."""

    def __init__(self, values: np.ndarray, weights: np.ndarray, *, cheapest_first: bool = False) -> None:
        self.values, self.weights = values, weights
        useful = np.flatnonzero(weights > 0)  # a sample of no weight fills and covers nothing
        ratio = values[useful] / weights[useful]
        self.order = useful[np.argsort(ratio if cheapest_first else -ratio, kind="stable")]

    def _sorted(self, without: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        order = self.order if without is None else self.order[~without[self.order]]
        return self.values[order], self.weights[order]

    def most(self, budget: float, without: np.ndarray | None = None) -> float:
        """The largest sum of values whose weights add up to at most ``budget``: every sample of no weight,
        then the most per unit of weight first (whole samples hold no more)."""
        free = self.weights <= 0
        if without is not None:
            free = free & ~without
        v, w = self._sorted(without)
        held = np.cumsum(w)
        whole = int(np.searchsorted(held, budget, side="right"))  # the samples that fit whole
        out = float(self.values[free].sum() + v[:whole].sum())
        if whole < w.size:
            out += float(v[whole]) * (budget - (held[whole - 1] if whole else 0.0)) / float(w[whole])
        return out

    def cover(self, need: float, without: np.ndarray | None = None) -> float:
        """The least sum of values whose weights add up to ``need``, the cheapest per unit of weight first
        (whole samples cost at least as much); all the values where the weights add up to less (no plan holds
        the samples then)."""
        if need <= 0:
            return 0.0
        v, w = self._sorted(without)
        held = np.cumsum(w)
        last = int(np.searchsorted(held, need))  # the first prefix that covers it
        if last >= w.size:
            return float(self.values.sum() if without is None else self.values[~without].sum())
        short = need - (held[last] - w[last])
        return float(v[:last].sum() + v[last] * short / w[last])


def _one(size: int, index: int) -> np.ndarray:
    mask = np.zeros(size, dtype=bool)
    mask[index] = True
    return mask


def cheapest_cover(values: np.ndarray, weights: np.ndarray, need: float) -> float:
    """``Fractions.cover`` of these samples."""
    return Fractions(values, weights, cheapest_first=True).cover(need)


def cramped_bound(values: np.ndarray, lengths: np.ndarray, patches: np.ndarray, shape: StepShape) -> float:
    """The largest over the ``ROOM_CANDIDATES`` samples ``j`` that fill their micro-batch the most of the mean
    of the other ranks' ``values``, given all that ``j``'s rank could hold (0 for one rank)."""
    ranks, micro_batches = shape.ranks, shape.micro_batches
    capacity, budget = shape.tokens_per_micro_batch, shape.patches_per_micro_batch
    if ranks < 2:
        return 0.0
    fullness = lengths / capacity if budget <= 0 else np.maximum(lengths / capacity, patches / budget)
    total, best = float(values.sum()), 0.0
    by_tokens, by_patches = Fractions(values, lengths), Fractions(values, patches)
    tokens_by_patches, patches_by_tokens = Fractions(lengths, patches), Fractions(patches, lengths)
    for j in np.argsort(-fullness, kind="stable")[:ROOM_CANDIDATES].tolist():
        without = _one(values.size, j)
        tokens_left = max(0.0, capacity - float(lengths[j]))  # in j's micro-batch
        held = by_tokens.most((micro_batches - 1) * capacity + tokens_left, without)
        if budget > 0:
            patches_left = max(0.0, budget - float(patches[j]))
            tokens_in = min(tokens_left, tokens_by_patches.most(patches_left, without))  # what the others bring
            patches_in = min(patches_left, patches_by_tokens.most(tokens_left, without))  # in both limits
            held = min(
                by_tokens.most((micro_batches - 1) * capacity + tokens_in, without),
                by_patches.most((micro_batches - 1) * budget + patches_in, without),
            )
        best = max(best, (total - float(values[j]) - held) / (ranks - 1))
    return best


def most_within(values: np.ndarray, weights: np.ndarray, budget: float) -> float:
    """``Fractions.most`` of these samples."""
    return Fractions(values, weights).most(budget)


def crowded_bound(values: np.ndarray, lengths: np.ndarray, patches: np.ndarray, shape: StepShape) -> float:
    """The level the largest rank reaches where the samples over half a micro-batch's tokens, or over half its
    patches, take a micro-batch each and are spread evenly over the ranks (the module docstring), for all of them
    and for as many as there are ranks; 0 for one rank or fewer than two such samples."""
    ranks, micro_batches = shape.ranks, shape.micro_batches
    capacity, budget = shape.tokens_per_micro_batch, shape.patches_per_micro_batch
    if ranks < 2:
        return 0.0
    sizes = [(lengths, capacity)] + ([(patches, budget)] if budget > 0 else [])
    total, best = float(values.sum()), 0.0
    for size, limit in sizes:
        over_half = np.flatnonzero(2 * size > limit)
        fullest = over_half[np.argsort(-size[over_half], kind="stable")]
        for k in sorted({fullest.size, min(fullest.size, ranks)}):
            if 2 <= k <= ranks * micro_batches:
                best = max(best, _spread_level(values, lengths, patches, shape, fullest[:k], total))
    return best


def _spread_level(
    values: np.ndarray, lengths: np.ndarray, patches: np.ndarray, shape: StepShape, crowd: np.ndarray, total: float
) -> float:
    """The level of ``crowded_bound`` for the samples ``crowd``, spread evenly."""
    ranks, micro_batches = shape.ranks, shape.micro_batches
    capacity, budget = shape.tokens_per_micro_batch, shape.patches_per_micro_batch
    without = np.zeros(values.size, dtype=bool)
    without[crowd] = True
    by_tokens, by_patches = Fractions(values, lengths), Fractions(values, patches)
    costliest = float(values[crowd].max())
    tokens_in = float(capacity - lengths[crowd].min())  # what the others bring into the roomiest of them
    patches_in = 0.0
    if budget > 0:
        patches_left = float(budget - patches[crowd].min())
        tokens_in, patches_in = (
            min(tokens_in, Fractions(lengths, patches).most(patches_left, without)),
            min(patches_left, Fractions(patches, lengths).most(tokens_in, without)),
        )

    def cap(c: int) -> float:
        held = by_tokens.most((micro_batches - c) * capacity + c * tokens_in, without)
        if budget > 0:
            held = min(held, by_patches.most((micro_batches - c) * budget + c * patches_in, without))
        return c * costliest + held

    fewer, more = divmod(crowd.size, ranks)  # ``more`` ranks hold fewer + 1 of them, the others ``fewer``
    caps = np.full(ranks, cap(fewer))
    if more:
        caps[:more] = cap(fewer + 1)
    return water_level(caps, total)


def water_level(caps: np.ndarray, total: float) -> float:
    """The least ``x`` with ``sum(min(x, caps)) >= total``: where each rank holds at most its cap, the largest
    holds at least that much; 0 where the caps cannot hold ``total`` (no such plan to bound)."""
    caps = np.sort(np.asarray(caps, dtype=np.float64))
    if total <= 0 or float(caps.sum()) < total:
        return 0.0
    below = np.concatenate([[0.0], np.cumsum(caps)[:-1]])  # the sum of the i lowest caps
    levels = (total - below) / (caps.size - np.arange(caps.size))  # the i lowest full, the others at the level
    reached = levels <= caps
    return float(levels[int(np.argmax(reached))]) if reached.any() else float(caps[-1])
