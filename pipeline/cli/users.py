"""`mixflow users add|remove|list`: the SCRAM-SHA-512 users of a secured cluster, through its admin API, as
the admin (``--admin-config``: the secured local stack's ``secrets/admin.properties`` by default); and
``users add NAME --cert``: a client certificate ``CN=NAME`` from the secured local stack's CA, which the stack's
mTLS listener takes as the same principal ``User:NAME`` (no cluster is asked: issuing needs the CA only).

The names the stack relies on (its admin, the brokers' own user, ``ANONYMOUS``) are refused to ``add`` and
``remove`` (exit 5): removing the admin would lock every later ``users`` and ``acl`` command out. A certificate
for the admin, a super user no ACL limits and no one can revoke, is issued only with ``--super-user``, for a
day at most."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pipeline.cli.arguments import positive_int
from pipeline.cli.command import Command
from pipeline.tools.stack.local_broker import default_state_dir
from pipeline.tools.stack.local_cluster import default_cluster_state_dir
from pipeline.tools.stack.secure import (
    ADMIN_USER,
    CLIENT_CERTIFICATE_DAYS,
    RESERVED_USERS,
    SUPER_USER_CERTIFICATE_DAYS,
    StackSecrets,
    check_user_name,
    is_secured,
    read_client_properties,
    secrets_dir,
)
from topics.errors import MixflowError, NotFoundError


def _admin_properties_defaults() -> list[Path]:
    return [
        StackSecrets(secrets_dir(folder)).admin_properties
        for folder in (default_state_dir(), default_cluster_state_dir())
    ]


def _add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin-config",
        type=Path,
        default=None,
        help="librdkafka settings (key=value lines) of a user allowed to change SCRAM credentials (default: the "
        f"secured local stack's, {' or '.join(map(str, _admin_properties_defaults()))})",
    )
    parser.add_argument("--bootstrap-servers", help="override the settings' bootstrap.servers")


def _admin_config(args: argparse.Namespace) -> dict[str, Any]:
    path = args.admin_config
    if path is None:
        path = next((found for found in _admin_properties_defaults() if found.is_file()), None)
        if path is None:
            msg = "no secured local stack here (mixflow stack up --secure): give the admin's --admin-config FILE"
            raise NotFoundError(msg)
    config: dict[str, Any] = read_client_properties(path)
    if args.bootstrap_servers:
        config["bootstrap.servers"] = args.bootstrap_servers
    if not config.get("bootstrap.servers"):
        msg = f"{path} sets no bootstrap.servers; add it there or give --bootstrap-servers"
        raise MixflowError(msg)
    return config


def _add_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the user's name (its principal is User:NAME)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--password-file", type=Path, help="read the password from this file (its first line)")
    source.add_argument("--password-env", metavar="VAR", help="read the password from this environment variable")
    source.add_argument(
        "--cert",
        action="store_true",
        help="instead of a password, issue a client certificate (CN=NAME) from the secured local stack's CA for "
        "its mTLS listener: written to secrets/clients/NAME.pem and NAME.key (owner only), their paths printed",
    )
    _add_admin_arguments(parser)
    certificate = parser.add_argument_group("with --cert")
    certificate.add_argument(
        "--days",
        type=positive_int,
        default=None,
        help=f"how long the certificate is valid (default: {CLIENT_CERTIFICATE_DAYS}; with --super-user "
        f"{SUPER_USER_CERTIFICATE_DAYS}, and no more)",
    )
    certificate.add_argument(
        "--super-user",
        action="store_true",
        help=f"issue the certificate of the super user {ADMIN_USER!r}: it bypasses every ACL and nothing can revoke "
        f"it, so it is valid {SUPER_USER_CERTIFICATE_DAYS} day at most (without this flag {ADMIN_USER!r} is "
        f"refused; {', '.join(sorted(RESERVED_USERS - {ADMIN_USER}))} always are)",
    )
    certificate.add_argument(
        "--key-password-env",
        metavar="VAR",
        help="encrypt the key with the password in this environment variable (the spec then gives ssl.key.password "
        "as {env: ...} or {file: ...})",
    )
    certificate.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"the secured stack's folder, whose CA signs (default: {default_state_dir()} or "
        f"{default_cluster_state_dir()}, whichever holds a secured stack)",
    )


def _password(args: argparse.Namespace) -> str:
    if args.password_env is not None:
        password = os.environ.get(args.password_env, "")
        where = f"${args.password_env}"
    else:
        try:
            lines = args.password_file.read_text().splitlines()
        except FileNotFoundError as exc:
            msg = f"no password file at {args.password_file}"
            raise NotFoundError(msg) from exc
        password = lines[0] if lines else ""
        where = str(args.password_file)
    if not password:
        msg = f"the password in {where} is empty (or not set)"
        raise MixflowError(msg)
    return password


def _issue(args: argparse.Namespace) -> int:
    from pipeline.tools.stack.client_certs import certificate_days, check_name, issue_client_certificate

    days = certificate_days(check_name(args.name), args.days, super_user=args.super_user)  # before the CA is read

    state_dir = args.state_dir or next(
        (folder for folder in (default_state_dir(), default_cluster_state_dir()) if is_secured(folder)), None
    )
    if state_dir is None:
        msg = "no secured local stack here (mixflow stack up --secure): give its --state-dir"
        raise NotFoundError(msg)
    key_password = None
    if args.key_password_env is not None:
        key_password = os.environ.get(args.key_password_env, "")
        if not key_password:
            msg = f"the key password in ${args.key_password_env} is empty (or not set)"
            raise MixflowError(msg)
    made = issue_client_certificate(
        state_dir, args.name, days=days, key_password=key_password, super_user=args.super_user
    )
    until = f"{made.not_after:%Y-%m-%d %H:%M} UTC"
    what = "a super user's client certificate" if args.super_user else "a client certificate"
    print(f"issued {args.name!r} {what} (principal {made.principal}), valid until {until}")
    print(f"certificate: {made.certificate}")
    print(f"key: {made.key}" + (" (encrypted)" if key_password else ""))
    return 0


def _add(args: argparse.Namespace) -> int:
    from pipeline.tools.stack.scram_users import ensure_users

    if args.cert:
        return _issue(args)
    for option in ("days", "key_password_env", "state_dir", "super_user"):
        if getattr(args, option) not in (None, False):
            msg = f"--{option.replace('_', '-')} goes with --cert only"
            raise MixflowError(msg)
    check_user_name(args.name, "add")
    config = _admin_config(args)
    ensure_users(config, {args.name: _password(args)})
    print(f"user {args.name!r} has a SCRAM-SHA-512 credential at {config['bootstrap.servers']}")
    return 0


def _add_remove_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="+", help="the users whose SCRAM credentials to remove")
    _add_admin_arguments(parser)


def _remove(args: argparse.Namespace) -> int:
    from pipeline.tools.stack.scram_users import remove_users

    for name in args.name:
        check_user_name(name, "remove")
    config = _admin_config(args)
    remove_users(config, args.name)
    print(f"removed the SCRAM-SHA-512 credentials of {', '.join(args.name)} at {config['bootstrap.servers']}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from pipeline.tools.stack.scram_users import list_users

    config = _admin_config(args)
    users = list_users(config)
    if not users:
        print(f"no SCRAM users at {config['bootstrap.servers']}")
    for user, credentials in users.items():
        print(f"{user:<40} {' '.join(credentials)}")
    return 0


ACTIONS = (
    Command(
        name="add",
        help="give a user a SCRAM-SHA-512 credential (a new user, or a new password), or with --cert a client "
        "certificate for the mTLS listener; never prints a password or a key",
        add_arguments=_add_add_arguments,
        run=_add,
    ),
    Command(
        name="remove", help="remove users' SCRAM-SHA-512 credentials", add_arguments=_add_remove_arguments, run=_remove
    ),
    Command(name="list", help="the users with SCRAM credentials", add_arguments=_add_admin_arguments, run=_list),
)
