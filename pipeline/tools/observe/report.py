"""``mixflow report``: a job's plots and Markdown summary, from its topics."""

from __future__ import annotations

from pathlib import Path

from pipeline.kafka.clients import KafkaConfig
from pipeline.spec import JobSpec
from pipeline.tools.observe.history import read_history
from pipeline.tools.observe.plots import write_plots
from pipeline.tools.observe.series import report_series
from pipeline.tools.observe.summary import REPORT_MD, summary_markdown


def write_report(config: KafkaConfig, spec: JobSpec, out: Path, job: str | None = None) -> Path:
    """Write the plots and ``report.md`` of ``job`` (the spec's by default) into ``out``; the summary's path."""
    history = read_history(config, spec, job)
    series = report_series(history)
    images = write_plots(series, history, out)
    summary = out / REPORT_MD
    summary.write_text(summary_markdown(series, history, images))
    return summary
