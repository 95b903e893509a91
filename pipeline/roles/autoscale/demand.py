"""Each source's demand (tokens/s) from the constructor's step rate and the mixture, looking ahead. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

from pipeline.planning.mixing import Mixer

# Steps of the horizon at which the mixture is read, at most, besides the steps where it changes: a linear
# schedule moves smoothly between its points, a constant one changes only at them.
HORIZON_SAMPLES = 64

WeightsAt = Callable[[int], Mapping[str, float]]


def horizon_shares(
    weights_at: WeightsAt, step: int, steps_ahead: float, breakpoints: Iterable[int] = ()
) -> dict[str, float]:
    """Each source's largest share from ``step`` to ``step + steps_ahead`` (``weights_at(step)`` gives the
    shares at a step; ``breakpoints`` are the steps where they jump). A source whose share grows within
    the horizon is supplied for it from now on; one whose share falls keeps its supply until the
    constructor gets there."""
    if step < 0 or not np.isfinite(steps_ahead) or steps_ahead < 0:
        msg = f"need step >= 0 and a finite steps_ahead >= 0, got {step}, {steps_ahead}"
        raise ValueError(msg)
    last = step + int(np.ceil(steps_ahead))
    inside = [b for b in breakpoints if step < b <= last]
    at = np.unique(np.concatenate([np.linspace(step, last, HORIZON_SAMPLES).round(), inside]).astype(np.int64))
    shares: dict[str, float] = {}
    for k in at.tolist():
        for source, share in weights_at(k).items():
            shares[source] = max(shares.get(source, 0.0), share)
    return shares


def mixer_breakpoints(mixer: Mixer) -> list[int]:
    """The steps where the mixer's shares may jump: its schedule's points and its changes' first steps."""
    return [*mixer.schedule.steps.tolist(), *(c.from_step for c in mixer.changes)]


def source_demands(
    mixer: Mixer, step: int, steps_per_second: float, tokens_per_step: float, lookahead_s: float
) -> dict[str, float]:
    """Tokens/s the constructor will take of each source: its consumption (``steps_per_second`` x
    ``tokens_per_step``) x the source's largest share over the next ``lookahead_s`` seconds of steps."""
    if steps_per_second < 0 or tokens_per_step < 0 or lookahead_s < 0:
        msg = f"rates and horizon must be >= 0, got {steps_per_second}, {tokens_per_step}, {lookahead_s}"
        raise ValueError(msg)
    consumption = steps_per_second * tokens_per_step
    shares = horizon_shares(mixer.weights_at, step, steps_per_second * lookahead_s, mixer_breakpoints(mixer))
    return {source: consumption * share for source, share in shares.items()}
