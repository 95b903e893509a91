"""The secured local stack: TLS and SASL/SCRAM on the client listener, a second client listener that takes TLS
client certificates instead (mTLS), TLS with client certificates on the controller listener, ACLs enforced, and
the secrets that takes, kept under the state folder.

``<state>/secrets/`` (mode 0700; every file in it 0600)::

    ca.pem ca.key      the local certificate authority (clients trust ca.pem: ``ssl.ca.location``)
    broker.pem         the brokers' key and certificate chain (Kafka's PEM key store)
    admin.password     the SCRAM password of the admin user (a super user)
    mixflow-broker.password   the SCRAM password of the brokers' own user
    admin.properties   librdkafka settings of the admin user, ready for ``--admin-config`` and ``-X``-style use
    clients/           client certificates the CA issued (``client_certs.py``): NAME.pem and NAME.key

The mTLS listener (``MTLS``, protocol SSL, ``ssl.client.auth=required``) maps a client certificate's subject
``CN=NAME`` to the principal ``User:NAME``: the principal a SCRAM user NAME has, so the same ACLs serve both. A
node's mTLS port comes after every node's client and controller ports (``node_mtls_port``).

The brokers authenticate to each other over the client listener as the SCRAM user ``mixflow-broker`` and
to the controllers with their certificate (principal ``User:CN=mixflow-broker``); both principals and the
admin are super users. Both SCRAM users are written into the metadata when the storage is formatted
(``kafka-storage format --add-scram``), so the cluster needs no unsecured moment to create them; their passwords
reach the formatting JVM in an argument file (``local_broker.py``), never on a command line.

A SCRAM session lasts at most ``SESSION_LIFETIME_S`` (``connections.max.reauth.ms``): then the client logs in
again (KIP-368; librdkafka does so on its own), so a user removed (``mixflow users remove``) loses its live
connections within that time. ACLs need no such bound: the broker checks them on every request.

The names the stack itself relies on (``RESERVED_USERS``) are never given to, or taken from, anyone else:
``mixflow users`` refuses them (``check_user_name``); a client certificate for a super user needs an explicit
flag and is valid for at most ``SUPER_USER_CERTIFICATE_DAYS``."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.tools.stack.tls import LOCAL_HOSTS, Issued, issue, key_store_pem, new_ca, subject_alternative_names
from topics.errors import MixflowError, RefusedError

ADMIN_USER = "admin"
BROKER_USER = "mixflow-broker"
BROKER_CERTIFICATE_NAME = "mixflow-broker"
SCRAM_MECHANISM = "SCRAM-SHA-512"
SECRETS = "secrets"
CLIENT_LISTENER = "SASL_SSL"
MTLS_LISTENER = "MTLS"
CERTIFICATE_PRINCIPAL_RULES = "RULE:^CN=([^,]+)$/$1/,RULE:^CN=([^,]+),.*$/$1/,DEFAULT"
"""Kafka's ``ssl.principal.mapping.rules`` of the mTLS listener: ``CN=NAME`` (first in the subject) is ``User:NAME``."""
SESSION_LIFETIME_S = 60
"""How long a SCRAM login lasts before the broker wants it made again (``connections.max.reauth.ms``): the bound on
how long a removed user's open connections keep working."""
SUPER_USERS = (ADMIN_USER, BROKER_USER)
"""The SCRAM users (and certificate names, ``CN=NAME``) the broker takes as super users."""
ANONYMOUS_USER = "ANONYMOUS"
RESERVED_USERS = frozenset({*SUPER_USERS, ANONYMOUS_USER})
"""Names ``mixflow users add`` and ``remove`` refuse: the stack's own users, and ``ANONYMOUS`` (the principal
Kafka gives a client that did not authenticate: a user of that name would share its ACLs)."""
CLIENT_CERTIFICATE_DAYS = 365
"""How long a client certificate is valid by default."""
SUPER_USER_CERTIFICATE_DAYS = 1
"""The longest validity of a client certificate for a super user: nothing can revoke one (the broker checks no
revocation list), so it expires soon."""
_PASSWORD_BYTES = 24
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"


def check_user_name(name: str, action: str) -> str:
    """``name``, when ``mixflow users`` may ``action`` it ("add", "remove"); ``RefusedError`` for a name the stack
    relies on, or one written as a distinguished name (``CN=...``, which Kafka could take as a certificate's
    principal)."""
    if name in RESERVED_USERS:
        what = (
            f"the secured stack relies on it ({ADMIN_USER!r} is its admin, {BROKER_USER!r} the brokers' own user)"
            if name in SUPER_USERS
            else "it is the principal Kafka gives every client that did not authenticate"
        )
        msg = f"cannot {action} user {name!r}: {what}; reserved: {', '.join(sorted(RESERVED_USERS))}"
        raise RefusedError(msg)
    if "=" in name or "," in name:
        msg = f"cannot {action} user {name!r}: '=' and ',' make it read as a certificate's distinguished name"
        raise RefusedError(msg)
    return name


def node_mtls_port(base_port: int, brokers: int = 1, node_id: int = 1) -> int:
    """The mTLS port of node ``node_id`` of ``brokers`` whose first client port is ``base_port``: after every
    node's client and controller ports (a single broker: its client port + 2)."""
    return base_port + 2 * brokers + node_id - 1


def secrets_dir(state_dir: Path) -> Path:
    return state_dir / SECRETS


def is_secured(state_dir: Path) -> bool:
    """Whether the stack of ``state_dir`` was made secured (its secrets are there)."""
    return secrets_dir(state_dir).is_dir()


def require_same_security(state_dir: Path, *, secure: bool, holds_stack: bool) -> None:
    """``RefusedError`` when ``state_dir`` holds a stack made the other way (plaintext asked of a secured one,
    or secured of a plaintext one): its data would be served unsecured, or its clients locked out."""
    if not holds_stack or secure == is_secured(state_dir):
        return
    made, asked = ("secured", "a plaintext") if not secure else ("plaintext", "a secured")
    hint = "add --secure" if not secure else "leave out --secure"
    msg = (
        f"{state_dir} holds a {made} stack; it cannot be started as {asked} one: {hint}, or use another "
        "--state-dir (or `mixflow stack down --wipe` it to start afresh)"
    )
    raise RefusedError(msg)


@dataclass(frozen=True)
class StackSecrets:
    """The secrets of one secured stack, by path; reading them is left to whoever needs a value."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def key_store(self) -> Path:
        return self.folder / "broker.pem"

    def password_file(self, user: str) -> Path:
        return self.folder / f"{user}.password"

    @property
    def admin_properties(self) -> Path:
        return self.folder / "admin.properties"

    def password(self, user: str) -> str:
        return self.password_file(user).read_text().strip()

    def admin_client_config(self, bootstrap: str) -> dict[str, str]:
        """librdkafka settings of the admin user for ``bootstrap``."""
        return {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": ADMIN_USER,
            "sasl.password": self.password(ADMIN_USER),
            "ssl.ca.location": str(self.ca),
        }

    def describe(self) -> list[str]:
        """Where the secrets are, for ``stack up`` and ``stack status``: paths only, never a secret."""
        return [
            f"secured: SASL_SSL with {SCRAM_MECHANISM}, ACLs enforced; super user {ADMIN_USER!r}",
            f"admin client settings: {self.admin_properties}",
            f"CA certificate: {self.ca}",
        ]

    @property
    def clients(self) -> Path:
        """The client certificates the CA issued (``client_certs.py``)."""
        return self.folder / "clients"


@dataclass(frozen=True)
class BrokerSecurity:
    """What a secured broker changes: its server properties (with ``{host}``, ``{port}`` and
    ``{controller_port}`` fields, filled in per node), the options that format its storage, and the
    settings of a client that may ask it for metadata."""

    overrides: Mapping[str, str]
    format_arguments: Sequence[str]
    client: Mapping[str, str]
    secrets: StackSecrets

    def redact(self, text: str) -> str:
        """``text`` (a tool's output, say) with every password of the stack replaced by ``***``."""
        for user in (ADMIN_USER, BROKER_USER):
            text = text.replace(self.secrets.password(user), "***")
        return text


def write_private(path: Path, data: bytes | str) -> None:
    """Write ``path`` readable and writable by its owner only, from its creation on."""
    payload = data.encode() if isinstance(data, str) else data
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(payload)
    os.chmod(path, 0o600)


def _broker_hosts(hosts: Sequence[str]) -> list[str]:
    return list(dict.fromkeys([*hosts, *LOCAL_HOSTS]))


def _certificate_covers(key_store: Path, hosts: Sequence[str]) -> bool:
    from cryptography import x509

    try:
        certificate = x509.load_pem_x509_certificate(key_store.read_bytes())
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    return all(name in list(names) for name in subject_alternative_names(hosts))


def ensure_secrets(state_dir: Path, hosts: Sequence[str], bootstrap: str) -> StackSecrets:
    """The stack's secrets, made on first use and reused afterwards (a new broker certificate only when the
    one there does not cover ``hosts``); ``admin.properties`` names ``bootstrap``."""
    stack = StackSecrets(secrets_dir(state_dir))
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)  # the broker's properties name its SCRAM password
    stack.folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(stack.folder, 0o700)
    if stack.ca.exists() and stack.ca_key.exists():
        ca = Issued.from_pem(stack.ca_key.read_bytes(), stack.ca.read_bytes())
    else:
        ca = new_ca()
        write_private(stack.ca_key, ca.key_pem())
        write_private(stack.ca, ca.certificate_pem())
    names = _broker_hosts(hosts)
    if not _certificate_covers(stack.key_store, names):
        write_private(stack.key_store, key_store_pem(issue(ca, BROKER_CERTIFICATE_NAME, names), ca))
    for user in (ADMIN_USER, BROKER_USER):
        if not stack.password_file(user).exists():
            write_private(stack.password_file(user), secrets.token_hex(_PASSWORD_BYTES) + "\n")
    write_private(stack.admin_properties, client_properties_text(stack.admin_client_config(bootstrap)))
    return stack


def client_properties_text(config: Mapping[str, str]) -> str:
    """librdkafka settings as a properties file (``key=value`` lines), as ``read_client_properties`` reads."""
    return "".join(f"{key}={value}\n" for key, value in config.items())


def read_client_properties(path: Path) -> dict[str, str]:
    """librdkafka settings from a properties file: ``key=value`` lines; blank lines and ``#`` comments skipped."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError as exc:
        msg = f"no Kafka client settings file at {path}"
        raise MixflowError(msg) from exc
    config = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, equals, value = line.partition("=")
        if not equals or not key.strip():
            msg = f"{path}:{number}: expected key=value (a librdkafka setting)"
            raise MixflowError(msg)
        config[key.strip()] = value.strip()
    return config


def recorded_security(state_dir: Path, bootstrap: str) -> BrokerSecurity | None:
    """The security of the stack in ``state_dir`` as its secrets say (None for a plaintext one): what every
    start of a secured stack's broker, a node of it included, must use again."""
    return broker_security(StackSecrets(secrets_dir(state_dir)), bootstrap) if is_secured(state_dir) else None


def broker_security(stack: StackSecrets, bootstrap: str) -> BrokerSecurity:
    """The secured broker's properties over ``server.properties``, the SCRAM users its storage is formatted
    with, and the admin's client settings."""
    broker_password = stack.password(BROKER_USER)
    overrides = {
        "listeners": (
            f"{CLIENT_LISTENER}://{{host}}:{{port}},CONTROLLER://{{host}}:{{controller_port}},"
            f"{MTLS_LISTENER}://{{host}}:{{mtls_port}}"
        ),
        "advertised.listeners": f"{CLIENT_LISTENER}://{{host}}:{{port}},{MTLS_LISTENER}://{{host}}:{{mtls_port}}",
        "listener.security.protocol.map": f"CONTROLLER:SSL,{CLIENT_LISTENER}:SASL_SSL,{MTLS_LISTENER}:SSL",
        "inter.broker.listener.name": CLIENT_LISTENER,
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        f"listener.name.{CLIENT_LISTENER.lower()}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
            f'{_SCRAM_LOGIN} required username="{BROKER_USER}" password="{broker_password}";'
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(stack.key_store),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(stack.ca),
        # Only the nodes themselves reach the controllers: each shows its certificate.
        "listener.name.controller.ssl.client.auth": "required",
        f"listener.name.{MTLS_LISTENER.lower()}.ssl.client.auth": "required",
        f"listener.name.{MTLS_LISTENER.lower()}.ssl.principal.mapping.rules": CERTIFICATE_PRINCIPAL_RULES,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{ADMIN_USER};User:{BROKER_USER};User:CN={BROKER_CERTIFICATE_NAME}",
        # A SCRAM login lasts this long, then is made again: a removed user's connections end within it.
        "connections.max.reauth.ms": str(SESSION_LIFETIME_S * 1000),
    }
    format_arguments = []
    for user in (ADMIN_USER, BROKER_USER):
        format_arguments += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={stack.password(user)}]"]
    return BrokerSecurity(overrides, tuple(format_arguments), stack.admin_client_config(bootstrap), stack)
