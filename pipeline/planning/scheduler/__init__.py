"""The balancing scheduler: plans each global step so every rank and micro-batch costs about the same.

A pure library of numba kernels over arrays; it imports no Kafka client.
"""

from pipeline.planning.scheduler.lpt import plan_lpt
from pipeline.planning.scheduler.plan import DEFAULT_TOLERANCE, PlanSummary, StepPlan, plan_step
from pipeline.planning.scheduler.rank_order import RankOrders, rank_order, rank_orders
from pipeline.planning.scheduler.validation import validate_plan
from pipeline.spec.cost import DEFAULT_COST_MODEL, CostModel

__all__ = [
    "DEFAULT_COST_MODEL",
    "DEFAULT_TOLERANCE",
    "CostModel",
    "PlanSummary",
    "RankOrders",
    "StepPlan",
    "plan_lpt",
    "plan_step",
    "rank_order",
    "rank_orders",
    "validate_plan",
]
