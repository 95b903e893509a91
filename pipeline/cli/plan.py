"""`mixflow plan`: plan one step from a file of sample lengths and write the assignment."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from pipeline.cli.arguments import output_file, positive_int
from pipeline.spec.cost import DEFAULT_COST_MODEL, CostModel
from topics.errors import MixflowError, NotFoundError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", type=Path, required=True, help=".npy file of int64 sample lengths")
    parser.add_argument("--ranks", type=positive_int, required=True, help="data-parallel ranks")
    parser.add_argument("--micro-batches", type=positive_int, required=True, help="micro-batches per rank")
    parser.add_argument("--capacity", type=positive_int, required=True, help="tokens per micro-batch")
    parser.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_COST_MODEL.alpha,
        help="quadratic cost per sample, alpha*L^2 (default: hidden 4096, 32 layers, causal)",
    )
    parser.add_argument("--beta", type=float, default=DEFAULT_COST_MODEL.beta, help="linear cost, beta*L")
    parser.add_argument("--out", type=output_file, required=True, help="output .npz with int32 arrays rank, micro")


def _load_lengths(path: Path) -> np.ndarray:
    try:
        lengths = np.load(path, allow_pickle=False)
    except FileNotFoundError as exc:
        msg = f"no such file: {path}"
        raise NotFoundError(msg) from exc
    except (OSError, ValueError) as exc:
        msg = f"cannot read {path} as a .npy array: {exc}"
        raise MixflowError(msg) from exc
    if not isinstance(lengths, np.ndarray) or lengths.dtype != np.int64:
        got = lengths.dtype if isinstance(lengths, np.ndarray) else type(lengths).__name__
        msg = f"{path} must hold int64 lengths, got {got}"
        raise MixflowError(msg)
    return lengths


def run(args: argparse.Namespace) -> int:
    from pipeline.planning.scheduler import plan_step, validate_plan

    lengths = _load_lengths(args.lengths)
    try:
        cost_model = CostModel(alpha=args.alpha, beta=args.beta)
        plan_step(np.array([1, 2, 3], np.int64), 2, 1, 4, cost_model)  # compile (or load) the kernels
        start = time.perf_counter()
        plan = plan_step(lengths, args.ranks, args.micro_batches, args.capacity, cost_model)
        seconds = time.perf_counter() - start
        validate_plan(plan, lengths)
    except ValueError as exc:
        raise MixflowError(str(exc)) from exc
    try:
        np.savez(args.out, rank=plan.rank, micro=plan.micro)
    except OSError as exc:
        msg = f"cannot write {args.out}: {exc}"
        raise MixflowError(msg) from exc
    for line in plan.summary(lengths, cost_model).lines():
        print(line)
    print(f"plan_seconds={seconds:.6f}")
    return 0
