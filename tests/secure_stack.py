"""A secured single-node broker for tests (``mixflow stack up --secure`` as a library call), in a state folder of
the test run's own on free ports, never the session's plaintext broker. The ``secure_stack`` fixture of
``tests/conftest.py`` starts one on first use and stops it at the end.

Beside its SASL_SSL client listener and its mTLS listener (``mtls_bootstrap``: client certificates) it has two TLS
listeners whose certificates clients must refuse, signed by the same CA: ``wrong_host_bootstrap`` presents a
certificate for another host, ``expired_bootstrap`` one that has expired; and a second SASL_SSL listener,
``reauth_bootstrap``, whose logins last ``REAUTH_LISTENER_S`` instead of the stack's ``SESSION_LIFETIME_S``, for
tests of what happens when a session ends without waiting a minute for it.

Under pytest-xdist the workers share one such broker: the first to need it starts it, the others find it
(``running_secure_stack``), and the run's controller stops it at the end (``tests/conftest.py``)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from pipeline.tools.stack.client_certs import issue_client_certificate
from pipeline.tools.stack.local_broker import DEFAULT_HOST, LocalBroker, free_port_block
from pipeline.tools.stack.secure import (
    SCRAM_MECHANISM,
    SUPER_USERS,
    StackSecrets,
    broker_security,
    ensure_secrets,
    secrets_dir,
)
from pipeline.tools.stack.tls import Issued, issue, key_store_pem

WRONG_HOST = "elsewhere.invalid"
REAUTH_LISTENER_S = 2.0


@dataclass(frozen=True)
class SecureStack:
    broker: LocalBroker
    secrets: StackSecrets
    bootstrap: str
    wrong_host_bootstrap: str
    expired_bootstrap: str
    mtls_bootstrap: str
    reauth_bootstrap: str

    @property
    def admin_config(self) -> dict[str, str]:
        """The admin's librdkafka settings (a super user)."""
        return dict(self.secrets.admin_client_config(self.bootstrap))

    def client_config(self, username: str, password: str) -> dict[str, str]:
        """librdkafka settings of another SCRAM user on the secured listener."""
        return {**self.admin_config, "sasl.username": username, "sasl.password": password}

    def certificate_config(self, name: str, **issued: object) -> dict[str, str]:
        """librdkafka settings of a client on the mTLS listener with a certificate issued to ``name`` now
        (``issued``: ``issue_client_certificate``'s options)."""
        super_user = name in SUPER_USERS
        made = issue_client_certificate(self.broker.state_dir, name, super_user=super_user, **issued)  # type: ignore[arg-type]
        return {
            "bootstrap.servers": self.mtls_bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.secrets.ca),
            "ssl.certificate.location": str(made.certificate),
            "ssl.key.location": str(made.key),
        }

    def down(self) -> None:
        self.broker.down()


def _refused_certificates(secrets: StackSecrets) -> tuple[Path, Path]:
    """Key stores, signed by the stack's CA, for another host and expired (a year ago): made once."""
    wrong_host, expired = secrets.folder / "wrong-host.pem", secrets.folder / "expired.pem"
    if wrong_host.exists() and expired.exists():
        return wrong_host, expired
    ca = Issued.from_pem(secrets.ca_key.read_bytes(), secrets.ca.read_bytes())
    wrong_host.write_bytes(key_store_pem(issue(ca, WRONG_HOST, [WRONG_HOST]), ca))
    year_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=365)
    expired.write_bytes(key_store_pem(issue(ca, "mixflow-expired", [DEFAULT_HOST], days=1, not_before=year_ago), ca))
    return wrong_host, expired


def start_secure_stack(state_dir: Path, timeout_s: float = 120.0) -> SecureStack:
    """Start a secured broker in ``state_dir`` on free ports (client, controller, mTLS and the three test
    listeners)."""
    port = free_port_block(6)
    ensure_secrets(state_dir, [DEFAULT_HOST], f"{DEFAULT_HOST}:{port}")
    stack = _secure_stack(state_dir, port)
    stack.broker.up(timeout_s=timeout_s)
    (state_dir / PORT_FILE).write_text(stack.bootstrap.rpartition(":")[2])
    return stack


def running_secure_stack(state_dir: Path) -> SecureStack | None:
    """The stack ``start_secure_stack`` started in ``state_dir`` and that still runs, or None."""
    try:
        port = int((state_dir / PORT_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    stack = _secure_stack(state_dir, port)
    return stack if stack.broker.running_pid() is not None else None


PORT_FILE = "stack-port"


def _secure_stack(state_dir: Path, port: int) -> SecureStack:
    """The stack in ``state_dir`` (its secrets made already) on ``port`` and the five ports after it."""
    host = DEFAULT_HOST
    bootstrap = f"{host}:{port}"
    secrets = StackSecrets(secrets_dir(state_dir))
    wrong_host, expired = _refused_certificates(secrets)
    security = broker_security(secrets, bootstrap)
    overrides = security.overrides
    reauth = f"REAUTH://{host}:{port + 5}"
    login = f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config"
    test_listeners = {
        "listeners": f"{overrides['listeners']},WRONGHOST://{host}:{port + 3},EXPIRED://{host}:{port + 4},{reauth}",
        "advertised.listeners": f"{overrides['advertised.listeners']},{reauth}",
        "listener.security.protocol.map": f"{overrides['listener.security.protocol.map']},WRONGHOST:SSL,"
        "EXPIRED:SSL,REAUTH:SASL_SSL",
        "listener.name.wronghost.ssl.keystore.location": str(wrong_host),
        "listener.name.expired.ssl.keystore.location": str(expired),
        f"listener.name.reauth.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": overrides[login],
        f"listener.name.reauth.{SCRAM_MECHANISM.lower()}.connections.max.reauth.ms": str(int(REAUTH_LISTENER_S * 1000)),
    }
    broker = LocalBroker(state_dir, host=host, port=port, overrides=test_listeners)
    broker.security = security
    mtls = f"{host}:{broker.mtls_port}"
    return SecureStack(
        broker, secrets, bootstrap, f"{host}:{port + 3}", f"{host}:{port + 4}", mtls, f"{host}:{port + 5}"
    )
