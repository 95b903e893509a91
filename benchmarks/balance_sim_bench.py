"""Balance simulator: naive per-rank loading, the in-order draw and composed steps on the same arrival stream.

    .venv/bin/python -m benchmarks.balance_sim_bench [--quick] [--steps N] [--seeds N] [--markdown]

A step is R = 8 data-parallel ranks of M micro-batches of C tokens (8k: 16 x 8192, 32k: 4 x 32768,
64k: 2 x 65536, 128k: 1 x 131072; 128k tokens per rank everywhere). A rank's time is the sum over its
samples of the H200 fit of one transformer block, t(L) = 8.78e-8 L^2 + 1.92e-3 L - 0.006 ms
(benchmarks/README.md); a step waits for its slowest rank. Every method gets the same arrival stream:

- **naive**: sample i goes to rank i mod R, which packs its samples first-fit in arrival order into its
  micro-batches; the first that does not fit waits (with all after it) for that rank's next step.
- **in-order**: ``draw_step`` (5% overdraw) then ``plan_step`` over all ranks, deferred samples first in the
  next draw, candidates in the pool's order: the constructor's step core (``StepCore``) makes the steps.
- **composed**: ``compose_step`` (look-ahead window) then ``plan_step``, by the same step core (from the
  composition's packing too, where it packed the holes: ``Draw.placement``, as the constructor does).

Reported per mix and context, each the median over seeds, over the steps after a warm-up (composition
keeps a backlog of up to a window's samples; measuring before it settles would flatter it): tokens/s
(tokens placed over the sum of step times) and its ratio to naive; **ceiling**, the most any method can
reach on the stream (every sample's cost spread evenly over the ranks: R x tokens / total cost); the
median over steps of max/mean rank time; fill (tokens placed over capacity); cost/tok, the cost per
token placed over the stream's (below 1, a method ran ahead on cheap samples while costly ones wait);
for composed, the longest wait of a sample from the step it entered its source's window to the step it
was placed; used/runs, the most offsets delivered above a source's low watermark (which the
constructor's state record lists) and the most runs of consecutive offsets they form; the time
``compose_step`` took per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks._table import add_markdown_flag, print_table
from pipeline.planning.mixing import Mixer, Schedule, step_budget
from pipeline.planning.mixing.compose import DEFAULT_DUE, DEFAULT_WINDOW, waiting_bound
from pipeline.planning.mixing.mixer import Composition
from pipeline.planning.scheduler import CostModel, plan_step
from pipeline.planning.shape import StepShape
from pipeline.planning.step.core import StepCore, StepWindow

RANKS = 8
ALPHA, BETA, CONSTANT = 8.78e-8, 1.92e-3, -0.006  # ms; the H200 block fit
COST_MODEL = CostModel(ALPHA, BETA)  # what the planner balances (the constant is not a cost)
SHAPES = {"8k": (16, 8192), "32k": (4, 32768), "64k": (2, 65536), "128k": (1, 131072)}


def step_ms(lengths: np.ndarray) -> np.ndarray:
    as_float = np.asarray(lengths, dtype=np.float64)
    return ALPHA * as_float * as_float + BETA * as_float + CONSTANT


Sampler = Callable[[np.random.Generator, int, int], np.ndarray]


def _lognormal(median: float, sigma: float) -> Sampler:
    return lambda rng, n, context: rng.lognormal(np.log(median), sigma, n)


def _uniform(low: float, high: float) -> Sampler:
    """Uniform between ``low`` and ``high`` times the context."""
    return lambda rng, n, context: rng.uniform(low * context, high * context, n)


def _pareto(scale: float, shape: float) -> Sampler:
    return lambda rng, n, context: scale * (1.0 + rng.pareto(shape, n))


@dataclass(frozen=True)
class Mix:
    """Samples arrive as components drawn by ``probability`` (by count); each component is a source,
    or all are one source when ``one_source``."""

    name: str
    components: tuple[tuple[str, float, Sampler], ...]
    one_source: bool = True

    def sources(self) -> list[str]:
        return ["stream"] if self.one_source else [name for name, _, _ in self.components]


WEB, CODE = _lognormal(500, 0.8), _lognormal(1500, 1.2)
ISSUE = (("web", 0.70, WEB), ("code", 0.25, CODE), ("long", 0.05, _uniform(0.25, 1.0)))
MIXES = (
    Mix("70/25/5", ISSUE),
    Mix("70/25/5, 3 sources", ISSUE, one_source=False),
    Mix("pareto 1.1", (("pareto", 1.0, _pareto(256, 1.1)),)),
    Mix("lognormal sigma 2", (("lognormal", 1.0, _lognormal(1000, 2.0)),)),
    Mix("bimodal 90/10", (("short", 0.9, _lognormal(600, 0.7)), ("long", 0.1, _uniform(0.2, 0.5)))),
    Mix("uniform to C", (("uniform", 1.0, _uniform(0.0, 1.0)),)),
)


@dataclass(frozen=True)
class Stream:
    lengths: np.ndarray  # (n,) in arrival order
    source: np.ndarray  # (n,) index into names
    names: list[str]
    weights: dict[str, float]  # each source's share of the stream's tokens


def make_stream(mix: Mix, context: int, tokens: int, rng: np.random.Generator) -> Stream:
    probabilities = np.array([p for _, p, _ in mix.components])
    chunks, kinds, total = [], [], 0
    while total < tokens:
        n = 65536
        kind = rng.choice(len(probabilities), n, p=probabilities / probabilities.sum())
        values = np.zeros(n)
        for k, (_, _, sample) in enumerate(mix.components):
            values[kind == k] = sample(rng, int((kind == k).sum()), context)
        lengths = np.clip(np.rint(values), 1, context).astype(np.int64)
        chunks.append(lengths)
        kinds.append(kind)
        total += int(lengths.sum())
    lengths, kind = np.concatenate(chunks), np.concatenate(kinds)
    source = np.zeros_like(kind) if mix.one_source else kind
    names = mix.sources()
    tokens_of = np.bincount(source, weights=lengths, minlength=len(names))
    return Stream(lengths, source, names, dict(zip(names, (tokens_of / tokens_of.sum()).tolist(), strict=True)))


@dataclass
class Result:
    tokens: int = 0
    ms: float = 0.0
    capacity: int = 0
    ratios: list[float] | None = None
    max_wait: int = 0
    draw_s: float = 0.0
    draw_times: list[float] = field(default_factory=list)  # seconds of each measured step's draw
    steps: int = 0
    work_ms: float = 0.0  # the placed samples' own time, summed over ranks
    used: int = 0  # most delivered offsets above a source's low watermark (the state record lists them)
    runs: int = 0  # most runs of consecutive offsets they form
    plans: list[list[list[list[int]]]] | None = None  # when kept: per step, rank and micro-batch, the lengths

    def add(self, placed: np.ndarray, rank: np.ndarray, capacity: int, micro: np.ndarray, micro_batches: int) -> None:
        if self.plans is not None:
            step: list[list[list[int]]] = [[[] for _ in range(micro_batches)] for _ in range(RANKS)]
            for length, r, m in zip(placed.tolist(), rank.tolist(), micro.tolist(), strict=True):
                step[r][m].append(length)
            self.plans.append(step)
        times = np.bincount(rank, weights=step_ms(placed), minlength=RANKS)
        self.work_ms += float(times.sum())
        self.tokens += int(placed.sum())
        self.ms += float(times.max())
        self.capacity += capacity
        self.ratios = [*(self.ratios or []), float(times.max() / times.mean())]
        self.steps += 1

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.ms * 1e3

    @property
    def median_ratio(self) -> float:
        return statistics.median(self.ratios or [1.0])

    @property
    def fill(self) -> float:
        return self.tokens / self.capacity

    def cost_per_token(self, stream: Stream) -> float:
        """Cost per token placed over the stream's: below 1, the method delivered cheaper samples than
        arrive (a backlog of costly ones grows, and tokens/s is flattered)."""
        return (self.work_ms / self.tokens) / (float(step_ms(stream.lengths).sum()) / float(stream.lengths.sum()))


def naive(
    stream: Stream, micro_batches: int, context: int, steps: int, warm_up: int, keep_plans: bool = False
) -> Result:
    result = Result(plans=[] if keep_plans else None)
    shards = [stream.lengths[r::RANKS].tolist() for r in range(RANKS)]
    heads = [0] * RANKS
    for step in range(warm_up + steps):
        placed, rank, micro = [], [], []
        for r in range(RANKS):
            held, shard, head = [0] * micro_batches, shards[r], heads[r]
            while head < len(shard):
                length = shard[head]
                slot = next((m for m in range(micro_batches) if held[m] + length <= context), None)
                if slot is None:
                    break
                held[slot] += length
                placed.append(length)
                rank.append(r)
                micro.append(slot)
                head += 1
            heads[r] = head
        if step >= warm_up:
            capacity = RANKS * micro_batches * context
            result.add(np.array(placed, dtype=np.int64), np.array(rank), capacity, np.array(micro), micro_batches)
    return result


def mixflow(
    stream: Stream,
    micro_batches: int,
    context: int,
    steps: int,
    warm_up: int,
    composed: bool,
    window: float = DEFAULT_WINDOW,
    due: float = DEFAULT_DUE,
    keep_plans: bool = False,
    use_start: bool = True,  # False: plan composed steps from scratch (for comparison)
) -> Result:
    """Steps made by the constructor's step core (``StepCore``: ``draw_step`` or ``compose_step``, then
    ``plan_step``) over a FIFO of sample ids per source, the deferred ids first in the next step."""
    result = Result(plans=[] if keep_plans else None)
    names = stream.names
    capacity = RANKS * micro_batches * context
    budget = step_budget(capacity)
    goal = min(budget, capacity) if composed else budget
    shape = StepShape(RANKS, micro_batches, context)
    composition = Composition(shape, COST_MODEL, window, due) if composed else None
    mixer = Mixer(Schedule(names, [0], [list(stream.weights.values())]), budget, composition=composition)
    core = StepCore(shape, COST_MODEL, from_placement=use_start)
    fifo = {s: np.flatnonzero(stream.source == k) for k, s in enumerate(names)}
    deferred = np.zeros(0, dtype=np.int64)
    state = mixer.initial_state()
    entered: dict[int, int] = {}
    delivered = np.zeros(len(stream.lengths), dtype=bool)
    for step in range(warm_up + steps):
        look = {s: _head(fifo[s], stream.lengths, (window + 2) * stream.weights[s] * budget) for s in names}
        available = {s: stream.lengths[fifo[s][:n]] for s, n in look.items()}
        window_of_step = StepWindow(available, stream.source[deferred], stream.lengths[deferred])
        if composed:
            for s in names:
                n = _head(fifo[s], stream.lengths, window * stream.weights[s] * goal)
                for i in fifo[s][:n].tolist():
                    entered.setdefault(i, step)
        began = time.perf_counter()  # the draw's own time, not the simulator's bookkeeping above
        draw = core.draw(mixer, state, window_of_step)
        if step >= warm_up:
            result.draw_times.append(time.perf_counter() - began)
            result.draw_s += result.draw_times[-1]
        planned = core.plan(draw, window_of_step).planned
        if planned is None:
            msg = f"step {step}: {draw.status} for {draw.waiting_for}; make the stream longer"
            raise RuntimeError(msg)
        candidates = planned.candidates_of(deferred, fifo)
        for s in names:
            fifo[s] = np.delete(fifo[s], planned.taken[s])
        placed = planned.plan.placed_mask
        if step >= warm_up:
            placed_lengths = stream.lengths[candidates[placed]]
            result.add(placed_lengths, planned.plan.rank[placed], capacity, planned.plan.micro[placed], micro_batches)
        if composed:
            result.max_wait = max(
                [result.max_wait, *(step - entered.get(i, step) for i in candidates[placed].tolist())]
            )
        deferred = candidates[~placed]
        state = planned.next_state
        delivered[candidates[placed]] = True
        if step >= warm_up:
            for k in range(len(names)):
                done = delivered[stream.source == k]
                above = done[int(np.argmin(done)) :] if not done.all() else done[:0]  # from the low watermark
                result.used = max(result.used, int(above.sum()))
                result.runs = max(result.runs, int(np.count_nonzero(np.diff(above.astype(np.int8)) == 1)))
    return result


def _head(ids: np.ndarray, lengths: np.ndarray, tokens: float) -> int:
    """How many of ``ids`` it takes to hold ``tokens`` (all of them if they hold fewer)."""
    total = np.cumsum(lengths[ids])
    return min(int(np.searchsorted(total, tokens, side="left")) + 1, len(ids))


def run(
    mix: Mix, context_name: str, seeds: int, steps: int, warm_up: int, window: float, due: float
) -> dict[str, object]:
    micro_batches, context = SHAPES[context_name]
    per_seed = []
    for seed in range(seeds):
        tokens = int(((steps + warm_up) * 1.3 + 3 * (window + 3)) * RANKS * micro_batches * context)
        stream = make_stream(mix, context, tokens, np.random.default_rng([seed, context]))
        ceiling = RANKS * float(stream.lengths.sum()) / float(step_ms(stream.lengths).sum()) * 1e3
        per_seed.append(
            (
                naive(stream, micro_batches, context, steps, warm_up),
                mixflow(stream, micro_batches, context, steps, warm_up, composed=False),
                mixflow(stream, micro_batches, context, steps, warm_up, composed=True, window=window, due=due),
                ceiling,
                stream,
            )
        )

    def median(value: Callable[[tuple], float]) -> float:
        return statistics.median(value(row) for row in per_seed)

    base = median(lambda r: r[0].tokens_per_s)
    row: dict[str, object] = {"mix": mix.name, "context": context_name, "MxC": f"{micro_batches}x{context}"}
    for k, name in enumerate(("naive", "in-order", "composed")):
        rate = median(lambda r, k=k: r[k].tokens_per_s)
        row[f"{name} Mtok/s"] = f"{rate / 1e6:.2f}" + ("" if k == 0 else f" ({rate / base:.2f}x)")
    row["ceiling"] = f"{median(lambda r: r[3]) / 1e6:.2f} ({median(lambda r: r[3]) / base:.2f}x)"
    for k, name in enumerate(("naive", "in-order", "composed")):
        row[f"max/mean {name}"] = f"{median(lambda r, k=k: r[k].median_ratio):.3f}"
    for k, name in enumerate(("naive", "in-order", "composed")):
        row[f"fill {name}"] = f"{median(lambda r, k=k: r[k].fill):.3f}"
    for k, name in enumerate(("in-order", "composed"), start=1):
        row[f"cost/tok {name}"] = f"{median(lambda r, k=k: r[k].cost_per_token(r[4])):.3f}"
    row["max wait"] = str(max(r[2].max_wait for r in per_seed))
    for k, name in enumerate(("in-order", "composed"), start=1):
        row[f"used/runs {name}"] = f"{max(r[k].used for r in per_seed)}/{max(r[k].runs for r in per_seed)}"
    row["compose ms"] = f"{median(lambda r: r[2].draw_s / r[2].steps * 1e3):.0f}"
    return row


def export_plans(
    path: Path, mix: Mix, contexts: list[str], steps: int, warm_up: int, window: float, due: float
) -> None:
    """The micro-batches of ``steps`` steps after the warm-up, per method and context (seed 0), as JSON for
    ``benchmarks/gpu_bench.py --plans`` to time real blocks over."""
    out: dict[str, object] = {
        "mix": mix.name,
        "ranks": RANKS,
        "fit_ms": {"alpha": ALPHA, "beta": BETA, "constant": CONSTANT},
        "warm_up": warm_up,
        "contexts": {},
    }
    for context_name in contexts:
        micro_batches, context = SHAPES[context_name]
        tokens = int(((steps + warm_up) * 1.3 + 3 * (window + 3)) * RANKS * micro_batches * context)
        stream = make_stream(mix, context, tokens, np.random.default_rng([0, context]))
        results = {
            "naive": naive(stream, micro_batches, context, steps, warm_up, keep_plans=True),
            "in-order": mixflow(stream, micro_batches, context, steps, warm_up, composed=False, keep_plans=True),
            "composed": mixflow(
                stream, micro_batches, context, steps, warm_up, composed=True, window=window, due=due, keep_plans=True
            ),
        }
        out["contexts"][context_name] = {  # type: ignore[index]
            "micro_batches": micro_batches,
            "capacity": context,
            "methods": {
                name: {"plans": r.plans, "simulated_tokens_per_s": r.tokens_per_s} for name, r in results.items()
            },
        }
        work = sum(r.work_ms for r in results.values())
        print(f"{context_name}: {steps} steps, {work / 1e3:.0f} s of simulated block time over all methods and ranks")
    path.write_text(json.dumps(out))
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: two contexts, one mix and seed, few steps")
    parser.add_argument("--steps", type=int, default=100, help="steps measured, after the warm-up")
    parser.add_argument("--warm-up", type=int, default=24, help="steps run before measuring")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW, help="steps looked ahead")
    parser.add_argument("--due", type=float, default=DEFAULT_DUE, help="share of a step taken from FIFO heads")
    parser.add_argument("--mixes", default="", help="comma-separated mix names (default: all)")
    parser.add_argument("--export-plans", type=Path, help="write the micro-batches for gpu_bench.py --plans, and stop")
    parser.add_argument("--contexts", default=",".join(SHAPES), help="contexts for --export-plans")
    add_markdown_flag(parser)
    args = parser.parse_args()
    if args.export_plans:
        mix = next(m for m in MIXES if m.name == (args.mixes or MIXES[0].name))
        contexts = args.contexts.split(",")
        export_plans(args.export_plans, mix, contexts, args.steps, args.warm_up, args.window, args.due)
        return
    mixes, contexts, steps, seeds, warm_up = MIXES, list(SHAPES), args.steps, args.seeds, args.warm_up
    if args.mixes:
        mixes = tuple(m for m in MIXES if m.name in args.mixes.split(","))
    if args.quick:
        mixes, contexts, steps, seeds, warm_up = MIXES[:1], ["8k", "64k"], 8, 1, 4
    plan_step(np.arange(1, 100, dtype=np.int64), 4, 2, 1000)  # compile (or load) the kernels first
    rows = [run(mix, context, seeds, steps, warm_up, args.window, args.due) for mix in mixes for context in contexts]
    print_table(list(rows[0]), [list(row.values()) for row in rows], markdown=args.markdown)
    bound = waiting_bound(args.window, args.due)
    print(
        f"R = {RANKS}; {steps} steps after {warm_up} of warm-up, median of {seeds} seed(s);"
        f" window {args.window:g} steps, due {args.due:g} of a step (waiting bound {bound} steps)."
    )
    print_targets([row for row in rows if row["mix"] == MIXES[0].name])


def print_targets(rows: list[dict[str, object]]) -> None:
    """The targets on the 70/25/5 stream, met or not."""

    def ratio(cell: object) -> float:
        return float(str(cell).split("(")[1].rstrip("x)"))

    lines = []
    for row in rows:
        context = row["context"]
        balance, fill = float(str(row["max/mean composed"])), float(str(row["fill composed"]))
        lines.append((balance <= 1.03, f"{context}: median max/mean <= 1.03: {balance:.3f}"))
        lines.append((fill >= (0.9 if context == "128k" else 0.95), f"{context}: fill: {fill:.3f}"))
        if context in ("64k", "128k"):
            speedup, ceiling = ratio(row["composed Mtok/s"]), ratio(row["ceiling"])
            lines.append((speedup >= 1.6, f"{context}: >= 1.6x naive: {speedup:.2f}x (ceiling {ceiling:.2f}x)"))
    for met, text in lines:
        print(f"target {'met' if met else 'NOT met'}: {text}")


if __name__ == "__main__":
    main()
