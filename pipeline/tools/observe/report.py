"""``mixflow report``: a job's plots and Markdown summary, from its topics."""

from __future__ import annotations

from pathlib import Path

from pipeline.spec import JobSpec
from pipeline.tools.observe.plots import (
    CONTEXT_PARALLEL_PNG,
    FILL_PNG,
    IMBALANCE_PNG,
    SHARES_PNG,
    THROUGHPUT_PNG,
    write_plots,
)
from pipeline.tools.observe.series import report_series
from pipeline.tools.observe.summary import REPORT_MD, summary_markdown
from pipeline.tools.observe.timeline import read_timeline
from topics.errors import RefusedError
from topics.kafka.clients import KafkaConfig

REPORT_FILES = (REPORT_MD, SHARES_PNG, IMBALANCE_PNG, FILL_PNG, THROUGHPUT_PNG, CONTEXT_PARALLEL_PNG)


def write_report(config: KafkaConfig, spec: JobSpec, out: Path, job: str | None = None) -> Path:
    """Write the plots and ``report.md`` of ``job`` (the spec's by default) into ``out``; the summary's path.
    A folder holding another job's report (or report files it cannot tell the job of) is refused first."""
    check_report_folder(out, job or spec.job)
    timeline = read_timeline(config, spec, job)
    series = report_series(timeline)
    images = write_plots(series, timeline, out)
    summary = out / REPORT_MD
    summary.write_text(summary_markdown(series, timeline, images))
    return summary


def check_report_folder(out: Path, job: str) -> None:
    """``RefusedError`` when writing ``job``'s report into ``out`` would overwrite files of another job's."""
    present = [name for name in REPORT_FILES if (out / name).exists()]
    if not present:
        return
    owner = report_job(out / REPORT_MD)
    if owner != job:
        whose = f"the report of job {owner}" if owner else f"{', '.join(present)}, of no job it can tell"
        msg = f"--out {out} holds {whose}; not overwriting it with job {job}'s (give another --out)"
        raise RefusedError(msg)


def report_job(summary: Path) -> str | None:
    """The job a ``report.md`` is of (its first line), or None."""
    try:
        with summary.open(encoding="utf-8") as text:
            first = text.readline().strip()
    except (OSError, UnicodeDecodeError):
        return None
    prefix, suffix = "# Job `", "`"
    return first[len(prefix) : -len(suffix)] if first.startswith(prefix) and first.endswith(suffix) else None
