"""What the constructor keeps stays bounded however many steps it writes, and its state record's used
offsets stay bounded by their span, however scattered (pure: no Kafka)."""

from __future__ import annotations

import json
import math
import tracemalloc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.mixing import MixerState
from pipeline.planning.step.pool import SamplePool
from pipeline.planning.step.state import ConstructorState, SourcePosition, encode_offsets
from pipeline.planning.step.used_bitmap import BITMAP_ABOVE_BYTES, encode_used, pack, unpack
from pipeline.roles.constructor.stats import ConstructorStats, StepRecord
from pipeline.roles.loader.stats import EPOCHS_KEPT, LoaderStats
from topics.formats.sample import Sample

SOURCES = ("a", "b", "c", "d")


def _record(step: int, rng: np.random.Generator) -> StepRecord:
    by_source = {s: int(n) for s, n in zip(SOURCES, rng.integers(0, 1000, len(SOURCES)), strict=True)}
    return StepRecord(step, sum(by_source.values()), 7, 1, 300, 2.0, 1.5, by_source, packed=bool(step % 2))


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 64), st.integers(1, 3000))
def test_the_stats_keep_totals_of_every_step_and_detail_of_the_last_ones(recent: int, steps: int) -> None:
    stats = ConstructorStats(recent)
    rng = np.random.default_rng(steps)
    records = [_record(k, rng) for k in range(steps)]
    for record in records:
        stats.add(record)
    assert list(stats.recent) == records[len(records) - min(recent, steps) :]
    assert (stats.steps_written, stats.first_step, stats.last_step) == (steps, 0, steps - 1)
    assert stats.tokens == sum(r.tokens for r in records)
    assert stats.samples == 7 * steps and stats.deferred == steps and stats.packed_steps == steps // 2
    assert stats.tokens_by_source == {s: sum(r.tokens_by_source[s] for r in records) for s in SOURCES}


def test_the_stats_memory_does_not_grow_with_steps() -> None:
    """50,000 more steps add nothing the size of a step each (a record of every step: about 30 MB); what
    tracemalloc sees is its own bookkeeping and the totals' larger ints."""
    stats = ConstructorStats(recent_steps=256)
    rng = np.random.default_rng(0)
    for k in range(1000):  # the window is full: from here on a step in is a step out
        stats.add(_record(k, rng))
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for k in range(1000, 51_000):
            stats.add(_record(k, rng))
        grown = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert stats.steps_written == 51_000 and len(stats.recent) == 256
    assert grown < 200_000, f"{grown:,} bytes more after 50,000 steps"


def test_every_step_is_kept_only_when_asked() -> None:
    stats = ConstructorStats(recent_steps=None)
    rng = np.random.default_rng(1)
    for k in range(5000):
        stats.add(_record(k, rng))
    assert len(stats.recent) == 5000


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 40))
def test_the_pool_forgets_what_lies_below_its_low_watermarks(seed: int, width: int) -> None:
    """Steps that take samples out of order from a FIFO of ``width`` samples, over 2,000 steps: the delivered
    offsets the pool keeps are exactly the state record's used offsets, those above the low watermark
    (below it nothing is kept); how far above it they reach depends on how long the oldest sample waits."""
    rng = np.random.default_rng(seed)
    state = ConstructorState.initial(MixerState.initial(["s"]))
    pool = SamplePool(state)
    tokens = np.zeros(8, dtype=np.int32)
    read = 0
    for _ in range(2000):
        fifo = pool.fifos["s"]
        while len(fifo.offsets) < width:
            pool.add("s", read, Sample(f"s/{read}", "s", tokens))
            read += 1
        # The oldest sample is taken with probability 1/2, so the low watermark moves on.
        positions = np.flatnonzero(rng.random(len(fifo.offsets)) < 0.3)
        if rng.random() < 0.5 and 0 not in positions:
            positions = np.concatenate([[0], positions])
        taken = pool.take({"s": positions})
        pool.settle(taken, [])
        position = pool.positions()["s"]
        assert fifo.delivered == set(position.used)
        assert all(position.low < o < read for o in position.used)
        assert len(position.used) <= read - position.low - len(fifo.offsets)


offset_sets = st.tuples(
    st.integers(0, 10**12), st.lists(st.integers(1, 200_000), min_size=1, max_size=6000, unique=True)
)


@settings(max_examples=60, deadline=None)
@given(offset_sets)
def test_a_bitmap_gives_the_offsets_back(case: tuple[int, list[int]]) -> None:
    low, above = case
    used = tuple(sorted(low + u for u in above))
    assert unpack(low, pack(low, used)) == used


@settings(max_examples=60, deadline=None)
@given(offset_sets)
def test_used_offsets_take_at_most_their_span_in_bits(case: tuple[int, list[int]]) -> None:
    """The bound: a source's used offsets take no more than the list form and, once that list is over
    BITMAP_ABOVE_BYTES, no more than a bitmap of their span (base64: 4 bytes for 3)."""
    low, above = case
    used = tuple(sorted(low + u for u in above))
    as_list = encode_offsets(used)
    listed = len(json.dumps(as_list, separators=(",", ":")))
    written = len(json.dumps(encode_used(low, used, as_list), separators=(",", ":")))
    span_bound = len('"bits:"') + 4 * math.ceil(math.ceil((used[-1] - low + 1) / 8) / 3)
    assert written <= listed
    if listed > BITMAP_ABOVE_BYTES:
        assert written <= span_bound
    else:
        assert written == listed  # a small job's records keep their bytes


@settings(max_examples=30, deadline=None)
@given(offset_sets, st.integers(0, 5))
def test_a_state_record_with_a_bitmap_round_trips(case: tuple[int, list[int]], step: int) -> None:
    low, above = case
    used = tuple(sorted(low + u for u in above))
    state = ConstructorState(MixerState.initial(["a", "b"]), {"a": SourcePosition(low, used), "b": SourcePosition()})
    assert ConstructorState.from_bytes(state.to_bytes()) == state


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 100)), max_size=400))
def test_a_loader_keeps_the_samples_of_its_latest_epochs_only(units: list[tuple[int, int]]) -> None:
    """Under ``next_epoch`` a loader's epochs never end; its stats keep the latest ``EPOCHS_KEPT``."""
    stats = LoaderStats()
    for epoch, samples in sorted(units):
        stats.count_epoch(epoch, samples)
    latest = sorted({e for e, _ in units})[-EPOCHS_KEPT:]
    assert stats.by_epoch == {e: sum(n for u, n in units if u == e) for e in latest}
