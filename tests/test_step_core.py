"""The step core (pipeline.planning.step.core, order.py): the candidate order, and steps made from the
constructor's pool of samples and from arrays of sample ids alike, over families of lengths, mixes and
step shapes. No Kafka."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.mixing import DrawStatus, Mixer, MixerState, Schedule, step_budget
from pipeline.planning.mixing.mixer import Composition
from pipeline.planning.order import candidate_order
from pipeline.planning.scheduler import CostModel, validate_plan
from pipeline.planning.shape import StepShape
from pipeline.planning.step.assemble import assemble_planned
from pipeline.planning.step.core import NothingFitsError, StepCore, StepWindow
from pipeline.planning.step.pool import SamplePool
from pipeline.planning.step.state import ConstructorState
from tests.length_families import FAMILIES, draw_lengths
from topics.formats.sample import Sample

drawn_lengths = st.lists(st.lists(st.integers(1, 50), max_size=12).map(np.asarray), max_size=4)


@settings(deadline=None, max_examples=200)
@given(st.integers(0, 6), drawn_lengths)
def test_candidate_order_sorts_share_before_source_and_place(deferred: int, drawn: list[np.ndarray]) -> None:
    """The deferred first, in their order; then the drawn ones as sorting (share of its source's drawn tokens
    before it, source, place) tuples does."""
    keys, numbers, first = [], [], deferred
    for k, lengths in enumerate(drawn):
        as_float = lengths.astype(np.float64)
        before = (np.cumsum(as_float) - as_float) / (as_float.sum() or 1.0)
        keys += [(float(b), k, i) for i, b in enumerate(before)]
        numbers.append(first + np.arange(len(lengths)))
        first += len(lengths)
    expected = list(range(deferred)) + [int(numbers[k][i]) for _, k, i in sorted(keys)]
    assert candidate_order(deferred, drawn).tolist() == expected


def _mixer(weights: dict[str, float], shape: StepShape, cost_model: CostModel, composed: bool) -> Mixer:
    composition = None
    if composed:
        composition = Composition(shape, cost_model, 2.0, 0.5)
    schedule = Schedule(list(weights), [0], [list(weights.values())])
    return Mixer(schedule, step_budget(shape.tokens_per_step), composition=composition)


@settings(deadline=None, max_examples=25)
@given(
    st.sampled_from(FAMILIES),
    st.sampled_from([StepShape(1, 1, 256), StepShape(2, 2, 512), StepShape(4, 1, 1024), StepShape(3, 4, 300)]),
    st.lists(st.floats(0.1, 1.0), min_size=1, max_size=3),
    st.booleans(),
    st.sampled_from([1, 3]),
    st.integers(0, 2**16),
)
def test_the_pool_of_samples_and_arrays_of_ids_make_the_same_steps(
    family: str, shape: StepShape, raw: list[float], composed: bool, lanes: int, seed: int
) -> None:
    """The constructor's way (``SamplePool`` of ``Sample`` objects, ``take`` and ``assemble_planned``) and the
    simulator's (arrays of ids, ``candidates_of``) put the same samples in the same places, step after step,
    and every plan is valid."""
    rng = np.random.default_rng(seed)
    weights = {f"s{k}": w for k, w in enumerate(raw)}
    cost_model = CostModel(alpha=3.0 / shape.tokens_per_micro_batch, beta=1.0)
    mixer = _mixer(weights, shape, cost_model, composed)
    core = StepCore(shape, cost_model, lanes)
    pool = SamplePool(ConstructorState.initial(MixerState.initial(weights)))
    ids = {s: np.zeros(0, np.int64) for s in weights}
    lengths_of: list[int] = []
    offsets = dict.fromkeys(weights, 0)
    deferred = np.zeros(0, np.int64)
    state = mixer.initial_state()
    for _ in range(6):
        for k, s in enumerate(weights):  # about two steps' worth of every source, read in
            count = int(rng.integers(0, 4 * shape.ranks * shape.micro_batches + 2))
            for length in draw_lengths(family, rng, count, shape.tokens_per_micro_batch).tolist():
                pool.add(s, offsets[s], Sample(str(len(lengths_of)), s, np.full(length, k, np.int32)))
                offsets[s] += 1
                ids[s] = np.append(ids[s], len(lengths_of))
                lengths_of.append(length)
        lengths = np.asarray(lengths_of, np.int64)
        window = pool.window()
        for s in weights:
            np.testing.assert_array_equal(window.available[s], lengths[ids[s]])
        np.testing.assert_array_equal(window.deferred_lengths, lengths[deferred])
        outcome = core.next_step(mixer, state, window)
        if outcome.status is not DrawStatus.OK:
            assert outcome.planned is None and outcome.status is DrawStatus.WAITING and outcome.waiting_for
            continue
        planned = outcome.planned
        assert planned is not None and planned.step == state.step
        validate_plan(planned.plan, planned.lengths)
        candidates = planned.candidates_of(deferred, ids)
        for s in weights:
            ids[s] = np.delete(ids[s], planned.taken[s])
        taken = pool.take(planned.taken, planned.order)
        assert [int(c.sample.sample_id) for c in taken] == candidates.tolist()
        assembled = assemble_planned(planned, taken)
        pool.settle(assembled.delivered, assembled.deferred)
        assert [int(c.sample.sample_id) for c in assembled.delivered] == candidates[planned.plan.placed_mask].tolist()
        for rank, batch in enumerate(assembled.batches):
            assert sorted(map(int, batch.sample_ids)) == sorted(candidates[planned.plan.rank == rank].tolist())
        deferred = candidates[~planned.plan.placed_mask]
        assert planned.next_state.step == state.step + lanes
        state = planned.next_state


@settings(deadline=None, max_examples=30)
@given(st.sampled_from(FAMILIES), st.integers(0, 2**16), st.sampled_from([1, 2]))
def test_a_final_step_takes_everything_and_keeps_the_credits(family: str, seed: int, lanes: int) -> None:
    rng = np.random.default_rng(seed)
    shape = StepShape(2, 2, 256)
    core = StepCore(shape, CostModel(alpha=0.01, beta=1.0), lanes)
    available = {s: draw_lengths(family, rng, int(rng.integers(0, 20)), 256) for s in ("a", "b")}
    deferred = draw_lengths(family, rng, int(rng.integers(0, 5)), 256)
    window = StepWindow(available, rng.integers(0, 2, len(deferred)), deferred)
    state = MixerState(7, {"a": 12.5, "b": -12.5}, 3.0)
    if not len(deferred) and not any(len(v) for v in available.values()):
        with pytest.raises(NothingFitsError, match="none of the 0 remaining samples fits a step"):
            core.final_step(state, window)
        return
    planned = core.final_step(state, window)
    assert all(np.array_equal(planned.taken[s], np.arange(len(v))) for s, v in available.items())
    assert sorted(planned.order.tolist()) == list(range(len(deferred) + sum(len(v) for v in available.values())))
    assert planned.order[: len(deferred)].tolist() == list(range(len(deferred)))
    assert planned.plan.placed_mask.any() and not planned.started
    assert planned.next_state == MixerState(7 + lanes, state.credit, state.long_credit)
