"""``mixflow report``'s Markdown summary: the key numbers of a job and links to its plots. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.tools.observe.history import JobHistory
from pipeline.tools.observe.series import ReportSeries

REPORT_MD = "report.md"


def _median(values: np.ndarray) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def summary_markdown(series: ReportSeries, history: JobHistory, images: Mapping[str, Path]) -> str:
    steps = len(series.steps)
    lines = [f"# Job `{history.job}`", ""]
    if steps == 0:
        return "\n".join([*lines, "No steps written yet.", ""])
    tokens = int(series.tokens.sum())
    samples = sum(s.samples for s in history.stats)
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
        "",
        "Naive per-rank loading: the step's samples in their written order, sample *i* to rank *i* mod *R*, "
        "packed first-fit into the rank's micro-batches (a sample that fits none is left out); rank costs "
        "under the spec's cost model.",
        "",
        "| source | tokens | share | scheduled share | largest drift (tokens) | largest backlog (records) |",
        "|---|---|---|---|---|---|",
    ]
    per_source = history.tokens_per_step.sum(axis=0)
    for i, source in enumerate(history.sources):
        backlog = int(history.backlog[:, i].max()) if len(history.backlog) else 0
        lines.append(
            f"| {source} | {int(per_source[i]):,} | {series.shares[-1, i]:.1%} | "
            f"{series.scheduled_shares[-1, i]:.1%} | {series.drift[i]:,.0f} | {backlog:,} |"
        )
    lines += [
        "",
        f"Drift: over the {history.steps_with_all_sources} steps before a source ran out, the largest "
        "|tokens delivered so far - tokens the schedule asks for so far|.",
        "",
    ]
    for name, path in images.items():
        lines += [f"## {name}", "", f"![{name}]({path.name})", ""]
    return "\n".join(lines)
