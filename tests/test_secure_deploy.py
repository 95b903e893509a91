"""The secured variants of the deployments, read as rendered (no Docker or Kubernetes here): the broker of
docker-compose.secure.yml is the secured local stack's, its credentials compose secrets read from the files
`mixflow stack secrets` makes; a job rendered with `--kafka-secrets` mounts each role's Secret read-only, and
no rendered object holds a credential."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.spec import load_spec
from pipeline.tools.deploy import DeployOptions, check_links, render_job
from pipeline.tools.deploy.manifests import KAFKA_SECRETS_FOLDER, kafka_secret_name
from pipeline.tools.stack.secure import ADMIN_USER, BROKER_USER, broker_security, ensure_secrets
from tests.test_compose import compose_command, read_properties, stack_settings
from tests.test_deploy import validate

REPO = Path(__file__).resolve().parent.parent
SECURE_COMPOSE = REPO / "docker-compose.secure.yml"
SECURE_PROPERTIES = REPO / "deploy" / "compose" / "kafka-secure.properties"
JOB = REPO / "deploy" / "job.yaml"
ROLES = ("loader", "constructor", "autoscaler")


def _compose() -> dict:
    return yaml.safe_load(SECURE_COMPOSE.read_text())


def _stack_security(tmp_path: Path) -> dict[str, str]:
    secrets = ensure_secrets(tmp_path / "state", ["kafka"], "kafka:9092")
    return dict(broker_security(secrets, "kafka:9092").overrides)


# -- docker compose ------------------------------------------------------------------------------------------


def test_the_compose_broker_has_the_secured_stacks_settings(tmp_path: Path) -> None:
    ours = read_properties(SECURE_PROPERTIES)
    secured = _stack_security(tmp_path)
    # Names and paths differ in a container: its listeners, and the files compose mounts at /run/secrets.
    differ = {"listeners", "advertised.listeners", "listener.security.protocol.map", "inter.broker.listener.name"}
    differ |= {key for key in secured if key.endswith((".location", ".sasl.jaas.config"))}
    for key, value in secured.items():
        if key not in differ:
            assert ours.get(key) == value, (
                f"{SECURE_PROPERTIES.name}: {key} is {ours.get(key)!r}, the stack's {value!r}"
            )
    protocols = dict(item.split(":") for item in ours["listener.security.protocol.map"].split(","))
    assert protocols.pop("CONTROLLER") == "SSL" and protocols.pop("MTLS") == "SSL", protocols
    assert set(protocols.values()) == {"SASL_SSL"}, protocols
    assert protocols[ours["inter.broker.listener.name"]] == "SASL_SSL"
    plain = stack_settings()
    for key, value in plain.items():  # the stack's tuning (replication, sizes, timeouts) is kept
        if key not in secured and key not in {"controller.quorum.voters", "log.dirs"}:
            assert ours.get(key) == value, (
                f"{SECURE_PROPERTIES.name}: {key} is {ours.get(key)!r}, the stack's {value!r}"
            )
    assert not any("password" in value for value in ours.values()), "a password in the broker's properties file"


def test_the_compose_credentials_are_secrets_read_from_files(tmp_path: Path) -> None:
    compose = _compose()
    secrets = ensure_secrets(tmp_path / "state", ["kafka"], "kafka:9092")
    made = {path.name for path in secrets.folder.iterdir()}
    files = {name: entry["file"] for name, entry in compose["secrets"].items()}
    assert set(files) == {"kafka_ca", "broker_keystore", "broker_password", "admin_password"}
    for name, file in files.items():
        assert file.startswith("${MIXFLOW_COMPOSE_SECRETS:-./.mixflow-compose/secrets}/"), (name, file)
        assert file.rpartition("/")[2] in made, f"secret {name}: `mixflow stack secrets` makes no {file}"
    assert files["broker_password"].endswith(secrets.password_file(BROKER_USER).name)
    assert files["admin_password"].endswith(secrets.password_file(ADMIN_USER).name)

    kafka = compose["services"]["kafka"]
    assert set(kafka["secrets"]) == set(files)
    properties = read_properties(SECURE_PROPERTIES)
    for key in ("ssl.keystore.location", "ssl.truststore.location"):
        assert properties[key].removeprefix("/run/secrets/") in kafka["secrets"], key
    command = "\n".join(kafka["command"])
    for password in ("broker_password", "admin_password"):
        assert f"$$(cat /run/secrets/{password})" in command
    # Every password in the file is a variable the command fills in from a secret, never a value.
    assert all(value.startswith("$$") for value in re.findall(r"password=\\?\"?(\S+)", command)), command
    mounted = [volume.split(":")[1] for volume in kafka["volumes"]]
    assert "/mixflow/kafka-secure.properties" in mounted and "cp /mixflow/kafka-secure.properties" in command


def test_the_secured_compose_file_is_valid_for_docker_compose(tmp_path: Path) -> None:
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    ensure_secrets(tmp_path / "state", ["kafka"], "kafka:9092")
    files = ["--file", str(REPO / "docker-compose.yml"), "--file", str(SECURE_COMPOSE)]
    env = {"MIXFLOW_COMPOSE_SECRETS": str(tmp_path / "state" / "secrets"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*command, *files, "config", "--quiet"], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr


# -- Kubernetes ----------------------------------------------------------------------------------------------


@settings(max_examples=10)
@given(prefix=st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True))
def test_each_role_mounts_its_own_secret_read_only(prefix: str) -> None:
    spec = load_spec(JOB)
    objects = render_job(spec, JOB.read_text(), DeployOptions(kafka_secrets=prefix))
    assert not check_links(objects)
    workloads = [obj for obj in objects if obj["kind"] in ("Deployment", "StatefulSet")]
    assert {obj["metadata"]["labels"]["app.kubernetes.io/component"] for obj in workloads} == set(ROLES)
    for obj in workloads:
        validate(obj)
        role = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        pod = obj["spec"]["template"]["spec"]
        secrets = [volume for volume in pod["volumes"] if "secret" in volume]
        assert [volume["secret"] for volume in secrets] == [
            {"secretName": kafka_secret_name(DeployOptions(kafka_secrets=prefix), role), "defaultMode": 0o400}
        ]
        assert secrets[0]["secret"]["secretName"] == f"{prefix}-{role}"
        (container,) = pod["containers"]
        mount = next(m for m in container["volumeMounts"] if m["name"] == secrets[0]["name"])
        assert mount == {"name": secrets[0]["name"], "mountPath": str(KAFKA_SECRETS_FOLDER), "readOnly": True}
    assert not [obj for obj in objects if obj["kind"] == "Secret"], "a Secret was rendered: credentials in a file"


def test_a_plaintext_rendering_mounts_no_secret() -> None:
    objects = render_job(load_spec(JOB), JOB.read_text(), DeployOptions())
    assert "secret" not in yaml.safe_dump(objects).lower()


def test_deploy_render_takes_the_secrets_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["deploy", "render", "--spec", str(JOB), "--out", str(out), "--kafka-secrets", "example-kafka"]) == 0
    rendered = [yaml.safe_load(path.read_text()) for path in sorted(out.glob("*.yaml"))]
    names = {
        volume["secret"]["secretName"]
        for obj in rendered
        if obj["kind"] in ("Deployment", "StatefulSet")
        for volume in obj["spec"]["template"]["spec"]["volumes"]
        if "secret" in volume
    }
    assert names == {f"example-kafka-{role}" for role in ROLES}
    capsys.readouterr()
