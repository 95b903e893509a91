"""Where a job's local files live."""

from __future__ import annotations

from pathlib import Path

JOBS_FOLDER = "jobs"


def job_folder(state_dir: Path, job: str) -> Path:
    """``<state dir>/jobs/<job>/``: a job's role logs, the spec it ran under, metrics.json, its trainer's
    records and its report, under the job's own name whatever spec file it was started from."""
    return state_dir / JOBS_FOLDER / job
