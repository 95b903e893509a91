"""Client certificates of a secured stack, issued by its local CA (``tls.issue``, the one signing path) for the
mTLS listener: a certificate with the subject ``CN=NAME`` authenticates there as ``User:NAME``, the principal
a SCRAM user NAME has, so ``kafka.principals`` and ``mixflow acl`` serve either mechanism alike.

Written under ``<state>/secrets/clients/`` (mode 0700, each file 0600): ``NAME.pem`` (the certificate) and
``NAME.key`` (its private key, PKCS#8 PEM, encrypted when a password is given). A certificate cannot be taken
back (the broker checks no revocation list): a short validity (``days``) and the principal's ACLs
(``mixflow acl revoke``) are what limit one that leaked. A super user's (``admin``) has no ACLs to revoke: it is
issued only when asked for as such (``super_user``), for at most ``SUPER_USER_CERTIFICATE_DAYS``; the stack's
other reserved names (``secure.RESERVED_USERS``) get none."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.tools.stack.secure import (
    ADMIN_USER,
    CLIENT_CERTIFICATE_DAYS,
    SUPER_USER_CERTIFICATE_DAYS,
    StackSecrets,
    check_user_name,
    secrets_dir,
    write_private,
)
from pipeline.tools.stack.tls import Issued, issue
from topics.errors import MixflowError, NotFoundError, RefusedError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A user name that is a file name as it is and needs no escaping in a certificate's subject."""


@dataclass(frozen=True)
class ClientCertificate:
    """Where one client's certificate and key are, and until when the certificate is valid."""

    name: str
    certificate: Path
    key: Path
    not_after: datetime.datetime

    @property
    def principal(self) -> str:
        return f"User:{self.name}"


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        msg = (
            f"{name!r} cannot name a client certificate: letters, digits, '.', '_' and '-' (not first), "
            "at most 128 characters"
        )
        raise MixflowError(msg)
    return name


def certificate_days(name: str, days: int | None, *, super_user: bool) -> int:
    """How long ``name``'s certificate is valid: ``days``, or by default ``CLIENT_CERTIFICATE_DAYS`` (a super
    user's: ``SUPER_USER_CERTIFICATE_DAYS``). ``RefusedError`` for a name the stack keeps to itself, a super
    user's name without ``super_user`` (or ``super_user`` for another name), a super user's longer than
    ``SUPER_USER_CERTIFICATE_DAYS``."""
    if super_user != (name == ADMIN_USER):
        msg = (
            f"{name!r} is a super user: a certificate for it bypasses every ACL and cannot be revoked; issue one "
            f"only with --super-user (valid {SUPER_USER_CERTIFICATE_DAYS} day at most)"
            if name == ADMIN_USER
            else f"--super-user issues a certificate for {ADMIN_USER!r} only, not {name!r}"
        )
        raise RefusedError(msg)
    if name != ADMIN_USER:
        check_user_name(name, "issue a certificate for")
    if days is None:
        return SUPER_USER_CERTIFICATE_DAYS if super_user else CLIENT_CERTIFICATE_DAYS
    if days < 1:
        msg = f"a client certificate is valid for at least 1 day, not {days}"
        raise MixflowError(msg)
    if super_user and days > SUPER_USER_CERTIFICATE_DAYS:
        msg = f"a super user's certificate is valid for at most {SUPER_USER_CERTIFICATE_DAYS} day, not {days}"
        raise RefusedError(msg)
    return days


def issue_client_certificate(
    state_dir: Path,
    name: str,
    *,
    days: int | None = None,
    key_password: str | None = None,
    not_before: datetime.datetime | None = None,
    super_user: bool = False,
) -> ClientCertificate:
    """Issue ``name`` a new client certificate signed by the CA of the secured stack in ``state_dir`` (a
    certificate issued before under that name is replaced, not revoked), valid ``certificate_days``;
    ``NotFoundError`` when the folder holds no secured stack's CA."""
    days = certificate_days(check_name(name), days, super_user=super_user)
    stack = StackSecrets(secrets_dir(state_dir))
    if not (stack.ca.is_file() and stack.ca_key.is_file()):
        msg = f"no secured stack's CA in {stack.folder}: make one with `mixflow stack up --secure` (or `stack secrets`)"
        raise NotFoundError(msg)
    ca = Issued.from_pem(stack.ca_key.read_bytes(), stack.ca.read_bytes())
    issued = issue(ca, name, [], days=days, not_before=not_before)
    stack.clients.mkdir(mode=0o700, exist_ok=True)
    stack.clients.chmod(0o700)
    key = stack.clients / f"{name}.key"
    certificate = stack.clients / f"{name}.pem"
    write_private(key, issued.key_pem(key_password.encode() if key_password else None))
    write_private(certificate, issued.certificate_pem())
    return ClientCertificate(name, certificate, key, issued.certificate.not_valid_after_utc)
