"""The autoscaler's metrics (``mixflow autoscale``): per source, the loaders it wants (what a KEDA
ScaledObject scales each loader Deployment on, ``pipeline/tools/deploy``), the loaders it sees, and the demand and
supply its decision weighed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge

if TYPE_CHECKING:  # the decisions' module needs no metrics, and roles that import metrics need no policy
    from pipeline.roles.autoscale.policy import Decision


class AutoscalerMetrics:
    """The gauges of one autoscaler process of one job, set from each decision."""

    def __init__(self, registry: CollectorRegistry, job: str) -> None:
        self.job = job
        labels = ["job", "source"]
        self.desired = Gauge(
            "mixflow_autoscaler_desired_loaders", "Loaders the autoscaler wants per source", labels, registry=registry
        )
        self.loaders = Gauge(
            "mixflow_autoscaler_loaders", "Loaders seen in each source's loader group", labels, registry=registry
        )
        self.demand = Gauge(
            "mixflow_autoscaler_demand_tokens_per_second",
            "Tokens/s the constructor will take of each source, looked ahead on the mixture",
            labels,
            registry=registry,
        )
        self.supply = Gauge(
            "mixflow_autoscaler_supply_tokens_per_second",
            "Tokens/s each source's loaders make: loaders x measured per-loader rate",
            labels,
            registry=registry,
        )

    def decided(self, decision: Decision) -> None:
        self.desired.labels(self.job, decision.source).set(decision.desired)
        self.loaders.labels(self.job, decision.source).set(decision.loaders)
        self.demand.labels(self.job, decision.source).set(decision.demand)
        self.supply.labels(self.job, decision.source).set(decision.supply)
