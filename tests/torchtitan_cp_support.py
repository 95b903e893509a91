"""For the torchtitan context-parallel tests: a static context-parallel job of one block of ``CP`` ranks on the real
broker, each rank's topic holding its slices, planned and cut by the constructor's own ``plan_cp_step`` and
``build_cp_batches``; and the losses the training script logs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from tests.sink_support import write_steps
from topics.formats.cp_batch import CPBatch
from topics.formats.sample import Sample

CP, CAPACITY, MICRO_BATCHES, MOST_MICRO_BATCHES, STEPS = 2, 64, 2, 3, 3
"""Ranks of a block, slice tokens a micro-batch, the job's micro-batches and most micro-batches a step, steps."""
VOCABULARY = 2048  # the debug model's
LOSS_CHUNKS = 8  # ChunkedLossWrapper's default num_chunks: the loader pads every batch to a multiple of it
NO_CLIPPING = 1e9  # training.max_norm: the optimizer takes the gradients as the model made them


@dataclass(frozen=True)
class CPJob:
    """The job's name, its batches ``[step][rank]`` as written, and each step's samples whole, by micro-batch."""

    bootstrap: str
    name: str
    batches: list[list[CPBatch]]
    micro_batches: list[list[list[np.ndarray]]]  # [step][micro_batch][sample] tokens


def _step_samples(rng: np.random.Generator, step: int) -> list[Sample]:
    """Odd and even lengths from one token to what a block holds (``CP x CAPACITY``, less the zigzag padding)."""
    lengths = ([1, 2 * CAPACITY - 3, 3, 17, 40, 9], [17, 40, 9, 64, 5, 33, 2], [3, 96, 7, 11, 50])[step % 3]
    return [
        Sample(f"docs/s{step}-{i}/0", "docs", rng.integers(0, VOCABULARY, n).astype(np.int32))
        for i, n in enumerate(lengths)
    ]


def cp_steps() -> tuple[list[list[CPBatch]], list[list[list[np.ndarray]]]]:
    """``STEPS`` steps of a static job of one block of ``CP`` ranks: the batches ``[step][rank]`` and the samples
    whole ``[step][micro_batch][sample]``."""
    rng = np.random.default_rng(4)
    shape = CPShape(CP, MICRO_BATCHES, CAPACITY, CPMode.STATIC, CP, MOST_MICRO_BATCHES)
    steps, whole = [], []
    for step in range(STEPS):
        drawn = _step_samples(rng, step)
        plan = plan_cp_step(np.array([s.length for s in drawn]), shape, ContextParallelCost())
        assert plan.placed_mask.all(), "a sample of the test's steps was deferred"
        batches = build_cp_batches(step, plan, drawn)
        tokens = {s.sample_id: s.tokens for s in drawn}
        rows = list(zip(batches[0].micro_batch.tolist(), batches[0].sample_ids, strict=True))
        whole.append([[tokens[i] for m, i in rows if m == k] for k in range(batches[0].micro_batches)])
        steps.append(batches)
    return steps, whole


def write_cp_job(bootstrap: str, name: str) -> CPJob:
    """``cp_steps`` written to the rank topics of the job ``name``."""
    steps, whole = cp_steps()
    write_steps(bootstrap, name, steps)
    return CPJob(bootstrap, name, steps, whole)


def logged_losses(out: Path) -> dict[int, float]:
    """The global loss of each training step, as rank 0 of the training script logged it."""
    lines = (out / "losses.jsonl").read_text().splitlines()
    return {int(row["step"]): float(row["loss"]) for row in map(json.loads, lines)}
