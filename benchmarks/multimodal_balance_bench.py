"""Balance of multimodal steps: naive per-rank loading against the step core, LLM and vision encoder apart.

    .venv/bin/python -m benchmarks.multimodal_balance_bench [--quick] [--steps N] [--seeds N] [--markdown]
        [--ranks R] [--stream mixed|vlm] [--methods naive,in-order,composed,...]

A stream of text, images and short clips, as a Qwen2-VL loader makes them: an image of H x W pixels (each
side 256..1280, drawn apart) is smart-resized (sides multiples of 28, at most 1,003,520 pixels, patch 14,
merge 2) to a grid of h x w patches and h * w / 4 placeholder tokens; a clip of 4..16 frames (256..640 px
sides) to t x h x w patches (t = frames / 2). A sample's tokens are its text and, per item, its placeholders
and two vision marker tokens. A step is R = 8 ranks (``--ranks``) of M micro-batches of C tokens and at most P
patches each (both capacities bind: see the fills). ``--stream vlm`` is a VLM team's stream instead: 55%
captioned images of 0.8-0.9 megapixels (short captions), 15% interleaved documents of 2-5 such images, 10% clips
of 2-8 frames pairs (360-720 x 480-1280 px), 20% text.

Costs are the FLOP models of both halves (forward FLOPs; the backward pass scales both alike): the LLM a
3584-hidden, 28-layer causal transformer (``CostModel.from_transformer(3584, 28)``: 24 h^2 n per token,
2 h n per pair of tokens), the encoder a 1280-hidden, 32-layer ViT attending within each image or clip
(``VisionCostModel.from_vit(1280, 32)``). A rank's LLM cost is the sum over its samples, its encoder cost the
sum over their items; each is compared with its mean over the ranks.

- **naive**: sample i goes to rank i mod R, which packs its samples first-fit in arrival order into its
  micro-batches while both tokens and patches fit; the first that does not fit waits (with all after it)
  for that rank's next step.
- **in-order**: ``draw_step`` (5% overdraw) then ``plan_step`` with costs = LLM + encoder and both
  capacities, by the constructor's step core (``StepCore``), deferred samples first in the next draw.
- **composed**: ``compose_step`` (look-ahead window; it chooses by length, then the scheduler balances the
  true costs), by the same step core.
- **... total only**: the same, balanced on the total cost alone (``StepCore(even_encoder=False)``: the
  scheduler is not given the encoder's part to even out).

Reported per method, the median over seeds of: the median over steps of max/mean rank cost of the LLM
part, of the encoder part and of the total (the targets: <= 1.05 for the LLM and the encoder parts); the
fill of tokens and of patches (placed over capacity); the samples waiting (deferred) after a step, mean;
the time the step core took to draw and plan a step, mean.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from benchmarks._table import add_markdown_flag, print_table
from pipeline.planning.mixing import Mixer, Schedule, step_budget
from pipeline.planning.mixing.compose import DEFAULT_DUE, DEFAULT_WINDOW
from pipeline.planning.mixing.mixer import Composition
from pipeline.planning.scheduler import CostModel, plan_step
from pipeline.planning.shape import StepShape
from pipeline.planning.step.core import StepCore, StepWindow
from pipeline.spec.cost import VisionCostModel

RANKS = 8
LLM = CostModel.from_transformer(3584, 28)
VISION = VisionCostModel.from_vit(1280, 32)
PATCH, MERGE, MAX_PIXELS, MIN_PIXELS = 14, 2, 1003520, 56 * 56
# Micro-batches M of C tokens and P patches: 128k or 32k tokens a rank.
SHAPES = {"16 x 8k": (16, 8192, 16384), "4 x 8k": (4, 8192, 16384), "1 x 32k": (1, 32768, 65536)}
VLM_SHAPE = {"4 x 8k / 32k patches": (4, 8192, 32768)}  # a VLM job's step: an image of 0.85 MP is 4,300 patches
"""Not in the default run; ``--contexts "4 x 8k / 32k patches"``."""


def smart_resize(height: int, width: int, factor: int = PATCH * MERGE) -> tuple[int, int]:
    """Qwen2-VL's resize: each side a multiple of ``factor``, the aspect kept, the pixels within bounds."""
    h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h * w > MAX_PIXELS:
        beta = math.sqrt(height * width / MAX_PIXELS)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


@dataclass(frozen=True)
class Stream:
    """Samples in arrival order: tokens, patches, encoder cost, and the patches of every item by sample."""

    lengths: np.ndarray
    patches: np.ndarray
    encoder: np.ndarray
    kinds: np.ndarray  # 0 text, 1 images, 2 clip


@dataclass
class _Samples:
    """A stream being made, sample by sample."""

    lengths: list[int] = field(default_factory=list)
    patches: list[int] = field(default_factory=list)
    items: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)

    def add(self, text: int, items: list[int], kind: int) -> None:
        """A sample of ``text`` tokens and the items of ``items`` patches (its kind 0 where it has none)."""
        self.lengths.append(text + _placeholders(items))
        self.patches.append(sum(items))
        self.items += items
        self.counts.append(len(items))
        self.kinds.append(kind if items else 0)

    def stream(self) -> Stream:
        encoder = VISION.sample_costs(np.array(self.items, np.int64), np.array(self.counts))
        return Stream(np.array(self.lengths), np.array(self.patches), encoder, np.array(self.kinds))


def _placeholders(patches: list[int]) -> int:
    return sum(p // MERGE**2 + 2 for p in patches)


def _item_patches(rng: np.random.Generator, clip: bool) -> int:
    sides = rng.integers(256, 641 if clip else 1281, 2)
    h, w = smart_resize(int(sides[0]), int(sides[1]))
    t = int(rng.integers(2, 9)) if clip else 1
    return t * (h // PATCH) * (w // PATCH)


def make_stream(rng: np.random.Generator, count: int, capacity: int, patch_capacity: int) -> Stream:
    """``count`` samples: 60% text (lognormal, median 700 tokens), 30% with 1 to 4 images, 10% a clip."""
    made = _Samples()
    for kind in rng.choice(3, count, p=[0.6, 0.3, 0.1]).tolist():
        text = int(np.clip(rng.lognormal(math.log(700 if kind == 0 else 120), 1.0), 1, capacity))
        n_items = 0 if kind == 0 else (1 if kind == 2 or rng.random() < 0.8 else int(rng.integers(2, 5)))
        mine: list[int] = []
        for _ in range(n_items):
            item = _item_patches(rng, kind == 2)
            if text + _placeholders([*mine, item]) <= capacity and sum(mine) + item <= patch_capacity:
                mine.append(item)
        made.add(text, mine, kind)
    return made.stream()


def _vlm_item(rng: np.random.Generator, clip: bool) -> int:
    if clip:
        h, w = smart_resize(int(rng.integers(360, 721)), int(rng.integers(480, 1281)))
        return int(rng.integers(2, 9)) * (h // PATCH) * (w // PATCH)
    pixels, aspect = rng.uniform(0.8e6, 0.9e6), rng.uniform(0.6, 1.7)
    h, w = smart_resize(int(math.sqrt(pixels / aspect)), int(math.sqrt(pixels * aspect)))
    return (h // PATCH) * (w // PATCH)


def make_vlm_stream(rng: np.random.Generator, count: int, capacity: int, patch_capacity: int) -> Stream:
    """``count`` samples of a VLM team's stream (``--stream vlm``)."""
    made = _Samples()
    for kind in rng.choice(4, count, p=[0.55, 0.15, 0.1, 0.2]).tolist():  # caption, interleaved, clip, text
        if kind == 3:
            made.add(int(np.clip(rng.lognormal(math.log(700), 1.0), 1, capacity)), [], 0)
            continue
        text = int(np.clip(rng.lognormal(math.log(40 if kind == 0 else 400), 0.6), 1, capacity))
        mine: list[int] = []
        for _ in range(int(rng.integers(2, 6)) if kind == 1 else 1):
            item = _vlm_item(rng, kind == 2)
            if text + _placeholders([*mine, item]) <= capacity and sum(mine) + item <= patch_capacity:
                mine.append(item)
        made.add(text, mine, 2 if kind == 2 else 1)
    return made.stream()


STREAMS = {"mixed": make_stream, "vlm": make_vlm_stream}


@dataclass
class Result:
    ranks: int = RANKS
    ratios: dict[str, list[float]] = field(default_factory=lambda: {"llm": [], "encoder": [], "total": []})
    tokens: int = 0
    patches: int = 0
    steps: int = 0
    waiting: int = 0
    seconds: float = 0.0  # the step core's, over the steps measured

    def add(self, stream: Stream, ids: np.ndarray, rank: np.ndarray) -> None:
        llm = np.bincount(rank, weights=LLM.costs(stream.lengths[ids]), minlength=self.ranks)
        encoder = np.bincount(rank, weights=stream.encoder[ids], minlength=self.ranks)
        for name, costs in (("llm", llm), ("encoder", encoder), ("total", llm + encoder)):
            self.ratios[name].append(float(costs.max() / costs.mean()) if costs.mean() > 0 else 1.0)
        self.tokens += int(stream.lengths[ids].sum())
        self.patches += int(stream.patches[ids].sum())
        self.steps += 1

    def median(self, name: str) -> float:
        return statistics.median(self.ratios[name])


def naive(stream: Stream, shape: tuple[int, int, int], steps: int, warm_up: int, ranks: int = RANKS) -> Result:
    micro_batches, capacity, patch_capacity = shape
    result = Result(ranks)
    shards = [np.arange(r, len(stream.lengths), ranks) for r in range(ranks)]
    heads = [0] * ranks
    for step in range(warm_up + steps):
        ids, owners = [], []
        for r in range(ranks):
            tokens, patches, shard = [0] * micro_batches, [0] * micro_batches, shards[r]
            while heads[r] < len(shard):
                i = int(shard[heads[r]])
                length, patch = int(stream.lengths[i]), int(stream.patches[i])
                fits = (m for m in range(micro_batches) if tokens[m] + length <= capacity)
                slot = next((m for m in fits if patches[m] + patch <= patch_capacity), None)
                if slot is None:
                    break
                tokens[slot] += length
                patches[slot] += patch
                ids.append(i)
                owners.append(r)
                heads[r] += 1
        if step >= warm_up:
            result.add(stream, np.array(ids, np.int64), np.array(owners, np.int64))
    return result


def mixflow(
    stream: Stream,
    shape: tuple[int, int, int],
    steps: int,
    warm_up: int,
    composed: bool,
    even_encoder: bool = True,
    ranks: int = RANKS,
) -> Result:
    """Steps by the constructor's step core over a FIFO of sample ids, the deferred ids first next time."""
    step_shape = StepShape(ranks, *shape)
    result = Result(ranks)
    budget = step_budget(step_shape.tokens_per_step)
    composition = Composition(step_shape, LLM, DEFAULT_WINDOW, DEFAULT_DUE) if composed else None
    mixer = Mixer(Schedule(["stream"], [0], [[1.0]]), budget, composition=composition)
    core = StepCore(step_shape, LLM, vision=VISION, even_encoder=even_encoder)
    fifo = {"stream": np.arange(len(stream.lengths))}
    deferred = np.zeros(0, np.int64)
    state = mixer.initial_state()
    for step in range(warm_up + steps):
        total = np.cumsum(stream.lengths[fifo["stream"]])
        head = fifo["stream"][: int(np.searchsorted(total, (DEFAULT_WINDOW + 2) * budget)) + 1]
        window = StepWindow(
            {"stream": stream.lengths[head]},
            np.zeros(len(deferred), np.int64),
            stream.lengths[deferred],
            {"stream": stream.patches[head]},
            {"stream": stream.encoder[head]},
            stream.patches[deferred],
            stream.encoder[deferred],
        )
        began = time.perf_counter()
        planned = core.next_step(mixer, state, window).planned
        if step >= warm_up:
            result.seconds += time.perf_counter() - began
        if planned is None:
            msg = f"step {step}: the stream ran out; make it longer"
            raise RuntimeError(msg)
        candidates = planned.candidates_of(deferred, fifo)
        fifo["stream"] = np.delete(fifo["stream"], planned.taken["stream"])
        placed = planned.plan.placed_mask
        if step >= warm_up:
            result.add(stream, candidates[placed], planned.plan.rank[placed].astype(np.int64))
            result.waiting += int((~placed).sum())
        deferred = candidates[~placed]
        state = planned.next_state
    return result


def run(
    context: str, seeds: int, steps: int, warm_up: int, ranks: int = RANKS, stream_kind: str = "mixed",
    methods: tuple[str, ...] | None = None,
) -> list[dict[str, object]]:  # fmt: skip
    shape = {**SHAPES, **VLM_SHAPE}[context]
    micro_batches, capacity, patch_capacity = shape
    every: dict[str, Callable[[Stream], Result]] = {
        "naive": lambda stream: naive(stream, shape, steps, warm_up, ranks),
        "in-order, total only": lambda stream: mixflow(stream, shape, steps, warm_up, False, False, ranks),
        "in-order": lambda stream: mixflow(stream, shape, steps, warm_up, False, True, ranks),
        "composed, total only": lambda stream: mixflow(stream, shape, steps, warm_up, True, False, ranks),
        "composed": lambda stream: mixflow(stream, shape, steps, warm_up, True, True, ranks),
    }
    chosen = {name: method for name, method in every.items() if methods is None or name in methods}
    per_method: dict[str, list[tuple[Result, Stream]]] = {name: [] for name in chosen}
    for seed in range(seeds):
        count = int((steps + warm_up + DEFAULT_WINDOW + 4) * ranks * micro_batches * capacity / 700 * 1.3)
        stream = STREAMS[stream_kind](np.random.default_rng([seed, capacity]), count, capacity, patch_capacity)
        for name, method in chosen.items():
            per_method[name].append((method(stream), stream))
    rows = []
    slots = ranks * micro_batches
    for method, results in per_method.items():

        def median(value: Callable[[Result], float], results: list[tuple[Result, Stream]] = results) -> float:
            return statistics.median(value(r) for r, _ in results)

        rows.append(
            {
                "context": context,
                "M x C tokens, P patches": f"{micro_batches} x {capacity}, {patch_capacity}",
                "method": method,
                "max/mean LLM": f"{median(lambda r: r.median('llm')):.3f}",
                "max/mean encoder": f"{median(lambda r: r.median('encoder')):.3f}",
                "max/mean total": f"{median(lambda r: r.median('total')):.3f}",
                "fill tokens": f"{median(lambda r: r.tokens / (r.steps * slots * capacity)):.3f}",
                "fill patches": f"{median(lambda r: r.patches / (r.steps * slots * patch_capacity)):.3f}",
                "waiting": f"{median(lambda r: r.waiting / r.steps):.0f}",
                "plan ms": "" if method == "naive" else f"{median(lambda r: r.seconds / r.steps * 1e3):.0f}",
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: one context and seed, few steps")
    parser.add_argument("--steps", type=int, default=60, help="steps measured, after the warm-up")
    parser.add_argument("--warm-up", type=int, default=12, help="steps run before measuring")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--contexts", default=",".join(SHAPES))
    parser.add_argument("--ranks", type=int, default=RANKS)
    parser.add_argument("--stream", choices=sorted(STREAMS), default="mixed")
    parser.add_argument("--methods", default=None, help="comma-separated methods (default: all)")
    add_markdown_flag(parser)
    args = parser.parse_args()
    contexts, steps, seeds, warm_up = args.contexts.split(","), args.steps, args.seeds, args.warm_up
    if args.quick:
        contexts, steps, seeds, warm_up = ["4 x 8k"], 8, 1, 4
    plan_step(np.arange(1, 100, dtype=np.int64), 4, 2, 1000)  # compile (or load) the kernels first
    methods = tuple(args.methods.split(",")) if args.methods else None
    rows = [row for c in contexts for row in run(c, seeds, steps, warm_up, args.ranks, args.stream, methods)]
    print_table(list(rows[0]), [list(row.values()) for row in rows], markdown=args.markdown)
    print(
        f"R = {args.ranks}, stream {args.stream}; {steps} steps after {warm_up} of warm-up, median of {seeds} seed(s)."
    )
    for row in rows:
        if row["method"] in ("in-order", "composed"):
            for part in ("LLM", "encoder"):
                value = float(str(row[f"max/mean {part}"]))
                met = "met" if value <= 1.05 else "NOT met"
                print(f"target {met}: {row['context']} {row['method']}: median max/mean {part} <= 1.05: {value:.3f}")


if __name__ == "__main__":
    main()
