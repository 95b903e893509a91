"""Shared by the tests of ``pipeline/tools/observe``: steps of rank batches drawn by hypothesis."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from topics.formats.batch import Batch

SOURCES = ("code", "docstrings", "topics")


def pack_in_order(lengths: list[int], micro_batches: int, capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` per micro-batch, each filled in order until the next does not fit; what is
    left after the last micro-batch is dropped."""
    out: list[list[int]] = [[] for _ in range(micro_batches)]
    m, room = 0, capacity
    for i, length in enumerate(lengths):
        while m < micro_batches and length > room:
            m, room = m + 1, capacity
        if m == micro_batches:
            break
        out[m].append(i)
        room -= length
    return out


def make_batch(
    step: int, rank: int, ranks: int, micro_batches: int, capacity: int, items: list[tuple[str, int]]
) -> Batch:
    """A batch of ``items`` (source, length), packed in order (what does not fit is left out)."""
    groups = pack_in_order([n for _, n in items], micro_batches, capacity)
    order = [i for group in groups for i in group]
    lengths = np.array([items[i][1] for i in order], dtype=np.int64)
    return Batch.from_arrays(
        step=step,
        rank=rank,
        ranks=ranks,
        micro_batches=micro_batches,
        capacity=capacity,
        sample_ids=[f"{items[i][0]}/f/{step}-{rank}-{i}" for i in order],
        sources=[items[i][0] for i in order],
        micro_batch=np.repeat(np.arange(micro_batches), [len(g) for g in groups]),
        offsets=np.concatenate([[0], np.cumsum(lengths)]),
        tokens=np.arange(int(lengths.sum()), dtype=np.int32) % 1000,
    )


LENGTH_FAMILIES = {
    "uniform": lambda rng, n, cap: rng.integers(1, cap + 1, n),
    "short": lambda rng, n, cap: rng.integers(1, max(2, cap // 16), n),
    "long-tailed": lambda rng, n, cap: np.minimum(cap, 1 + rng.pareto(1.2, n) * cap / 20).astype(np.int64),
    "bimodal": lambda rng, n, cap: np.where(rng.random(n) < 0.1, cap, rng.integers(1, max(2, cap // 8), n)),
}


@st.composite
def steps(draw: st.DrawFn, max_ranks: int = 6, max_steps: int = 6) -> list[list[Batch]]:
    """Steps of a job: per step, the batch of every rank, with samples of every length family."""
    ranks = draw(st.integers(1, max_ranks))
    micro_batches = draw(st.integers(1, 4))
    capacity = draw(st.sampled_from([16, 64, 512, 4096]))
    family = draw(st.sampled_from(sorted(LENGTH_FAMILIES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    out = []
    for step in range(draw(st.integers(1, max_steps))):
        batches = []
        for rank in range(ranks):
            n = int(rng.integers(0, 12))
            lengths = LENGTH_FAMILIES[family](rng, n, capacity)
            sources = rng.choice(SOURCES, n)
            items = [(str(s), int(x)) for s, x in zip(sources, lengths, strict=True)]
            batches.append(make_batch(step, rank, ranks, micro_batches, capacity, items))
        out.append(batches)
    return out
