"""``mixflow report``'s PNG plots, drawn with matplotlib's object API on the Agg canvas (no display, no
pyplot state shared between calls)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pipeline.tools.observe.series import ReportSeries, rate_over_time, rolling_median
from pipeline.tools.observe.timeline import JobTimeline

DPI = 100
THROUGHPUT_BINS = 60
MEDIAN_STEPS = 25  # the per-step lines are noisy: each is drawn faint, with its rolling median

SHARES_PNG = "shares.png"
IMBALANCE_PNG = "imbalance.png"
FILL_PNG = "fill.png"
THROUGHPUT_PNG = "throughput.png"
CONTEXT_PARALLEL_PNG = "context-parallel.png"


def _save(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    return path


def _per_step(ax: Axes, steps: np.ndarray, values: np.ndarray, label: str) -> None:
    (line,) = ax.plot(steps, values, linewidth=0.6, alpha=0.35)
    ax.plot(
        steps,
        rolling_median(values, MEDIAN_STEPS),
        color=line.get_color(),
        label=f"{label} ({MEDIAN_STEPS}-step median)",
    )


def plot_shares(series: ReportSeries, timeline: JobTimeline, path: Path) -> Path:
    figure = Figure(figsize=(8, 4.5))
    ax = figure.add_subplot()
    for i, source in enumerate(timeline.sources):
        (line,) = ax.plot(series.steps, series.shares[:, i], label=f"{source}")
        ax.plot(series.steps, series.scheduled_shares[:, i], linestyle="--", color=line.get_color())
    if timeline.steps_with_all_sources < len(series.steps):
        ax.axvline(timeline.steps_with_all_sources, color="grey", linestyle=":", label="a source ran out")
    ax.plot([], [], linestyle="--", color="black", label="schedule")
    ax.set(xlabel="step", ylabel="share of tokens so far", ylim=(0, 1), title=f"{timeline.job}: cumulative shares")
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    return _save(figure, path)


def _imbalance_panel(
    ax: Axes, steps: np.ndarray, balanced: np.ndarray, naive: np.ndarray | None, title: str, bound: np.ndarray | None
) -> None:
    if naive is not None:
        _per_step(ax, steps, naive, "naive per-rank loading")
    _per_step(ax, steps, balanced, "as written (balanced)")
    if bound is not None:
        _per_step(ax, steps, bound, "bound: the least any plan of the step's samples reaches")
    ax.set(xlabel="step", ylabel="largest / mean rank cost", title=title)
    ax.set_ylim(bottom=min(1.0, float(balanced.min(initial=1.0))) - 0.02)
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)


def plot_imbalance(series: ReportSeries, timeline: JobTimeline, path: Path) -> Path:
    """Per step, largest / mean rank cost as written and under naive loading; a multimodal job's in three
    panels, each with its bound: both parts together, the vision encoder's and the LLM's; a context-parallel job's
    as written only."""
    title = f"{timeline.job}: per-step imbalance (1 = every rank equally costly)"
    parts = series.parts
    if parts is None:
        figure = Figure(figsize=(8, 4.5))
        naive = series.naive_imbalance if series.cp is None else None
        _imbalance_panel(figure.add_subplot(), series.steps, series.imbalance, naive, title, None)
        return _save(figure, path)
    figure = Figure(figsize=(8, 11))
    total_ax, encoder_ax, llm_ax = figure.subplots(3, 1, sharex=True)
    total = parts.weighing.total_label
    steps = series.steps
    _imbalance_panel(total_ax, steps, series.imbalance, series.naive_imbalance, f"{title}\n{total}", parts.bound)
    _imbalance_panel(encoder_ax, steps, parts.encoder, parts.naive_encoder, parts.weighing.label, parts.bound_encoder)
    _imbalance_panel(llm_ax, steps, parts.llm, parts.naive_llm, "LLM", parts.bound_llm)
    for ax in (total_ax, encoder_ax):
        ax.set(xlabel="")
    return _save(figure, path)


def plot_fill(series: ReportSeries, timeline: JobTimeline, path: Path) -> Path:
    figure = Figure(figsize=(8, 4.5))
    ax = figure.add_subplot()
    if series.cp is None:
        _per_step(ax, series.steps, series.naive_fill, "naive per-rank loading")
    _per_step(ax, series.steps, series.fill, "as written")
    ax.set(xlabel="step", ylabel="tokens / step capacity", ylim=(0, 1.02), title=f"{timeline.job}: fill per step")
    ax.legend(loc="lower left", fontsize="small")
    ax.grid(alpha=0.3)
    return _save(figure, path)


def plot_throughput(series: ReportSeries, timeline: JobTimeline, path: Path) -> Path:
    figure = Figure(figsize=(8, 6))
    rate_ax, lag_ax = figure.subplots(2, 1, sharex=True)
    centres, rates = rate_over_time(series.elapsed_s, series.tokens, THROUGHPUT_BINS)
    rate_ax.plot(centres, rates)
    rate_ax.set(ylabel="tokens/s into the rank topics", title=f"{timeline.job}: throughput and backlog")
    rate_ax.grid(alpha=0.3)
    start = timeline.step_times[0] if len(timeline.step_times) else 0.0
    for i, source in enumerate(timeline.sources):
        lag_ax.plot(timeline.backlog_times - start, timeline.backlog[:, i], label=source)
    lag_ax.set(xlabel="seconds since the first step", ylabel="source records not yet delivered")
    lag_ax.legend(loc="best", fontsize="small")
    lag_ax.grid(alpha=0.3)
    return _save(figure, path)


def plot_context_parallel(series: ReportSeries, timeline: JobTimeline, path: Path) -> Path:
    """A context-parallel job's step times over each step's lower bound: as written, and under static context
    parallelism sized for the step's longest sample (where its ranks are whole blocks of that size)."""
    figure = Figure(figsize=(8, 4.5))
    ax = figure.add_subplot()
    steps = [s for s in timeline.stats if s.cp is not None]
    static = [(s.step, s.cp.static_s / s.cp.bound_s) for s in steps if s.cp.static_s is not None and s.cp.bound_s > 0]
    if static:
        at, ratio = (np.array(column) for column in zip(*static, strict=True))
        _per_step(ax, at, ratio, "static CP sized for the step's longest sample")
    _per_step(ax, np.array([s.step for s in steps]), np.array([s.cp.over_bound for s in steps]), "as written")
    ax.axhline(1.0, color="grey", linestyle=":", label="lower bound")
    ax.set(xlabel="step", ylabel="step time / lower bound", title=f"{timeline.job}: context-parallel step time")
    ax.set_ylim(bottom=0.98)
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    return _save(figure, path)


def write_plots(series: ReportSeries, timeline: JobTimeline, out: Path) -> dict[str, Path]:
    """Every plot, into ``out``; by name."""
    out.mkdir(parents=True, exist_ok=True)
    if len(series.steps) == 0:
        return {}
    return {
        "shares": plot_shares(series, timeline, out / SHARES_PNG),
        "imbalance": plot_imbalance(series, timeline, out / IMBALANCE_PNG),
        "fill": plot_fill(series, timeline, out / FILL_PNG),
        "throughput": plot_throughput(series, timeline, out / THROUGHPUT_PNG),
        **(
            {"context parallelism": plot_context_parallel(series, timeline, out / CONTEXT_PARALLEL_PNG)}
            if series.cp is not None
            else {}
        ),
    }
