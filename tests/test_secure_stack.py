"""The secured local stack (`mixflow stack up --secure`), its SCRAM users (`mixflow users`), and the one-line
refusals of a client a secured listener will not take: no credentials, a wrong password, an unknown user, a
CA that does not match, a certificate for another host, an expired certificate.

The broker is the session's secured one (``secure_stack`` in conftest.py); the pure parts (certificates,
the refusal reasons, the client settings files, the state folder's rules) need none."""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.tools.stack.client_certs import certificate_days
from pipeline.tools.stack.local_broker import free_port_block, override_properties
from pipeline.tools.stack.scram_users import ensure_users, list_users, remove_users
from pipeline.tools.stack.secure import (
    ADMIN_USER,
    BROKER_USER,
    CLIENT_CERTIFICATE_DAYS,
    RESERVED_USERS,
    SUPER_USER_CERTIFICATE_DAYS,
    StackSecrets,
    broker_security,
    check_user_name,
    client_properties_text,
    ensure_secrets,
    read_client_properties,
    require_same_security,
)
from pipeline.tools.stack.tls import new_ca
from tests.secure_stack import SecureStack
from topics.errors import RefusedError, SecurityRefusedError
from topics.kafka.client_refusals import refusal
from topics.kafka.cluster_probe import cluster_topics

MIXFLOW = [sys.executable, "-m", "pipeline.cli"]
REFUSED_EXIT = RefusedError.exit_code


def _mixflow(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MIXFLOW, *args], capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **(env or {})}
    )


def _write_properties(path: Path, config: dict[str, str]) -> Path:
    path.write_text(client_properties_text(config))
    return path


def _one_line_refusal(done: subprocess.CompletedProcess[str], *secrets: str) -> str:
    """The refusal's message, checked to be one line of stderr with exit code 5, no traceback, and no secret."""
    assert done.returncode == REFUSED_EXIT, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for secret in secrets:
        assert secret not in done.stdout + done.stderr
    return lines[0]


# -- pure: certificates, settings files, refusal reasons, the state folder's rules ----------------------------

_hosts = st.lists(
    st.one_of(
        st.ip_addresses(v=4).map(str),
        st.from_regex(r"[a-z][a-z0-9-]{0,12}(\.[a-z][a-z0-9-]{0,12}){0,2}", fullmatch=True),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=8)  # each example makes RSA keys
@given(hosts=_hosts)
def test_the_broker_certificate_names_every_host_clients_use(tmp_path_factory: pytest.TempPathFactory, hosts) -> None:
    state = tmp_path_factory.mktemp("state")
    secrets = ensure_secrets(state, hosts, "h:1")
    certificate = x509.load_pem_x509_certificate(secrets.key_store.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(names.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    for host in [*hosts, "localhost", "127.0.0.1"]:
        assert host in (ips if _is_ip(host) else dns), (host, dns, ips)
    ca = x509.load_pem_x509_certificate(secrets.ca.read_bytes())
    certificate.verify_directly_issued_by(ca)

    first = {path.name: path.read_bytes() for path in secrets.folder.iterdir()}
    ensure_secrets(state, hosts[:1], "h:1")
    assert secrets.key_store.read_bytes() == first["broker.pem"], "a certificate that covers the hosts was replaced"
    ensure_secrets(state, [*hosts, "added.example"], "h:1")
    assert secrets.key_store.read_bytes() != first["broker.pem"], "a new host got no new certificate"
    assert secrets.ca.read_bytes() == first["ca.pem"]
    assert secrets.password_file(ADMIN_USER).read_bytes() == first["admin.password"]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def test_secrets_are_the_owners_only(tmp_path: Path) -> None:
    secrets = ensure_secrets(tmp_path / "state", ["127.0.0.1"], "127.0.0.1:1")
    assert stat.S_IMODE(secrets.folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    files = list(secrets.folder.iterdir())
    names = {"ca.pem", "ca.key", "broker.pem", "admin.password", "mixflow-broker.password", "admin.properties"}
    assert {path.name for path in files} == names
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files), [oct(p.stat().st_mode) for p in files]
    admin = read_client_properties(secrets.admin_properties)
    assert admin["sasl.username"] == ADMIN_USER and admin["sasl.password"] == secrets.password(ADMIN_USER)
    assert admin["security.protocol"] == "SASL_SSL" and admin["sasl.mechanism"] == "SCRAM-SHA-512"
    assert admin["ssl.ca.location"] == str(secrets.ca) and admin["bootstrap.servers"] == "127.0.0.1:1"
    assert secrets.password(ADMIN_USER) != secrets.password("mixflow-broker")
    security = broker_security(secrets, "127.0.0.1:1")
    said = " ".join(security.format_arguments)
    assert secrets.password(ADMIN_USER) in said and "***" in security.redact(said)
    assert secrets.password(ADMIN_USER) not in security.redact(said)
    assert secrets.password("mixflow-broker") not in security.redact(said)


_setting = st.from_regex(r"[a-z]+(\.[a-z]+){0,3}", fullmatch=True)
_value = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=40).map(str.strip)


@given(config=st.dictionaries(_setting, _value, max_size=8))
def test_client_settings_files_read_back_as_written(tmp_path_factory: pytest.TempPathFactory, config) -> None:
    path = tmp_path_factory.mktemp("props") / "client.properties"
    assert read_client_properties(_write_properties(path, config)) == config


@given(
    user=st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True),
    password=st.text("0123456789abcdef", min_size=16, max_size=40),
    port=st.integers(1024, 65535),
)
def test_refusal_reasons_name_the_user_and_never_the_password(user: str, password: str, port: int) -> None:
    config = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user}
    config |= {"sasl.password": password, "ssl.ca.location": "/ca.pem"}
    listener = f"sasl_ssl://127.0.0.1:{port}/bootstrap"
    lines = {
        "wrong password or unknown user": f"{listener}: SASL authentication error: Authentication failed during "
        "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 307ms in state AUTH_REQ)",
        "CA this client trusts": f"{listener}: SSL handshake failed: error:0A000086:SSL routines::certificate verify "
        "failed: broker certificate could not be verified",
    }
    for expected, line in lines.items():
        reason = refusal(config, line)
        assert reason is not None and expected in reason and password not in reason
    assert f"user {user!r}" in str(refusal(config, lines["wrong password or unknown user"]))
    assert "has expired" in str(refusal(config, lines["CA this client trusts"], "certificate has expired"))
    assert refusal(config, f"{listener}: Connect to ipv4#127.0.0.1:{port} failed: Connection refused") is None


def test_a_stack_is_not_started_the_other_way(tmp_path: Path) -> None:
    plaintext = tmp_path / "plaintext"
    (plaintext / "config").mkdir(parents=True)
    (plaintext / "config" / "server.properties").write_text("process.roles=broker,controller\n")
    with pytest.raises(RefusedError, match="holds a plaintext stack; it cannot be started as a secured one"):
        require_same_security(plaintext, secure=True, holds_stack=True)
    refused = _mixflow("stack", "up", "--secure", "--state-dir", str(plaintext), "--port", "1")
    assert refused.returncode == REFUSED_EXIT and "leave out --secure" in refused.stderr
    assert not (plaintext / "secrets").exists(), "secrets were made for a plaintext stack"

    secured = tmp_path / "secured"
    ensure_secrets(secured, ["127.0.0.1"], "127.0.0.1:1")
    (secured / "config").mkdir()
    (secured / "config" / "server.properties").write_text("process.roles=broker,controller\n")
    refused = _mixflow("stack", "up", "--state-dir", str(secured), "--port", "1")
    assert refused.returncode == REFUSED_EXIT and "holds a secured stack" in refused.stderr
    assert "add --secure" in refused.stderr

    wiped = _mixflow("stack", "down", "--wipe", "--state-dir", str(secured))
    assert wiped.returncode == 0 and not secured.exists(), wiped.stderr


_ordinary_names = st.from_regex(r"[a-z][a-z0-9._-]{0,20}", fullmatch=True).filter(lambda n: n not in RESERVED_USERS)
_dn_like_names = st.from_regex(r"[A-Za-z]{1,8}[=,][A-Za-z0-9=,.-]{0,12}", fullmatch=True)


@given(name=st.sampled_from(sorted(RESERVED_USERS)) | _dn_like_names, action=st.sampled_from(["add", "remove"]))
def test_the_stacks_own_names_and_distinguished_names_are_refused(name: str, action: str) -> None:
    with pytest.raises(RefusedError, match=f"cannot {action} user {re.escape(repr(name))}"):
        check_user_name(name, action)


@given(name=_ordinary_names, action=st.sampled_from(["add", "remove"]))
def test_other_names_are_anyones(name: str, action: str) -> None:
    assert check_user_name(name, action) == name


@given(
    name=st.sampled_from(sorted(RESERVED_USERS)) | _ordinary_names,
    super_user=st.booleans(),
    days=st.none() | st.integers(1, 400),
)
def test_a_super_users_certificate_is_asked_for_and_short_lived(name: str, super_user: bool, days: int | None) -> None:
    allowed = (name == ADMIN_USER) == super_user and name not in RESERVED_USERS - {ADMIN_USER}
    allowed = allowed and not (super_user and days is not None and days > SUPER_USER_CERTIFICATE_DAYS)
    if not allowed:
        with pytest.raises(RefusedError):
            certificate_days(name, days, super_user=super_user)
        return
    default = SUPER_USER_CERTIFICATE_DAYS if super_user else CLIENT_CERTIFICATE_DAYS
    assert certificate_days(name, days, super_user=super_user) == (default if days is None else days)


def test_users_refuses_the_stacks_own_names_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = str(tmp_path / "state")
    ensure_secrets(tmp_path / "state", ["127.0.0.1"], "127.0.0.1:1")
    os.environ.setdefault("MIXFLOW_TEST_PW", "a-password")
    for args, said in (
        (["remove", ADMIN_USER], "cannot remove user 'admin': the secured stack relies on it ('admin' is its admin"),
        (["remove", "someone", BROKER_USER], "cannot remove user 'mixflow-broker': the secured stack relies on it"),
        (["add", ADMIN_USER, "--password-env", "MIXFLOW_TEST_PW"], "cannot add user 'admin'"),
        (["add", "ANONYMOUS", "--password-env", "MIXFLOW_TEST_PW"], "the principal Kafka gives every client that did"),
        (["add", "CN=admin", "--password-env", "MIXFLOW_TEST_PW"], "read as a certificate's distinguished name"),
        (["add", ADMIN_USER, "--cert", "--state-dir", state], "issue one only with --super-user (valid 1 day at most)"),
        (["add", ADMIN_USER, "--cert", "--super-user", "--days", "2", "--state-dir", state], "at most 1 day, not 2"),
        (
            ["add", BROKER_USER, "--cert", "--super-user", "--state-dir", state],
            "for 'admin' only, not 'mixflow-broker'",
        ),
        (["add", BROKER_USER, "--cert", "--state-dir", state], "cannot issue a certificate for user 'mixflow-broker'"),
    ):
        # No cluster is asked: `remove`'s admin settings file does not even exist.
        admin = ["--admin-config", str(tmp_path / "none.properties")] if args[0] == "remove" else []
        assert main(["users", *args, *admin]) == REFUSED_EXIT, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, (args, err)
    assert not (tmp_path / "state" / "secrets" / "clients").exists(), "a refused certificate was written"
    assert main(["users", "add", ADMIN_USER, "--cert", "--super-user", "--state-dir", state]) == 0
    assert "a super user's client certificate (principal User:admin)" in capsys.readouterr().out
    issued = x509.load_pem_x509_certificate((tmp_path / "state" / "secrets" / "clients" / "admin.pem").read_bytes())
    assert issued.not_valid_after_utc - issued.not_valid_before_utc <= datetime.timedelta(days=1)


def test_overrides_may_hold_the_fields_of_the_template() -> None:
    text = override_properties(
        "listeners=PLAINTEXT://{host}:{port}\nnode.id=1\n", {"listeners": "SASL_SSL://{host}:{port}"}
    )
    assert text == "listeners=SASL_SSL://{host}:{port}\nnode.id=1\n"


# -- a secured cluster of its own (first, before the session's secured broker starts) --------------------------


def _transactional_write(config: dict[str, str], topic: str) -> None:
    """Create ``topic`` (3 replicas) and commit a record to it in a transaction: the brokers' own traffic (the
    replicas' fetches, the transaction's markers) passes their secured listener."""
    admin = AdminClient(config)
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(timeout=60)
    producer = Producer({**config, "transactional.id": f"{topic}-writer"})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, b"secured")
    producer.commit_transaction(60)


@pytest.mark.kafka  # starts brokers of its own
def test_a_secured_cluster_of_three_brokers_writes_transactions_and_takes_a_node_back(tmp_path: Path) -> None:
    state, port = str(tmp_path / "cluster"), str(free_port_block(9))  # 3 nodes: client, controller and mTLS ports
    up = _mixflow("stack", "up", "--secure", "--brokers", "3", "--state-dir", state, "--port", port)
    try:
        assert up.returncode == 0, up.stderr
        secrets = StackSecrets(tmp_path / "cluster" / "secrets")
        assert f"admin client settings: {secrets.admin_properties}" in up.stdout
        admin = read_client_properties(secrets.admin_properties)
        assert admin["bootstrap.servers"] == up.stdout.strip().splitlines()[-1]
        _transactional_write(admin, "secured.before")
        assert _mixflow("stack", "stop-node", "2", "--kill", "--state-dir", state).returncode == 0
        started = _mixflow("stack", "start-node", "2", "--state-dir", state)
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 120  # a node that answers its port may not serve metadata yet
        while True:
            status = _mixflow("stack", "status", "--state-dir", state)
            if (status.returncode == 0 and "3 live in its metadata" in status.stdout) or time.monotonic() > deadline:
                break
        assert status.returncode == 0 and "3 live in its metadata" in status.stdout, status.stdout
        _transactional_write(admin, "secured.after")
        # The mTLS listener of every node, after the restart too: the admin's certificate is a super user there.
        mtls = ",".join(f"127.0.0.1:{int(port) + 6 + i}" for i in range(3))
        assert f"mTLS listener (client certificates, security.protocol SSL): {mtls}" in status.stdout
        issued = _mixflow("users", "add", ADMIN_USER, "--cert", "--super-user", "--state-dir", state)
        assert issued.returncode == 0, issued.stderr
        clients = secrets.folder / "clients"
        by_certificate = {"bootstrap.servers": mtls, "security.protocol": "SSL", "ssl.ca.location": str(secrets.ca)}
        by_certificate |= {
            "ssl.certificate.location": str(clients / "admin.pem"),
            "ssl.key.location": str(clients / "admin.key"),
        }
        _transactional_write(by_certificate, "secured.by-certificate")
    finally:
        down = _mixflow("stack", "down", "--wipe", "--state-dir", state)
    assert down.returncode == 0, down.stderr


# -- the secured broker: the stack's commands, users, refusals -------------------------------------------------


def test_status_and_a_second_up_say_where_the_secrets_are_and_no_secret(secure_stack: SecureStack) -> None:
    state = secure_stack.broker.state_dir
    password = secure_stack.secrets.password(ADMIN_USER)
    before = _files(secure_stack.secrets.folder)
    port = secure_stack.bootstrap.rpartition(":")[2]
    up = _mixflow("stack", "up", "--secure", "--state-dir", str(state), "--port", port)
    assert up.returncode == 0, up.stderr
    lines = up.stdout.strip().splitlines()
    assert lines[-1] == secure_stack.bootstrap
    assert f"admin client settings: {secure_stack.secrets.admin_properties}" in lines
    assert f"CA certificate: {secure_stack.secrets.ca}" in lines
    assert _files(secure_stack.secrets.folder) == before

    status = _mixflow("stack", "status", "--state-dir", str(state))
    assert status.returncode == 0, status.stdout + status.stderr
    assert "answering" in status.stdout and str(secure_stack.secrets.admin_properties) in status.stdout
    for done in (up, status):
        assert password not in done.stdout + done.stderr

    plaintext = _mixflow("stack", "up", "--state-dir", str(state), "--port", port)
    assert "holds a secured stack" in _one_line_refusal(plaintext, password)


def test_users_add_list_and_remove(secure_stack: SecureStack, tmp_path: Path) -> None:
    admin = _write_properties(tmp_path / "admin.properties", secure_stack.admin_config)
    user, password = f"u{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    added = _mixflow("users", "add", user, "--password-env", "NEW_PASSWORD", "--admin-config", str(admin),
                     env={"NEW_PASSWORD": password})  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert password not in added.stdout + added.stderr
    assert cluster_topics(secure_stack.client_config(user, password)) is not None  # it authenticates

    listed = _mixflow("users", "list", "--admin-config", str(admin))
    assert listed.returncode == 0, listed.stderr
    assert any(line.split() == [user, "SCRAM_SHA_512/4096"] for line in listed.stdout.splitlines()), listed.stdout

    removed = _mixflow("users", "remove", user, "--admin-config", str(admin))
    assert removed.returncode == 0, removed.stderr
    with pytest.raises(SecurityRefusedError, match=f"as user '{user}' failed: wrong password or unknown user"):
        cluster_topics(secure_stack.client_config(user, password))
    again = _mixflow("users", "remove", user, "--admin-config", str(admin))
    assert (
        again.returncode == 4
        and f"no SCRAM_SHA_512 credential at {secure_stack.bootstrap} for '{user}'" in again.stderr
    )


def test_a_user_who_is_not_an_admin_is_refused_users_and_acls_in_one_line(
    secure_stack: SecureStack, tmp_path: Path
) -> None:
    user, password = f"plain{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    ensure_users(secure_stack.admin_config, {user: password})
    settings = _write_properties(tmp_path / "plain.properties", secure_stack.client_config(user, password))
    (tmp_path / "password").write_text("a-new-password\n")
    spec = _spec(tmp_path / "job", f"t{uuid.uuid4().hex[:8]}", {})
    document = yaml.safe_load(spec.read_text())
    document["kafka"]["principals"] = {"loader": {"sasl.username": "someone", "sasl.password": {"env": "PW"}}}
    spec.write_text(yaml.safe_dump(document))
    for args, refused in (
        (["users", "add", "someone", "--password-file", str(tmp_path / "password")], "ALTER on the cluster (setting"),
        (["users", "remove", "someone"], "ALTER on the cluster (removing the SCRAM credentials of user 'someone')"),
        (["users", "list"], "DESCRIBE on the cluster (listing the SCRAM users)"),  # librdkafka aborted here
        (["acl", "apply", "--spec", str(spec)], "ALTER on the cluster (creating the ACL User:someone "),
        (["acl", "revoke", "--spec", str(spec)], "ALTER on the cluster (deleting the ACL User:someone "),
    ):
        message = _one_line_refusal(_mixflow(*args, "--admin-config", str(settings)), password)
        assert f"Kafka at {secure_stack.bootstrap} refused User:{user} {refused}" in message, message
        assert "Request(" not in message and len(message) < 400, message
    assert "someone" not in list_users(secure_stack.admin_config)


def test_ensure_users_sets_every_password_and_replaces_old_ones(secure_stack: SecureStack) -> None:
    users = {f"role{i}-{uuid.uuid4().hex[:6]}": uuid.uuid4().hex for i in range(3)}
    ensure_users(secure_stack.admin_config, users)
    for user, password in users.items():
        cluster_topics(secure_stack.client_config(user, password))
    first = next(iter(users))
    ensure_users(secure_stack.admin_config, {first: "a-new-password"})
    cluster_topics(secure_stack.client_config(first, "a-new-password"))
    with pytest.raises(SecurityRefusedError):
        cluster_topics(secure_stack.client_config(first, users[first]))
    assert set(users) <= set(list_users(secure_stack.admin_config))
    remove_users(secure_stack.admin_config, users)
    assert not set(users) & set(list_users(secure_stack.admin_config))


def _refused_add(secure_stack: SecureStack, tmp_path: Path, config: dict[str, str]) -> str:
    """`mixflow users add` as a client with ``config``: its one-line refusal, checked to have written nothing."""
    user, password = f"never{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    settings = _write_properties(tmp_path / "client.properties", config)
    (tmp_path / "password").write_text(password)
    done = _mixflow(
        "users", "add", user, "--password-file", str(tmp_path / "password"), "--admin-config", str(settings)
    )
    message = _one_line_refusal(done, password, *(config[key] for key in ("sasl.password",) if key in config))
    assert user not in list_users(secure_stack.admin_config), "a refused client created a user"
    return message


def test_a_client_without_credentials_is_refused(secure_stack: SecureStack, tmp_path: Path) -> None:
    message = _refused_add(secure_stack, tmp_path, {"bootstrap.servers": secure_stack.bootstrap})
    assert f"Kafka at {secure_stack.bootstrap} refused this client" in message
    assert "it wants TLS (and credentials), and this client has neither (security.protocol is PLAINTEXT" in message

    tls_only = {"bootstrap.servers": secure_stack.bootstrap, "security.protocol": "SSL"}
    message = _refused_add(secure_stack, tmp_path, {**tls_only, "ssl.ca.location": str(secure_stack.secrets.ca)})
    assert f"(listener ssl://{secure_stack.bootstrap})" in message
    assert "it wants SASL credentials too, and this client has none (security.protocol is SSL" in message


@pytest.mark.parametrize("who", ["a wrong password", "an unknown user"])
def test_a_wrong_password_or_an_unknown_user_is_refused(secure_stack: SecureStack, tmp_path: Path, who: str) -> None:
    user = ADMIN_USER if who == "a wrong password" else f"ghost{uuid.uuid4().hex[:6]}"
    config = secure_stack.client_config(user, "not-the-password")
    message = _refused_add(secure_stack, tmp_path, config)
    assert message.startswith(f"mixflow users: error: Kafka at {secure_stack.bootstrap} refused this client")
    assert f"(listener sasl_ssl://{secure_stack.bootstrap})" in message
    assert f"SASL/SCRAM-SHA-512 authentication as user '{user}' failed: wrong password or unknown user" in message


def test_a_ca_that_does_not_match_is_refused(secure_stack: SecureStack, tmp_path: Path) -> None:
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(new_ca("another CA").certificate_pem())
    message = _refused_add(secure_stack, tmp_path, {**secure_stack.admin_config, "ssl.ca.location": str(other_ca)})
    assert f"(listener sasl_ssl://{secure_stack.bootstrap}): TLS handshake failed" in message
    assert f"is not signed by the CA this client trusts (ssl.ca.location {other_ca})" in message


def test_a_certificate_for_another_host_is_refused(secure_stack: SecureStack, tmp_path: Path) -> None:
    config = {**secure_stack.admin_config, "bootstrap.servers": secure_stack.wrong_host_bootstrap}
    message = _refused_add(secure_stack, tmp_path, config)
    assert f"(listener sasl_ssl://{secure_stack.wrong_host_bootstrap}): TLS handshake failed" in message
    assert "the broker's certificate is for another host: its names do not include 127.0.0.1" in message


def test_an_expired_certificate_is_refused(secure_stack: SecureStack, tmp_path: Path) -> None:
    config = {**secure_stack.admin_config, "bootstrap.servers": secure_stack.expired_bootstrap}
    message = _refused_add(secure_stack, tmp_path, config)
    assert f"(listener sasl_ssl://{secure_stack.expired_bootstrap}): TLS handshake failed" in message
    assert "the broker's certificate has expired" in message


def _spec(folder: Path, job: str, kafka: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        "job": job,
        "kafka": {"config": kafka},
        "sources": [{"name": "web", "reader": "parquet", "path": str(folder), "pretokenized": True, "field": "tokens"}],
        "mixture": {"weights": {"web": 1}},
        "step": {"ranks": 2, "micro_batches": 1, "tokens_per_micro_batch": 4096},
        "cost": {"hidden_size": 4096, "num_layers": 32},
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize("who", ["a wrong password", "no credentials"])
def test_a_role_refused_by_the_cluster_says_so_before_it_starts(
    secure_stack: SecureStack, tmp_path: Path, unique_name: str, who: str
) -> None:
    admin = {key: value for key, value in secure_stack.admin_config.items() if key != "bootstrap.servers"}
    kafka = {**admin, "sasl.password": {"env": "MIXFLOW_TEST_PASSWORD"}} if who == "a wrong password" else {}
    spec = _spec(tmp_path, unique_name, kafka)
    done = _mixflow(
        "construct",
        "--spec",
        str(spec),
        "--bootstrap-servers",
        secure_stack.bootstrap,
        env={"MIXFLOW_TEST_PASSWORD": "not-the-password"},
    )
    message = _one_line_refusal(done, secure_stack.secrets.password(ADMIN_USER))
    assert message.startswith(f"mixflow construct: error: Kafka at {secure_stack.bootstrap} refused this client")
    expected = "wrong password or unknown user" if who == "a wrong password" else "this client has neither"
    assert expected in message
    assert not [topic for topic in cluster_topics(secure_stack.admin_config) if topic.startswith(unique_name)]


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (the tests sharing the stack add client folders to it) by its relative path."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}
