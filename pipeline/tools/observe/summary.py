"""``mixflow report``'s Markdown summary: the key numbers of a job and links to its plots. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

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


def _part_rows(series: ReportSeries, parts: PartSeries) -> list[str]:
    """A multimodal job's rows: the balance of the vision encoder's part, the LLM's, and their total."""
    return [
        _balance_row(parts.weighing.label, parts.encoder, parts.naive_encoder),
        _balance_row("LLM", parts.llm, parts.naive_llm),
        _balance_row(parts.weighing.total_label, series.imbalance, series.naive_imbalance),
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
        "budget (`patches_per_micro_batch`) too."
    )


def summary_markdown(series: ReportSeries, timeline: JobTimeline, images: Mapping[str, Path]) -> str:
    steps = len(series.steps)
    lines = [f"# Job `{timeline.job}`", ""]
    if steps == 0:
        return "\n".join([*lines, "No steps written yet.", ""])
    tokens = int(series.tokens.sum())
    samples = sum(s.samples for s in timeline.stats)
    span = float(series.elapsed_s[-1]) if steps > 1 else 0.0
    rate = f"{(steps - 1) / span:.2f} steps/s, {tokens / span:,.0f} tokens/s" if span > 0 else "n/a (one step)"
    speedup = _median(series.naive_imbalance / series.imbalance)
    lines += [
        "| | |",
        "|---|---|",
        f"| steps | {steps} (steps {series.steps[0]}-{series.steps[-1]}) |",
        f"| samples, tokens | {samples:,}, {tokens:,} |",
        f"| throughput, first to last step | {rate} over {span:.1f} s |",
        f"| fill, mean (min) | {series.fill.mean():.1%} ({series.fill.min():.1%}) |",
        f"| largest / mean rank cost, median (worst) | {_median(series.imbalance):.3f} "
        f"({series.imbalance.max():.3f}) |",
        f"| same under naive per-rank loading | {_median(series.naive_imbalance):.3f} "
        f"({series.naive_imbalance.max():.3f}); step-time speedup {speedup:.2f}x median |",
        f"| naive loading: fill, samples that fit no micro-batch | {series.naive_fill.mean():.1%}, "
        f"{series.naive_left_out:,} |",
        *(_part_rows(series, series.parts) if series.parts is not None else []),
        "",
        "Naive per-rank loading: the step's samples in their written order, sample *i* to rank *i* mod *R*, "
        "packed first-fit into the rank's micro-batches (a sample that fits none is left out); rank costs "
        "under the spec's cost model.",
        *([_part_note(series.parts)] if series.parts is not None else []),
        "",
        "| source | tokens | share | scheduled share | largest drift (tokens) | largest backlog (records) |",
        "|---|---|---|---|---|---|",
    ]
    per_source = timeline.tokens_per_step.sum(axis=0)
    for i, source in enumerate(timeline.sources):
        backlog = int(timeline.backlog[:, i].max()) if len(timeline.backlog) else 0
        lines.append(
            f"| {source} | {int(per_source[i]):,} | {series.shares[-1, i]:.1%} | "
            f"{series.scheduled_shares[-1, i]:.1%} | {series.drift[i]:,.0f} | {backlog:,} |"
        )
    lines += [
        "",
        f"Drift: over the {timeline.steps_with_all_sources} steps before a source ran out, the largest "
        "|tokens delivered so far - tokens the schedule asks for so far|.",
        "",
    ]
    for name, path in images.items():
        lines += [f"## {name}", "", f"![{name}]({path.name})", ""]
    return "\n".join(lines)
