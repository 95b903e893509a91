"""``mixflow report``'s Markdown summary: the key numbers of a job and links to its plots. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.tools.observe.cp_summary import STEP_COLUMNS, CPStepRow, CPSummary
from pipeline.tools.observe.naive import REPORT_BACKLOG_STEPS
from pipeline.tools.observe.series import PartSeries, ReportSeries
from pipeline.tools.observe.step_stats import HIGH_PERCENTILE, median_and_high
from pipeline.tools.observe.timeline import JobTimeline

REPORT_MD = "report.md"


def _median(values: np.ndarray) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def _balance_row(label: str, balanced: np.ndarray, naive: np.ndarray) -> str:
    median, high = median_and_high(balanced)
    naive_median, naive_high = median_and_high(naive)
    return (
        f"| {label}: largest / mean rank cost, median (p{HIGH_PERCENTILE}) | {median:.3f} ({high:.3f}); "
        f"naive per-rank loading {naive_median:.3f} ({naive_high:.3f}) |"
    )


def _part_row(label: str, balanced: np.ndarray, bound: np.ndarray, naive: np.ndarray) -> str:
    median, high = median_and_high(balanced)
    bound_median, bound_high = median_and_high(bound)
    over_median, over_high = median_and_high(balanced / bound)
    naive_median, naive_high = median_and_high(naive)
    return (
        f"| {label}: largest / mean rank cost, median (p{HIGH_PERCENTILE}) | {median:.3f} ({high:.3f}); "
        f"bound {bound_median:.3f} ({bound_high:.3f}), planned over it {over_median:.3f} ({over_high:.3f}); "
        f"naive per-rank loading {naive_median:.3f} ({naive_high:.3f}) |"
    )


def _part_rows(series: ReportSeries, parts: PartSeries) -> list[str]:
    """A multimodal job's rows: the balance of the vision encoder's part, the LLM's, and their total, each
    against its bound and naive per-rank loading."""
    return [
        _part_row(parts.weighing.label, parts.encoder, parts.bound_encoder, parts.naive_encoder),
        _part_row("LLM", parts.llm, parts.bound_llm, parts.naive_llm),
        _part_row(parts.weighing.total_label, series.imbalance, parts.bound, series.naive_imbalance),
    ]


def _part_note(parts: PartSeries) -> str:
    if parts.weighing.in_total:
        weighed = (
            "is its samples' cost in the LLM (text and placeholder tokens) plus their cost in the vision encoder "
            "(per image or clip of *n* patches, alpha n^2 + beta n + gamma: `cost.vision`)"
        )
    else:
        weighed = (
            "is its samples' cost in the LLM (text and placeholder tokens): the spec has no `cost.vision`, so the "
            "vision encoder's part counts patches and is left out of it"
        )
    return (
        f"With images and clips, a rank's cost {weighed}; naive loading fills each micro-batch under its patch "
        "budget (`patches_per_micro_batch`) too. " + BOUND_NOTE
    )


BOUND_NOTE = (
    "A part's bound is, per step, the least largest rank cost of that part any plan of the step's samples could "
    "reach on its ranks and micro-batches, over the mean: no plan of those samples does better "
    "(`largest_rank_bound`: the mean; the costliest samples, some of which must share a rank; what a rank must hold "
    "that the other ranks have no room for; what a rank cramped by a sample that fills its micro-batch cannot "
    "hold; what ranks crowded by several such samples leave to the others). Planned over it is each step's figure "
    "over its bound: at 1.000 the plan is the best those samples allow; above it, the plan is at most that far from "
    "the best. Each part's bound is of that part alone: the scheduler balances both together first, then evens out "
    "each part as far as that allows."
)


def _balance_rows(series: ReportSeries) -> list[str]:
    """The balance against naive per-rank loading, and its note."""
    return [
        f"| largest / mean rank cost, median (worst) | {_median(series.imbalance):.3f} "
        f"({series.imbalance.max():.3f}) |",
        f"| same under naive per-rank loading | {_median(series.naive_imbalance):.3f} "
        f"({series.naive_imbalance.max():.3f}); its time for the same samples {series.naive_time:.2f}x |",
        f"| naive loading: fill, steps for the same samples | {series.naive_fill.mean():.1%}, "
        f"{series.naive_steps:,} against {series.fill.size:,}{_dropped(series.naive_dropped)} |",
        *(_part_rows(series, series.parts) if series.parts is not None else []),
        "",
        NAIVE_NOTE,
        *([_part_note(series.parts)] if series.parts is not None else []),
    ]


def _dropped(samples: int) -> str:
    if not samples:
        return ""
    return f" and {samples:,} samples it held waiting past {REPORT_BACKLOG_STEPS} steps, left out of its time"


NAIVE_NOTE = (
    "Naive per-rank loading: the job's samples in their written order, sample *i* to rank *i* mod *R*, each rank "
    "packing first-fit into its micro-batches what it holds waiting, then its new samples; a sample that fits none "
    "waits for its rank's next step. Its figures are of its step as each step is written; it may need steps more "
    "for what still waits at the end, which count in its time: the sum of its steps' largest rank cost over the "
    "job's, how much longer naive loading takes for the same samples. Rank costs under the spec's cost model."
)


CP_NOTE = (
    "Context parallelism: a rank's time is its slices' seconds under the spec's cost (`cost.context_parallel`: "
    "compute and the ring traffic it cannot hide); a step's time is the slowest rank's, each running its "
    "micro-batches in turn and a block's ranks starting one together; the lower bound is the least time any "
    "plan of the step's samples in the job's mode can take; static CP plans the same samples on blocks of one "
    "size, the smallest power of two whose slices of the step's longest sample fit a rank's micro-batch (the "
    "planner's own "
    "functions: `CPPlan.step_time`, `lower_bound`, `static_shape` and `plan_cp_step`)."
)
CP_STEPS_SHOWN = 100
"""Steps in the per-step table of a context-parallel job; past it, those farthest over the lower bound."""


def _cp_rows(cp: CPSummary, imbalance: np.ndarray) -> list[str]:
    """A context-parallel job's rows: its ranks' balance, its blocks and micro-batches, its step times; the note."""
    return [
        f"| largest / mean rank time, median (worst) | {_median(imbalance):.3f} ({imbalance.max():.3f}) |",
        *(f"| {what} | {value} |" for what, value in cp.pairs()),
        "",
        CP_NOTE,
    ]


def _cp_step_table(timeline: JobTimeline) -> list[str]:
    stats = [s for s in timeline.stats if s.cp is not None]
    shown = stats
    title = "## Context parallelism by step"
    if len(stats) > CP_STEPS_SHOWN:
        worst = sorted(stats, key=lambda s: s.cp.over_bound if s.cp is not None else 0.0)[-CP_STEPS_SHOWN:]
        shown = sorted(worst, key=lambda s: s.step)
        title += f" (the {CP_STEPS_SHOWN} of {len(stats)} steps farthest over the lower bound)"
    rows = [f"| {' | '.join(CPStepRow.of(s.step, s.cp).cells())} |" for s in shown if s.cp is not None]
    return [
        title,
        "",
        f"| {' | '.join(STEP_COLUMNS)} |",
        "|" + "---|" * len(STEP_COLUMNS),
        *rows,
        "",
    ]


def summary_markdown(series: ReportSeries, timeline: JobTimeline, images: Mapping[str, Path]) -> str:
    steps = len(series.steps)
    lines = [f"# Job `{timeline.job}`", ""]
    if steps == 0:
        return "\n".join([*lines, "No steps written yet.", ""])
    tokens = int(series.tokens.sum())
    samples = sum(s.samples for s in timeline.stats)
    span = float(series.elapsed_s[-1]) if steps > 1 else 0.0
    rate = f"{(steps - 1) / span:.2f} steps/s, {tokens / span:,.0f} tokens/s" if span > 0 else "n/a (one step)"
    lines += [
        "| | |",
        "|---|---|",
        f"| steps | {steps} (steps {series.steps[0]}-{series.steps[-1]}) |",
        f"| samples, tokens | {samples:,}, {tokens:,} |",
        f"| throughput, first to last step | {rate} over {span:.1f} s |",
        f"| fill, mean (min) | {series.fill.mean():.1%} ({series.fill.min():.1%}) |",
        *(_balance_rows(series) if series.cp is None else _cp_rows(series.cp, series.imbalance)),
        "",
        "| source | tokens | share | scheduled share | largest drift (tokens) | largest backlog (records) |",
        "|---|---|---|---|---|---|",
    ]
    per_source = timeline.tokens_per_step.sum(axis=0)
    measured = timeline.steps_with_all_sources > 0
    drift = [f"{d:,.0f}" if measured else "n/a" for d in series.drift]
    for i, source in enumerate(timeline.sources):
        backlog = int(timeline.backlog[:, i].max()) if len(timeline.backlog) else 0
        lines.append(
            f"| {source} | {int(per_source[i]):,} | {series.shares[-1, i]:.1%} | "
            f"{series.scheduled_shares[-1, i]:.1%} | {drift[i]} | {backlog:,} |"
        )
    lines += [
        "",
        _drift_note(timeline.steps_with_all_sources),
        "",
    ]
    if series.cp is not None:
        lines += _cp_step_table(timeline)
    for name, path in images.items():
        lines += [f"## {name}", "", f"![{name}]({path.name})", ""]
    return "\n".join(lines)


def _drift_note(steps_with_all_sources: int) -> str:
    if steps_with_all_sources == 0:
        return "Drift: not measured, a source ran out before the first step."
    return (
        f"Drift: over the {steps_with_all_sources} steps before a source ran out, the largest "
        "|tokens delivered so far - tokens the schedule asks for so far|."
    )
