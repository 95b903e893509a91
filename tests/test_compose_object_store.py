"""docker-compose.yml's object store (profile ``object-store``) stays in line with the local stack's: the same
versitygw version, port and layout, keys from the environment, and only on 127.0.0.1 (no Docker needed)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from pipeline.tools.stack.object_store import DEFAULT_PORT, REGION
from pipeline.tools.stack.object_store_install import VERSITYGW_VERSION
from tests.test_compose import COMPOSE_FILE, REPO, compose, compose_command, environment, services

SERVICE = "object-store"


def _service() -> dict:
    assert SERVICE in services(), f"{COMPOSE_FILE.name}: no {SERVICE!r} service"
    return services()[SERVICE]


def _dockerfile() -> Path:
    build = _service()["build"]
    return REPO / build["context"] / build.get("dockerfile", "Dockerfile")


def test_the_object_store_is_an_opt_in_profile_with_a_volume_of_its_own() -> None:
    service = _service()
    assert service["profiles"] == ["object-store"], "`docker compose up` alone must still start the broker alone"
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in service["volumes"]}
    assert mounts["/data"] in compose()["volumes"], "the objects must live in a named volume"
    assert service["command"][-2:] == ["posix", "/data"]


def test_it_builds_the_version_the_local_stack_builds() -> None:
    service = _service()
    assert service["build"]["args"]["VERSITYGW_VERSION"] == VERSITYGW_VERSION
    assert service["image"].endswith(f":{VERSITYGW_VERSION}")
    text = _dockerfile().read_text()
    assert f"ARG VERSITYGW_VERSION={VERSITYGW_VERSION}" in text
    assert "go install" in text and "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}" in text


def test_it_serves_the_stack_port_on_localhost_only_with_keys_from_the_environment() -> None:
    service = _service()
    command = service["command"]
    assert command[command.index("--port") + 1] == f":{DEFAULT_PORT}"
    assert service["ports"] == [f"127.0.0.1:{DEFAULT_PORT}:{DEFAULT_PORT}"]
    env = environment(service)
    assert env["VGW_REGION"] == REGION
    for name, variable in (
        ("ROOT_ACCESS_KEY_ID", "MIXFLOW_S3_ACCESS_KEY"),
        ("ROOT_SECRET_ACCESS_KEY", "MIXFLOW_S3_SECRET_KEY"),
    ):
        assert re.fullmatch(rf"\$\{{{variable}:-[^}}]+\}}", env[name]), f"{name} must come from ${variable}"
    assert "healthcheck" in service


def test_compose_file_with_the_object_store_is_valid_for_docker_compose() -> None:
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    result = subprocess.run(
        [*command, "--file", str(COMPOSE_FILE), "--profile", SERVICE, "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{COMPOSE_FILE.name} is not a valid compose file:\n{result.stderr.strip()}"
