"""A step's batches built rank by rank and its samples let go of as they are (``AssembledStep.drain_batches``,
what the constructor encodes a step from): the same batches as ``iter_batches``, and a rank's samples gone
once its batch is built (freed by reference counting alone: no cycle holds them), over families of lengths, media
and step shapes. No Kafka."""

from __future__ import annotations

import weakref
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler import CostModel
from pipeline.planning.shape import StepShape
from pipeline.planning.step.assemble import AssembledStep, BatchFormat, assemble_step
from pipeline.planning.step.pool import Candidate
from pipeline.planning.step.state import SampleRef
from topics.formats.batch_codec import encode_batch
from topics.formats.media import MediaItem
from topics.formats.sample import Sample

COST = CostModel(1.0, 64.0)
SHAPES = [StepShape(1, 1, 64), StepShape(2, 2, 48), StepShape(3, 1, 100), StepShape(4, 3, 32)]


def _sample(k: int, length: int, images: int) -> Sample:
    """Sample ``k``: ``images`` images of 2x2 raw pixels (one placeholder each) at its start, text after."""
    items = tuple(
        MediaItem("image", 1, 2, 2, 2, 1, 2, 2, i, "raw", (bytes([k % 256]) * 12,)) for i in range(min(images, length))
    )
    return Sample(f"s{k % 2}/f/{k}", f"s{k % 2}", np.arange(length, dtype=np.int32) + k, {}, items)


def _step(pool: list[tuple[int, int]], shape: StepShape, with_media: bool) -> AssembledStep:
    candidates = [Candidate(SampleRef(f"s{k % 2}", k), _sample(k, n, m)) for k, (n, m) in enumerate(pool)]
    return replace(assemble_step(5, candidates, shape, COST), batch_format=BatchFormat(with_media))


@settings(deadline=None, max_examples=30)
@given(
    st.lists(st.tuples(st.integers(1, 32), st.integers(0, 3)), max_size=30),
    st.sampled_from(SHAPES),
    st.booleans(),
)
def test_drained_batches_are_the_batches_and_let_go_of_each_rank_as_built(
    pool: list[tuple[int, int]], shape: StepShape, with_media: bool
) -> None:
    expected = [encode_batch(b) for b in _step(pool, shape, with_media).iter_batches()]
    step = _step(pool, shape, with_media)  # samples only this step holds
    summary = step.summary()
    tokens = [weakref.ref(c.sample.tokens) for c in step.candidates]
    rank, placed = step.plan.rank.copy(), step.plan.placed_mask.copy()
    drained = step.drain_batches()
    assert not step.candidates
    got = []
    for r, batch in enumerate(drained):
        got.append(encode_batch(batch))
        del batch  # let go of at once: by reference counting, no collection needed
        alive = np.array([t() is not None for t in tokens], dtype=bool)
        assert not np.any(alive & placed & (rank <= r)), f"rank {r}: samples of ranks built are still held"
    del drained
    assert all(t() is None for t in tokens)
    assert got == expected
    images = sum(min(m, n) for (n, m), p in zip(pool, placed.tolist(), strict=True) if p)
    assert summary.media_by_kind == ({"image": images} if images else {})
    assert summary.samples == int(placed.sum()) and summary.deferred == len(pool) - int(placed.sum())
    lengths = [n for n, _ in pool]
    assert summary.tokens == sum(n for n, p in zip(lengths, placed.tolist(), strict=True) if p)
    assert summary.tokens_by_source == {
        s: sum(n for k, (n, p) in enumerate(zip(lengths, placed.tolist(), strict=True)) if p and f"s{k % 2}" == s)
        for s in summary.samples_by_source
    }
