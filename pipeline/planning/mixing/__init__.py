"""The pure mixing core: which samples each step draws from each source (numpy, no Kafka).

The constructor keeps, per source, a FIFO of available sample lengths and the samples the scheduler
deferred; each step it calls ``Mixer.draw`` (or ``draw_step``), hands the drawn samples to the
scheduler, and stores ``draw.settle(deferred)`` — a ``MixerState`` of a few hundred bytes at most —
in its per-step state record.
"""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_composition.values": ["StepMedia"],
        "changes": ["MixtureChange", "MixtureTimeline", "refusal"],
        "draw": ["Draw", "DrawStatus", "LongContext", "draw_step"],
        "mixer": ["DEFAULT_OVERDRAW", "Mixer", "step_budget", "step_rng"],
        "schedule": ["Schedule", "schedule_weights"],
        "state": ["MixerState"],
    },
)
