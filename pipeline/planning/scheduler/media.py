"""``plan_with_media``: a step's plan where samples may carry images and clips, as the step core and step
composition both make it, so that composition scores its options with the plan the step will get."""

from __future__ import annotations

import numpy as np

from pipeline.planning.scheduler.parts import even_parts
from pipeline.planning.scheduler.plan import StepPlan, plan_step
from pipeline.planning.shape import StepShape
from pipeline.spec.cost import CostModel


def plan_with_media(
    lengths: np.ndarray,
    shape: StepShape,
    cost_model: CostModel,
    start: np.ndarray | None,
    patches: np.ndarray | None,
    encoder_costs: np.ndarray | None,
    even_encoder: bool = True,
    near_bounds: bool = True,
) -> StepPlan:
    """The plan of a step of ``shape`` whose candidates have ``patches`` and ``encoder_costs`` (None: text).

    A step without patches under a patch budget and without encoder costs is planned as text, bit for bit.
    Otherwise each sample costs its LLM cost plus its encoder cost, every micro-batch keeps both
    capacities, ``start`` loses the newest samples with patches of any micro-batch over the budget
    (``within_patch_capacity``), and with ``even_encoder`` the encoder's part is evened out too; then, with
    ``near_bounds`` as well, the total, the encoder's part and the LLM's are each brought near its own bound
    (``even_parts``: exchanges that keep what is placed, the total allowed up to the parts' largest ratio).
    Composition scores its options without that last search (``near_bounds=False``): it costs a bound of each
    load, and moves no sample in or out of the step."""
    ranks, micro_batches, patch_capacity = shape.ranks, shape.micro_batches, shape.patches_per_micro_batch
    args = (lengths, ranks, micro_batches, shape.tokens_per_micro_batch, cost_model)
    if patches is None or encoder_costs is None or not planned_with_media(patches, encoder_costs, patch_capacity):
        return plan_step(*args, start=start)
    if start is not None and patch_capacity > 0:
        start = within_patch_capacity(start, patches, ranks * micro_batches, patch_capacity)
    costs = cost_model.costs(lengths) + encoder_costs
    plan = plan_step(
        *args,
        start=start,
        costs=costs,
        patches=patches,
        patch_capacity=patch_capacity,
        encoder_costs=encoder_costs if even_encoder else None,
    )
    if not (even_encoder and near_bounds):
        return plan
    return even_parts(plan, lengths, costs, patches, encoder_costs, shape)


def planned_with_media(patches: np.ndarray, encoder_costs: np.ndarray, patch_capacity: int) -> bool:
    """Whether ``plan_with_media`` plans candidates of these ``patches`` and ``encoder_costs`` as a multimodal
    step (with both capacities and the encoder's costs): some have patches under a patch budget
    (``patch_capacity`` > 0), or some cost something in the encoder."""
    return bool((patch_capacity > 0 and patches.any()) or encoder_costs.any())


def within_patch_capacity(start: np.ndarray, patches: np.ndarray, slots: int, patch_capacity: int) -> np.ndarray:
    """``start`` (a micro-batch per candidate, -1 for none, candidates in priority order) with the newest
    samples with patches of every micro-batch over ``patch_capacity`` taken out of it (-1) until it is not."""
    placed = start >= 0
    held = np.bincount(start[placed], weights=patches[placed], minlength=slots)
    over = np.flatnonzero(held > patch_capacity)
    if not over.size:
        return start
    start = start.copy()
    for slot in over.tolist():
        members = np.flatnonzero((start == slot) & (patches > 0))[::-1]  # newest first
        excess = held[slot] - patch_capacity
        leaving = members[: int(np.searchsorted(np.cumsum(patches[members]), excess)) + 1]
        start[leaving] = -1
    return start
