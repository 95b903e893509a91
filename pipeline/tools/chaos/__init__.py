"""Chaos runs: a whole job under random faults (SIGKILLed roles, broker restarts) from a seeded schedule,
then an audit that nothing was lost or repeated. ``schedule`` is pure; ``roles``, ``watch`` and ``run``
are the thin shell of processes and Kafka around it; ``sink`` is the trainer stand-in each rank runs;
``secured`` gives a run on a secured broker (``--secure``) its broker, a principal per role and the job's ACLs."""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "report": ["ChaosReport", "InjectedFault"],
        "run": ["ChaosError", "ChaosOptions", "run_chaos"],
        "schedule": ["Fault", "FaultKind", "Targets", "plan_faults"],
    },
)
