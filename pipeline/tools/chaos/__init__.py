"""Chaos runs: a whole job under random faults (SIGKILLed roles, broker restarts) from a seeded schedule,
then an audit that nothing was lost or repeated. ``schedule`` is pure; ``roles``, ``watch`` and ``run``
are the thin shell of processes and Kafka around it; ``sink`` is the trainer stand-in each rank runs."""

from pipeline.tools.chaos.report import ChaosReport, InjectedFault
from pipeline.tools.chaos.run import ChaosError, ChaosOptions, run_chaos
from pipeline.tools.chaos.schedule import Fault, FaultKind, Targets, plan_faults

__all__ = [
    "ChaosError",
    "ChaosOptions",
    "ChaosReport",
    "Fault",
    "FaultKind",
    "InjectedFault",
    "Targets",
    "plan_faults",
    "run_chaos",
]
