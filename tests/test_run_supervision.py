"""The local supervisor's handling of a role's exit (``pipeline/tools/run/job.py``), on real child processes
and no broker: a role that fails is started again, up to ``MAX_RESTARTS`` times; one that keeps failing
stops the run with the end of its log; one that finishes leaves the run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.tools.run import job
from pipeline.tools.run.job import MAX_RESTARTS, RoleProcess, _start, _wait
from topics.errors import MixflowError


def _failing_role(folder: Path, name: str, failures: int) -> tuple[RoleProcess, Path]:
    """A role that exits 1 on each of its first ``failures`` starts, then 0; each start counted in a file."""
    starts = folder / f"{name}.starts"
    script = (
        "import pathlib, sys\n"
        f"p = pathlib.Path({str(starts)!r})\n"
        "n = int(p.read_text()) if p.exists() else 0\n"
        "p.write_text(str(n + 1))\n"
        "print('start', n + 1)\n"
        f"sys.exit(1 if n < {failures} else 0)\n"
    )
    return _start(name, folder, [sys.executable, "-c", script]), starts


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(failures=st.integers(min_value=0, max_value=MAX_RESTARTS + 1))
def test_a_failing_role_is_restarted_up_to_max_restarts_then_stops_the_run(
    failures: int, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job, "RESTART_BACKOFF_S", 0.0)
    folder = tmp_path_factory.mktemp("roles")
    role, starts = _failing_role(folder, "flaky", failures)
    roles = [role]
    if failures <= MAX_RESTARTS:
        _wait(roles, None)
        assert role.restarts == failures
        assert int(starts.read_text()) == failures + 1
        return
    with pytest.raises(MixflowError, match=f"flaky exited with 1 after {MAX_RESTARTS} restarts") as raised:
        _wait(roles, None)
    assert f"start {MAX_RESTARTS + 1}" in str(raised.value), "the error holds the end of the role's log"
    assert int(starts.read_text()) == MAX_RESTARTS + 1
