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

Megatron-Core's ``BalancedCPScheduler`` (``cp_bench``'s third contender, where ``megatron.core`` imports) is
timed too, scored as ``cp_bench`` scores it: its groups one after the other, each as long as its slowest rank.

Reported per pool, size and plan: measured step time, the cost model's (``ContextParallelCost`` for one layer
of this block: ``predicted``, with exposed ring traffic; ``predicted compute``, without), measured / predicted,
and measured and predicted tokens per second over static's.

    python3 -m benchmarks.gpu_cp_check --out $OUT            # on the GPU machine; writes $OUT/gpu_cp_check.json

Run time on an H200, estimated (no GPU run yet) from each distinct micro-batch's FLOPs at 600 TFLOP/s for the
matmuls and 400 for attention, 2.5 runs each (the median of two, and overhead): ~150 distinct micro-batches an
aligned plan, under 10 a static one, ~80 Megatron's; ~30 s for the three pools at 8k tokens a rank, ~5 minutes
at 32k (the slices of a 2M-token sample on 64 ranks weigh most), ~3.5 minutes without Megatron; with start-up
and the planner's numba compilation on a fresh machine (up to a minute), 5-7 minutes. No cell starts once
``--budget-s`` (default 300) is spent (those left are listed as skipped); the JSON is written after every cell.
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
from benchmarks.cp_bench import POOLS, megatron_groups, megatron_groups_time, pool_of
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


def megatron_row(
    lengths: np.ndarray, ranks: int, capacity: int, timer: _cp_block.Timer, costs: dict[str, ContextParallelCost]
) -> dict[str, Any] | None:
    """Megatron-Core's ``BalancedCPScheduler``'s step, as ``cp_bench`` scores it: its groups one after the other,
    each as long as its slowest rank; a rank's share of a group timed as one micro-batch (its samples' zigzag
    slices, its place among each sample's ranks). None where ``megatron.core`` does not import."""
    try:
        groups, fits, _ = megatron_groups(lengths, ranks, capacity)
    except ImportError:
        return None
    cache: dict[Any, float] = {}
    began = time.perf_counter()
    times = np.zeros((ranks, len(groups)))
    for g, holders in enumerate(groups):
        slots: dict[int, list[tuple[int, int, int]]] = {}
        for i, gpus in holders.items():
            for place, gpu in enumerate(sorted(gpus)):
                slots.setdefault(gpu, []).append((int(lengths[i]), len(gpus), place))
        for gpu, samples in slots.items():
            key = shape_key(samples)
            if key not in cache:
                cache[key] = timer.time(samples)
            times[gpu, g] = cache[key] / 1000.0
    row = {
        "largest_block": max((len(gpus) for holders in groups for gpus in holders.values()), default=0),
        "tokens": int(lengths[fits].sum()),
        "distinct_micro_batches": len(cache),
        "timing_s": time.perf_counter() - began,
        "measured_s": float(times.max(axis=0).sum()),
        "micro_times_s": times.tolist(),
    }
    for label, cost in costs.items():
        row[f"{label}_s"] = megatron_groups_time(groups, lengths, ranks, cost)
    return row


def _rates(row: dict[str, Any], labels: list[str]) -> dict[str, Any]:
    for label in labels[1:]:
        row[f"measured_over_{label}"] = row["measured_s"] / row[f"{label}_s"]
    for label in labels:
        row[f"{label}_tokens_per_s"] = row["tokens"] / row[f"{label}_s"]
    return row


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
        out["plans"][name] = _rates(row, ["measured", *costs])
    megatron = megatron_row(lengths, ranks, capacity, timer, costs)
    if megatron is not None:
        out["plans"]["megatron"] = _rates(megatron, ["measured", *costs])
    static = out["plans"]["static"]
    for name, row in out["plans"].items():
        for label in ("measured", *costs):
            if name != "static":
                out[f"{name}_over_static_{label}"] = row[f"{label}_tokens_per_s"] / static[f"{label}_tokens_per_s"]
    return out


def table(cells: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'pool':12s} {'tokens':>8s} {'plan':8s} {'block':>5s} {'distinct':>8s} {'measured ms':>11s} "
        f"{'predicted ms':>12s} {'meas/pred':>9s} {'meas/compute':>12s} {'tok/s vs static (meas, pred)':>28s}"
    ]
    for cell in cells:
        for name, row in cell["plans"].items():
            versus = (
                f"{cell[f'{name}_over_static_measured']:.3f}, {cell[f'{name}_over_static_predicted']:.3f}"
                if name != "static"
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
    parser.add_argument("--budget-s", type=float, default=300.0, help="no new cell once this is spent")
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
