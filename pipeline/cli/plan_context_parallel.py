"""`mixflow plan --context-parallel`: plan one step whose long samples span blocks of ranks, from a file of sample
lengths, and write each sample's first rank, block size and micro-batch."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import numpy as np
import yaml
from pydantic import ValidationError

from pipeline.planning.scheduler.context_parallel import (
    CPMode,
    CPPlan,
    CPShape,
    cp_sizes,
    lower_bound,
    plan_cp_step,
    slice_tokens,
    static_shape,
    validate_cp_plan,
)
from pipeline.spec.cost import CostModel
from pipeline.spec.cp_cost import ContextParallelCost
from pipeline.spec.sections import CostSpec
from topics.errors import MixflowError, NotFoundError


def context_parallel(text: str) -> tuple[CPMode, int]:
    """``static:C``, ``aligned``, ``aligned:C``, ``free`` or ``free:C``: the mode, and its largest block (0: the
    mode's largest the step allows)."""
    mode_text, _, size_text = text.partition(":")
    try:
        mode = CPMode(mode_text)
    except ValueError:
        msg = f"{text!r}: the mode is static:C, aligned[:C] or free[:C]"
        raise argparse.ArgumentTypeError(msg) from None
    if not size_text and mode is CPMode.STATIC:
        msg = f"{text!r}: static needs its size, static:C (C ranks a block)"
        raise argparse.ArgumentTypeError(msg)
    if not size_text:
        return mode, 0
    if not size_text.isdigit() or int(size_text) < 1:
        msg = f"{text!r}: the block size after ':' is a whole number >= 1"
        raise argparse.ArgumentTypeError(msg)
    return mode, int(size_text)


def read_cost_section(path: Path) -> CostSpec:
    """A spec's ``cost`` section from ``path``: a whole spec (its ``cost`` key) or the section alone."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        msg = f"no such file: {path}"
        raise NotFoundError(msg) from exc
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        msg = f"cannot read {path} as YAML: {exc}"
        raise MixflowError(msg) from exc
    if isinstance(data, dict) and "cost" in data:
        data = data["cost"]
    if not isinstance(data, dict):
        msg = f"{path} must hold a cost section (a mapping, or a spec with a cost key)"
        raise MixflowError(msg)
    try:
        return CostSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(section)"
        msg = f"{path}: cost.{where}: {first['msg']}"
        raise MixflowError(msg) from exc


def block_cost(args: argparse.Namespace) -> ContextParallelCost:
    """The cost a block's ranks pay: ``--cost``'s section, or the default terms over ``--alpha``/``--beta``."""
    if args.cost is not None:
        return read_cost_section(args.cost).context_parallel_cost()
    return ContextParallelCost(model=CostModel(alpha=args.alpha, beta=args.beta))


def step_shape(args: argparse.Namespace, capacity: int) -> CPShape:
    mode, size = args.context_parallel
    if size == 0:
        size = args.ranks if mode is CPMode.FREE else 1 << (args.ranks.bit_length() - 1)
    extra = {"max_micro_batches": args.max_micro_batches} if args.max_micro_batches else {}
    try:
        return CPShape(args.ranks, args.micro_batches, capacity, mode, size, **extra)
    except ValueError as exc:
        raise MixflowError(str(exc)) from exc


def refuse_unplaceable(lengths: np.ndarray, shape: CPShape, cost: ContextParallelCost) -> None:
    """A sample that no block of the mode holds would wait for ever: refused, naming the first."""
    never = np.flatnonzero(cp_sizes(lengths, shape, cost) == 0)
    if never.size:
        i = int(never[0])
        largest = shape.sizes()[-1]
        per_rank = int(slice_tokens(lengths[i : i + 1], np.array([largest]))[0])
        msg = (
            f"lengths[{i}] = {int(lengths[i])} does not fit a block: on {largest} ranks ({shape.mode.value} mode) "
            f"its slices are {per_rank} tokens a rank, over --max-tokens-per-rank {shape.capacity}"
        )
        raise MixflowError(msg)


def summary(plan: CPPlan, lengths: np.ndarray, cost: ContextParallelCost, static: CPPlan | None) -> list[str]:
    placed = plan.placed_mask
    tokens = int(lengths[placed].sum())
    shape = plan.shape
    sizes = Counter(plan.cp[placed].tolist())
    used = np.zeros((shape.ranks, shape.max_micro_batches), bool)
    sample, place = plan.slots()
    used[plan.rank[sample] + place, plan.micro[sample]] = True
    micro_counts = used.sum(axis=1)
    step = plan.step_time(lengths, cost)
    bound = lower_bound(lengths[placed], shape, cost)
    lines = [
        f"samples={lengths.size} placed={int(placed.sum())} deferred={int((~placed).sum())}",
        f"tokens placed={tokens} / capacity={shape.ranks * shape.micro_batches * shape.capacity}",
        "cp sizes: " + " ".join(f"{c}x{sizes[c]}" for c in sorted(sizes)),
        f"micro-batches a rank: {int(micro_counts.min())} to {int(micro_counts.max())}",
        f"step time={step:.6g} s / lower bound={bound:.6g} s (bound over step {bound / step if step else 1.0:.4f})",
        f"tokens/s={plan.tokens_per_second(lengths, cost):.6g}",
    ]
    if static is not None:
        ratio = plan.tokens_per_second(lengths, cost) / max(static.tokens_per_second(lengths, cost), 1e-300)
        lines.append(
            f"static cp={static.shape.size}: tokens/s={static.tokens_per_second(lengths, cost):.6g}"
            f" (this plan {ratio:.3f}x)"
        )
    return lines


def run(args: argparse.Namespace, lengths: np.ndarray) -> int:
    capacity = args.max_tokens_per_rank or args.capacity
    cost = block_cost(args)
    shape = step_shape(args, capacity)
    refuse_unplaceable(lengths, shape, cost)
    try:
        plan_cp_step(np.array([1, 2, 3], np.int64), CPShape(2, 1, 4, CPMode.FREE, 2), cost)  # compile the kernels
        start = time.perf_counter()
        plan = plan_cp_step(lengths, shape, cost)
        seconds = time.perf_counter() - start
        validate_cp_plan(plan, lengths)
        static = _static_plan(lengths, shape, cost)
    except ValueError as exc:
        raise MixflowError(str(exc)) from exc
    try:
        np.savez(args.out, rank=plan.rank, micro=plan.micro, cp=plan.cp)
    except OSError as exc:
        msg = f"cannot write {args.out}: {exc}"
        raise MixflowError(msg) from exc
    for line in summary(plan, lengths, cost, static):
        print(line)
    print(f"plan_seconds={seconds:.6f}")
    return 0


def _static_plan(lengths: np.ndarray, shape: CPShape, cost: ContextParallelCost) -> CPPlan | None:
    """Static context parallelism sized for the longest sample, side by side (none where the ranks are not whole
    blocks of it, or where the plan is static already)."""
    if shape.mode is CPMode.STATIC:
        return None
    try:
        static = static_shape(lengths, shape.ranks, shape.micro_batches, shape.capacity)
    except ValueError:
        return None
    return plan_cp_step(lengths, static, cost)
