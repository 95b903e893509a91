"""Loader autoscaling: the policy (pure), the measurements it needs from a job's topics, and the
autoscaler that turns one into the other every interval. ``mixflow run`` acts on its decisions
(``pipeline/local_job.py``); ``mixflow autoscale`` exports them for Kubernetes."""

from pipeline.autoscale.autoscaler import Autoscaler
from pipeline.autoscale.demand import horizon_shares, source_demands
from pipeline.autoscale.measure import JobProbe, JobSnapshot, SourceSnapshot
from pipeline.autoscale.policy import Decision, PolicySettings, PolicyState, SourceReading, decide
from pipeline.autoscale.rates import SmoothedRate

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
