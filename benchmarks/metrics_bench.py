"""What the metrics hooks cost on the roles' hot paths, against the same loop without them (no Kafka).

- constructor: one step as the constructor makes it from a pool of held samples (``pool.take``,
  ``assemble_step``, ``pool.settle``, reading the next samples in), with and without ``look_at_pool`` and
  ``step_committed``;
- sink: handing out decoded micro-batches, with and without ``noting_tokens`` and ``handed_out``;
- loader: the per-transaction hooks alone (a unit's reading and tokenizing dwarfs them).

    .venv/bin/python -m benchmarks.metrics_bench [--repeats 5] [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from benchmarks._table import add_markdown_flag, print_table
from pipeline.planning.mixing import MixerState
from pipeline.planning.shape import StepShape
from pipeline.planning.step.assemble import assemble_step
from pipeline.planning.step.pool import SamplePool
from pipeline.planning.step.state import ConstructorState, SourcePosition
from pipeline.roles.constructor.metrics import ConstructorMetrics
from pipeline.roles.loader.metrics import LoaderMetrics
from pipeline.spec.cost import CostModel
from pipeline.spec.sections import StepSpec
from topics.formats.dead_letter import DeadLetter
from topics.formats.sample import Sample
from trainer_sink.deliveries import Delivery
from trainer_sink.metrics import SinkMetrics

SOURCES = ("a", "b", "c")
COST = CostModel(alpha=1.0, beta=100.0)


def median_seconds(run: Callable[[], int], repeats: int) -> float:
    """Median over ``repeats`` of seconds per item (``run`` returns how many it did)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        items = run()
        times.append((time.perf_counter() - began) / items)
    return statistics.median(times)


def constructor_steps(
    shape: StepSpec, held: int, steps: int, with_metrics: bool, hook_seconds: list[float] | None = None
) -> Callable[[], int]:
    """Steps as the constructor makes them; with metrics, the seconds spent in the hooks are appended to
    ``hook_seconds`` (per step), timed apart from the step so that the machine's noise does not hide them."""
    rng = np.random.default_rng(0)
    cost = COST
    budget = shape.tokens_per_step
    step_shape = StepShape.from_spec(shape)

    def run() -> int:
        state = ConstructorState(MixerState.initial(SOURCES), {s: SourcePosition(0, ()) for s in SOURCES})
        pool = SamplePool(state)
        metrics = ConstructorMetrics(CollectorRegistry(), "bench", _spec(shape)) if with_metrics else None
        offsets = dict.fromkeys(SOURCES, 0)

        def read(n: int) -> None:
            for _ in range(n):
                source = SOURCES[int(rng.integers(len(SOURCES)))]
                length = int(rng.integers(16, shape.tokens_per_micro_batch // 2))
                pool.add(
                    source, offsets[source], Sample(f"{source}/{offsets[source]}", source, np.ones(length, np.int32))
                )
                offsets[source] += 1

        read(held)
        for k in range(steps):
            hooks = 0.0
            if metrics is not None:
                began = time.perf_counter()
                metrics.look_at_pool(pool)
                hooks += time.perf_counter() - began
            take, tokens = {}, 0
            for s, fifo in pool.fifos.items():
                n = int(np.searchsorted(np.cumsum(fifo.lengths), budget * 1.05 / len(SOURCES)))
                take[s] = np.arange(min(n, len(fifo.lengths)))
                tokens += sum(fifo.lengths[: len(take[s])])
            candidates = pool.take(take)
            assembled = assemble_step(k, candidates, step_shape, cost)
            pool.settle(assembled.delivered, assembled.deferred)
            summary = assembled.summary()
            _record(summary, cost)  # the constructor's StepRecord, made with or without metrics
            if metrics is not None:
                began = time.perf_counter()
                metrics.step_committed(summary, [])
                hooks += time.perf_counter() - began
                if hook_seconds is not None:
                    hook_seconds.append(hooks)
            read(summary.samples)
        return steps

    return run


def pool_looks(held: int, looks: int) -> Callable[[], int]:
    """``look_at_pool`` when it sums what the pool holds, as it does every ``POOL_LOOK_S``."""
    state = ConstructorState(MixerState.initial(SOURCES), {s: SourcePosition(0, ()) for s in SOURCES})
    pool = SamplePool(state)
    for i in range(held):
        source = SOURCES[i % len(SOURCES)]
        pool.add(source, i // len(SOURCES), Sample(f"{source}/{i}", source, np.ones(100, np.int32)))
    metrics = ConstructorMetrics(
        CollectorRegistry(), "bench", _spec(StepSpec(ranks=1, micro_batches=1, tokens_per_micro_batch=8))
    )

    def run() -> int:
        for _ in range(looks):
            metrics._pool_look_at = -1.0  # due now
            metrics.look_at_pool(pool)
        return looks

    return run


def _spec(shape: StepSpec) -> SimpleNamespace:
    """What ConstructorMetrics reads of a JobSpec."""
    return SimpleNamespace(step=shape, cost=SimpleNamespace(cost_model=lambda: COST), source_names=list(SOURCES))


def _record(summary, cost) -> object:
    from pipeline.roles.constructor.stats import StepRecord

    return StepRecord.of(summary, cost, 0)


def sink_hand_out(micro_batches: int, with_metrics: bool) -> Callable[[], int]:
    lengths = np.full(16, 512)
    tensors = {"cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))}
    deliveries = [Delivery(tensors, i, i // 4, i % 4, 4, 8) for i in range(micro_batches)]

    def run() -> int:
        items = iter(deliveries)
        if with_metrics:
            metrics = SinkMetrics(CollectorRegistry(), "bench", 0)
            for delivery in metrics.noting_tokens(items):
                began = time.perf_counter()
                metrics.handed_out(delivery, time.perf_counter() - began)
        else:
            for _ in items:
                began = time.perf_counter()
                time.perf_counter() - began  # the iterator's own timing, kept for a like-for-like loop
        return micro_batches

    return run


def loader_hooks(units: int) -> Callable[[], int]:
    letters = [DeadLetter("a", "f.txt", "not UTF-8: byte 3")]

    def run() -> int:
        metrics = LoaderMetrics(CollectorRegistry(), "bench", "a")
        for _ in range(units):
            metrics.letters_produced(letters)
            metrics.unit_committed(100, 50_000)
            metrics.transaction_ended(True, 0.5)
        return units

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    add_markdown_flag(parser)
    args = parser.parse_args()
    rows = []
    for ranks, held in ((8, 2_000), (64, 20_000)):
        shape = StepSpec(ranks=ranks, micro_batches=4, tokens_per_micro_batch=4096)
        constructor_steps(shape, held, 3, True)()  # compiles the scheduler's kernels first
        hook_seconds: list[float] = []
        base = median_seconds(constructor_steps(shape, held, 30, False), args.repeats)
        hooked = median_seconds(constructor_steps(shape, held, 30, True, hook_seconds), args.repeats)
        hooks = statistics.median(hook_seconds)
        case = f"constructor step, {ranks} ranks x 4 x 4096, {held} samples held"
        rows.append((case, f"{base * 1e6:.0f}", f"{hooked * 1e6:.0f}", f"{hooks * 1e6:.1f} ({hooks / base:.2%})"))
        summing = median_seconds(pool_looks(held, 200), args.repeats)
        rows.append(
            (f"constructor pool look that sums it (every 0.5 s), {held} held", "-", "-", f"{summing * 1e6:.1f}")
        )
    base = median_seconds(sink_hand_out(20_000, False), args.repeats)
    hooked = median_seconds(sink_hand_out(20_000, True), args.repeats)
    rows.append(
        (
            "sink, one micro-batch handed out",
            f"{base * 1e6:.2f}",
            f"{hooked * 1e6:.2f}",
            f"{(hooked - base) * 1e6:+.2f}",
        )
    )
    hooks = median_seconds(loader_hooks(20_000), args.repeats)
    rows.append(("loader, one unit's hooks (1 dead letter)", "-", f"{hooks * 1e6:.2f}", f"{hooks * 1e6:+.2f}"))
    print_table(
        ("per item", "without metrics (µs)", "with metrics (µs)", "metrics cost (µs)"),
        rows,
        title=f"Metrics hooks, median of {args.repeats} runs",
        markdown=args.markdown,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
