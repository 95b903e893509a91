"""A chaos run on a secured broker of its own (``mixflow chaos --secure``): the broker is the secured stack of
``mixflow stack up --secure`` (SASL_SSL with SCRAM-SHA-512, ACLs enforced), so its restarts keep the security;
the run gives each role of its job a SCRAM user of its own and grants the job's ACLs before any role starts.

``<run>/principals/`` (mode 0700) holds one password file per user (0600), random for each run; the run's
specs name them as ``{file: PATH}``, never by value. The users are ``<job>-<key>`` for the keys
``loader.<source>`` (one per source), ``constructor``, ``trainer`` (the sinks) and ``operator`` (the run's own
clients: topic creation, the state and lease watches, the audit)."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.spec import JobSpec
from pipeline.tools.stack.local_broker import LocalBroker
from pipeline.tools.stack.scram_users import ensure_users
from pipeline.tools.stack.secure import SCRAM_MECHANISM, broker_security, ensure_secrets
from topics.kafka.acl_admin import AclAdmin
from topics.kafka.acls import all_bindings, job_bindings
from topics.kafka.settings import SOURCE_LOADER_PREFIX

log = logging.getLogger(__name__)

PRINCIPALS_FOLDER = "principals"
_ROLES = ("constructor", "trainer", "operator")
_PASSWORD_BYTES = 24


def secured_broker(state_dir: Path, port: int) -> LocalBroker:
    """A broker in ``state_dir`` on ``port`` secured as ``mixflow stack up --secure`` makes it, its secrets
    (CA, broker certificate, admin password) made under ``state_dir/secrets`` on first use."""
    broker = LocalBroker(state_dir, port=port)
    broker.security = broker_security(
        ensure_secrets(broker.state_dir, [broker.host], broker.bootstrap), broker.bootstrap
    )
    return broker


def principal_keys(sources: Sequence[str]) -> list[str]:
    """The ``kafka.principals`` keys a secured run gives a user: a loader per source, then the other roles."""
    return [f"{SOURCE_LOADER_PREFIX}{source}" for source in sources] + list(_ROLES)


def _write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)


@dataclass(frozen=True)
class RunPrincipals:
    """The SCRAM users of one secured run's job, by ``kafka.principals`` key, and their password files."""

    job: str
    folder: Path
    keys: tuple[str, ...]
    ca: Path

    @classmethod
    def create(cls, run_folder: Path, job: str, sources: Sequence[str], broker: LocalBroker) -> RunPrincipals:
        """A random password per user, written owner-only under ``run_folder/principals``, and the users made
        on ``broker`` with the admin's credentials."""
        assert broker.security is not None, "principals are made on a secured broker"
        folder = run_folder / PRINCIPALS_FOLDER
        folder.mkdir(mode=0o700)
        os.chmod(folder, 0o700)
        made = cls(job, folder, tuple(principal_keys(sources)), broker.security.secrets.ca)
        passwords = {}
        for key in made.keys:
            password = secrets.token_hex(_PASSWORD_BYTES)
            _write_private(made.password_file(key), password + "\n")
            passwords[made.user(key)] = password
        ensure_users(broker.security.client, passwords)
        return made

    def user(self, key: str) -> str:
        return f"{self.job}-{key}"

    def password_file(self, key: str) -> Path:
        return self.folder / f"{key}.password"

    def kafka_section(self, kafka: Mapping[str, Any]) -> dict[str, Any]:
        """The spec's ``kafka`` section with the secured listener's settings over its ``config`` and these
        principals in place of any it had."""
        config = {
            **kafka.get("config", {}),
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "ssl.ca.location": str(self.ca),
        }
        principals = {
            key: {"sasl.username": self.user(key), "sasl.password": {"file": str(self.password_file(key))}}
            for key in self.keys
        }
        return {**kafka, "config": config, "principals": principals}


def grant_job_acls(broker: LocalBroker, spec: JobSpec) -> int:
    """Create on ``broker`` the ACLs ``mixflow acl apply`` would for ``spec``'s job and principals, as the admin,
    and wait until they are in force; how many bindings."""
    assert broker.security is not None, "ACLs are granted on a secured broker"
    bindings = all_bindings(job_bindings(spec.job, spec.source_names, spec.kafka.principals, spec.step.ranks))
    admin = AclAdmin(broker.security.client)
    held = admin.granted({b.principal for b in bindings})
    admin.create([b for b in bindings if b not in held])
    log.info("job %s: %d ACL bindings for %d principals in force", spec.job, len(bindings), len(spec.kafka.principals))
    return len(bindings)
