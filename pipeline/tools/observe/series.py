"""The series ``mixflow report`` plots and sums up, computed from a ``JobTimeline``. Pure: no Kafka, no
matplotlib."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.tools.observe.cp_summary import CPSummary, cp_summary
from pipeline.tools.observe.naive import NaiveLoading
from pipeline.tools.observe.step_stats import cumulative_shares, schedule_drift, scheduled_tokens
from pipeline.tools.observe.timeline import JobTimeline
from pipeline.tools.observe.vision_parts import EncoderWeighing


def rate_over_time(times: np.ndarray, amounts: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """``amounts`` (N,) that happened at ``times`` (N,), as a rate per second in ``bins`` equal slices of
    the span from the first time to the last: (centres, rates), each (bins,). Empty for fewer than two
    distinct times."""
    times = np.asarray(times, dtype=np.float64)
    if times.size < 2 or times.max() <= times.min():
        return np.zeros(0), np.zeros(0)
    edges = np.linspace(times.min(), times.max(), bins + 1)
    sums, _ = np.histogram(times, bins=edges, weights=np.asarray(amounts, dtype=np.float64))
    return (edges[:-1] + edges[1:]) / 2, sums / np.diff(edges)


def rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    """(N,) the median of each value and the ``window - 1`` before it (fewer at the start)."""
    values = np.asarray(values, dtype=np.float64)
    if window < 1:
        msg = f"window must be >= 1, got {window}"
        raise ValueError(msg)
    if values.size == 0:
        return values
    padded = np.concatenate([np.full(window - 1, np.nan), values])
    windows = np.lib.stride_tricks.sliding_window_view(padded, window)  # (N, window)
    return np.nanmedian(windows, axis=1)


@dataclass(frozen=True)
class PartSeries:
    """A multimodal job's per-step largest / mean rank cost of each part, as written, at the bound (the least
    any plan of the step's samples could reach) and under naive per-rank loading of the same samples (its step
    as each step is written: ``ReportSeries.naive_imbalance``), (K,) each. ``weighing``: how the encoder's part
    was weighed (and named); ``bound``: the bound of both parts together."""

    weighing: EncoderWeighing
    encoder: np.ndarray
    naive_encoder: np.ndarray
    llm: np.ndarray
    naive_llm: np.ndarray
    bound_encoder: np.ndarray
    bound_llm: np.ndarray
    bound: np.ndarray


@dataclass(frozen=True)
class ReportSeries:
    steps: np.ndarray  # (K,)
    shares: np.ndarray  # (K, S) each source's share of the tokens delivered up to each step
    scheduled_shares: np.ndarray  # (K, S) the same had every step followed the schedule exactly
    drift: np.ndarray  # (S,) largest |tokens - scheduled tokens| before a source ran out
    imbalance: np.ndarray  # (K,) largest / mean rank cost, as written
    # (K,) the same under naive per-rank loading of the job's samples as one run: its step as each step is written
    naive_imbalance: np.ndarray
    fill: np.ndarray  # (K,) tokens / capacity, as written
    naive_fill: np.ndarray  # (K,) tokens naive loading packs / capacity, its step as each step is written
    naive_steps: int  # the steps naive loading takes for the job's samples: K and those after for what still waits
    naive_time: float  # the sum of naive loading's steps' largest rank cost over the job's: its time for the samples
    naive_dropped: int  # samples naive loading held waiting past its backlog: not in its time
    elapsed_s: np.ndarray  # (K,) each step's commit time, from the first step's
    tokens: np.ndarray  # (K,) tokens of each step
    parts: PartSeries | None = None  # a multimodal job's: imbalance and naive above are of both parts together
    cp: CPSummary | None = None  # a context-parallel job's: no naive loading (NaN), its steps against static CP


def part_series(timeline: JobTimeline) -> PartSeries | None:
    if timeline.encoder is None:
        return None
    stats = timeline.stats
    return PartSeries(
        weighing=timeline.encoder,
        encoder=np.array([s.encoder_imbalance for s in stats], dtype=np.float64),
        naive_encoder=np.array([s.naive_encoder_imbalance for s in stats], dtype=np.float64),
        llm=np.array([s.llm_imbalance for s in stats], dtype=np.float64),
        naive_llm=np.array([s.naive_llm_imbalance for s in stats], dtype=np.float64),
        bound_encoder=np.array([s.encoder_bound_imbalance for s in stats], dtype=np.float64),
        bound_llm=np.array([s.llm_bound_imbalance for s in stats], dtype=np.float64),
        bound=np.array([s.bound_imbalance for s in stats], dtype=np.float64),
    )


def _naive_steps(timeline: JobTimeline) -> list[NaiveLoading]:
    """Naive loading's steps: one as each step is written, then its tail (none for a context-parallel job)."""
    return [s.naive for s in timeline.stats if s.naive is not None] + list(timeline.naive_tail)


def naive_time(timeline: JobTimeline) -> float:
    """Naive loading's time for the job's samples over the job's: the sum of its steps' largest rank cost over the
    sum of the job's steps' (NaN for none)."""
    naive = [s.rank_costs for s in _naive_steps(timeline)]
    written = math.fsum(float(s.rank_costs.max()) for s in timeline.stats)
    if not naive or written <= 0:
        return float("nan")
    return math.fsum(float(costs.max()) for costs in naive) / written


def cp_series(timeline: JobTimeline) -> CPSummary | None:
    if timeline.cp is None:
        return None
    return cp_summary([s.cp for s in timeline.stats], timeline.cp.shape.mode.value, timeline.cp.shape.size)


def report_series(timeline: JobTimeline) -> ReportSeries:
    per_step = timeline.tokens_per_step  # (K, S)
    scheduled = scheduled_tokens(per_step, timeline.weights)  # (K, S)
    full = timeline.steps_with_all_sources
    stats = timeline.stats
    start = timeline.step_times[0] if len(timeline.step_times) else 0.0
    return ReportSeries(
        steps=np.array([s.step for s in stats], dtype=np.int64),
        shares=cumulative_shares(per_step),
        scheduled_shares=scheduled / np.maximum(scheduled.sum(axis=1, keepdims=True), 1e-12),
        drift=schedule_drift(per_step[:full], timeline.weights[:full]),
        imbalance=np.array([s.imbalance for s in stats]),
        naive_imbalance=np.array([s.naive_imbalance for s in stats]),
        fill=np.array([s.fill for s in stats]),
        naive_fill=np.array([s.naive_fill for s in stats]),
        naive_steps=len(_naive_steps(timeline)),
        naive_time=naive_time(timeline),
        naive_dropped=timeline.naive_dropped,
        elapsed_s=timeline.step_times - start,
        tokens=np.array([s.tokens for s in stats], dtype=np.int64),
        parts=part_series(timeline),
        cp=cp_series(timeline),
    )
