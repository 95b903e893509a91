"""``validate_plan``: a cheap, independent check of a plan against the lengths it was made from."""

from __future__ import annotations

import numpy as np

from pipeline.planning.scheduler._kernels.state import check_lengths
from pipeline.planning.scheduler.plan import StepPlan


def validate_plan(plan: StepPlan, lengths: np.ndarray, patches: np.ndarray | None = None) -> None:
    """Raise ValueError unless every sample appears exactly once (placed in one (rank, micro-batch) or
    deferred with both set to -1) and no micro-batch holds more than ``plan.capacity`` tokens, nor, with
    ``patches`` (each sample's vision patches) and ``plan.patch_capacity > 0``, more patches than that."""
    lengths = check_lengths(lengths)
    n = lengths.size
    for name in ("rank", "micro"):
        array = getattr(plan, name)
        if not isinstance(array, np.ndarray) or array.dtype != np.int32 or array.shape != (n,):
            got = f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
            msg = f"plan.{name} must be an int32 array of shape ({n},), got {got}"
            raise ValueError(msg)
    for name, array, count in (("rank", plan.rank, plan.ranks), ("micro", plan.micro, plan.micro_batches)):
        bad = np.flatnonzero((array < -1) | (array >= count))
        if bad.size:
            first = int(bad[0])
            msg = f"plan.{name}[{first}] = {int(array[first])} is outside [-1, {count})"
            raise ValueError(msg)
    mismatched = np.flatnonzero((plan.rank < 0) != (plan.micro < 0))
    if mismatched.size:
        first = int(mismatched[0])
        msg = (
            f"sample {first} is half placed: rank={int(plan.rank[first])}, micro={int(plan.micro[first])}"
            " (both must be -1 for a deferred sample)"
        )
        raise ValueError(msg)
    placed = plan.rank >= 0
    slots = plan.rank[placed].astype(np.int64) * plan.micro_batches + plan.micro[placed]
    # bincount, not np.add.at (an order of magnitude slower); float64 weights are exact below 2**53 tokens.
    tokens = np.bincount(slots, weights=lengths[placed], minlength=plan.ranks * plan.micro_batches).astype(np.int64)
    check_capacity(tokens, plan.capacity, plan.micro_batches, "tokens", "capacity")
    if patches is not None and plan.patch_capacity > 0:
        held = np.bincount(slots, weights=check_lengths(patches)[placed], minlength=plan.ranks * plan.micro_batches)
        check_capacity(held.astype(np.int64), plan.patch_capacity, plan.micro_batches, "patches", "patch capacity")


def check_capacity(held: np.ndarray, capacity: int, micro_batches: int, what: str, name: str) -> None:
    """Raise ValueError naming the first slot (``rank * micro_batches + micro``) of ``held`` over ``capacity``."""
    over = np.flatnonzero(held > capacity)
    if over.size:
        slot = int(over[0])
        msg = (
            f"rank {slot // micro_batches} micro-batch {slot % micro_batches} holds"
            f" {int(held[slot])} {what}, over the {name} {capacity}"
        )
        raise ValueError(msg)
