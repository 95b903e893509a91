"""The per-step numbers shared by `mixflow top`, `mixflow report` and `mixflow run`'s report, and the
report's plots and summary, over families of generated steps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.image import imread

from pipeline.spec.cost import CostModel
from pipeline.tools.observe.naive import REPORT_BACKLOG_STEPS, NaiveStream, first_fit, naive_loading
from pipeline.tools.observe.plots import write_plots
from pipeline.tools.observe.series import rate_over_time, report_series, rolling_median
from pipeline.tools.observe.step_stats import (
    cumulative_shares,
    imbalance,
    schedule_drift,
    scheduled_tokens,
    step_stats,
)
from pipeline.tools.observe.summary import summary_markdown
from pipeline.tools.observe.timeline import JobTimeline
from tests.observe_support import LENGTH_FAMILIES, SOURCES, steps

COSTS = st.builds(
    CostModel,
    alpha=st.sampled_from([0.0, 1.0, 2048.0]),
    beta=st.sampled_from([0.0, 1.0, 24.0 * 1024]),
    gamma=st.sampled_from([0.0, 50.0]),
).filter(lambda c: c.alpha + c.beta + c.gamma > 0)


def lengths_of(family: str, seed: int, n: int, capacity: int) -> np.ndarray:
    return LENGTH_FAMILIES[family](np.random.default_rng(seed), n, capacity).astype(np.int64)


@given(
    family=st.sampled_from(sorted(LENGTH_FAMILIES)),
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 80),
    bins=st.integers(1, 6),
    capacity=st.sampled_from([8, 100, 1024]),
)
def test_first_fit_puts_each_sample_in_the_first_bin_with_room(
    family: str, seed: int, n: int, bins: int, capacity: int
) -> None:
    lengths = lengths_of(family, seed, n, capacity)
    placed = first_fit(lengths, bins, capacity)
    room = np.full(bins, capacity)
    for length, b in zip(lengths.tolist(), placed.tolist(), strict=True):
        with_room = np.flatnonzero(room >= length)
        if b < 0:
            assert with_room.size == 0, "a sample was left out although a bin had room"
        else:
            assert b == with_room[0], "a sample went past a bin with room"
            room[b] -= length
    assert (room >= 0).all()


@given(
    family=st.sampled_from(sorted(LENGTH_FAMILIES)),
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 120),
    ranks=st.integers(1, 9),
    micro_batches=st.integers(1, 4),
    capacity=st.sampled_from([16, 256, 4096]),
    cost=COSTS,
)
def test_naive_loading_deals_round_robin_and_packs_first_fit(
    family: str, seed: int, n: int, ranks: int, micro_batches: int, capacity: int, cost: CostModel
) -> None:
    lengths = lengths_of(family, seed, n, capacity)
    naive = naive_loading(lengths, ranks, micro_batches, capacity, cost)
    expected_costs = np.zeros(ranks)
    packed_tokens = left_out = 0
    for r in range(ranks):
        mine = lengths[r::ranks]  # sample i goes to rank i mod R
        bins = first_fit(mine, micro_batches, capacity)
        expected_costs[r] = cost.costs(mine[bins >= 0]).sum()
        packed_tokens += int(mine[bins >= 0].sum())
        left_out += int((bins < 0).sum())
    np.testing.assert_allclose(naive.rank_costs, expected_costs, rtol=1e-12)
    assert naive.tokens == packed_tokens and naive.left_out == left_out
    assert naive.tokens <= ranks * micro_batches * capacity
    if lengths.sum() <= capacity:  # everything fits in any rank's first micro-batch
        assert naive.left_out == 0


@given(costs=st.lists(st.floats(0, 1e12), min_size=1, max_size=64), scale=st.floats(1e-3, 1e3))
def test_imbalance_is_at_least_one_and_scale_free(costs: list[float], scale: float) -> None:
    values = np.array(costs)
    ratio = float(imbalance(values))
    assert ratio >= 1.0 - 1e-12
    if values.mean() > 1e-6:
        assert float(imbalance(values * scale)) == pytest.approx(ratio, rel=1e-9)
    assert float(imbalance(np.full(len(costs), 7.0))) == pytest.approx(1.0)


@settings(max_examples=40, deadline=None)
@given(job=steps(), cost=COSTS)
def test_step_stats_add_up_to_the_batches(job, cost: CostModel) -> None:
    for batches in job:
        stats = step_stats(batches, SOURCES, cost)
        lengths = np.concatenate([b.lengths for b in batches])
        assert stats.tokens == int(lengths.sum()) and stats.samples == lengths.size
        for i, source in enumerate(SOURCES):
            mine = [n for b in batches for s, n in zip(b.sources, b.lengths.tolist(), strict=True) if s == source]
            assert stats.tokens_by_source[i] == sum(mine)
        np.testing.assert_allclose(stats.rank_costs, [cost.costs(b.lengths).sum() for b in batches])
        assert 0 <= stats.fill <= 1 and 0 <= stats.naive_fill <= 1
        assert stats.imbalance >= 1 - 1e-12
        # The same samples: what naive loading packs plus what it leaves out is the step.
        assert stats.naive.tokens <= stats.tokens


def test_step_stats_refuse_a_source_the_spec_does_not_mix() -> None:
    from tests.observe_support import make_batch

    batch = make_batch(3, 0, 1, 1, 64, [("other", 5)])
    with pytest.raises(ValueError, match="step 3 rank 0 holds a sample of source 'other'"):
        step_stats([batch], SOURCES, CostModel(1.0, 1.0))


weights_rows = st.lists(st.floats(0.01, 1.0), min_size=3, max_size=3).map(lambda w: np.array(w) / sum(w))


@given(
    rows=st.lists(st.tuples(weights_rows, st.integers(0, 5000)), min_size=1, max_size=40),
    noise=st.integers(0, 2**32 - 1),
)
def test_shares_and_drift_against_the_schedule(rows, noise: int) -> None:
    weights = np.stack([w for w, _ in rows])  # (K, S)
    totals = np.array([t for _, t in rows], dtype=np.float64)
    exact = weights * totals[:, None]  # every step exactly by its schedule
    np.testing.assert_allclose(schedule_drift(exact, weights), 0, atol=1e-6)
    np.testing.assert_allclose(scheduled_tokens(exact, weights), np.cumsum(exact, axis=0), rtol=1e-9, atol=1e-6)
    # Moving tokens between sources within a step keeps the step's total and makes drift the largest move.
    rng = np.random.default_rng(noise)
    moved = rng.integers(0, 50, len(rows)).astype(np.float64)
    shifted = exact.copy()
    shifted[:, 0] += moved
    shifted[:, 1] -= moved
    drift = schedule_drift(shifted, weights)
    assert drift[0] == pytest.approx(np.cumsum(moved).max(), abs=1e-6)
    assert drift[2] == pytest.approx(0, abs=1e-6)
    shares = cumulative_shares(shifted.clip(min=0))
    started = np.cumsum(shifted.clip(min=0).sum(axis=1)) > 0
    np.testing.assert_allclose(shares[started].sum(axis=1), 1.0)


@given(
    times=st.lists(st.floats(0, 1000), min_size=2, max_size=200),
    bins=st.integers(1, 50),
    seed=st.integers(0, 2**32 - 1),
)
def test_rate_over_time_keeps_every_amount(times: list[float], bins: int, seed: int) -> None:
    amounts = np.random.default_rng(seed).integers(0, 10_000, len(times)).astype(np.float64)
    centres, rates = rate_over_time(np.array(times), amounts, bins)
    if max(times) == min(times):
        assert centres.size == 0
        return
    width = (max(times) - min(times)) / bins
    assert rates.sum() * width == pytest.approx(amounts.sum(), rel=1e-9)
    assert (np.diff(centres) > 0).all()


def synthetic_timeline(job, cost: CostModel, seed: int = 0) -> JobTimeline:
    stats = [step_stats(batches, SOURCES, cost) for batches in job]
    k = len(stats)
    rng = np.random.default_rng(seed)
    return JobTimeline(
        job="synthetic",
        sources=list(SOURCES),
        stats=stats,
        step_times=1_700_000_000 + np.cumsum(rng.random(k)),
        weights=np.tile([0.5, 0.3, 0.2], (k, 1)),
        steps_with_all_sources=k,
        backlog_times=1_700_000_000 + np.arange(k, dtype=np.float64),
        backlog=rng.integers(0, 100, (k, 3)).astype(np.float64),
    )


@settings(max_examples=3, deadline=None)
@given(job=steps(max_steps=12), cost=COSTS)
def test_plots_are_png_images_and_the_summary_links_them(tmp_path_factory, job, cost: CostModel) -> None:
    out: Path = tmp_path_factory.mktemp("report")
    timeline = synthetic_timeline(job, cost)
    series = report_series(timeline)
    images = write_plots(series, timeline, out)
    assert set(images) == {"shares", "imbalance", "fill", "throughput"}
    for path in images.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = imread(path)
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    summary = summary_markdown(series, timeline, images)
    for path in images.values():
        assert f"]({path.name})" in summary
    assert f"| steps | {len(job)} " in summary
    tokens = sum(s.tokens for s in timeline.stats)
    assert f"{tokens:,}" in summary


def test_a_job_without_steps_gets_a_summary_and_no_plots(tmp_path: Path) -> None:
    timeline = synthetic_timeline([], CostModel(1.0, 1.0))
    series = report_series(timeline)
    assert write_plots(series, timeline, tmp_path) == {}
    assert "No steps written yet." in summary_markdown(series, timeline, {})


@given(values=st.lists(st.floats(-1e6, 1e6), max_size=60), window=st.integers(1, 30))
def test_rolling_median_is_the_median_of_each_trailing_window(values: list[float], window: int) -> None:
    out = rolling_median(np.array(values), window)
    assert out.shape == (len(values),)
    for i in range(len(values)):
        assert out[i] == pytest.approx(np.median(values[max(0, i - window + 1) : i + 1]))


@settings(max_examples=3, deadline=None)
@given(job=steps(max_steps=6))
def test_drift_is_not_measured_when_a_source_ran_out_before_the_first_step(job) -> None:
    timeline = synthetic_timeline(job, CostModel(1.0, 1.0))
    timeline = replace(timeline, steps_with_all_sources=0)
    summary = summary_markdown(report_series(timeline), timeline, {})
    assert "Drift: not measured, a source ran out before the first step." in summary
    rows = [line for line in summary.splitlines() if line.startswith(tuple(f"| {s} |" for s in SOURCES))]
    assert len(rows) == len(SOURCES) and all(row.split("|")[5].strip() == "n/a" for row in rows)


@settings(max_examples=3, deadline=None)
@given(job=steps(max_steps=6))
def test_the_summary_compares_with_naive_loading_as_one_run_and_says_what_it_dropped(job) -> None:
    """Naive loading's steps: one a written step, then those for what still waits; its time, over the job's, the
    sum of all its steps' largest rank cost; samples past its backlog named."""
    cost = CostModel(1.0, 1.0)
    stream = NaiveStream(cost)
    stats = [step_stats(batches, SOURCES, cost, naive=stream) for batches in job]
    timeline = replace(synthetic_timeline(job, cost), stats=stats, naive_tail=stream.drain())
    series = report_series(timeline)
    assert series.naive_steps == len(job) + len(timeline.naive_tail)
    naive = [s.naive.rank_costs.max() for s in stats] + [t.rank_costs.max() for t in timeline.naive_tail]
    written = sum(s.rank_costs.max() for s in stats)
    if written > 0:
        assert series.naive_time == pytest.approx(sum(naive) / written)
    summary = summary_markdown(series, timeline, {})
    assert f"{series.naive_steps:,} against {len(job):,} |" in summary and "waiting past" not in summary
    dropped = summary_markdown(report_series(replace(timeline, naive_dropped=7)), timeline, {})
    assert f"and 7 samples it held waiting past {REPORT_BACKLOG_STEPS} steps, left out of its time" in dropped
