"""GPU check of the vision cost model and of planning multimodal steps by it: one short GPU lease.

(a) **Vision calibration**, what ``mixflow calibrate --vision`` measures (``pipeline.tools.calibrate``): the
    vision encoder's block at Qwen2-VL's ViT shape (hidden 1280, 16 heads, MLP 5120; bf16, varlen attention
    full within each image) timed forward+backward over micro-batches of 16384 patches made of images of
    n = 64..16384 patches and fitted to ``alpha*n^2 + beta*n + gamma`` per image; then the two blocks of the
    VLM of (b), its LLM's and its encoder's, printed as the spec's ``cost:`` section with ``vision:``: the
    cost model (b) plans with.
(b) **VLM steps.** A vision-language model in bf16, randomly initialised (about 150M parameters: a ViT of 8
    blocks of width 512 over 14 px patches, a 2x2 merger, an LLM of 10 blocks of width 768 and a 32k
    vocabulary; the blocks are ``pipeline.tools.calibrate.block.Block``, packed over ``cu_seqlens``). One
    arrival stream of samples (text; an image and its caption; interleaved documents of 2-5 images; a video
    clip) fills steps of 8 ranks x 4 micro-batches x 8192 tokens, at most 16384 patches a micro-batch, three
    ways:

    - ``naive``: sample i goes to rank i mod 8, which packs its samples first-fit in arrival order into its
      micro-batches under both budgets; the first that does not fit waits, with all after it, for that
      rank's next step;
    - ``mixflow``: the in-order draw (the samples deferred by the step before first, then arrivals up to 5%
      over the step's tokens) planned by ``plan_step`` with each sample's LLM cost plus its encoder cost
      from (a), and the patch budget (the constructor's step core with ``composition: null``);
    - ``mixflow-llm-cost``: the same with the LLM's cost alone (and the patch budget).

    Each rank's micro-batches run one after another on the one GPU (forward+backward each, then an AdamW
    step); a step waits for its slowest rank. Reported per method, over the same steps: the median of max/mean
    rank time, tokens/s, samples/s, images/s and patches/s, each throughput's ratio to naive, and the cost
    model's predicted max/mean for the same micro-batches.

    python3 -m benchmarks.gpu_vlm_check --out $OUT    # a GPU: a few minutes
    python -m benchmarks.gpu_vlm_check --smoke        # a CPU: tiny sizes, seconds

The GPU image has torch, numpy, numba and lazy-loader but not pydantic: the scheduler and the cost models load
there without the spec package's models (``_without_spec_models``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
import types
from dataclasses import asdict, dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TEXT, CAPTION, INTERLEAVED, VIDEO = range(4)
KIND_NAMES = ("text", "caption", "interleaved", "video")
KIND_SHARES = (0.40, 0.30, 0.15, 0.15)  # by count
METHODS = ("naive", "mixflow", "mixflow-llm-cost")
QWEN2_VL_VIT = (1280, 16, 5120, 32)  # hidden, heads, MLP, layers


@dataclass(frozen=True)
class Sizes:
    ranks: int = 8
    micro_batches: int = 4
    tokens: int = 8192  # a micro-batch's token budget
    patches: int = 16384  # and its patch budget
    vocab: int = 32000
    hidden: int = 768
    heads: int = 12
    layers: int = 10
    vision_hidden: int = 512
    vision_heads: int = 8
    vision_mlp: int = 2048
    vision_layers: int = 8
    patch_dim: int = 3 * 2 * 14 * 14  # Qwen2-VL: RGB x 2 frames x 14 x 14 px
    merge: int = 4  # patches per placeholder token (2x2)
    steps: int = 12
    repeats: int = 5  # calibration rounds


SMOKE = Sizes(
    micro_batches=2,
    tokens=256,
    patches=512,
    vocab=512,
    hidden=32,
    heads=2,
    layers=2,
    vision_hidden=32,
    vision_heads=2,
    vision_mlp=64,
    vision_layers=2,
    patch_dim=48,
    steps=2,
    repeats=1,
)


def _without_spec_models() -> None:
    """Where pydantic is missing, make ``pipeline.spec`` a bare package so that ``pipeline.spec.cost`` (numpy
    alone) imports without ``pipeline/spec/__init__.py``, which loads the spec's pydantic models."""
    try:
        import pydantic  # noqa: F401
    except ImportError:
        if "pipeline.spec" in sys.modules:
            return
        package = types.ModuleType("pipeline.spec")
        package.__path__ = [str(REPO / "pipeline" / "spec")]
        sys.modules["pipeline.spec"] = package


# -- the sample stream ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """Samples in arrival order: each one's kind, tokens (text, placeholders and vision start/end tokens) and
    the patches of each of its images or clips."""

    kind: np.ndarray
    lengths: np.ndarray
    items: list[np.ndarray]

    @property
    def patches(self) -> np.ndarray:
        return np.array([int(p.sum()) for p in self.items], dtype=np.int64)


def _lognormal(rng: np.random.Generator, median: float, sigma: float, low: float, high: float) -> int:
    return int(np.clip(rng.lognormal(np.log(median), sigma), low, high))


def _items(kind: int, sizes: Sizes, rng: np.random.Generator) -> list[int]:
    """The patches of a sample's images or clips, each a whole number of merge windows."""
    p, m = sizes.patches, sizes.merge
    if kind == CAPTION:
        drawn = [_lognormal(rng, p / 16, 0.8, 16, p / 2)]
    elif kind == INTERLEAVED:
        drawn = [_lognormal(rng, p / 32, 0.8, 16, p / 4) for _ in range(int(rng.integers(2, 6)))]
    elif kind == VIDEO:
        drawn = [_lognormal(rng, p / 4, 0.7, p / 16, p)]
    else:
        drawn = []
    return [m * max(1, n // m) for n in drawn]


def _text(kind: int, sizes: Sizes, rng: np.random.Generator) -> int:
    c = sizes.tokens
    if kind == TEXT:
        return _lognormal(rng, c / 16, 1.0, 16, c)
    if kind == INTERLEAVED:
        return _lognormal(rng, c / 8, 0.8, 16, c)
    return _lognormal(rng, c / 128, 0.6, 4, c / 8)


def make_stream(sizes: Sizes, samples: int, rng: np.random.Generator) -> Stream:
    """``samples`` samples, each within one micro-batch's budgets (drawn again where one is not)."""
    kinds, lengths, items = [], [], []
    while len(kinds) < samples:
        kind = int(rng.choice(len(KIND_SHARES), p=KIND_SHARES))
        patches = _items(kind, sizes, rng)
        tokens = _text(kind, sizes, rng) + sum(n // sizes.merge + 2 for n in patches)
        if tokens <= sizes.tokens and sum(patches) <= sizes.patches:
            kinds.append(kind)
            lengths.append(tokens)
            items.append(np.array(patches, dtype=np.int64))
    return Stream(np.array(kinds), np.array(lengths, dtype=np.int64), items)


# -- plans: per step, rank and micro-batch, the stream's samples ----------------------------------------------

Plan = list[list[list[int]]]


def naive_plans(stream: Stream, sizes: Sizes, steps: int) -> list[Plan]:
    patches = stream.patches
    heads = list(range(sizes.ranks))  # rank r's next sample: r, r + R, r + 2R, ...
    plans = []
    for _ in range(steps):
        step: Plan = []
        for r in range(sizes.ranks):
            micro: list[list[int]] = [[] for _ in range(sizes.micro_batches)]
            held = np.zeros((sizes.micro_batches, 2), dtype=np.int64)
            while heads[r] < len(stream.lengths):
                need = np.array([stream.lengths[heads[r]], patches[heads[r]]])
                fits = np.flatnonzero(np.all(held + need <= (sizes.tokens, sizes.patches), axis=1))
                if not fits.size:
                    break
                held[fits[0]] += need
                micro[fits[0]].append(heads[r])
                heads[r] += sizes.ranks
            step.append(micro)
        plans.append(step)
    return plans


def mixflow_plans(stream: Stream, sizes: Sizes, steps: int, llm: Any, vision: Any | None) -> list[Plan]:
    """Steps of the in-order draw planned by ``plan_step`` with both budgets; each sample's cost its LLM cost
    plus, with ``vision``, its encoder cost (the step core's costs for a multimodal window)."""
    from pipeline.planning.scheduler import plan_step

    patches = stream.patches
    counts = np.array([len(p) for p in stream.items])
    costs = llm.costs(stream.lengths)
    if vision is not None:
        costs = costs + vision.sample_costs(np.concatenate(stream.items), counts)
    budget = int(np.ceil(sizes.ranks * sizes.micro_batches * sizes.tokens * 1.05))
    deferred, head, plans = np.zeros(0, dtype=np.int64), 0, []
    for _ in range(steps):
        drawn = np.searchsorted(np.cumsum(stream.lengths[head:]), budget - int(stream.lengths[deferred].sum())) + 1
        candidates = np.concatenate([deferred, np.arange(head, min(head + drawn, len(stream.lengths)))])
        head += int(drawn)
        plan = plan_step(
            stream.lengths[candidates],
            sizes.ranks,
            sizes.micro_batches,
            sizes.tokens,
            llm,
            costs=costs[candidates],
            patches=patches[candidates],
            patch_capacity=sizes.patches,
        )
        step: Plan = [[[] for _ in range(sizes.micro_batches)] for _ in range(sizes.ranks)]
        for i in np.flatnonzero(plan.placed_mask).tolist():
            step[int(plan.rank[i])][int(plan.micro[i])].append(int(candidates[i]))
        plans.append(step)
        deferred = candidates[plan.deferred_indices]
    return plans


# -- the model ------------------------------------------------------------------------------------------------


def build_model(sizes: Sizes, device: Any, dtype: Any) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from pipeline.tools.calibrate.block import Block, attention_backend

    class VLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            vh, m = sizes.vision_hidden, sizes.merge
            vision_attention = attention_backend(device, dtype, causal=False)
            self.patch_embed = nn.Linear(sizes.patch_dim, vh, bias=False)
            self.vit = nn.ModuleList(
                Block(vh, sizes.vision_heads, vision_attention, mlp=sizes.vision_mlp, causal=False)
                for _ in range(sizes.vision_layers)
            )
            self.merger = nn.Sequential(
                nn.LayerNorm(m * vh), nn.Linear(m * vh, m * vh), nn.GELU(), nn.Linear(m * vh, sizes.hidden)
            )
            self.embed = nn.Embedding(sizes.vocab, sizes.hidden)
            attention = attention_backend(device, dtype)
            self.llm = nn.ModuleList(Block(sizes.hidden, sizes.heads, attention) for _ in range(sizes.layers))
            self.norm, self.head = nn.RMSNorm(sizes.hidden), nn.Linear(sizes.hidden, sizes.vocab, bias=False)
            self.attention = {"llm": attention, "vision": vision_attention}

        def forward(self, batch: dict[str, Any]) -> torch.Tensor:
            x = self.embed(batch["ids"])
            if batch["pixels"] is not None:
                v = self.patch_embed(batch["pixels"])
                for block in self.vit:
                    v = block(v, batch["item_cu"], batch["item_longest"])
                merged = self.merger(v.reshape(-1, sizes.merge * sizes.vision_hidden))
                x = x.index_put((batch["placeholders"],), merged.to(x.dtype))
            for block in self.llm:
                x = block(x, batch["cu"], batch["longest"])
            return F.cross_entropy(self.head(self.norm(x)).float(), batch["ids"])

    return VLM().to(device, dtype)


def _placeholders(start: int, patches: np.ndarray, merge: int) -> list[np.ndarray]:
    """Where a sample starting at ``start`` holds its items' placeholder tokens: each item's between its vision
    start and end tokens, the first item's start token the sample's first token, the text after the items."""
    positions, at = [], start
    for n in patches.tolist():
        positions.append(at + 1 + np.arange(n // merge))
        at += n // merge + 2
    return positions


def micro_batch_inputs(stream: Stream, samples: list[int], sizes: Sizes, pool: Any, device: Any) -> dict[str, Any]:
    """Random token ids and pixels for ``samples`` packed in one micro-batch (as the sink hands it over)."""
    import torch

    lengths = stream.lengths[samples]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    batch: dict[str, Any] = {
        "ids": torch.randint(sizes.vocab, (int(lengths.sum()),), device=device),
        "cu": torch.tensor(starts, dtype=torch.int32, device=device),
        "longest": int(lengths.max()),
        "pixels": None,
    }
    items = [stream.items[i] for i in samples]
    flat = np.concatenate(items)
    if flat.size:
        where = [
            p
            for start, item in zip(starts.tolist(), items, strict=False)
            for p in _placeholders(start, item, sizes.merge)
        ]
        batch |= {
            "pixels": pool[: int(flat.sum())],
            "item_cu": torch.tensor(np.concatenate([[0], np.cumsum(flat)]), dtype=torch.int32, device=device),
            "item_longest": int(flat.max()),
            "placeholders": torch.tensor(np.concatenate(where), dtype=torch.int64, device=device),
        }
    return batch


# -- timing ---------------------------------------------------------------------------------------------------


class Timer:
    """ms between marks: CUDA events on a GPU (one synchronisation at the end), the wall clock on a CPU."""

    def __init__(self, device: Any) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []
        self._torch = torch

    def mark(self) -> None:
        if self.cuda:
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        if self.cuda:
            self._torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:], strict=False)]


def time_rank(model: Any, optimizer: Any, batches: list[dict[str, Any]], device: Any) -> list[float]:
    """ms of each micro-batch's forward and backward, then of the optimizer step."""
    timer = Timer(device)
    timer.mark()
    for batch in batches:
        model(batch).backward()
        timer.mark()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    timer.mark()
    return timer.intervals()


def predicted_ms(stream: Stream, samples: list[int], fits: dict[str, Any]) -> float:
    """The calibrated cost model's time of one micro-batch (the blocks only: no embeddings, head or merger)."""
    if not samples:
        return 0.0
    llm, vision = fits["llm"], fits["vision"]
    lengths = stream.lengths[samples].astype(np.float64)
    ms = llm.per_micro_batch + float(np.sum(llm.alpha * lengths**2 + llm.beta * lengths + llm.gamma))
    items = np.concatenate([stream.items[i] for i in samples]).astype(np.float64)
    if items.size:
        ms += vision.per_micro_batch + float(np.sum(vision.alpha * items**2 + vision.beta * items + vision.gamma))
    return ms


def time_steps(
    plans: dict[str, list[Plan]], stream: Stream, sizes: Sizes, fits: dict[str, Any], device: Any, budget_s: float
) -> dict[str, list[dict[str, Any]]]:
    """Every method's steps, interleaved (step k of each method, then step k + 1), so that a spent budget leaves
    each method the same steps; per step and rank its micro-batches' ms, optimizer ms and predicted ms."""
    import torch

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(sizes, device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    parameters = sum(p.numel() for p in model.parameters())
    print(f"VLM: {parameters / 1e6:.1f}M parameters, {dtype}, attention {model.attention}", flush=True)
    pool = torch.randn(sizes.patches, sizes.patch_dim, device=device, dtype=dtype)

    def run_rank(rank: list[list[int]]) -> dict[str, Any]:
        batches = [micro_batch_inputs(stream, mb, sizes, pool, device) for mb in rank if mb]
        *micro, optimizer_ms = time_rank(model, optimizer, batches, device)
        predicted = [predicted_ms(stream, mb, fits) for mb in rank if mb]
        return {"micro_ms": micro, "optimizer_ms": optimizer_ms, "predicted_ms": predicted}

    first = plans[METHODS[1]][0]
    for rank in first[:2]:  # warm-up: kernels, allocator, autotuning
        run_rank(rank)
    timed: dict[str, list[dict[str, Any]]] = {method: [] for method in plans}
    began = time.perf_counter()
    for k in range(sizes.steps):
        if time.perf_counter() - began > budget_s:
            print(f"budget of {budget_s:.0f} s spent after {k} steps", flush=True)
            break
        for method, steps in plans.items():
            timed[method].append({"ranks": [run_rank(rank) for rank in steps[k]], "plan": steps[k]})
        print(f"step {k + 1}/{sizes.steps} timed ({time.perf_counter() - began:.0f} s)", flush=True)
    return timed


def summarise(timed: dict[str, list[dict[str, Any]]], stream: Stream) -> dict[str, dict[str, float]]:
    summary: dict[str, dict[str, float]] = {}
    patches = stream.patches
    for method, steps in timed.items():
        rank_ms = [np.array([sum(r["micro_ms"]) + r["optimizer_ms"] for r in s["ranks"]]) for s in steps]
        predicted = [np.array([sum(r["predicted_ms"]) for r in s["ranks"]]) for s in steps]
        placed = [i for s in steps for rank in s["plan"] for mb in rank for i in mb]
        seconds = sum(float(ms.max()) for ms in rank_ms) / 1e3
        ratios = [float(m) for s in steps for r in s["ranks"] for m in np.divide(r["micro_ms"], r["predicted_ms"])]
        summary[method] = {
            "steps": len(steps),
            "max_over_mean": statistics.median(float(ms.max() / ms.mean()) for ms in rank_ms),
            "predicted_max_over_mean": statistics.median(float(p.max() / p.mean()) for p in predicted),
            "step_ms": statistics.median(float(ms.max()) for ms in rank_ms),
            "tokens_per_s": float(stream.lengths[placed].sum()) / seconds,
            "samples_per_s": len(placed) / seconds,
            "images_per_s": sum(len(stream.items[i]) for i in placed) / seconds,
            "patches_per_s": float(patches[placed].sum()) / seconds,
            "measured_over_predicted_median": statistics.median(ratios),
            "measured_over_predicted_p10": float(np.quantile(ratios, 0.1)),
            "measured_over_predicted_p90": float(np.quantile(ratios, 0.9)),
        }
    if "naive" in summary:
        naive = summary["naive"]
        for row in summary.values():
            row |= {f"{key}_vs_naive": row[key] / naive[key] for key in ("tokens_per_s", "images_per_s")}
    return summary


# -- calibration ----------------------------------------------------------------------------------------------


def _fit(shapes: list[Any], device: str, dtype: str, repeats: int, **block: Any) -> Any:
    from pipeline.tools.calibrate import fit_cost
    from pipeline.tools.calibrate.timing import measure

    def progress(line: str) -> None:
        print(f"  {line}", flush=True)

    kind = "LLM block (causal)" if block.get("causal", True) else "ViT block (full within each item)"
    shape = ", ".join(f"{key} {value}" for key, value in block.items() if key != "causal")
    progress(f"{kind}, {shape}, {dtype}: {len(shapes)} micro-batches of up to {max(s.tokens for s in shapes)}")

    measured = measure(shapes, device=device, dtype=dtype, repeats=repeats, warmups=2, progress=progress, **block)
    return measured, fit_cost(measured.timings)


def calibrate_qwen2_vl_vit(device: str, repeats: int) -> dict[str, Any]:
    """The vision encoder's block at Qwen2-VL's ViT shape, as ``mixflow calibrate --vision`` times it."""
    from pipeline.tools.calibrate import calibration_grid, default_lengths, fit_table

    hidden, heads, mlp, layers = QWEN2_VL_VIT
    print(f"(a) vision calibration: Qwen2-VL's ViT block (hidden {hidden}, {heads} heads, MLP {mlp})", flush=True)
    shapes = calibration_grid(default_lengths(16384, shortest=64), 16384)
    measured, fit = _fit(shapes, device, "bf16", repeats, hidden=hidden, heads=heads, mlp=mlp, causal=False)
    for line in fit_table(fit, length="n", count="images"):
        print(line, flush=True)
    scaled = fit.scaled(layers)
    coefficients = f"alpha: {scaled.alpha:.4g}, beta: {scaled.beta:.4g}, gamma: {scaled.gamma:.4g}"
    print(f"  x {layers} layers, the spec's cost.vision: {{{coefficients}}}", flush=True)
    return {
        "attention": measured.attention,
        "device": measured.device,
        "one_block": _coefficients(fit),
        "layers": layers,
        "all_layers": _coefficients(scaled),
        "r_squared": fit.r_squared(),
        "worst_error_by_n": fit.worst_error_by_length(),
    }


def _coefficients(fit: Any) -> dict[str, float]:
    return {"alpha": fit.alpha, "beta": fit.beta, "gamma": fit.gamma, "per_micro_batch": fit.per_micro_batch}


def calibrate_vlm(sizes: Sizes, device: str) -> tuple[dict[str, Any], str]:
    """Both blocks of the VLM timed and fitted, scaled by their layers, and the spec's cost section of them."""
    from pipeline.tools.calibrate import calibration_grid, default_lengths
    from pipeline.tools.calibrate.section import Provenance, VisionPart, cost_section

    dtype = "bf16" if device == "cuda" else "fp32"
    print("(a) the VLM's blocks, for the cost model its steps are planned by", flush=True)
    llm_shapes = calibration_grid(default_lengths(sizes.tokens, shortest=sizes.tokens // 32), sizes.tokens)
    llm_measured, llm = _fit(llm_shapes, device, dtype, sizes.repeats, hidden=sizes.hidden, heads=sizes.heads)
    shortest = max(16, sizes.patches // 256)
    vision_shapes = calibration_grid(default_lengths(sizes.patches, shortest=shortest), sizes.patches)
    vision_block = {"hidden": sizes.vision_hidden, "heads": sizes.vision_heads, "mlp": sizes.vision_mlp}
    vision_measured, vision = _fit(vision_shapes, device, dtype, sizes.repeats, causal=False, **vision_block)
    fits = {"llm": llm.scaled(sizes.layers), "vision": vision.scaled(sizes.vision_layers)}
    where = Provenance(
        llm_measured.device,
        llm_measured.torch,
        dtype,
        llm_measured.attention,
        sizes.hidden,
        sizes.heads,
        sizes.layers,
        date.today(),
    )
    part = VisionPart(
        fits["vision"],
        sizes.vision_hidden,
        sizes.vision_heads,
        sizes.vision_mlp,
        sizes.vision_layers,
        vision_measured.attention,
    )
    section = cost_section(fits["llm"], where, part)
    print(section, flush=True)
    return fits, section


# -- the whole check ------------------------------------------------------------------------------------------


def check(
    sizes: Sizes, device_name: str, budget_s: float, seed: int, qwen: bool, out: dict[str, Any], save: Any
) -> None:
    """Fills ``out`` part by part, calling ``save()`` after each, so that a part that fails on the GPU leaves
    the parts before it. A failing calibration at Qwen2-VL's shape is reported and the rest goes on."""
    _without_spec_models()
    import torch

    from pipeline.planning.scheduler import CostModel
    from pipeline.spec.cost import VisionCostModel

    device = torch.device(device_name)
    out |= {"sizes": asdict(sizes), "torch": torch.__version__}
    if qwen:
        try:
            out["qwen2_vl_vit"] = calibrate_qwen2_vl_vit(device_name, sizes.repeats)
        except Exception as exc:  # the rest of the check does not depend on it
            traceback.print_exc()
            out["qwen2_vl_vit"] = {"error": repr(exc)}
        save()
    fits, out["cost_section"] = calibrate_vlm(sizes, device_name)
    out["fits"] = {name: _coefficients(fit) for name, fit in fits.items()}
    save()
    llm_cost = CostModel(fits["llm"].alpha, fits["llm"].beta, fits["llm"].gamma)
    vision_cost = VisionCostModel(fits["vision"].alpha, fits["vision"].beta, fits["vision"].gamma)
    per_step = sizes.ranks * sizes.micro_batches * sizes.tokens
    stream = make_stream(sizes, int(3 * (sizes.steps + 2) * per_step / (sizes.tokens / 8)), np.random.default_rng(seed))
    out["stream"] = {
        "samples": len(stream.lengths),
        "by_kind": dict(zip(KIND_NAMES, np.bincount(stream.kind, minlength=len(KIND_NAMES)).tolist(), strict=True)),
        "mean_tokens": float(stream.lengths.mean()),
        "mean_patches": float(stream.patches.mean()),
    }
    plans = {
        "naive": naive_plans(stream, sizes, sizes.steps),
        "mixflow": mixflow_plans(stream, sizes, sizes.steps, llm_cost, vision_cost),
        "mixflow-llm-cost": mixflow_plans(stream, sizes, sizes.steps, llm_cost, None),
    }
    print(
        f"(b) VLM steps: {sizes.ranks} ranks x {sizes.micro_batches} x {sizes.tokens} tokens,"
        f" {sizes.patches} patches a micro-batch, on {device_name}",
        flush=True,
    )
    timed = time_steps(plans, stream, sizes, fits, device, budget_s)
    out["methods"] = summarise(timed, stream)
    out["timed"] = timed
    save()
    for method, row in out["methods"].items():
        versus = f" ({row['tokens_per_s_vs_naive']:.2f}x naive)" if "tokens_per_s_vs_naive" in row else ""
        print(
            f"{method:17s} steps {row['steps']}: max/mean rank time {row['max_over_mean']:.3f}"
            f" (predicted {row['predicted_max_over_mean']:.3f}), step {row['step_ms']:.1f} ms,"
            f" {row['tokens_per_s'] / 1e3:.1f}k tokens/s{versus}, {row['samples_per_s']:.1f} samples/s,"
            f" {row['images_per_s']:.1f} images/s, {row['patches_per_s'] / 1e3:.1f}k patches/s;"
            f" measured/predicted per micro-batch {row['measured_over_predicted_median']:.2f}"
            f" (p10 {row['measured_over_predicted_p10']:.2f}, p90 {row['measured_over_predicted_p90']:.2f})",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (a test that the script runs)")
    parser.add_argument("--device", help="default: cuda when there is one, else cpu")
    parser.add_argument("--steps", type=int, help="steps timed per method (default 12; 2 with --smoke)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop timing steps after this (default 240)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-qwen", action="store_true", help="skip the ViT calibration at Qwen2-VL's shape")
    parser.add_argument("--out", type=Path, help="write results.json into this folder")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch on a CPU (default 1)")
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(args.threads)
    sizes = SMOKE if args.smoke else Sizes()
    if args.steps is not None:
        sizes = replace(sizes, steps=args.steps)
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}

    def save() -> None:
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "results.json").write_text(json.dumps(out, indent=1, default=str) + "\n")

    began = time.perf_counter()
    check(sizes, device, args.budget_s, args.seed, device == "cuda" and not args.skip_qwen, out, save)
    out["seconds"] = time.perf_counter() - began
    save()
    print(f"done in {out['seconds']:.0f} s on {out['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
