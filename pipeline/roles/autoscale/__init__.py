"""Loader autoscaling: the policy (pure), the measurements it needs from a job's topics, and the
autoscaler that turns one into the other every interval. ``mixflow run`` acts on its decisions
(``pipeline/tools/run/job.py``); ``mixflow autoscale`` exports them for Kubernetes."""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "autoscaler": ["Autoscaler"],
        "demand": ["horizon_shares", "source_demands"],
        "measure": ["JobProbe", "JobSnapshot", "SourceSnapshot"],
        "policy": ["Decision", "PolicySettings", "PolicyState", "SourceReading", "decide"],
        "rates": ["SmoothedRate"],
    },
)
