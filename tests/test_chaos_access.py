"""The chaos suite's revoked rights, without a broker: the schedule draws `revoke-acls` and `revoke-storage-key`
only where a run has something to revoke, within their bounds; the supervisor takes a role that stops with exit 5
naming the revoked rights for a refusal (held until they are back, then started again), and any other exit 5 for
a failure; the run's specs give the loaders the run's own storage key."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pipeline.tools.chaos import FaultKind, Targets, plan_faults
from pipeline.tools.chaos.access import StorageKey, revocable_principals, role_prefix
from pipeline.tools.chaos.object_store import ChaosObjectStore
from pipeline.tools.chaos.roles import RoleKind, Supervisor
from pipeline.tools.chaos.schedule import ACCESS_KINDS, OBJECT_STORE_KINDS
from pipeline.tools.chaos.secured import principal_keys
from pipeline.tools.stack.object_store import LocalObjectStore

LOADERS = ("load-code-0", "load-docs-0", "load-docs-1")
SINKS = ("sink-0", "sink-1")
PRINCIPALS = revocable_principals(principal_keys(["code", "docs"]))


@given(
    seed=st.integers(0, 2**32),
    count=st.integers(0, 40),
    secured=st.booleans(),
    storage_key=st.booleans(),
    max_revoke_s=st.floats(0.5, 20),
)
def test_revoked_rights_are_drawn_only_where_the_run_has_them_and_last_within_their_bounds(
    seed: int, count: int, secured: bool, storage_key: bool, max_revoke_s: float
) -> None:
    remote = LOADERS[1:] if storage_key else ()  # the loaders of s3:// sources
    targets = Targets(
        LOADERS,
        SINKS,
        shadows=1,
        broker=True,
        object_store=storage_key,
        principals=PRINCIPALS if secured else (),
        storage_loaders=remote,
    )
    faults = plan_faults(seed, count, targets, max_revoke_s=max_revoke_s)
    kinds = {f.kind for f in faults}
    assert (FaultKind.REVOKE_ACLS in kinds) <= secured
    assert (FaultKind.REVOKE_STORAGE_KEY in kinds) <= storage_key
    if count >= len(targets.kinds()):
        assert kinds == set(targets.kinds())
        assert (FaultKind.REVOKE_ACLS in kinds) == secured and (FaultKind.REVOKE_STORAGE_KEY in kinds) == storage_key
    for fault in (f for f in faults if f.kind in ACCESS_KINDS):
        assert min(1.0, max_revoke_s) - 1e-3 <= fault.down_s <= max_revoke_s + 1e-3
        assert f"for {fault.down_s:.1f} s at least" in fault.describe()
        if fault.kind is FaultKind.REVOKE_ACLS:
            assert fault.target in PRINCIPALS and f"revoke-acls {fault.target}," in fault.describe()
        else:  # the loader restarted if none reads the store while the key is away
            assert fault.target in remote and f"then {fault.target} restarted if no loader" in fault.describe()
    without = Targets(LOADERS, SINKS, shadows=1, broker=True, object_store=storage_key)
    assert plan_faults(seed, count, without) == plan_faults(seed, count, without, max_revoke_s=max_revoke_s)


def test_a_run_without_rights_to_revoke_says_what_each_kind_needs() -> None:
    targets = Targets(LOADERS, SINKS, shadows=1, broker=True, object_store=True)
    missing = targets.missing([FaultKind.REVOKE_ACLS, FaultKind.REVOKE_STORAGE_KEY, *OBJECT_STORE_KINDS])
    assert missing == [
        "revoke-acls needs a secured run (--secure), a principal and ACLs per role",
        "revoke-storage-key needs an object store (--object-store-dir) that the spec's s3:// sources are read from",
    ]


def test_each_principal_strikes_the_roles_that_run_as_it() -> None:
    assert PRINCIPALS == ("constructor", "loader.code", "loader.docs", "trainer")
    roles = [*LOADERS, "construct-0", "construct-1", *SINKS, "load-codex-0"]
    struck = {key: [r for r in roles if r.startswith(role_prefix(key))] for key in PRINCIPALS}
    assert struck == {
        "constructor": ["construct-0", "construct-1"],
        "loader.code": ["load-code-0"],
        "loader.docs": ["load-docs-0", "load-docs-1"],
        "trainer": ["sink-0", "sink-1"],
    }
    key = StorageKey(ChaosObjectStore(LocalObjectStore(Path("/nonexistent"), port=1), user=True), ("docs",))
    assert [r for r in roles if key.strikes(r)] == ["load-docs-0", "load-docs-1"]


def test_the_run_specs_give_every_storage_section_the_runs_own_key(tmp_path: Path) -> None:
    store = ChaosObjectStore(LocalObjectStore(tmp_path, port=7124), user=True)
    assert store.user is not None and store.user.access_key != store.store.credentials().access_key
    body = {
        "storage": {"endpoint_url": "http://127.0.0.1:7124", "profile": "prod"},
        "sources": [
            {"path": "s3://b/a", "storage": {"credentials": {"access_key_id": {"file": "k"}}}},
            {"path": "s3://b/c", "storage": {"region": "eu-west-1"}},
            {"path": "local"},
        ],
    }
    run = store.for_run(body)
    keys = {"access_key_id": {"env": "AWS_ACCESS_KEY_ID"}, "secret_access_key": {"env": "AWS_SECRET_ACCESS_KEY"}}
    assert run["storage"] == {"endpoint_url": store.proxy.endpoint, "credentials": keys}
    assert run["sources"][0]["storage"] == {"credentials": keys}
    assert run["sources"][1]["storage"] == {"region": "eu-west-1"}  # the environment's keys: the run's user's
    assert run["sources"][2] == {"path": "local"}
    environment = store.environment()
    assert (environment["AWS_ACCESS_KEY_ID"], environment["AWS_SECRET_ACCESS_KEY"]) == (
        store.user.access_key,
        store.user.secret_key,
    )


def _exiting(code: int, line: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; print({line!r}); sys.exit({code})"]


def _until(supervisor: Supervisor, done: Callable[[], bool], failing: str) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, failing
        supervisor.poll()
        time.sleep(0.05)  # child processes exiting: nothing to block on


def test_a_role_refused_its_revoked_rights_is_held_until_they_are_back_and_any_other_exit_5_fails(
    tmp_path: Path,
) -> None:
    flag = tmp_path / "refused-once"
    refused_once = (
        f"import pathlib, sys, time; f = pathlib.Path({str(flag)!r})\n"
        "if not f.exists():\n"
        "    f.touch(); print('mixflow load: error: refused User:j-loader.a READ on topic j.work.a'); sys.exit(5)\n"
        "time.sleep(60)"
    )
    supervisor = Supervisor(tmp_path, dict(os.environ))
    revocation = supervisor.revoke(
        "the ACLs of User:j-loader.a", frozenset({"load-a-0", "load-a-1", "sink-0"}), re.compile("refused User:j-")
    )
    refused = supervisor.start("load-a-0", RoleKind.LOADER, [sys.executable, "-c", refused_once])
    other_line = supervisor.start("load-a-1", RoleKind.LOADER, _exiting(5, "mixflow load: error: a bucket is gone"))
    not_struck = supervisor.start("load-b-0", RoleKind.LOADER, _exiting(5, "mixflow load: error: refused User:j-x"))
    try:
        _until(supervisor, lambda: refused.held is revocation and len(supervisor.failures) == 2, "no refusal")
        assert revocation.refused == ["load-a-0"] and refused.starts == 1
        assert sorted(f.role for f in supervisor.failures) == [other_line.name, not_struck.name]
        [refusal] = supervisor.refusals
        assert refusal.role == "load-a-0" and refusal.line.startswith("mixflow load: error: refused User:j-loader.a")
        for _ in range(10):  # held: not started again while the rights are away
            supervisor.poll()
        assert refused.starts == 1 and not refused.running

        supervisor.restore(revocation)
        _until(supervisor, lambda: refused.running, "the refused role was not started again")
        assert refused.starts == 2 and refused.held is None
        assert "load-a-0" not in supervisor.logged_errors()  # its refusal is reported apart, not as an error
        assert set(supervisor.logged_errors()) == {other_line.name, not_struck.name}

        # A process started after the rights came back that exits 5 is refused by something else: a failure.
        flag.unlink()
        supervisor.kill(refused)
        _until(supervisor, lambda: len(supervisor.failures) == 3, "a later exit 5 was not taken for a failure")
        assert supervisor.failures[-1].role == "load-a-0" and len(supervisor.refusals) == 1
    finally:
        supervisor.kill_all()
