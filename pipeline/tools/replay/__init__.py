"""Replay a job's steps into another job: the determinism audit, and elastic world size.

Under the original's step shape the constructor mixes again from the state of the first step replayed,
and must write the same bytes (``audit``). Under another number of ranks each step's samples are read
back from the original's rank topics and planned again over the new shape, with the original's state
record, so that ``mixflow construct`` can go on with the replayed job under the new shape. Either way a
replay is one transaction per step and continues where an earlier run of it stopped.
"""

from pipeline.tools.replay.audit import Audit
from pipeline.tools.replay.plan import ReplayMode, ReplayPlan, ReplayRequest, plan_replay
from pipeline.tools.replay.reshape import ReshapeError, default_micro_batches, reshape_step
from pipeline.tools.replay.run import ReplaySummary, replay, verify

__all__ = [
    "Audit",
    "ReplayMode",
    "ReplayPlan",
    "ReplayRequest",
    "ReplaySummary",
    "ReshapeError",
    "default_micro_batches",
    "plan_replay",
    "replay",
    "reshape_step",
    "verify",
]
