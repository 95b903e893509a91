"""The mixing core: schedule interpolation, drawn shares, determinism, policies, state round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.mixing import Draw, DrawStatus, LongContext, Mixer, MixerState, Schedule, draw_step
from pipeline.spec import Interpolation, MixtureSpec, OnExhausted
from topics.errors import DecodeError

SOURCES = ("a", "b", "c")


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    n = draw(st.integers(1, 4))
    gaps = draw(st.lists(st.integers(1, 50), min_size=n - 1, max_size=n - 1))
    steps = np.concatenate([[0], np.cumsum(gaps)]).astype(int)
    rows = draw(
        st.lists(
            st.lists(st.floats(0, 10), min_size=3, max_size=3).filter(lambda r: sum(r) > 0.1),
            min_size=n,
            max_size=n,
        )
    )
    return Schedule(SOURCES, steps, rows, draw(st.sampled_from(list(Interpolation))))


@given(schedules(), st.integers(0, 400))
@settings(max_examples=60, deadline=None)
def test_schedule_normalised_and_endpoints(schedule: Schedule, step: int) -> None:
    w = schedule.weights_array(step)
    assert w.shape == (3,) and np.all(w >= 0) and w.sum() == pytest.approx(1.0)
    for k, at in enumerate(schedule.steps):  # every point's own weights at its step
        np.testing.assert_allclose(schedule.weights_array(int(at)), schedule.weights[k])
    np.testing.assert_allclose(schedule.weights_array(int(schedule.steps[-1]) + 1000), schedule.weights[-1])
    many = schedule.weights_array(np.arange(0, 401))
    np.testing.assert_allclose(many[step], w)  # vectorised == one at a time


@given(schedules(), st.integers(0, 400))
@settings(max_examples=60, deadline=None)
def test_constant_holds_and_linear_lies_between(schedule: Schedule, step: int) -> None:
    k = int(np.searchsorted(schedule.steps, step, side="right")) - 1
    w = schedule.weights_array(step)
    if schedule.interpolation is Interpolation.CONSTANT or k == len(schedule.steps) - 1:
        np.testing.assert_allclose(w, schedule.weights[k])
    else:
        lo = np.minimum(schedule.weights[k], schedule.weights[k + 1]) - 1e-12
        hi = np.maximum(schedule.weights[k], schedule.weights[k + 1]) + 1e-12
        assert np.all((lo <= w) & (w <= hi))
        mid = (schedule.steps[k] + schedule.steps[k + 1]) / 2
        if mid == int(mid):
            np.testing.assert_allclose(
                schedule.weights_array(int(mid)), (schedule.weights[k] + schedule.weights[k + 1]) / 2
            )


def test_schedule_from_spec_and_errors() -> None:
    mixture = MixtureSpec.model_validate(
        {"interpolation": "linear", "schedule": [{"step": 0, "weights": {"a": 1}}, {"step": 10, "weights": {"b": 3}}]}
    )
    schedule = Schedule.from_spec(mixture, SOURCES)
    assert schedule.weights_at(5) == pytest.approx({"a": 0.5, "b": 0.5, "c": 0.0})
    assert schedule.mean_weights(0, 1) == pytest.approx([1, 0, 0])
    with pytest.raises(ValueError, match="strictly increase"):
        Schedule(SOURCES, [0, 0], np.ones((2, 3)))
    with pytest.raises(ValueError, match="steps must be >= 0"):
        schedule.weights_array(-1)


def _abundant(rng: np.random.Generator, n: int = 64, high: int = 1024) -> dict[str, np.ndarray]:
    return {s: rng.integers(1, high + 1, n) for s in SOURCES}


@given(schedules(), st.integers(0, 2**32 - 1), st.booleans())
@settings(max_examples=15, deadline=None)
def test_cumulative_shares_converge(schedule: Schedule, seed: int, defer_some: bool) -> None:
    """With abundant data, delivered tokens per source track the schedule's average share within
    about one sample per source, also when the scheduler defers part of every step."""
    rng = np.random.default_rng(seed)
    mixer = Mixer(schedule, budget_tokens=16384)
    state, deferred = mixer.initial_state(), {}
    delivered, wanted = np.zeros(3), np.zeros(3)
    steps = 120
    for step in range(steps):
        draw = mixer.draw(state, _abundant(rng), deferred)
        assert draw.status is DrawStatus.OK
        deferred = {s: v[rng.random(len(v)) < 0.1] for s, v in draw.lengths.items()} if defer_some else {}
        now = np.array([draw.tokens[s] - deferred.get(s, np.zeros(0)).sum() for s in SOURCES])
        delivered += now
        # The weights at each step apply to that step's delivered tokens, and deferring makes steps unequal.
        wanted += schedule.weights_array(step) * now.sum()
        state = draw.settle(deferred)
    np.testing.assert_allclose(delivered / delivered.sum(), wanted / wanted.sum(), atol=0.01)
    assert max(abs(c) for c in state.credit.values()) < 3 * 1024 + 0.1 * 16384


def test_draw_is_deterministic_and_ignores_surplus() -> None:
    rng = np.random.default_rng(1)
    available = _abundant(rng, n=200)
    state = MixerState(step=7, credit={"a": 300.0, "b": -100.0, "c": -200.0})
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    first = draw_step(state, weights, 8192, available)
    again = draw_step(state, weights, 8192, {s: v.copy() for s, v in available.items()})
    surplus = {s: np.concatenate([v, rng.integers(1, 99, 50)]) for s, v in available.items()}
    more = draw_step(state, weights, 8192, surplus)
    for other in (again, more):
        assert all(np.array_equal(first.take[s], other.take[s]) for s in SOURCES)
        assert first.state == other.state
    assert all(np.array_equal(first.take[s], np.arange(len(first.take[s]))) for s in SOURCES)  # FIFO prefix
    assert first.state.step == 8


def _targets_met(draw: Draw) -> None:
    for s, target in draw.targets.items():
        tokens = draw.tokens[s]
        assert tokens >= target - 1e-9
        if len(draw.take[s]):  # the last sample drawn was still needed
            assert tokens - draw.lengths[s][-1] < target


def test_deferred_come_first_and_count() -> None:
    available = {s: np.full(100, 100) for s in SOURCES}
    deferred = {"a": np.array([700, 600])}
    draw = draw_step(MixerState.initial(SOURCES), {"a": 1, "b": 1, "c": 1}, 3000, available, deferred)
    assert draw.lengths["a"][:2].tolist() == [700, 600]
    assert len(draw.take["a"]) == 0 and draw.tokens["a"] == 1300  # the deferred already exceed a's 1000
    assert len(draw.take["b"]) == 10 and len(draw.take["c"]) == 10
    _targets_met(draw)
    with pytest.raises(ValueError, match="more tokens than"):
        draw.settle({"b": np.full(11, 100)})


def test_waiting_for_short_sources() -> None:
    available = {"a": np.full(100, 100), "b": np.full(3, 100), "c": np.zeros(0, dtype=int)}
    state = MixerState.initial(SOURCES)
    draw = draw_step(state, {"a": 1, "b": 1, "c": 1}, 3000, available)
    assert draw.status is DrawStatus.WAITING and draw.waiting_for == ("b", "c")
    assert draw.state == state and draw.take == {}
    # next_epoch: an exhausted source is waited for too (its loaders start another pass)
    draw = draw_step(
        state, {"a": 1, "b": 1, "c": 1}, 3000, available, exhausted={"b", "c"}, on_exhausted=OnExhausted.NEXT_EPOCH
    )
    assert draw.waiting_for == ("b", "c")


def test_stop_policy() -> None:
    available = {"a": np.full(100, 100), "b": np.full(3, 100), "c": np.full(100, 100)}
    draw = draw_step(MixerState.initial(SOURCES), {"a": 1, "b": 1, "c": 1}, 3000, available, exhausted={"b"})
    assert draw.status is DrawStatus.STOP and draw.exhausted == ("b",)


def test_renormalize_policy() -> None:
    available = {"a": np.full(100, 100), "b": np.full(3, 100), "c": np.full(100, 100)}
    draw = draw_step(
        MixerState.initial(SOURCES),
        {"a": 2, "b": 1, "c": 1},
        4000,
        available,
        exhausted={"b"},
        on_exhausted=OnExhausted.RENORMALIZE,
    )
    assert draw.status is DrawStatus.OK and draw.exhausted == ("b",)
    assert draw.tokens == {"a": 2500, "b": 300, "c": 1300}  # 4000 - 300 split 2:1, whole samples
    assert draw.weights == pytest.approx({"a": 2 / 3, "b": 0.0, "c": 1 / 3})
    assert draw.state.credit["b"] == 0.0
    assert sum(draw.state.credit.values()) == pytest.approx(0.0, abs=1e-6)
    # once empty, b is left out every step and the others share the whole budget
    empty = draw_step(
        draw.state,
        {"a": 2, "b": 1, "c": 1},
        4000,
        available | {"b": np.zeros(0, dtype=int)},
        exhausted={"b"},
        on_exhausted=OnExhausted.RENORMALIZE,
    )
    assert empty.tokens["b"] == 0 and empty.tokens["a"] + empty.tokens["c"] >= 4000
    everything_gone = {s: np.zeros(0, dtype=int) for s in SOURCES}
    done = draw_step(
        MixerState(),
        {"a": 1, "b": 1, "c": 1},
        4000,
        everything_gone,
        exhausted=set(SOURCES),
        on_exhausted=OnExhausted.RENORMALIZE,
    )
    assert done.status is DrawStatus.STOP


def test_long_context_share_and_lanes() -> None:
    """FIFOs kept across steps as the constructor keeps them: drawn samples leave, new ones arrive,
    and a waiting draw is retried with more data."""
    rng = np.random.default_rng(3)
    long = LongContext(min_length=1500, token_share=0.3, sources=frozenset({"a", "b"}))
    state, long_tokens, total = MixerState.initial(SOURCES), 0, 0
    fifo = {s: np.zeros(0, dtype=np.int64) for s in SOURCES}

    def arrive() -> None:
        for s in SOURCES:
            new = rng.integers(1, 800, 20)
            if s != "c":
                new[rng.random(20) < 0.05] = 2000  # a long sample now and then
            fifo[s] = np.concatenate([fifo[s], new])

    for _ in range(100):
        arrive()
        while (draw := draw_step(state, {"a": 1, "b": 1, "c": 1}, 16384, fifo, long_context=long)).waiting_for:
            assert draw.status is DrawStatus.WAITING
            arrive()
        assert draw.status is DrawStatus.OK
        for s in SOURCES:
            picked = fifo[s][draw.take[s]]
            is_long = fifo[s] >= 1500
            # the drawn samples are a prefix of the long lane and a prefix of the short lane
            assert np.array_equal(picked[picked >= 1500], fifo[s][is_long][: int((picked >= 1500).sum())])
            assert np.array_equal(picked[picked < 1500], fifo[s][~is_long][: int((picked < 1500).sum())])
            assert np.array_equal(draw.long[s], draw.lengths[s] >= 1500)
            fifo[s] = np.delete(fifo[s], draw.take[s])
        long_tokens += sum(int(v[draw.long[s]].sum()) for s, v in draw.lengths.items())
        total += sum(draw.tokens.values())
        state = draw.state
    assert long_tokens / total == pytest.approx(0.3, abs=0.01)
    assert not any(draw.long["c"])


def test_state_round_trip() -> None:
    state = MixerState(step=12, credit={"a": 1 / 3, "b": -1e-17, "c": 123456.789}, long_credit=-0.1)
    data = state.to_bytes()
    assert MixerState.from_bytes(data) == state and len(data) < 200
    for bad in (b"", b"[]", b'{"v": 2}', b'{"v": 1, "step": -1, "credit": {}, "long": 0}', b"\xff"):
        with pytest.raises(DecodeError):
            MixerState.from_bytes(bad)


def test_bad_arguments_are_value_errors() -> None:
    state = MixerState()
    with pytest.raises(ValueError, match="budget_tokens"):
        draw_step(state, {"a": 1}, 0, {})
    with pytest.raises(ValueError, match="sum to more than 0"):
        draw_step(state, {"a": 0}, 10, {})
    with pytest.raises(ValueError, match="not mixed"):
        draw_step(state, {"a": 1}, 10, {"z": [1]})
    with pytest.raises(ValueError, match="<= 0"):
        draw_step(state, {"a": 1}, 10, {"a": [3, 0]})


def _take_by_union(available: np.ndarray, need: float, need_long: float, min_length: int, final: bool):
    """The take as first written (np.union1d of the head and the first long samples), for comparison."""
    long_positions = np.flatnonzero(available >= min_length) if need_long > 0 else np.zeros(0, dtype=np.int64)
    total_long = np.cumsum(available[long_positions])
    if need_long <= 0:
        n_long = 0
    elif len(total_long) and total_long[-1] >= need_long:
        n_long = int(np.searchsorted(total_long, need_long, side="left")) + 1
    elif final:
        n_long = len(long_positions)
    else:
        return None
    rest = available.copy()
    rest[long_positions[:n_long]] = 0
    need_rest = need - float(available[long_positions[:n_long]].sum())
    total = np.cumsum(rest)
    if need_rest <= 0:
        n_head = 0
    elif len(total) and total[-1] >= need_rest:
        n_head = int(np.searchsorted(total, need_rest, side="left")) + 1
    else:
        return None
    return np.union1d(np.arange(n_head), long_positions[:n_long])


@given(
    st.lists(st.integers(1, 5000), max_size=60),
    st.floats(0, 1e5),
    st.floats(0, 5e4),
    st.integers(1, 5000),
    st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_a_take_is_the_sorted_union_of_the_head_and_the_first_long_samples(
    lengths: list[int], need: float, need_long: float, min_length: int, final: bool
) -> None:
    from pipeline.planning.mixing._take import take

    available = np.asarray(lengths, dtype=np.int64)
    got = take(available, need, need_long, min_length, final)
    expected = _take_by_union(available, need, need_long, min_length, final)
    assert (got is None) == (expected is None)
    if got is not None:
        assert got.positions.dtype == np.int64
        np.testing.assert_array_equal(got.positions, expected)
        assert got.tokens == int(available[expected].sum())
