"""The pure mixing core: which samples each step draws from each source (numpy, no Kafka).

The constructor keeps, per source, a FIFO of available sample lengths and the samples the scheduler
deferred; each step it calls ``Mixer.draw`` (or ``draw_step``), hands the drawn samples to the
scheduler, and stores ``draw.settle(deferred)`` — a ``MixerState`` of a few hundred bytes at most —
in its per-step state record.
"""

from pipeline.planning.mixing.changes import MixtureChange, MixtureTimeline, refusal
from pipeline.planning.mixing.draw import Draw, DrawStatus, LongContext, draw_step
from pipeline.planning.mixing.mixer import DEFAULT_OVERDRAW, Mixer, step_budget, step_rng
from pipeline.planning.mixing.schedule import Schedule, schedule_weights
from pipeline.planning.mixing.state import MixerState

__all__ = [
    "DEFAULT_OVERDRAW",
    "Draw",
    "DrawStatus",
    "LongContext",
    "Mixer",
    "MixerState",
    "MixtureChange",
    "MixtureTimeline",
    "Schedule",
    "draw_step",
    "refusal",
    "schedule_weights",
    "step_budget",
    "step_rng",
]
