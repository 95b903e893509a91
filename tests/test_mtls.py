"""mTLS on the secured stack: client certificates from the stack's CA (`mixflow users add NAME --cert`), the
mTLS listener that takes them as ``User:<CN>``, a job whose roles authenticate by certificate under the ACLs
`mixflow acl apply` grants, and the one-line refusals of a certificate the listener will not take.

The pure parts (issuing, principals, ports) need no broker; the rest uses the session's secured broker
(``secure_stack``)."""

from __future__ import annotations

import datetime
import os
import re
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tools.stack.client_certs import issue_client_certificate
from pipeline.tools.stack.local_cluster import ClusterLayout
from pipeline.tools.stack.secure import (
    CERTIFICATE_PRINCIPAL_RULES,
    MTLS_LISTENER,
    RESERVED_USERS,
    broker_security,
    client_properties_text,
    ensure_secrets,
    node_mtls_port,
)
from tests.loader_support import REPO, build_example_data, write_spec
from tests.secure_stack import SecureStack
from topics.errors import RefusedError
from topics.kafka.acls import job_bindings
from topics.kafka.authorization import AuthorizationError
from topics.kafka.client_refusals import refusal
from topics.kafka.cluster_probe import ClusterProbe, cluster_topics
from topics.kafka.settings import certificate_principal, client_certificate, settings_principal
from trainer_sink.dataset import KafkaBatchDataset
from trainer_sink.read_options import ReadOptions

MIXFLOW = [sys.executable, "-m", "pipeline.cli"]
ROLES = ("loader", "constructor", "trainer", "observer", "operator")
YEAR_AGO = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=365)


def _mixflow(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"} | (env or {})
    command = [*MIXFLOW, *args]
    return subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env=environ, check=False
    )


# -- pure: issuing, principals, ports ---------------------------------------------------------------------------

_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,30}", fullmatch=True).filter(lambda n: n not in RESERVED_USERS)


@settings(max_examples=5, deadline=None)  # each example makes an RSA key
@given(name=_names, days=st.integers(1, 3650))
def test_a_client_certificate_is_its_names_principal_signed_by_the_stacks_ca(
    tmp_path_factory: pytest.TempPathFactory, name: str, days: int
) -> None:
    state = tmp_path_factory.mktemp("state")
    secrets = ensure_secrets(state, ["127.0.0.1"], "127.0.0.1:1")
    made = issue_client_certificate(state, name, days=days)
    certificate = client_certificate({"ssl.certificate.location": str(made.certificate)})
    assert certificate is not None
    assert certificate_principal(certificate) == made.principal == f"User:{name}"
    certificate.verify_directly_issued_by(x509.load_pem_x509_certificate(secrets.ca.read_bytes()))
    assert certificate.not_valid_after_utc - certificate.not_valid_before_utc == datetime.timedelta(days=days)
    usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
    settings_of_role = {"ssl.certificate.location": str(made.certificate), "ssl.key.location": str(made.key)}
    assert settings_principal(settings_of_role) == f"User:{name}"
    assert settings_principal({**settings_of_role, "sasl.username": "scram"}) == "User:scram"


def test_users_add_cert_writes_owner_only_files_and_prints_their_paths(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ensure_secrets(state, ["127.0.0.1"], "127.0.0.1:1")
    done = _mixflow("users", "add", "job-trainer", "--cert", "--days", "30", "--state-dir", str(state))
    assert done.returncode == 0, done.stderr
    clients = state / "secrets" / "clients"
    key, certificate = clients / "job-trainer.key", clients / "job-trainer.pem"
    assert f"certificate: {certificate}" in done.stdout and f"key: {key}" in done.stdout
    assert "principal User:job-trainer" in done.stdout
    assert "BEGIN" not in done.stdout + done.stderr, "a key or certificate was printed"
    assert stat.S_IMODE(clients.stat().st_mode) == 0o700
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in clients.iterdir()} == {
        "job-trainer.key": 0o600,
        "job-trainer.pem": 0o600,
    }
    encrypted = _mixflow(
        "users", "add", "job-loader", "--cert", "--key-password-env", "KEY_PW", "--state-dir", str(state),
        env={"KEY_PW": "a-key-password"},
    )  # fmt: skip
    assert encrypted.returncode == 0, encrypted.stderr
    assert (clients / "job-loader.key").read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert "a-key-password" not in encrypted.stdout + encrypted.stderr

    for args, code, said in (
        (["bad,name", "--cert", "--state-dir", str(state)], 2, "cannot name a client certificate"),
        (["x", "--cert", "--state-dir", str(tmp_path / "none")], 4, "no secured stack's CA in"),
        (["x", "--password-env", "KEY_PW", "--days", "3"], 2, "--days goes with --cert only"),
    ):
        refused = _mixflow("users", "add", *args, env={"KEY_PW": "pw"})
        assert refused.returncode == code and said in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1


@given(base=st.integers(10_000, 30_000), brokers=st.integers(1, 7))
def test_each_node_has_an_mtls_port_of_its_own_after_the_client_and_controller_ports(base: int, brokers: int) -> None:
    layout = ClusterLayout("id", "127.0.0.1", base, brokers)
    ports = [
        p for i in layout.node_ids for p in (layout.client_port(i), layout.controller_port(i), layout.mtls_port(i))
    ]
    assert sorted(ports) == list(range(base, base + 3 * brokers))
    assert node_mtls_port(base) == base + 2  # the single broker's


def test_the_mtls_listener_requires_certificates_and_maps_cn_to_the_user(tmp_path: Path) -> None:
    secrets = ensure_secrets(tmp_path / "state", ["127.0.0.1"], "127.0.0.1:1")
    overrides = broker_security(secrets, "127.0.0.1:1").overrides
    name = MTLS_LISTENER.lower()
    assert f"{MTLS_LISTENER}://{{host}}:{{mtls_port}}" in overrides["listeners"]
    assert f"{MTLS_LISTENER}://{{host}}:{{mtls_port}}" in overrides["advertised.listeners"]
    assert overrides[f"listener.name.{name}.ssl.client.auth"] == "required"
    assert overrides[f"listener.name.{name}.ssl.principal.mapping.rules"] == CERTIFICATE_PRINCIPAL_RULES
    assert overrides["inter.broker.listener.name"] == "SASL_SSL"


_ALERTS = ("bad certificate: SSL alert number 42", "certificate unknown: SSL alert number 46", "unknown ca")


@given(alert=st.sampled_from(_ALERTS), port=st.integers(1024, 65535), days_ago=st.integers(2, 3000))
@settings(max_examples=12, deadline=None)
def test_a_refused_client_certificate_is_explained_from_the_certificate(
    tmp_path_factory: pytest.TempPathFactory, alert: str, port: int, days_ago: int
) -> None:
    state = tmp_path_factory.mktemp("state")
    secrets = ensure_secrets(state, ["127.0.0.1"], "127.0.0.1:1")
    line = f"ssl://127.0.0.1:{port}/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls alert {alert}"
    base = {"security.protocol": "SSL", "ssl.ca.location": str(secrets.ca)}
    assert "this client has none" in str(refusal(base, line))
    began = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=days_ago)
    old = issue_client_certificate(state, "old", days=1, not_before=began)
    with_old = {**base, "ssl.certificate.location": str(old.certificate), "ssl.key.location": str(old.key)}
    expired = str(refusal(with_old, line))
    assert f"({old.certificate}, User:old) expired on {old.not_after:%Y-%m-%d %H:%M} UTC" in expired
    assert old.key.read_text() not in expired and str(old.key) not in expired


# -- the secured broker: certificates authenticate, and are refused ---------------------------------------------


def _properties(path: Path, config: dict[str, str]) -> Path:
    path.write_text(client_properties_text(config))
    return path


def _one_line_refusal(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == RefusedError.exit_code, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "PRIVATE KEY" not in done.stdout + done.stderr
    return lines[0]


def test_status_names_the_mtls_listener(secure_stack: SecureStack) -> None:
    status = _mixflow("stack", "status", "--state-dir", str(secure_stack.broker.state_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"mTLS listener (client certificates, security.protocol SSL): {secure_stack.mtls_bootstrap}" in status.stdout


def test_the_admins_certificate_is_a_super_user_and_another_is_refused_by_its_cn(
    secure_stack: SecureStack, tmp_path: Path
) -> None:
    admin = _properties(tmp_path / "admin.properties", secure_stack.certificate_config("admin"))
    listed = _mixflow("users", "list", "--admin-config", str(admin))
    assert listed.returncode == 0, listed.stderr  # describing SCRAM users takes a super user
    user = f"cert{uuid.uuid4().hex[:8]}"
    config = secure_stack.certificate_config(user)
    assert cluster_topics(config) is not None  # it authenticates: its principal may describe nothing
    with pytest.raises(AuthorizationError) as info, ClusterProbe(config) as probe:
        probe.topics(f"{user}.rank.0")
    assert f"refused User:{user} DESCRIBE on topic {user}.rank.0 (asking for its metadata)" in str(info.value)


def test_a_client_without_a_certificate_is_refused(secure_stack: SecureStack, tmp_path: Path) -> None:
    config = secure_stack.certificate_config(f"c{uuid.uuid4().hex[:6]}")
    del config["ssl.certificate.location"], config["ssl.key.location"]
    message = _one_line_refusal(_mixflow("users", "list", "--admin-config", str(_properties(tmp_path / "p", config))))
    assert f"refused this client (listener ssl://{secure_stack.mtls_bootstrap})" in message
    assert "the listener wants a client certificate (mTLS), and this client has none" in message


def test_a_certificate_from_another_ca_is_refused(secure_stack: SecureStack, tmp_path: Path) -> None:
    other = tmp_path / "other"
    ensure_secrets(other, ["127.0.0.1"], "127.0.0.1:1")
    foreign = issue_client_certificate(other, "admin", super_user=True)
    config = secure_stack.certificate_config("admin")
    config |= {"ssl.certificate.location": str(foreign.certificate), "ssl.key.location": str(foreign.key)}
    message = _one_line_refusal(_mixflow("users", "list", "--admin-config", str(_properties(tmp_path / "p", config))))
    assert f"refused this client (listener ssl://{secure_stack.mtls_bootstrap})" in message
    assert f"the broker does not trust this client's certificate ({foreign.certificate}, User:admin)" in message
    assert f"not signed by the CA in ssl.ca.location ({secure_stack.secrets.ca};" in message


def test_an_expired_certificate_is_refused(secure_stack: SecureStack, tmp_path: Path) -> None:
    config = secure_stack.certificate_config("admin", days=1, not_before=YEAR_AGO)
    message = _one_line_refusal(_mixflow("users", "list", "--admin-config", str(_properties(tmp_path / "p", config))))
    assert f"refused this client (listener ssl://{secure_stack.mtls_bootstrap})" in message
    expired_on = (YEAR_AGO + datetime.timedelta(days=1)).strftime("%Y-%m-%d")
    assert f"this client's certificate ({config['ssl.certificate.location']}, User:admin) expired on {expired_on}" in (
        message
    )


# -- a job whose roles authenticate by certificate --------------------------------------------------------------


def test_a_job_with_a_certificate_per_role_runs_exactly_once(
    secure_stack: SecureStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = f"t{uuid.uuid4().hex[:8]}-mtls"
    password = f"key-{uuid.uuid4().hex}"
    principals: dict[str, dict[str, object]] = {}
    for role in ROLES:
        encrypted = role == "trainer"  # one role's key encrypted, its password referenced
        made = issue_client_certificate(
            secure_stack.broker.state_dir, f"{job}-{role}", key_password=password if encrypted else None
        )
        principals[role] = {"ssl.certificate.location": str(made.certificate), "ssl.key.location": str(made.key)}
        if encrypted:
            principals[role]["ssl.key.password"] = {"env": "MTLS_KEY_PASSWORD"}
    kafka = {
        "bootstrap_servers": secure_stack.mtls_bootstrap,
        "config": {"security.protocol": "SSL", "ssl.ca.location": str(secure_stack.secrets.ca)},
        "principals": principals,
    }
    data = build_example_data(tmp_path / "data", limit=6)
    step = {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512}
    source = {"name": "topics", "reader": "text", "path": str(data / "topics"), "max_sample_length": 512}
    one_source = {"sources": [source], "mixture": {"weights": {"topics": 1}}}
    spec = write_spec(tmp_path, job, secure_stack.mtls_bootstrap, data, step=step, kafka=kafka, **one_source)
    bindings = job_bindings(job, ["topics"], principals)
    assert {key: {b.principal for b in listed} for key, listed in bindings.items()} == {
        role: {f"User:{job}-{role}"} for role in ROLES
    }
    env = {"MTLS_KEY_PASSWORD": password}
    applied = _mixflow(
        "acl", "apply", "--spec", str(spec), "--admin-config", str(secure_stack.secrets.admin_properties)
    )
    assert applied.returncode == 0, applied.stderr

    ran = _mixflow("run", "--spec", str(spec), "--state-dir", str(tmp_path / "state"), env=env, timeout_s=400)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "each sample exactly once: yes" in ran.stdout, ran.stdout
    assert "0 not from any source" in ran.stdout or "every committed source sample reached" in ran.stdout
    assert password not in ran.stdout + ran.stderr
    steps = re.search(r"^steps (\d+), samples", ran.stdout, re.MULTILINE)
    assert steps is not None, ran.stdout

    monkeypatch.setenv("MTLS_KEY_PASSWORD", password)  # the sink resolves the trainer's reference from it
    sinks = [
        KafkaBatchDataset(
            str(spec), bootstrap_servers=secure_stack.mtls_bootstrap, rank=rank, read=ReadOptions(wait_timeout_s=60)
        )
        for rank in (0, 1)
    ]
    every_micro_batch = int(steps.group(1)) * step["micro_batches"]
    assert [sum(1 for _ in sink) for sink in sinks] == [every_micro_batch, every_micro_batch]
