"""The balancing scheduler: plans each global step so every rank and micro-batch costs about the same.

A pure library of numba kernels over arrays; it imports no Kafka client.
"""

import lazy_loader

from pipeline.spec.cost import DEFAULT_COST_MODEL, CostModel

# Each name is imported from its module on first use: a process loads only the modules it touches.
__getattr__, _, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "lpt": ["plan_lpt"],
        "media": ["plan_with_media", "planned_with_media", "within_patch_capacity"],
        "part_bound": ["largest_rank_bound"],
        "plan": ["DEFAULT_TOLERANCE", "PlanSummary", "StepPlan", "plan_step"],
        "rank_order": ["RankOrders", "rank_order", "rank_orders"],
        "validation": ["validate_plan"],
    },
)
__all__ += ["DEFAULT_COST_MODEL", "CostModel"]
