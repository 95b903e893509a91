"""A chaos run on a secured broker of its own (`mixflow chaos --secure`): each role a SCRAM user of its own with
the job's ACLs, a broker restart (which keeps the security) and role kills, then the audit: every sample exactly
once. The passwords stay in owner-only files of the run, never in its specs, logs or report."""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.spec import load_spec
from pipeline.tools.chaos import ChaosOptions, FaultKind, run_chaos
from pipeline.tools.chaos.roles import RoleKind, Supervisor
from pipeline.tools.chaos.secured import PRINCIPALS_FOLDER, principal_keys
from tests.loader_support import build_example_data, write_spec
from topics.errors import MixflowError
from topics.kafka.acls import all_bindings, job_bindings

KINDS = (FaultKind.RESTART_BROKER, FaultKind.KILL_ACTIVE_CONSTRUCTOR, FaultKind.KILL_LOADER, FaultKind.KILL_SINK)


def test_a_secured_run_refuses_a_broker_it_did_not_start(tmp_path: Path) -> None:
    options = ChaosOptions(spec=tmp_path / "spec.yaml", faults=1, seed=1, bootstrap="127.0.0.1:9", secure=True)
    with pytest.raises(MixflowError, match="secured broker of its own"):
        run_chaos(options)


def test_a_role_that_found_no_broker_while_the_run_restarted_it_is_started_again_and_reported_apart(
    tmp_path: Path,
) -> None:
    """A role started just before a broker restart gives up after its start-up probe's timeout (exit 6) when the
    broker is away longer (a secured broker on a busy machine, say): started again, as `mixflow run` does. The
    same exit with the broker never away is a failure."""
    flag = tmp_path / "unreachable-once"
    unreachable_once = (
        f"import pathlib, sys; f = pathlib.Path({str(flag)!r})\n"
        "if not f.exists():\n    f.touch(); print('mixflow load: error: no Kafka broker answers'); sys.exit(6)"
    )
    supervisor = Supervisor(tmp_path, dict(os.environ))
    supervisor.broker_away.append((time.monotonic(), None))
    role = supervisor.start("load-a-0", RoleKind.LOADER, [sys.executable, "-c", unreachable_once], finite=True)
    unreachable = [
        sys.executable,
        "-c",
        "import sys; print('mixflow load: error: no Kafka broker answers'); sys.exit(6)",
    ]
    try:
        _until(supervisor, lambda: role.done, "the supervisor did not start the role again")
        assert role.starts == 2 and supervisor.failures == []
        assert supervisor.unreachable_restarts() == {"load-a-0": 1} and supervisor.logged_errors() == {}

        supervisor.broker_away[-1] = (supervisor.broker_away[-1][0], time.monotonic())  # answered again
        later = supervisor.start("load-b-0", RoleKind.LOADER, unreachable)
        _until(supervisor, lambda: bool(supervisor.failures), "the supervisor did not report the failure")
        assert [(f.role, f.code) for f in supervisor.failures] == [(later.name, 6)]
        assert supervisor.unreachable_restarts() == {"load-a-0": 1}
    finally:
        supervisor.kill_all()


def _until(supervisor: Supervisor, done: Callable[[], bool], failing: str) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, failing
        supervisor.poll()
        time.sleep(0.05)  # child processes exiting: nothing to block on


@pytest.mark.kafka  # starts a secured broker of its own (not the session's), which it restarts
def test_a_job_on_a_secured_broker_survives_a_restart_and_kills_with_nothing_lost_or_repeated(tmp_path: Path) -> None:
    data = build_example_data(tmp_path / "data", limit=8)
    step = {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512}
    spec = write_spec(tmp_path, "chaos", "127.0.0.1:9", data, step=step)
    out = tmp_path / "chaos"
    options = ChaosOptions(
        spec=spec, faults=len(KINDS), seed=24, out=out, shadows=1, kinds=KINDS, max_lead_steps=2, secure=True
    )
    report = run_chaos(options)
    print("\n".join(report.lines()))
    assert report.ok, "\n".join(report.lines())
    assert {kind for kind, (injected, survived) in report.by_kind().items() if injected == survived} == set(KINDS)
    assert report.audit is not None and report.audit.steps > 0 and report.audit.samples == report.audit.expected

    # Every role ran as its own principal, with the ACLs `mixflow acl plan` gives the job.
    ran = load_spec(out / "spec.yaml")
    assert ran.kafka.config["security.protocol"] == "SASL_SSL"
    keys = principal_keys(ran.source_names)
    assert sorted(ran.kafka.principals) == sorted(keys)
    users = {settings["sasl.username"] for settings in ran.kafka.principals.values()}
    assert len(users) == len(keys)
    assert all_bindings(job_bindings(ran.job, ran.source_names, ran.kafka.principals))

    # The passwords: owner-only files, named by reference, found in no spec, log or report of the run.
    folder = out / PRINCIPALS_FOLDER
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    passwords = []
    for key in keys:
        reference = ran.kafka.principals[key]["sasl.password"]
        assert reference == {"file": str(folder / f"{key}.password")}
        path = Path(reference["file"])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        passwords.append(path.read_text().strip())
    shown = [p for p in out.rglob("*") if p.is_file() and p.suffix in {".yaml", ".log", ".json", ".jsonl"}]
    assert shown
    for path in shown:
        text = path.read_text(errors="replace")
        assert not any(password in text for password in passwords), f"a password is in {path}"
