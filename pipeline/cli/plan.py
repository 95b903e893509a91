"""`mixflow plan`: plan one step from a file of sample lengths and write the assignment (with
``--context-parallel``, each sample's block of ranks too: ``pipeline.cli.plan_context_parallel``; with
``--patches``, samples with vision patches under both capacities: ``pipeline.cli.plan_media``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from pipeline.cli import plan_media
from pipeline.cli.arguments import output_file, positive_int
from pipeline.cli.plan_context_parallel import context_parallel, read_cost_section
from pipeline.spec.cost import DEFAULT_COST_MODEL, CostModel
from topics.errors import MixflowError, NotFoundError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", type=Path, required=True, help=".npy file of int64 sample lengths")
    parser.add_argument("--ranks", type=positive_int, required=True, help="data-parallel ranks")
    parser.add_argument("--micro-batches", type=positive_int, required=True, help="micro-batches per rank")
    parser.add_argument("--capacity", type=positive_int, help="tokens per micro-batch (a rank's)")
    parser.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_COST_MODEL.alpha,
        help="quadratic cost per sample, alpha*L^2 (default: hidden 4096, 32 layers, causal)",
    )
    parser.add_argument("--beta", type=float, default=DEFAULT_COST_MODEL.beta, help="linear cost, beta*L")
    parser.add_argument(
        "--cost",
        type=Path,
        help="YAML file with a spec's cost section (or a whole spec): alpha/beta or hidden_size/num_layers, and "
        "its context_parallel terms (instead of --alpha/--beta)",
    )
    parser.add_argument(
        "--context-parallel",
        type=context_parallel,
        metavar="{static:C,aligned[:C],free[:C]}",
        help="long samples span blocks of ranks: one size C for all (static), a power of two a sample on blocks "
        "aligned to it (aligned, Megatron-Core's hybrid CP), any size on any consecutive ranks (free); C: the "
        "largest block (default: all the ranks); writes cp, the block size, with rank its first rank",
    )
    parser.add_argument(
        "--max-tokens-per-rank",
        type=positive_int,
        help="with --context-parallel: the tokens a rank holds in a micro-batch, slices padded to 2*cp "
        "(default: --capacity)",
    )
    parser.add_argument(
        "--max-micro-batches",
        type=positive_int,
        help="with --context-parallel: the most micro-batches a rank may run (default: twice --micro-batches; "
        "static: --micro-batches)",
    )
    parser.add_argument(
        "--patches",
        type=Path,
        help=".npy file of int64 vision patches, one per sample (aligned with --lengths, 0 for text); a sample's "
        "patches cost the encoder as one image or clip",
    )
    parser.add_argument(
        "--patch-capacity", type=positive_int, help="with --patches: the vision patches a micro-batch holds"
    )
    parser.add_argument(
        "--vision-alpha",
        type=float,
        help="with --patches: encoder cost per pair of a sample's patches, in the unit of --alpha/--beta (the spec's "
        "cost.vision.alpha; default: cost.vision of --cost, else the encoder costs nothing)",
    )
    parser.add_argument("--vision-beta", type=float, help="with --patches: encoder cost per patch (cost.vision.beta)")
    parser.add_argument(
        "--out",
        type=output_file,
        required=True,
        help="output .npz with int32 arrays rank, micro (and cp; with --patches, float64 llm_rank_cost and "
        "encoder_rank_cost, by rank)",
    )


def _load_counts(path: Path, what: str = "lengths") -> np.ndarray:
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
        msg = f"{path} must hold int64 {what}, got {got}"
        raise MixflowError(msg)
    return lengths


def _check_arguments(args: argparse.Namespace) -> None:
    if args.capacity is None and (args.context_parallel is None or args.max_tokens_per_rank is None):
        msg = "give --capacity (or --max-tokens-per-rank with --context-parallel)"
        raise MixflowError(msg)
    if args.context_parallel is None and (args.max_tokens_per_rank or args.max_micro_batches):
        msg = "--max-tokens-per-rank and --max-micro-batches plan context parallelism: give --context-parallel"
        raise MixflowError(msg)
    default = DEFAULT_COST_MODEL
    if args.cost is not None and (args.alpha != default.alpha or args.beta != default.beta):
        msg = "give --cost or --alpha/--beta, not both"
        raise MixflowError(msg)
    plan_media.check_media_arguments(args)


def run(args: argparse.Namespace) -> int:
    from pipeline.planning.scheduler import plan_step, validate_plan

    _check_arguments(args)
    lengths = _load_counts(args.lengths)
    if args.context_parallel is not None:
        from pipeline.cli import plan_context_parallel

        return plan_context_parallel.run(args, lengths)
    section = read_cost_section(args.cost) if args.cost else None
    try:
        cost_model = section.cost_model() if section else CostModel(alpha=args.alpha, beta=args.beta)
    except ValueError as exc:
        raise MixflowError(str(exc)) from exc
    if args.patches is not None:
        patches = _load_counts(args.patches, "patches")
        return plan_media.run(args, lengths, patches, cost_model, section.vision_cost_model() if section else None)
    try:
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
