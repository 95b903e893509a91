"""Loader autoscaling: the policy (pure), the measurements it needs from a job's topics, and the
autoscaler that turns one into the other every interval. ``mixflow run`` acts on its decisions
(``pipeline/tools/run/job.py``); ``mixflow autoscale`` exports them for Kubernetes."""

from pipeline.roles.autoscale.autoscaler import Autoscaler
from pipeline.roles.autoscale.demand import horizon_shares, source_demands
from pipeline.roles.autoscale.measure import JobProbe, JobSnapshot, SourceSnapshot
from pipeline.roles.autoscale.policy import Decision, PolicySettings, PolicyState, SourceReading, decide
from pipeline.roles.autoscale.rates import SmoothedRate

__all__ = [
    "Autoscaler",
    "Decision",
    "JobProbe",
    "JobSnapshot",
    "PolicySettings",
    "PolicyState",
    "SmoothedRate",
    "SourceReading",
    "SourceSnapshot",
    "decide",
    "horizon_shares",
    "source_demands",
]
