"""`mixflow plan --patches FILE --patch-capacity N`: plan one step of samples that carry vision patches, with the
constructor's planner (``plan_with_media``: both capacities, each sample's LLM cost plus its encoder cost, the
encoder's part evened out), and write the assignment and each rank's LLM and encoder cost."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from pipeline.planning.shape import StepShape
from pipeline.spec.cost import CostModel, VisionCostModel
from topics.errors import MixflowError


def check_media_arguments(args: argparse.Namespace) -> None:
    """The media options together, and only where they mean something: one line saying what is wrong."""
    vision = [name for name in ("vision_alpha", "vision_beta") if getattr(args, name) is not None]
    if args.patches is None:
        given = [f"--{name.replace('_', '-')}" for name in ("patch_capacity", *vision) if getattr(args, name)]
        if given:
            msg = f"{'/'.join(given)} plan samples with vision patches: give --patches"
            raise MixflowError(msg)
        return
    if args.context_parallel is not None:
        msg = "--patches cannot be planned with --context-parallel (a multimodal step spans no blocks of ranks)"
        raise MixflowError(msg)
    if args.patch_capacity is None:
        msg = "--patches needs --patch-capacity (the vision patches a micro-batch holds)"
        raise MixflowError(msg)
    if vision and args.cost is not None:
        msg = "give --cost or --vision-alpha/--vision-beta, not both"
        raise MixflowError(msg)
    if len(vision) == 1:
        msg = "give --vision-alpha and --vision-beta together"
        raise MixflowError(msg)


def check_patches(patches: np.ndarray, path: Path, lengths: np.ndarray, lengths_path: Path, capacity: int) -> None:
    """One count per sample, none below 0 nor above a micro-batch's ``capacity``; the first wrong one named."""
    if patches.shape != lengths.shape:
        msg = f"{path} holds patches of shape {patches.shape}, {lengths_path} lengths of shape {lengths.shape}"
        raise MixflowError(msg)
    negative = np.flatnonzero(patches < 0)
    if negative.size:
        i = int(negative[0])
        msg = f"{path}: patches[{i}] = {int(patches[i])} is below 0"
        raise MixflowError(msg)
    over = np.flatnonzero(patches > capacity)
    if over.size:
        i = int(over[0])
        msg = f"{path}: patches[{i}] = {int(patches[i])} exceeds --patch-capacity {capacity}"
        raise MixflowError(msg)


def vision_cost(args: argparse.Namespace, from_cost: VisionCostModel | None) -> VisionCostModel | None:
    """The encoder's cost model: ``from_cost`` (``--cost``'s ``vision`` part), or ``--vision-alpha``/
    ``--vision-beta``; None (the encoder costs nothing, only the patch budget binds) as in a spec without
    ``cost.vision``."""
    if args.cost is not None or args.vision_alpha is None:
        return from_cost
    try:
        return VisionCostModel(alpha=args.vision_alpha, beta=args.vision_beta)
    except ValueError as exc:
        msg = f"--vision-alpha/--vision-beta: {exc}"
        raise MixflowError(msg) from exc


def encoder_costs(patches: np.ndarray, vision: VisionCostModel | None) -> np.ndarray:
    """Each sample's encoder cost, its patches counted as one image or clip (0 for a sample without patches)."""
    if vision is None:
        return np.zeros(patches.size)
    with_media = patches > 0
    costs = np.zeros(patches.size)
    costs[with_media] = vision.sample_costs(patches[with_media], np.ones(int(with_media.sum()), np.int64))
    return costs


def run(
    args: argparse.Namespace,
    lengths: np.ndarray,
    patches: np.ndarray,
    cost_model: CostModel,
    vision: VisionCostModel | None,
) -> int:
    """Plan and write the step; ``vision``: the encoder's cost model of ``--cost``, where it has one."""
    from pipeline.planning.scheduler import plan_with_media, validate_plan

    check_patches(patches, args.patches, lengths, args.lengths, args.patch_capacity)
    encoder = encoder_costs(patches, vision_cost(args, vision))
    try:
        shape = StepShape(args.ranks, args.micro_batches, args.capacity, args.patch_capacity)
        warm = np.array([1, 2, 3], np.int64)
        plan_with_media(warm, StepShape(2, 1, 4, 2), cost_model, None, warm % 2, np.ones(3))  # compile the kernels
        start = time.perf_counter()
        plan = plan_with_media(lengths, shape, cost_model, None, patches, encoder)
        seconds = time.perf_counter() - start
        validate_plan(plan, lengths, patches)
    except ValueError as exc:
        raise MixflowError(str(exc)) from exc
    llm = plan.rank_costs(lengths, cost_model)
    encoder_by_rank = plan.rank_totals(encoder)
    try:
        np.savez(args.out, rank=plan.rank, micro=plan.micro, llm_rank_cost=llm, encoder_rank_cost=encoder_by_rank)
    except OSError as exc:
        msg = f"cannot write {args.out}: {exc}"
        raise MixflowError(msg) from exc
    total = cost_model.costs(lengths) + encoder
    lines = plan.summary(lengths, cost_model, costs=total).lines()
    placed_patches = int(patches[plan.placed_mask].sum())
    patch_room = args.ranks * args.micro_batches * args.patch_capacity
    lines.insert(2, f"patches placed={placed_patches} / capacity={patch_room} ({placed_patches / patch_room:.2%})")
    lines += [_part_line("llm", llm), _part_line("encoder", encoder_by_rank)]
    for line in lines:
        print(line)
    print(f"plan_seconds={seconds:.6f}")
    return 0


def _part_line(name: str, by_rank: np.ndarray) -> str:
    """A part's costliest rank against the mean of the ranks (ratio 1.0: even)."""
    largest, mean = float(by_rank.max()), float(by_rank.mean())
    return f"{name} max rank cost={largest:.6g} / mean={mean:.6g} (ratio {largest / mean if mean > 0 else 1.0:.4f})"
