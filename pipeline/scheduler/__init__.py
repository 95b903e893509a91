"""The balancing scheduler: plans each global step so every rank and micro-batch costs about the same.

A pure library of numba kernels over arrays; it imports no Kafka client.
"""

from pipeline.scheduler.cost import DEFAULT_COST_MODEL, CostModel
from pipeline.scheduler.lpt import plan_lpt
from pipeline.scheduler.plan import DEFAULT_TOLERANCE, PlanSummary, StepPlan, plan_step
from pipeline.scheduler.rank_order import RankOrders, rank_order, rank_orders
from pipeline.scheduler.validation import validate_plan

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
