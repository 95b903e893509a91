"""Context-parallel steps for the replay tests: made as the constructor makes them (``plan_cp_step``, then
``build_cp_batches``), and their samples put back together from the slices independently of replay's own code
(``cp_slices.reassemble``, block by block)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.planning.scheduler.context_parallel import plan_cp_step
from pipeline.planning.scheduler.cp_plan import CPShape
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from tests.length_families import draw_lengths
from topics.formats.batch_codec import decode_any_batch, encode_batch
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_slices import reassemble
from topics.formats.sample import Sample

COST = ContextParallelCost()


def longest(shape: CPShape) -> int:
    """The longest sample a block of the shape's largest size holds (as the spec's ``longest_sample``)."""
    return shape.capacity if shape.size == 1 else 2 * shape.size * (shape.capacity // 2)


def cp_step(rng: np.random.Generator, family: str, shape: CPShape, count: int, step: int = 3) -> list[CPBatch]:
    """A step of ``count`` candidates of the length ``family`` planned over ``shape``: each rank's batch."""
    lengths = draw_lengths(family, rng, count, longest(shape))
    samples = [
        Sample(f"{'ab'[k % 2]}/f/{k}", "ab"[k % 2], rng.integers(0, 50_000, int(n), dtype=np.int32))
        for k, n in enumerate(lengths.tolist())
    ]
    return build_cp_batches(step, plan_cp_step(lengths, shape, COST), samples)


def step_samples(batches: Sequence[CPBatch]) -> list[Sample]:
    """The samples of a step, each from its block's slices, in the order the blocks' first ranks hold them."""
    order: list[str] = []
    found: dict[str, dict[int, np.ndarray]] = {}
    about: dict[str, tuple[str, int]] = {}
    for batch in batches:
        offsets = batch.offsets
        for row, sample_id in enumerate(batch.sample_ids):
            if batch.cp_rank[row] == 0:
                order.append(sample_id)
            found.setdefault(sample_id, {})[int(batch.cp_rank[row])] = batch.tokens[offsets[row] : offsets[row + 1]]
            about[sample_id] = (batch.sources[row], int(batch.lengths[row]))
    out = []
    for sample_id in order:
        slices = found[sample_id]
        source, length = about[sample_id]
        tokens = reassemble([slices[k] for k in range(len(slices))], length)
        out.append(Sample(sample_id, source, tokens.astype(np.int32)))
    return out


def checked(batches: Sequence[CPBatch]) -> list[CPBatch]:
    """``batches`` encoded and read back: version 3's checks run on every one (layout, capacity, positions)."""
    out = []
    for batch in batches:
        _, value, headers = encode_batch(batch)
        decoded = decode_any_batch(value, headers)
        assert isinstance(decoded, CPBatch)
        out.append(decoded)
    return out


def values(batches: Sequence[CPBatch]) -> list[bytes]:
    return [encode_batch(b)[1] for b in batches]


def ids_and_tokens(samples: Sequence[Sample]) -> list[tuple[str, str, bytes]]:
    return [(s.sample_id, s.source, s.tokens.astype(np.int32).tobytes()) for s in samples]
