"""A chaos run on a secured broker of its own (`mixflow chaos --secure`): each role a SCRAM user of its own with
the job's ACLs, a broker restart (which keeps the security), role kills and revoked ACLs (a trainer's, a loader's,
the constructors'), then the audit: every sample exactly once. A role whose ACLs are revoked stops with exit 5
naming its principal, is no failure, and runs again once they are back. The passwords stay in owner-only files
of the run, never in its specs, logs or report."""

from __future__ import annotations

import json
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

KINDS = (
    FaultKind.RESTART_BROKER,
    FaultKind.KILL_ACTIVE_CONSTRUCTOR,
    FaultKind.KILL_LOADER,
    FaultKind.KILL_SINK,
    FaultKind.REVOKE_ACLS,
)


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
def test_a_job_on_a_secured_broker_survives_a_restart_kills_and_revoked_acls_with_nothing_lost_or_repeated(
    tmp_path: Path,
) -> None:
    data = build_example_data(tmp_path / "data", limit=8)
    step = {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512}
    spec = write_spec(tmp_path, "chaos", "127.0.0.1:9", data, step=step)
    out = tmp_path / "chaos"
    # Seed 23 revokes the ACLs of the trainer (both sinks), of a loader (loader.topics) and of the constructor
    # (the active one and its shadow), beside a fault of every other kind. Short pauses between faults and a
    # short broker outage: each fault still waits until the one before is survived, and the schedule's kinds
    # and targets do not depend on these bounds.
    options = ChaosOptions(
        spec=spec,
        faults=7,
        seed=23,
        out=out,
        shadows=1,
        kinds=KINDS,
        max_lead_steps=2,
        secure=True,
        max_revoke_s=3,
        max_pause_s=0.5,
        max_down_s=1.0,
    )
    report = run_chaos(options)
    print("\n".join(report.lines()))
    assert report.ok, "\n".join(report.lines())
    assert {kind for kind, (injected, survived) in report.by_kind().items() if injected == survived} == set(KINDS)
    assert report.audit is not None and report.audit.steps > 0 and report.audit.samples == report.audit.expected
    assert report.failures == [] and report.audit.dead_letters == 0

    # Every role whose ACLs were revoked stopped with one line naming its principal, and ran again.
    revoked = [f for f in report.injected if f.fault.kind is FaultKind.REVOKE_ACLS]
    struck = {"trainer": {"sink-0", "sink-1"}, "loader.topics": {"load-topics-0"}, "constructor": {"construct-0"}}
    struck["constructor"].add("construct-1")
    assert {f.fault.target: set(f.refused) for f in revoked} == struck
    job = report.job
    for refusal in report.refusals:
        key = next(k for k, roles in struck.items() if refusal.role in roles)
        assert f"refused User:{job}-{key} " in refusal.line and refusal.line.count("\n") == 0, refusal
        command = "chaos sink" if key == "trainer" else f"mixflow {'load' if key.startswith('loader') else 'construct'}"
        assert refusal.line.startswith(f"{command}: error: "), refusal
    body = json.loads((out / "report.json").read_text())
    assert {r["role"] for r in body["refusals"]} == set().union(*struck.values())
    assert any(line.startswith("roles stopped by revoked rights") for line in report.lines())

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
