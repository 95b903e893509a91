"""`mixflow acl plan|apply|revoke --spec SPEC`: the ACLs each role of a job needs (``pipeline.kafka.acls``),
printed, created or removed with an admin's client settings."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pipeline.cli.arguments import job_name
from pipeline.cli.command import Command
from pipeline.kafka.acls import Binding, all_bindings, job_bindings
from pipeline.spec import load_spec
from topics.errors import MixflowError
from topics.kafka_settings import redacted


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
        required=True,
        help="librdkafka settings of a user allowed to alter ACLs, one key=value a line (bootstrap.servers "
        "included), e.g. <state>/secrets/admin.properties of `mixflow stack up --secure`",
    )


def _planned(args: argparse.Namespace) -> tuple[str, dict[str, list[Binding]]]:
    spec = load_spec(args.spec)
    job = args.job or spec.job
    by_key = job_bindings(job, spec.source_names, spec.kafka.principals)
    if not any(by_key.values()):
        msg = f"{args.spec}: kafka.principals names no user (sasl.username): there is no principal to grant"
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
        if listed:
            print(f"{key} ({listed[0].principal}): {len(listed)} bindings")
            for b in listed:
                print(f"  allow {b.operation.value:<16} {b.resource.value:<16} {b.pattern.value:<8} {b.name}")
    print(f"job {job}: {len(bindings)} bindings for {len({b.principal for b in bindings})} principals")
    return 0


def read_admin_config(path: Path) -> dict[str, Any]:
    """librdkafka settings from a ``key=value`` file (``#`` comments, blank lines)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        msg = f"cannot read the admin settings {path}: {exc.strerror or exc}"
        raise MixflowError(msg) from exc
    config: dict[str, Any] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith(("#", "!")):
            continue
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            msg = f"{path}:{number}: expected key=value"  # the line itself may hold a secret
            raise MixflowError(msg)
        config[key.strip()] = value.strip()
    if not config.get("bootstrap.servers"):
        msg = f"{path}: no bootstrap.servers (settings found: {', '.join(redacted(config)) or 'none'})"
        raise MixflowError(msg)
    return config


def _apply(args: argparse.Namespace) -> int:
    from pipeline.kafka.acl_admin import AclAdmin

    job, by_key = _planned(args)
    bindings = all_bindings(by_key)
    admin = AclAdmin(read_admin_config(args.admin_config))
    held = admin.granted({b.principal for b in bindings})
    missing = [b for b in bindings if b not in held]
    admin.create(missing)
    print(f"job {job}: created {len(missing)} bindings, {len(bindings) - len(missing)} were there already")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    """The planned bindings, and any other binding of the job's principals on a resource of the job's
    (one an older spec granted)."""
    from pipeline.kafka.acl_admin import AclAdmin

    job, by_key = _planned(args)
    bindings = all_bindings(by_key)
    admin = AclAdmin(read_admin_config(args.admin_config))
    held = admin.granted({b.principal for b in bindings})
    stale = [b for b in held if b.name.startswith(f"{job}.")]
    deleted = admin.delete(sorted({*bindings, *stale}))
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
        help="create the job's ACL bindings that the cluster does not hold yet",
        add_arguments=_add_admin_arguments,
        run=_apply,
    ),
    Command(
        name="revoke",
        help="delete the job's ACL bindings (those plan prints, and its principals' others on the job's resources)",
        add_arguments=_add_admin_arguments,
        run=_revoke,
    ),
)
