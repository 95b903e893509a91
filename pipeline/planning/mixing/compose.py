"""Step composition: choose each step's samples from a look-ahead window so that the step can be balanced.

At long context one sample can cost more than a whole rank of short ones, so how well the scheduler
balances a step depends on *which* samples make it up. ``compose_step`` draws a step like ``draw_step``
(same inputs, same ``Draw``, same per-source targets and credits), but instead of taking each source's
FIFO head it picks from a window of upcoming samples: long samples grouped so that every rank gets the
same excess cost from them, short samples filling around them, and where those are too few, window
samples packed into the holes that remain (``_composition``).

**Window.** Per source in play, the window is the shortest head of its FIFO holding ``window`` steps of
the source's tokens (``window * weight * goal``, where the goal is 99% of the step's capacity). A step is
composed only when every window is complete, or its source is exhausted (then the window is all it
has); otherwise the draw is ``WAITING`` for those sources. The result is a pure function of the windows,
the deferred samples and the mixer state, never of how many more samples are buffered.

**Window bytes.** With ``window_bytes``, a source's window also ends where its samples' bytes (tokens and
media, ``sizes``) would pass its weight's share of ``window_bytes``, though never short of one step of its
tokens: ``window_need``. Where that share runs out before ``window`` steps, the window is only as long as
the share allows; which samples those are depends on the FIFO alone, so the result stays a pure function
of it. This bounds the look-ahead's memory where steps are large (a thousand ranks of media), at the cost
of choice (a window of one or two steps still holds a whole step's samples to choose from).

**Waiting bound.** Every sample with fewer than ``due * weight * goal`` tokens before it in its source's
FIFO is *due*, and due samples are taken first, in FIFO order, while the source is behind its target
(the last one may pass it, as in ``draw_step``). A source that is not ahead of its share thus loses at
least that many tokens from the head of its FIFO each step, so a sample in its source's window is taken
within ``ceil(window / due) - 1`` steps (63 with the defaults, at constant weights; measured waits are
far shorter). A source ahead of its share takes nothing until its credit is back, and it is never ahead
by more than about two of its samples and ``PACK_AHEAD`` micro-batches (see Shares), so a source whose
samples or micro-batches are long against its tokens per step (``unit = weight * goal``) adds
``ceil((2 * longest + PACK_AHEAD * capacity) / unit)`` steps:
``waiting_bound(window, due, longest / unit, capacity / unit)``. The in-order draw has the same rate
limit: a source gives about ``unit`` tokens a step. Sources out of play (weight 0) wait with all their
samples, as in ``draw_step``. A drawn sample the scheduler defers comes back first in the next draw, as
in ``draw_step``.

**Shares.** Each source in play gives about its target (its weight's share of the goal plus its credit,
as in ``draw_step``): the due samples and the long samples chosen for balance may pass it by one sample
each, the short samples that fill the rest stop *below* it (a whole step must fit the capacity, so that
the scheduler need not cut the newest samples, which here may be the chosen long ones). The credit
carries the difference to later steps. (Due samples are taken only while the source is behind its target:
taken whatever the target, they would let a source whose samples are longer than its tokens per step run
ahead by one sample every step.) A *packed* step (where the grouped options leave
holes) may take up to ``PACK_AHEAD`` micro-batches of tokens more from a source than its target (less
what the source is already ahead of its tokens per step), to fill them: at 2 ranks x 2 micro-batches of
1,024 tokens, with two sources of 1,024-token chunks and a short one at a tenth of the step, the short
source's share cannot fill the hole that three chunks leave, and the due short samples keep a fourth out,
so without it such stretches of steps run at 85-90% fill and 1.2 max/mean; with it, a step of three
chunks and a micro-batch of short samples and a step of four alternate, and the short source catches up
by taking nothing in the second. So a source's cumulative share stays within three of its longest samples
and a micro-batch (the property test's bound; a pareto mix reached 2.06 samples and a micro-batch, the
example job about two samples).

**Long context.** The spec's ``long_context`` section (a token share from samples of ``min_length`` or
more) is not an input: composition makes it redundant for balancing, and every long sample is delivered
within the waiting bound, so the long share follows the data. A job that wants another share of long
documents puts them in a source of their own and gives it a weight.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import replace

import numpy as np
from numpy.typing import ArrayLike

from pipeline.planning.mixing._composition.options import PACK_AHEAD, compose_takes
from pipeline.planning.mixing._composition.values import SourceWindow, StepMedia
from pipeline.planning.mixing._take import EMPTY
from pipeline.planning.mixing.draw import Draw, DrawStatus, draw_step
from pipeline.planning.mixing.state import MixerState
from pipeline.planning.scheduler import CostModel
from pipeline.planning.shape import StepShape
from pipeline.spec.sections import OnExhausted

DEFAULT_WINDOW = 8.0
"""Steps of each source's tokens looked ahead."""
DEFAULT_DUE = 1 / 8
"""Share of a step of each source's tokens, from the head of its FIFO, taken whatever the balance."""
HEADROOM = 0.01
"""Share of the step's capacity left undrawn, so that the scheduler can balance rather than pack."""


def waiting_bound(
    window: float = DEFAULT_WINDOW,
    due: float = DEFAULT_DUE,
    longest_per_unit: float = 0.0,
    capacity_per_unit: float = 0.0,
) -> int:
    """The most steps a sample waits once in its source's window (at constant weights), where the
    source's longest sample is ``longest_per_unit`` times its tokens per step and a micro-batch
    ``capacity_per_unit`` times (a packed step may take up to ``PACK_AHEAD`` micro-batches ahead of it)."""
    return math.ceil(window / due) - 1 + math.ceil(2 * longest_per_unit + PACK_AHEAD * capacity_per_unit)


def window_need(
    lengths: np.ndarray, sizes: np.ndarray | None, unit: float, window: float, byte_share: float | None
) -> float:
    """The tokens a source's window must hold: ``window`` steps of its ``unit`` tokens a step, or, where
    ``byte_share`` (the source's bytes of look-ahead) runs out before that among the FIFO's samples
    (``lengths`` and their ``sizes`` in bytes), the tokens of the samples within it, but at least ``unit``."""
    need = window * unit
    if byte_share is None or sizes is None or len(sizes) == 0:
        return need
    within = int(np.searchsorted(np.cumsum(sizes), byte_share, side="right"))
    if within == len(sizes):
        return need  # the share is not reached yet: its end is not known, wait for window steps as ever
    return min(need, max(unit, float(lengths[:within].sum())))


def compose_step(
    state: MixerState,
    weights: Mapping[str, float],
    budget_tokens: int,
    available: Mapping[str, ArrayLike],
    deferred: Mapping[str, ArrayLike] | None = None,
    *,
    exhausted: Collection[str] = (),
    on_exhausted: OnExhausted = OnExhausted.STOP,
    shape: StepShape,
    cost_model: CostModel,
    window: float = DEFAULT_WINDOW,
    due: float = DEFAULT_DUE,
    media: StepMedia | None = None,
    window_bytes: float | None = None,
    sizes: Mapping[str, ArrayLike] | None = None,
) -> Draw:
    """Draw step ``state.step`` from look-ahead windows (see the module docstring).

    Inputs as for ``draw_step``, plus the step's ``shape``, the scheduler's ``cost_model``, ``window``
    (steps looked ahead, >= 1) and ``due`` (in (0, 1]). The step's goal is ``min(budget_tokens, (1 -
    HEADROOM) * shape.tokens_per_step)``: composition does its own choosing, so an overdraw in the budget
    is not used.
    ``Draw.take`` holds ascending FIFO positions, not necessarily a prefix; ``Draw.lengths`` the deferred
    samples, then the taken ones in FIFO order; ``Draw.placement``, where the holes were packed, the
    packing, for the scheduler to start from (``plan_step``'s ``start``). ``media``: where the samples
    carry images or clips, their patches and encoder costs (aligned with ``available`` and ``deferred``):
    the options are chosen by length as ever, and scored with the plan the step will get, by true costs
    under both capacities, tokens and ``shape``'s patch budget (``plan_with_media``). ``window_bytes``
    (all sources together) with ``sizes`` (each sample's bytes, aligned with ``available``): see Window
    bytes in the module docstring.
    """
    if not (math.isfinite(window) and window >= 1) or not (math.isfinite(due) and 0 < due <= 1):
        msg = f"need window >= 1 and 0 < due <= 1, got window={window!r}, due={due!r}"
        raise ValueError(msg)
    goal = min(int(budget_tokens), math.floor(shape.tokens_per_step * (1 - HEADROOM)))
    first = draw_step(state, weights, goal, available, deferred, exhausted=exhausted, on_exhausted=on_exhausted)
    if first.status is not DrawStatus.OK:
        return first
    sources = list(weights)
    final = set(exhausted) if on_exhausted is not OnExhausted.NEXT_EPOCH else set()
    avail = {s: np.asarray(available.get(s, EMPTY), dtype=np.int64).reshape(-1) for s in sources}
    before = {s: first.lengths[s][: len(first.lengths[s]) - len(first.take[s])] for s in sources}
    in_play = [s for s in sources if first.weights.get(s, 0.0) > 0 and s not in first.exhausted]
    unit = {s: first.weights[s] * goal for s in in_play}
    need = {s: _need(s, avail[s], sizes, unit[s], window, window_bytes, first.weights[s]) for s in in_play}
    waiting = tuple(s for s in in_play if s not in final and float(avail[s].sum()) < need[s])
    if waiting:
        return Draw(first.step, DrawStatus.WAITING, waiting_for=waiting, state_before=state)
    if not in_play:
        return first
    windows = {}
    for s in in_play:
        total = np.cumsum(avail[s])
        n = len(avail[s]) if s in final else int(np.searchsorted(total, need[s], side="left")) + 1
        n = min(max(n, len(first.take[s])), len(avail[s]))
        lengths = avail[s][:n]
        ahead = total[:n] - lengths
        remaining = first.targets[s] - float(before[s].sum())
        windows[s] = SourceWindow(lengths, ahead, ahead < min(due * unit[s], remaining), unit[s], remaining)
    capacity = shape.tokens_per_micro_batch
    too_long = [s for s in sources if len(before[s]) and before[s].max() > capacity]
    too_long += [s for s, w in windows.items() if len(w.lengths) and w.lengths.max() > capacity]
    if too_long:
        msg = f"sources {sorted(set(too_long))} hold samples longer than a micro-batch ({capacity}); split them first"
        raise ValueError(msg)
    fixed = {s: avail[s][first.take[s]] for s in sources if s not in windows}
    with_media = None if media is None else (media, {s: first.take[s] for s in fixed})
    composed = compose_takes(windows, before, fixed, shape, cost_model, goal, with_media)
    take = {s: composed.take.get(s, first.take[s]) for s in sources}
    lengths = {s: np.concatenate([before[s], avail[s][take[s]]]) for s in sources}
    long = {s: v >= first.min_length for s, v in lengths.items()}
    return replace(first, take=take, lengths=lengths, long=long, placement=composed.placement)


def _need(
    source: str,
    lengths: np.ndarray,
    sizes: Mapping[str, ArrayLike] | None,
    unit: float,
    window: float,
    window_bytes: float | None,
    weight: float,
) -> float:
    if window_bytes is None or sizes is None:
        return window * unit
    of = np.asarray(sizes.get(source, EMPTY), dtype=np.int64).reshape(-1)
    if len(of) != len(lengths):
        msg = f"source {source}: {len(of)} sizes for {len(lengths)} samples"
        raise ValueError(msg)
    return window_need(lengths, of, unit, window, weight * window_bytes)
