"""Context-parallel plans on one GPU: what each rank of a planned step computes, timed, against the cost model.

For each pool of long-context samples (``cp_bench``'s: lognormal, ByteScale-like, turns+books; 64 ranks of 4
micro-batches of 8k and of 32k tokens a rank by default), two plans of one step: ``plan_cp_step`` in the aligned
mode (blocks of power-of-two sizes, up to 64 ranks) and static context parallelism (``static_shape``: one size
for every sample, sized for the longest). Every rank's every micro-batch is timed on the one GPU as one
transformer block (hidden 4096, 32 heads and 8 KV heads of 128, MLP 4x, bf16; forward and backward) over the
rank's slice tokens: a sample on a block of ``c > 1`` ranks is the rank's zigzag slice (``zigzag_positions``:
two chunks of ``P / 2c`` tokens) whose queries attend to the whole sample's keys and values before them, as ring
(or all-gather) context parallelism computes it on that rank: each chunk causally against itself and in full
against the keys that precede it (flash varlen attention, ``cu_seqlens`` for queries and keys apart; SDPA per
sequence on a CPU). The other ranks' keys and values stand ready in memory: **communication is not timed** (no
ring traffic, no all-gather, no gradient reduce-scatter), so measured times are compute only.

A rank's step time is the sum of its micro-batches; a block micro-batch starts when the last of its ranks is
ready (``CPPlan.step_time_of``, the simulation ``CPPlan.step_time`` runs on the cost model's seconds). The
ranks of one block micro-batch hold the same samples, so each distinct micro-batch (its samples' lengths and
block sizes) is timed once and its time reused.

Reported per pool, size and plan: measured step time, the cost model's (``ContextParallelCost`` for one layer
of this block: ``predicted``, with exposed ring traffic; ``predicted compute``, without), measured / predicted,
and measured and predicted tokens per second of aligned over static. Megatron-Core's ``BalancedCPScheduler``
(``cp_bench``'s third contender) is not timed: its groups end at a barrier, which ``CPPlan`` does not model.

    python3 -m benchmarks.gpu_cp_check --out $OUT            # on the GPU machine; writes $OUT/gpu_cp_check.json

Run time on an H200, estimated (no GPU run yet) from each distinct micro-batch's FLOPs at 600 TFLOP/s for the
matmuls and 400 for attention, 2.5 runs each (the median of two, and overhead): about 750 distinct micro-batches
in all (~150 an aligned plan, under 10 a static one), ~20 s for the three pools at 8k tokens a rank, ~3 minutes
at 32k (the slices of a 2M-token sample on 64 ranks are the heaviest), ~200 s of GPU time; with start-up and
the planner's numba compilation on a fresh machine (up to a minute), about 5 minutes. ``--budget-s`` (default
420) skips the cells left once it is spent; the JSON is written after every cell.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import _cp_block
from benchmarks.cp_bench import POOLS, pool_of
from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step, static_shape
from pipeline.planning.scheduler.cp_plan import CPPlan
from pipeline.spec.cost import CostModel
from pipeline.spec.cp_cost import ContextParallelCost

PLANNER_COST = ContextParallelCost()
"""What the plans are made with (a 7B-class model, as ``cp_bench``)."""


def one_layer_cost(hidden: int, heads: int, kv_heads: int, communication: bool = True) -> ContextParallelCost:
    """The cost model's seconds for one layer of the timed block (without ring traffic: ``communication``)."""
    unbounded = 1e30
    return ContextParallelCost(
        model=CostModel.from_transformer(hidden, 1),
        layers=1,
        hidden_size=hidden,
        kv_heads=kv_heads,
        head_dim=hidden // heads,
        **({} if communication else {"nvlink_bytes_per_s": unbounded, "network_bytes_per_s": unbounded}),
    )


def plans_of(lengths: np.ndarray, ranks: int, micro_batches: int, capacity: int) -> dict[str, CPPlan]:
    aligned = CPShape(ranks, micro_batches, capacity, CPMode.ALIGNED, 1 << (ranks.bit_length() - 1))
    return {
        "aligned": plan_cp_step(lengths, aligned, PLANNER_COST),
        "static": plan_cp_step(lengths, static_shape(lengths, ranks, micro_batches, capacity), PLANNER_COST),
    }


def rank_micro_batches(plan: CPPlan, lengths: np.ndarray) -> dict[tuple[int, int], list[tuple[int, int, int]]]:
    """Every used (rank, micro-batch) slot's samples: (length, block size, the rank's place in the block)."""
    sample, place = plan.slots()
    out: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for i, p in zip(sample.tolist(), place.tolist(), strict=True):
        slot = (int(plan.rank[i]) + p, int(plan.micro[i]))
        out.setdefault(slot, []).append((int(lengths[i]), int(plan.cp[i]), p))
    return out


def shape_key(samples: list[tuple[int, int, int]]) -> tuple[tuple[int, int], ...]:
    """What a slot's time depends on: its samples' lengths and block sizes (a block's ranks share it)."""
    return tuple(sorted((length, cp) for length, cp, _ in samples))


def measured_micro_times(
    plan: CPPlan, lengths: np.ndarray, timer: _cp_block.Timer, cache: dict[Any, float]
) -> np.ndarray:
    """Seconds of every rank's every micro-batch, as ``CPPlan.micro_times`` shapes them, from ``timer``'s ms
    (one timing a distinct slot shape, kept in ``cache``)."""
    times = np.zeros((plan.shape.ranks, plan.shape.max_micro_batches))
    for (rank, micro), samples in sorted(rank_micro_batches(plan, lengths).items()):
        key = shape_key(samples)
        if key not in cache:
            cache[key] = timer.time(samples)
        times[rank, micro] = cache[key] / 1000.0
    return times


def check_cell(
    pool_name: str,
    ranks: int,
    micro_batches: int,
    capacity: int,
    longest: int,
    seed: int,
    timer: _cp_block.Timer,
    costs: dict[str, ContextParallelCost],
) -> dict[str, Any]:
    pool = next(p for p in POOLS if p.name == pool_name)
    rng = np.random.default_rng([seed, ranks, capacity, longest])
    lengths = pool_of(pool, rng, ranks * micro_batches * capacity, longest)
    began = time.perf_counter()
    plans = plans_of(lengths, ranks, micro_batches, capacity)
    planning_s = time.perf_counter() - began
    out: dict[str, Any] = {
        "pool": pool_name,
        "ranks": ranks,
        "micro_batches": micro_batches,
        "capacity": capacity,
        "longest": longest,
        "samples": int(lengths.size),
        "planning_s": planning_s,
        "plans": {},
    }
    for name, plan in plans.items():
        cache: dict[Any, float] = {}
        began = time.perf_counter()
        micro = measured_micro_times(plan, lengths, timer, cache)
        tokens = int(lengths[plan.placed_mask].sum())
        row = {
            "largest_block": int(plan.cp.max(initial=0)),
            "tokens": tokens,
            "distinct_micro_batches": len(cache),
            "timing_s": time.perf_counter() - began,
            "measured_s": plan.step_time_of(micro),
            "micro_times_s": micro.tolist(),
        }
        for label, cost in costs.items():
            row[f"{label}_s"] = plan.step_time(lengths, cost)
            row[f"measured_over_{label}"] = row["measured_s"] / row[f"{label}_s"]
        for label in ("measured", *costs):
            row[f"{label}_tokens_per_s"] = tokens / row[f"{label}_s"]
        out["plans"][name] = row
    aligned, static = out["plans"]["aligned"], out["plans"]["static"]
    for label in ("measured", *costs):
        out[f"aligned_over_static_{label}"] = aligned[f"{label}_tokens_per_s"] / static[f"{label}_tokens_per_s"]
    return out


def table(cells: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'pool':12s} {'tokens':>8s} {'plan':8s} {'block':>5s} {'distinct':>8s} {'measured ms':>11s} "
        f"{'predicted ms':>12s} {'meas/pred':>9s} {'meas/compute':>12s} {'tok/s vs static (meas, pred)':>28s}"
    ]
    for cell in cells:
        for name, row in cell["plans"].items():
            versus = (
                f"{cell['aligned_over_static_measured']:.3f}, {cell['aligned_over_static_predicted']:.3f}"
                if name == "aligned"
                else "1"
            )
            lines.append(
                f"{cell['pool']:12s} {cell['capacity']:>8d} {name:8s} {row['largest_block']:>5d} "
                f"{row['distinct_micro_batches']:>8d} {1000 * row['measured_s']:>11.2f} "
                f"{1000 * row['predicted_s']:>12.2f} {row['measured_over_predicted']:>9.3f} "
                f"{row['measured_over_predicted_compute']:>12.3f} {versus:>28s}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--pools", default=",".join(p.name for p in POOLS))
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument(
        "--sizes", default="8192:262144,32768:2097152", help="tokens a rank:longest sample, comma-separated"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block", default="4096,32,8", help="hidden,heads,kv_heads")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs a distinct micro-batch (median)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="no new cell once this is spent")
    args = parser.parse_args(argv)
    hidden, heads, kv_heads = (int(x) for x in args.block.split(","))
    timer = _cp_block.Timer(args.device, hidden, heads, kv_heads, args.repeats)
    costs = {
        "predicted": one_layer_cost(hidden, heads, kv_heads),
        "predicted_compute": one_layer_cost(hidden, heads, kv_heads, communication=False),
    }
    result: dict[str, Any] = {
        **timer.describe(),
        "communication": "not timed",
        "repeats": args.repeats,
        "cells": [],
        "skipped": [],
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("cells", "skipped")}), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    sizes = [tuple(int(x) for x in size.split(":")) for size in args.sizes.split(",")]
    for capacity, longest in sizes:
        for pool in args.pools.split(","):
            name = f"{pool} {capacity}:{longest}"
            if time.perf_counter() - began > args.budget_s:
                result["skipped"].append(name)
                continue
            cell = check_cell(pool, args.ranks, args.micro_batches, capacity, longest, args.seed, timer, costs)
            result["cells"].append(cell)
            (args.out / "gpu_cp_check.json").write_text(json.dumps(result))
            print(f"{name}: done at {time.perf_counter() - began:.0f} s", flush=True)
    result["seconds"] = time.perf_counter() - began
    result["timings_ms_median"] = statistics.median(timer.timings_ms) if timer.timings_ms else None
    (args.out / "gpu_cp_check.json").write_text(json.dumps(result))
    print("\n".join(table(result["cells"])), flush=True)
    if result["skipped"]:
        print(f"skipped (budget spent): {', '.join(result['skipped'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
