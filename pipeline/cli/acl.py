"""`mixflow acl plan|apply|revoke --spec SPEC`: the ACLs each role of a job needs (``topics.kafka.acls``),
printed, created or removed with an admin's client settings."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pipeline.cli.arguments import job_name
from pipeline.cli.command import Command
from pipeline.spec import load_spec
from topics.errors import MixflowError, NotFoundError
from topics.kafka.acls import Binding, all_bindings, job_bindings


def _add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec (its kafka.principals)")
    parser.add_argument("--job", type=job_name, help="the job to grant, if not the spec's (a job run with --job)")


def _add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    _add_spec_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per binding instead of the table")


def _add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    _add_spec_arguments(parser)
    parser.add_argument(
        "--admin-config",
        type=Path,
        default=None,
        help="librdkafka settings (key=value lines, bootstrap.servers included) of a user allowed to alter ACLs "
        "(default: the secured local stack's secrets/admin.properties)",
    )


def _planned(args: argparse.Namespace) -> tuple[str, dict[str, list[Binding]]]:
    spec = load_spec(args.spec)
    job = args.job or spec.job
    by_key = job_bindings(job, spec.source_names, spec.kafka.principals, spec.step.ranks)
    if not any(by_key.values()):
        msg = (
            f"{args.spec}: kafka.principals names no user (sasl.username) and no client certificate "
            "(ssl.certificate.location): there is no principal to grant"
        )
        raise MixflowError(msg)
    return job, by_key


def _plan(args: argparse.Namespace) -> int:
    job, by_key = _planned(args)
    bindings = all_bindings(by_key)
    if args.json:
        for b in bindings:
            fields = {"principal": b.principal, "resource": b.resource, "pattern": b.pattern, "name": b.name}
            print(json.dumps({**fields, "operation": b.operation, "permission": "allow", "host": "*"}))
        return 0
    for key, listed in by_key.items():
        by_principal: dict[str, list[Binding]] = {}
        for b in listed:  # one principal a key, but a trainer per rank has one a rank
            by_principal.setdefault(b.principal, []).append(b)
        for principal, own in by_principal.items():
            print(f"{key} ({principal}): {len(own)} bindings")
            for b in own:
                print(f"  allow {b.operation.value:<16} {b.resource.value:<16} {b.pattern.value:<8} {b.name}")
    print(f"job {job}: {len(bindings)} bindings for {len({b.principal for b in bindings})} principals")
    return 0


def _admin_config(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.tools.stack.local_broker import default_state_dir
    from pipeline.tools.stack.local_cluster import default_cluster_state_dir
    from pipeline.tools.stack.secure import StackSecrets, read_client_properties, secrets_dir

    path = args.admin_config
    if path is None:
        defaults = [
            StackSecrets(secrets_dir(d)).admin_properties for d in (default_state_dir(), default_cluster_state_dir())
        ]
        path = next((found for found in defaults if found.is_file()), None)
        if path is None:
            msg = "no secured local stack here (mixflow stack up --secure): give the admin's --admin-config FILE"
            raise NotFoundError(msg)
    config: dict[str, Any] = read_client_properties(path)
    if not config.get("bootstrap.servers"):
        msg = f"{path} sets no bootstrap.servers"
        raise MixflowError(msg)
    return config


def _apply(args: argparse.Namespace) -> int:
    from topics.kafka.acl_admin import AclAdmin

    job, by_key = _planned(args)
    bindings = all_bindings(by_key)
    admin = AclAdmin(_admin_config(args))
    held = admin.granted({b.principal for b in bindings})
    missing = [b for b in bindings if b not in held]
    admin.create(missing)
    # What the job's principals hold on its resources beyond the plan (an older version's or spec's grants).
    stale = sorted(b for b in set(held) - set(bindings) if b.name.startswith(f"{job}."))
    removed = admin.delete(stale) if stale else 0
    there = len(bindings) - len(missing)
    print(f"job {job}: created {len(missing)} bindings, {there} were there already, removed {removed} not planned")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    """The job's bindings: those plan prints and any other of its principals on the job's resources (one an
    older spec granted). The principals' DESCRIBE on the groups ``mixflow-`` stays: it is on no job's
    resource, and another job of the same principals needs it."""
    from topics.kafka.acl_admin import AclAdmin

    job, by_key = _planned(args)
    bindings = all_bindings(by_key)
    admin = AclAdmin(_admin_config(args))
    held = admin.granted({b.principal for b in bindings})
    ours = sorted({b for b in [*bindings, *held] if b.name.startswith(f"{job}.")})
    deleted = admin.delete(ours)
    print(f"job {job}: deleted {deleted} bindings")
    return 0


ACTIONS = (
    Command(
        name="plan",
        help="print the ACL bindings each role's principal needs (a dry run; no cluster needed)",
        add_arguments=_add_plan_arguments,
        run=_plan,
    ),
    Command(
        name="apply",
        help="create the job's ACL bindings that the cluster does not hold yet, and remove those its principals hold "
        "on the job's resources beyond them",
        add_arguments=_add_admin_arguments,
        run=_apply,
    ),
    Command(
        name="revoke",
        help="delete the job's ACL bindings: those on its resources that plan prints, and its principals' others there",
        add_arguments=_add_admin_arguments,
        run=_revoke,
    ),
)
