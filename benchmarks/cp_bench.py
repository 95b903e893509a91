"""Context-parallel steps against the peers, side by side, on one cost model: step time of every contender as a
fraction of the step's lower bound, the bytes a rank receives, and planning time.

    .venv/bin/python -m benchmarks.cp_bench [--quick] [--seeds N] [--markdown]

Every contender's plan is scored by the same ``ContextParallelCost`` (a 7B-class layer, 400 TFLOP/s a GPU, NVLink
400 GB/s inside nodes of 8 ranks, 50 GB/s between them, ring traffic hidden behind the attention it overlaps)
and the same simulation (``CPPlan.step_time``: a rank runs its micro-batches in order; a block's ranks start a
block micro-batch together). Contenders, on the same pool:

- **static**: one context-parallel size for the job, sized for the longest sample (the smallest power of two
  whose slices of it fit a rank), every sample split that many ways, balanced over the data-parallel groups
  (costliest first onto the least loaded group);
- **megatron**: Megatron-Core 0.16.1's ``BalancedCPScheduler`` run as it is (``get_groups_and_subsamples`` with
  ``max_seq_len_per_rank`` the rank's tokens), its groups run one after the other, each as long as its slowest
  rank, every sample scored at the size and ranks it was given;
- **aligned**, **free**: ``plan_cp_step`` in those modes (blocks up to the whole step);
- **bound**: every sample at its cheapest feasible size, GPU time spread evenly (``lower_bound``).

A pool holds samples of a distribution until 95% of the step's tokens (``ranks x micro-batches x tokens a
rank``): room for all. Columns: each contender's bound / step time (1.0 = the bound; tokens per second follow
it, the tokens being the same), tokens it deferred, bytes a rank receives over its slices' (static: every rank
of a group reads the group's whole micro-batches, as trainers read them today; ours: the slices), plan ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from benchmarks._table import add_markdown_flag, print_table
from pipeline.planning.scheduler.context_parallel import (
    CPMode,
    CPPlan,
    CPShape,
    lower_bound,
    plan_cp_step,
    slice_tokens,
    static_shape,
)
from pipeline.spec.cp_cost import ContextParallelCost

COST = ContextParallelCost()
FILL = 0.95


@dataclass(frozen=True)
class Pool:
    name: str
    draw: Callable[[np.random.Generator, int, int], np.ndarray]  # (rng, n, longest) -> lengths


def _lognormal(rng: np.random.Generator, n: int, longest: int) -> np.ndarray:
    return np.clip(rng.lognormal(np.log(3000), 1.4, n), 16, longest)


def _bytescale(rng: np.random.Generator, n: int, longest: int) -> np.ndarray:
    """80% under 4k tokens, 19% 4k-128k, 1% from 128k to the longest."""
    kind = rng.random(n)
    short = rng.integers(64, 4096, n)
    middle = np.exp(rng.uniform(np.log(4096), np.log(131072), n))
    long = np.exp(rng.uniform(np.log(131072), np.log(longest), n))
    return np.where(kind < 0.80, short, np.where(kind < 0.99, middle, long))


def _turns_and_books(rng: np.random.Generator, n: int, longest: int) -> np.ndarray:
    """Short chat turns, and now and then a whole book."""
    books = rng.random(n) < 0.004
    return np.where(books, rng.uniform(longest / 4, longest, n), rng.lognormal(np.log(400), 0.7, n))


POOLS = (Pool("lognormal", _lognormal), Pool("bytescale", _bytescale), Pool("turns+books", _turns_and_books))


def pool_of(pool: Pool, rng: np.random.Generator, step_tokens: int, longest: int) -> np.ndarray:
    """Samples until ``FILL`` of the step's tokens, the longest one always among them."""
    chunks = [np.array([longest])]
    total = longest
    while total < FILL * step_tokens:
        chunk = np.clip(np.rint(pool.draw(rng, 4096, longest)), 1, longest).astype(np.int64)
        chunks.append(chunk)
        total += int(chunk.sum())
    lengths = np.concatenate(chunks)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), FILL * step_tokens, side="right"))]
    return rng.permutation(lengths)


class _Group:
    """What ``BalancedCPScheduler`` asks of its DPxCP process group."""

    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


def megatron_groups(
    lengths: np.ndarray, ranks: int, capacity: int
) -> tuple[list[dict[int, list[int]]], np.ndarray, float]:
    """Megatron-Core's ``BalancedCPScheduler`` on ``lengths`` (run as it is): its groups, run one after the other,
    each as the ranks that hold each of its samples; which samples it could place; its planning seconds."""
    from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler

    began = time.perf_counter()
    scheduler = BalancedCPScheduler(capacity, _Group(ranks))
    fits = np.array([scheduler.gpus_needed(int(length)) <= ranks for length in lengths])
    _, sample_groups = scheduler.get_groups_and_subsamples(
        [(i, int(lengths[i])) for i in np.flatnonzero(fits)], SimpleNamespace()
    )
    seconds = time.perf_counter() - began
    groups = []
    for per_gpu in sample_groups:
        holders: dict[int, list[int]] = {}
        for gpu, ids in enumerate(per_gpu):
            for i in ids:
                holders.setdefault(int(i), []).append(gpu)
        groups.append(holders)
    return groups, fits, seconds


def megatron_step_time(
    lengths: np.ndarray, ranks: int, capacity: int, cost: ContextParallelCost = COST
) -> tuple[float, int, float]:
    """The step time of ``megatron_groups`` (groups one after the other, each as long as its slowest rank, every
    sample scored at the size and ranks it was given), the tokens it could not place, and its planning seconds."""
    groups, fits, seconds = megatron_groups(lengths, ranks, capacity)
    return megatron_groups_time(groups, lengths, ranks, cost), int(lengths[~fits].sum()), seconds


def megatron_groups_time(
    groups: list[dict[int, list[int]]], lengths: np.ndarray, ranks: int, cost: ContextParallelCost
) -> float:
    """Seconds of ``megatron_groups``' groups one after the other, each as long as its slowest rank."""
    total = 0.0
    for holders in groups:
        busy = np.zeros(ranks)
        for i, gpus in holders.items():
            c, first = len(gpus), min(gpus)
            busy[gpus] += cost.per_rank(np.array([lengths[i]]), c, bool(cost.within_node(first, c)))[0]
        total += float(busy.max())
    return total


def bytes_ratio(plan: CPPlan, lengths: np.ndarray, static: bool) -> float:
    """The tokens the busiest rank receives over the tokens of its own slices: 1 for slices; with static
    context parallelism as trainers read it, every rank of a group reads the group's whole samples."""
    placed = np.flatnonzero(plan.placed_mask)
    first, cp = plan.rank[placed].astype(np.int64), plan.cp[placed].astype(np.int64)
    own = slice_tokens(lengths[placed], cp)
    received = cp * own if static else own
    mine = np.zeros(plan.shape.ranks)
    read = np.zeros(plan.shape.ranks)
    for offset in range(int(cp.max(initial=1))):
        inside = offset < cp
        np.add.at(mine, first[inside] + offset, own[inside])
        np.add.at(read, first[inside] + offset, received[inside])
    busy = mine > 0
    return float((read[busy] / mine[busy]).max()) if busy.any() else 1.0


def run(pool: Pool, ranks: int, capacity: int, longest: int, micro: int, seeds: int) -> list[object]:
    shape_tokens = ranks * micro * capacity
    cells: dict[str, list[float]] = {}
    for seed in range(seeds):
        rng = np.random.default_rng([seed, ranks, capacity, longest])
        lengths = pool_of(pool, rng, shape_tokens, longest)
        bound = lower_bound(lengths, CPShape(ranks, micro, capacity, CPMode.FREE, ranks), COST)
        static = static_shape(lengths, ranks, micro, capacity)
        began = time.perf_counter()
        static_plan = plan_cp_step(lengths, static, COST)
        static_s = time.perf_counter() - began
        mega_time, mega_deferred, mega_s = megatron_step_time(lengths, ranks, capacity)
        row = {
            "static": bound / static_plan.step_time(lengths, COST),
            "static deferred": _deferred_share(static_plan, lengths),
            "static bytes": bytes_ratio(static_plan, lengths, static=True),
            "static ms": 1000 * static_s,
            "megatron": bound / mega_time,
            "megatron deferred": mega_deferred / lengths.sum(),
            "megatron ms": 1000 * mega_s,
        }
        for mode in (CPMode.ALIGNED, CPMode.FREE):
            size = ranks if mode is CPMode.FREE else 1 << (ranks.bit_length() - 1)
            began = time.perf_counter()
            plan = plan_cp_step(lengths, CPShape(ranks, micro, capacity, mode, size), COST)
            seconds = time.perf_counter() - began
            row[mode.value] = bound / plan.step_time(lengths, COST)
            row[f"{mode.value} deferred"] = _deferred_share(plan, lengths)
            row[f"{mode.value} ms"] = 1000 * seconds
            row[f"{mode.value} bytes"] = bytes_ratio(plan, lengths, static=False)
            row[f"{mode.value} longest placed"] = float(plan.placed_mask[int(np.argmax(lengths))])
        for key, value in row.items():
            cells.setdefault(key, []).append(value)
    med = {key: statistics.median(values) for key, values in cells.items()}
    worst = {key: min(values) for key, values in cells.items()}
    return [
        pool.name,
        ranks,
        f"{capacity // 1024}k",
        f"{longest // 1024}k",
        f"{med['static']:.3f}",
        f"{med['megatron']:.3f}",
        f"{med['aligned']:.3f} ({worst['aligned']:.3f})",
        f"{med['free']:.3f} ({worst['free']:.3f})",
        f"{max(cells['aligned deferred']):.1%}",
        "yes" if min(cells["aligned longest placed"]) == 1.0 else "no",
        f"{med['static bytes']:.1f}",
        f"{med['aligned bytes']:.2f}",
        f"{med['aligned ms']:.0f}",
        f"{med['free ms']:.0f}",
        f"{med['megatron ms']:.0f}",
    ]


def _deferred_share(plan: CPPlan, lengths: np.ndarray) -> float:
    return float(lengths[~plan.placed_mask].sum()) / float(lengths.sum())


HEADERS = [
    "pool",
    "ranks",
    "tokens/rank",
    "longest",
    "static",
    "megatron",
    "aligned (worst)",
    "free (worst)",
    "aligned deferred",
    "longest placed",
    "static bytes/slice",
    "ours bytes/slice",
    "aligned ms",
    "free ms",
    "megatron ms",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 and 256 ranks only")
    parser.add_argument("--seeds", type=int, default=3, help="pools drawn per row (default 3); medians and worst")
    parser.add_argument("--micro-batches", type=int, default=4, help="micro-batches a rank (default 4)")
    add_markdown_flag(parser)
    args = parser.parse_args(argv)
    scales = (64, 256) if args.quick else (64, 256, 1024)
    rows = []
    for pool in POOLS:
        for ranks in scales:
            for capacity, longest in ((8192, 262144), (32768, 2097152)):
                if longest > ranks * capacity:
                    continue
                rows.append(run(pool, ranks, capacity, longest, args.micro_batches, args.seeds))
    title = "the lower bound's step time over each contender's (1.0 = the bound; medians, worst in brackets)"
    print_table(HEADERS, rows, title=title, markdown=args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
