"""Compile the planning kernels into numba's on-disk cache before any role needs them.

A constructor (or a test, a replay) that starts with no compiled kernels spends its first steps compiling them:
about a minute on a small machine, and several processes started at once each compile their own. One run of
this module plans a few steps of every kind the step core makes (text, composed text, multimodal composed and in
order, context-parallel in each mode) so that every later process loads them (``kernels/jit.py``: the cache is
fresh while no planning module changes). ``python -m pipeline.planning.warm``; prints what it took.
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.planning.mixing import Mixer, Schedule, step_budget
from pipeline.planning.mixing.compose import DEFAULT_DUE, DEFAULT_WINDOW
from pipeline.planning.mixing.mixer import Composition
from pipeline.planning.scheduler import CostModel, rank_orders
from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step
from pipeline.planning.shape import StepShape
from pipeline.planning.step.core import StepCore, StepWindow
from pipeline.spec.cost import VisionCostModel
from pipeline.spec.cp_cost import ContextParallelCost

_LLM = CostModel.from_transformer(1024, 8)
_VISION = VisionCostModel.from_vit(512, 8)


def _steps(shape: StepShape, composed: bool, media: bool, steps: int = 3) -> None:
    rng = np.random.default_rng(0)
    budget = step_budget(shape.tokens_per_step)
    composition = Composition(shape, _LLM, DEFAULT_WINDOW, DEFAULT_DUE) if composed else None
    mixer = Mixer(Schedule(["a", "b"], [0], [[0.7, 0.3]]), budget, composition=composition)
    core = StepCore(shape, _LLM, vision=_VISION if media else None)
    state = mixer.initial_state()
    for _ in range(steps):
        count = int((DEFAULT_WINDOW + 3) * shape.tokens_per_step / 200)
        lengths = {s: rng.integers(1, shape.tokens_per_micro_batch // 2, count) for s in ("a", "b")}
        patches = {s: np.where(rng.random(count) < 0.4, rng.integers(4, 64, count) * 4, 0) for s in lengths}
        encoder = {s: _VISION.sample_costs(p[p > 0], np.ones(int((p > 0).sum()), np.int64)) for s, p in patches.items()}
        encoder_costs = {s: np.zeros(count) for s in lengths}
        for s, p in patches.items():
            encoder_costs[s][p > 0] = encoder[s]
        window = StepWindow(lengths, np.zeros(0, np.int64), np.zeros(0, np.int64))
        if media:
            window = StepWindow(
                lengths, np.zeros(0, np.int64), np.zeros(0, np.int64), patches, encoder_costs,
                np.zeros(0, np.int64), np.zeros(0),
            )  # fmt: skip
        planned = core.next_step(mixer, state, window).planned
        if planned is None:
            return
        rank_orders(planned.plan)  # what assembling the step's batches runs
        state = planned.next_state


def compile_kernels() -> float:
    """Plan a few steps of every kind; the seconds it took (mostly compiling, where the cache was cold)."""
    began = time.perf_counter()
    for ranks, micro in ((4, 2), (64, 8)):  # both widths of a placement's ``at`` (kernels/state.at_dtype)
        for composed in (False, True):
            _steps(StepShape(ranks, micro, 4096), composed, media=False)
        shape = StepShape(ranks, micro, 4096, 8192)
        for composed in (False, True):
            _steps(shape, composed, media=True)
    rng = np.random.default_rng(1)
    lengths = np.concatenate([rng.integers(64, 2048, 40), rng.integers(6000, 30000, 3)])
    for mode in CPMode:
        size = 4
        plan_cp_step(lengths, CPShape(8, 2, 8192, mode, size), ContextParallelCost())
    return time.perf_counter() - began


def main() -> None:
    print(f"planning kernels ready in {compile_kernels():.1f} s")


if __name__ == "__main__":
    main()
