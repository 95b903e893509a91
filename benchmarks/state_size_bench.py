"""The constructor's state record at scale: its bytes per step with composition at 256 to 10,240 ranks.

    PYTHONPATH=. .venv/bin/python benchmarks/state_size_bench.py [--ranks 256,1024,10240] [--steps N]
        [--micro-batches 2] [--capacity 8192] [--markdown]

The constructor's own pure step loop, without Kafka: each source's ``SamplePool`` FIFO is read ahead as
``SourceTopicFeed.hold`` does (the composition window plus two steps of its share, plus a step), the
default composition (``Mixer`` with window 8, due share 1/8) draws, the constructor's step core
(``StepCore``) plans (its batches are not built), ``SamplePool.settle`` takes back the deferred samples, and the step's
``ConstructorState`` is encoded as ``DataConstructor._write`` does. The stream is the 70/25/5 mix of
``balance_sim_bench.py`` as three sources (web lognormal ~500, code lognormal ~1.5k, long uniform 25-100%
of the context), shares 0.70/0.25/0.05 of the tokens, seed 0.

Reported per rank count: samples per step; the state record's bytes at the last step, the median and
the most over the steps after ``--warm-up``, and the most with every used-offset list in list form (no
``used_bitmap``); and what the largest holds: used offsets above the low watermarks
(and the runs they form), deferred references, and each part's bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass

import numpy as np

from pipeline.planning.mixing import Mixer, Schedule
from pipeline.planning.mixing.compose import DEFAULT_DUE, DEFAULT_WINDOW
from pipeline.planning.mixing.mixer import Composition, step_budget
from pipeline.planning.shape import StepShape
from pipeline.planning.step import used_bitmap
from pipeline.planning.step.core import StepCore
from pipeline.planning.step.pool import SamplePool
from pipeline.planning.step.state import ConstructorState, SourcePosition
from pipeline.spec import OnExhausted
from pipeline.spec.cost import CostModel
from topics.formats.sample import Sample

COST_MODEL = CostModel(8.78e-8, 1.92e-3)  # the H200 block fit of balance_sim_bench.py
SHARES = {"web": 0.70, "code": 0.25, "long": 0.05}
TOKENS = np.zeros(1 << 20, dtype=np.int32)  # every sample's tokens are a view of this: no copies


def sampler(source: str, capacity: int, rng: np.random.Generator, n: int) -> np.ndarray:
    if source == "web":
        values = rng.lognormal(np.log(500), 0.8, n)
    elif source == "code":
        values = rng.lognormal(np.log(1500), 1.2, n)
    else:
        values = rng.uniform(0.25 * capacity, capacity, n)
    return np.clip(np.rint(values), 1, capacity).astype(np.int64)


class Stream:
    """Each source's samples in offset order, made as they are read."""

    def __init__(self, capacity: int, seed: int) -> None:
        self.capacity = capacity
        self.rng = {s: np.random.default_rng([seed, k]) for k, s in enumerate(SHARES)}
        self.next = dict.fromkeys(SHARES, 0)

    def feed(self, pool: SamplePool, source: str, tokens: float) -> None:
        """Read ``source`` until its FIFO holds at least ``tokens``."""
        fifo = pool.fifos[source]
        while fifo.tokens < tokens:
            for length in sampler(source, self.capacity, self.rng[source], 4096).tolist():
                offset = self.next[source]
                self.next[source] += 1
                pool.add(source, offset, Sample(f"{source}/{offset}", source, TOKENS[:length]))


@dataclass
class Measure:
    ranks: int
    samples_per_step: float
    last_bytes: int
    median_bytes: float
    max_bytes: int
    max_list_bytes: int  # the most with every source's used offsets as a list (the form before the bitmap)
    used: int
    runs: int
    deferred: int
    sources_bytes: int
    deferred_bytes: int
    seconds_per_step: float


def list_form_bytes(state: ConstructorState) -> int:
    """The record's bytes with every source's used offsets as a list, however long."""
    limit, used_bitmap.BITMAP_ABOVE_BYTES = used_bitmap.BITMAP_ABOVE_BYTES, 1 << 62
    try:
        return len(state.to_bytes())
    finally:
        used_bitmap.BITMAP_ABOVE_BYTES = limit


def runs_of(offsets: tuple[int, ...]) -> int:
    return int(np.count_nonzero(np.diff(np.asarray(offsets, dtype=np.int64)) != 1)) + 1 if offsets else 0


def measure(ranks: int, micro_batches: int, capacity: int, steps: int, warm_up: int, seed: int) -> Measure:
    sources = list(SHARES)
    shape = StepShape(ranks, micro_batches, capacity)
    composition = Composition(shape, COST_MODEL, DEFAULT_WINDOW, DEFAULT_DUE)
    schedule = Schedule(sources, [0], [[SHARES[s] for s in sources]])
    budget = step_budget(shape.tokens_per_step)
    mixer = Mixer(schedule, budget, OnExhausted.RENORMALIZE, composition=composition)
    state = ConstructorState.initial(mixer.initial_state())
    pool = SamplePool(state)
    stream = Stream(capacity, seed)
    mixer_state = state.mixer
    core = StepCore(shape, COST_MODEL)
    sizes, list_sizes, samples, largest, seconds = [], [], [], None, []
    for step in range(steps):
        began = time.perf_counter()
        for s in sources:  # SourceTopicFeed.hold(window + 2, weights): that many steps of its share, plus one
            stream.feed(pool, s, budget * ((DEFAULT_WINDOW + 2) * SHARES[s] + 1))
        outcome = core.next_step(mixer, mixer_state, pool.window())
        if outcome.planned is None:
            msg = f"step {step}: {outcome.status}"
            raise RuntimeError(msg)
        planned = outcome.planned
        candidates = pool.take(planned.taken, planned.order)
        placed = planned.plan.placed_mask.tolist()
        delivered = [c for c, p in zip(candidates, placed, strict=True) if p]
        pool.settle(delivered, [c for c, p in zip(candidates, placed, strict=True) if not p])
        mixer_state = planned.next_state
        written = ConstructorState(mixer_state, pool.positions(), pool.deferred_refs())
        size = len(written.to_bytes())
        seconds.append(time.perf_counter() - began)
        listed = list_form_bytes(written)
        if step >= warm_up:
            sizes.append(size)
            list_sizes.append(listed)
            samples.append(len(delivered))
            if largest is None or size >= len(largest.to_bytes()):
                largest = written
        print(f"{ranks} ranks, step {step}: {len(delivered)} samples, state {size:,} bytes ({listed:,} as lists)")
        print(
            f"  {_positions_summary(written.positions)}; {len(written.deferred)} deferred, {seconds[-1]:.1f} s",
            flush=True,
        )
    assert largest is not None
    body = json.loads(largest.to_bytes())
    used = sum(len(p.used) for p in largest.positions.values())
    runs = sum(runs_of(p.used) for p in largest.positions.values())
    return Measure(
        ranks,
        statistics.mean(samples),
        sizes[-1],
        statistics.median(sizes),
        max(sizes),
        max(list_sizes),
        used,
        runs,
        len(largest.deferred),
        len(json.dumps(body["sources"], separators=(",", ":"))),
        len(json.dumps(body["deferred"], separators=(",", ":"))),
        statistics.median(seconds[warm_up:]),
    )


def _positions_summary(positions: dict[str, SourcePosition]) -> str:
    return ", ".join(f"{s}: low {p.low}, {len(p.used)} used" for s, p in positions.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="256,1024,10240")
    parser.add_argument("--steps", type=int, default=90, help="steps per rank count (a sample waits up to 63)")
    parser.add_argument("--warm-up", type=int, default=20)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = [
        measure(int(r), args.micro_batches, args.capacity, args.steps, args.warm_up, args.seed)
        for r in args.ranks.split(",")
    ]
    header = [
        "ranks",
        "samples/step",
        "state bytes: last",
        "median",
        "max",
        "max as lists",
        "at the max: used offsets",
        "their runs",
        "deferred refs",
        "sources bytes",
        "deferred bytes",
        "s/step",
    ]
    table = [
        [
            f"{m.ranks:,}",
            f"{m.samples_per_step:,.0f}",
            f"{m.last_bytes:,}",
            f"{m.median_bytes:,.0f}",
            f"{m.max_bytes:,}",
            f"{m.max_list_bytes:,}",
            f"{m.used:,}",
            f"{m.runs:,}",
            f"{m.deferred:,}",
            f"{m.sources_bytes:,}",
            f"{m.deferred_bytes:,}",
            f"{m.seconds_per_step:.2f}",
        ]
        for m in rows
    ]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in table:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
        for row in [header, *table]:
            print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    shape = f"{args.micro_batches} x {args.capacity}"
    print(f"{shape} tokens a rank; {args.steps} steps, the first {args.warm_up} left out; seed {args.seed}")


if __name__ == "__main__":
    main()
