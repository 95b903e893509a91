"""docker-compose.yml and the Dockerfile stay in line with the code (no Docker or broker needed).

- The kafka service's broker settings are the ones `mixflow stack up` writes (read from the stack's own
  config code), apart from the few that must differ in a container, each listed with its reason.
- Every role service's command parses with mixflow's own CLI, names a source of its spec, and the loader
  instances of each source are exactly ``range(loaders)``.
- The Dockerfile installs the package and its entrypoint is the ``mixflow`` command.

The apache/kafka image turns ``KAFKA_*`` variables into broker properties: ``KAFKA_`` dropped, ``_`` to
``.``, ``__`` to ``_``, ``___`` to ``-``, lower case (``KAFKA_MESSAGE_MAX_BYTES`` -> ``message.max.bytes``).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
import xml.etree.ElementTree as ET
from collections import Counter
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from pipeline.cli import build_parser
from pipeline.spec import JobSpec, load_spec
from pipeline.tools.stack.jars import pom_text
from pipeline.tools.stack.local_broker import DEFAULT_HOST, DEFAULT_PORT, JVM_OPTIONS, LocalBroker

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
KAFKA_SERVICE = "kafka"
ROLE_COMMANDS = ("load", "construct")
DATA_SCRIPT = "examples/build_example_data.py"

# Broker properties of the local stack that a container must set differently; each is still checked
# for its structure by test_container_listeners_keep_the_stack_listeners.
CONTAINER_DIFFERENCES = {
    "listeners": "the container listens on every interface, and adds the HOST listener that the published "
    "host port lands on (same names and ports as the stack otherwise)",
    "advertised.listeners": "other containers reach the broker as kafka:9092, the host as 127.0.0.1:9092",
    "listener.security.protocol.map": "gains the entry of the HOST listener (keeps every entry of the stack's)",
    "controller.quorum.voters": "the controller's address inside the container (same node ids and port)",
    "log.dirs": "a path inside the container instead of the stack's state folder",
}
# Variables the image's launcher reads itself instead of writing them as broker properties.
IMAGE_LAUNCHER_VARIABLES = frozenset(
    ("KAFKA_HEAP_OPTS", "KAFKA_OPTS", "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_GC_LOG_OPTS", "KAFKA_JMX_OPTS")
)
# JVM options of the stack that kafka-run-class.sh's default KAFKA_JVM_PERFORMANCE_OPTS in the image has.
KAFKA_RUN_CLASS_DEFAULTS = {"-XX:+UseG1GC", "-Djava.awt.headless=true"}


# -- reading the files ------------------------------------------------------------------------------


@cache
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), f"{COMPOSE_FILE}: no services"
    return data


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as the container sees it (list or mapping form; numbers and booleans
    become the strings compose passes)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: _compose_string(value) for key, value in env.items()}


def _compose_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def read_properties(path: Path) -> dict[str, str]:
    props = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        assert not line.endswith("\\"), f"{path}: continued lines are not supported here: {line!r}"
        key, _, value = line.partition("=")
        props[key.strip()] = value.strip()
    return props


@cache
def stack_settings() -> dict[str, str]:
    """The broker properties `mixflow stack up` writes, by the stack's own code, with its default host
    and ports, into a throw-away state folder."""
    with tempfile.TemporaryDirectory(prefix="mixflow-compose-test-") as tmp:
        broker = LocalBroker(Path(tmp))
        broker._write_config(broker.port + 1)  # what `up` writes before it starts java
        return read_properties(broker.config_dir / "server.properties")


def env_to_property(name: str) -> str:
    """The broker property the apache/kafka image makes of a ``KAFKA_*`` variable (its ConvertKey)."""
    key = name.removeprefix("KAFKA_")
    key = re.sub(r"[^_]_[^_]", lambda m: m.group().replace("_", "."), key)
    return key.replace("___", "-").replace("__", "_").lower()


def property_to_env(prop: str) -> str:
    return "KAFKA_" + prop.replace("_", "__").replace("-", "___").replace(".", "_").upper()


def compose_broker_settings() -> dict[str, tuple[str, str]]:
    """property -> (variable, value) for the kafka service's KAFKA_* variables that become properties."""
    env = environment(services()[KAFKA_SERVICE])
    return {
        env_to_property(key): (key, value)
        for key, value in env.items()
        if key.startswith("KAFKA_") and key not in IMAGE_LAUNCHER_VARIABLES
    }


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    out = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        out[name] = (host, int(port))
    return out


def protocol_map(value: str) -> dict[str, str]:
    return dict(item.strip().split(":", 1) for item in value.split(",") if item.strip())


@cache
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, f"{DOCKERFILE}: ends inside a continued line"
    return instructions


def dockerfile_entrypoint() -> list[str]:
    entrypoints = [args for keyword, args in dockerfile() if keyword == "ENTRYPOINT"]
    assert entrypoints, f"{DOCKERFILE}: no ENTRYPOINT"
    last = entrypoints[-1]
    return json.loads(last) if last.startswith("[") else ["/bin/sh", "-c", last]


def dockerfile_workdir() -> PurePosixPath:
    workdirs = [args for keyword, args in dockerfile() if keyword == "WORKDIR"]
    assert workdirs, f"{DOCKERFILE}: no WORKDIR; the services' relative paths need one"
    return PurePosixPath(workdirs[-1])


def dockerignore_patterns() -> list[str]:
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    return [line.rstrip("/") for line in lines if line and not line.startswith("#")]


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (or a folder above it) out of the build context."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in dockerignore_patterns():
        if pattern.startswith("!"):
            continue
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/")):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatch(prefix.rsplit("/", 1)[-1], pattern[3:]):
                return True
    return False


# -- the services -----------------------------------------------------------------------------------


def argv(service: dict[str, Any]) -> list[str]:
    """What the container runs: its entrypoint (the image's when not overridden) and command."""

    def as_list(value: Any) -> list[str]:
        if value is None:
            return []
        return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]

    entrypoint = as_list(service["entrypoint"]) if "entrypoint" in service else dockerfile_entrypoint()
    return entrypoint + as_list(service.get("command"))


def built_services() -> dict[str, dict[str, Any]]:
    """The services that run the image of ./Dockerfile."""
    out = {}
    for name, service in services().items():
        build = service.get("build")
        if build is None:
            continue
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile_name = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        if (REPO / context).resolve() == REPO and dockerfile_name == "Dockerfile":
            out[name] = service
    return out


def mixflow_roles() -> dict[str, list[str]]:
    """Service name -> mixflow arguments, for the services that run `mixflow ...`."""
    return {
        name: args[1:]
        for name, service in built_services().items()
        if (args := argv(service)) and PurePosixPath(args[0]).name == "mixflow"
    }


def parse_mixflow(service: str, args: list[str]):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(
            f"service {service!r}: `mixflow {shlex.join(args)}` does not parse with mixflow's CLI:\n"
            f"{stderr.getvalue().strip()}"
        )


@cache
def spec_at(path: str) -> JobSpec:
    return load_spec(REPO / path)


def repo_path(service: str, path: str | Path) -> str:
    """A path the service names (relative to the image's WORKDIR, or absolute under it) as a path in
    the repository."""
    workdir = dockerfile_workdir()
    posix = PurePosixPath(path)
    if posix.is_absolute():
        assert posix.is_relative_to(workdir), f"service {service!r}: {path} is outside the image's {workdir}"
        posix = posix.relative_to(workdir)
    return posix.as_posix()


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> volume or host path, for a service's volumes (short or long form)."""
    out = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        out[target] = source
    return out


def published_ports(service: dict[str, Any]) -> dict[str, int]:
    """``host_ip:host_port`` -> container port, for a service's published ports (short or long form)."""
    out = {}
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            host_ip, published, target = port.get("host_ip", ""), port.get("published", ""), port["target"]
        else:
            *host, target = str(port).split("/")[0].split(":")
            host_ip, published = ["", "", *host][-2:]
        out[f"{host_ip}:{published}"] = int(target)
    return out


def internal_bootstrap() -> str:
    """The address the kafka service advertises to the other containers: ``<service>:<port>``."""
    settings = compose_broker_settings()
    advertised = listeners(settings["advertised.listeners"][1])
    in_network = [f"{host}:{port}" for host, port in advertised.values() if host == KAFKA_SERVICE]
    assert len(in_network) == 1, (
        f"service {KAFKA_SERVICE!r}: KAFKA_ADVERTISED_LISTENERS must advertise exactly one listener as "
        f"{KAFKA_SERVICE}:<port> for the other containers, got {settings['advertised.listeners'][1]!r}"
    )
    return in_network[0]


def data_service() -> tuple[str, str]:
    """(service name, volume) of the one-shot service that builds the example data into a volume."""
    found = [(name, s) for name, s in built_services().items() if DATA_SCRIPT in argv(s)]
    assert len(found) == 1, f"expected one service running {DATA_SCRIPT}, found {[n for n, _ in found]}"
    name, service = found[0]
    args = argv(service)
    assert "--out" in args, f"service {name!r}: {DATA_SCRIPT} without --out writes into the image, not a volume"
    out = args[args.index("--out") + 1]
    volume = mounts(service).get(out)
    assert volume, f"service {name!r}: --out {out} is not a volume mount of the service ({mounts(service)})"
    return name, volume


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (dep or {}).get("condition", "service_started") for name, dep in deps.items()}


# -- the file as Docker Compose reads it ------------------------------------------------------------


def compose_command() -> list[str] | None:
    """`docker compose` or `docker-compose` when one is installed (neither needs a running engine)."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0:
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    return [standalone] if standalone else None


def test_compose_file_is_valid_for_docker_compose() -> None:
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    result = subprocess.run(
        [*command, "--file", str(COMPOSE_FILE), "--profile", "example", "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{COMPOSE_FILE.name} is not a valid compose file:\n{result.stderr.strip()}"


# -- (a) the broker ---------------------------------------------------------------------------------


def test_broker_settings_match_the_local_stack() -> None:
    stack = stack_settings()
    ours = compose_broker_settings()
    drift = []
    for prop, value in stack.items():
        if env_to_property(property_to_env(prop)) != prop:
            drift.append(f"{prop}: no KAFKA_* variable of the apache/kafka image maps to this name")
        if prop in CONTAINER_DIFFERENCES:
            if prop not in ours:
                drift.append(
                    f"{prop}: differs in a container ({CONTAINER_DIFFERENCES[prop]}) but must still be set, "
                    f"as {property_to_env(prop)}: the image fills in its own default for it otherwise"
                )
            continue
        if prop not in ours:
            drift.append(f"{prop}={value}: set by `mixflow stack up`, missing (add {property_to_env(prop)}: {value})")
        elif ours[prop][1] != value:
            drift.append(f"{prop}: `mixflow stack up` sets {value!r}, {ours[prop][0]} is {ours[prop][1]!r}")
    for prop, (variable, value) in ours.items():
        if prop not in stack:
            drift.append(f"{variable}={value} sets {prop}, which `mixflow stack up` does not set")
    for prop in CONTAINER_DIFFERENCES:
        if prop not in stack:
            drift.append(f"{prop}: listed as a container difference, but `mixflow stack up` no longer sets it")
    assert not drift, f"{COMPOSE_FILE.name} service {KAFKA_SERVICE!r} drifted from pipeline/tools/stack:\n  " + (
        "\n  ".join(drift)
    )


def test_container_listeners_keep_the_stack_listeners() -> None:
    stack = stack_settings()
    ours = {prop: value for prop, (_, value) in compose_broker_settings().items()}
    where = f"{COMPOSE_FILE.name} service {KAFKA_SERVICE!r}"

    stack_listeners, our_listeners = listeners(stack["listeners"]), listeners(ours["listeners"])
    for name, (_, port) in stack_listeners.items():
        assert name in our_listeners, f"{where}: listener {name} of the stack is missing from KAFKA_LISTENERS"
        assert our_listeners[name][1] == port, (
            f"{where}: listener {name} is on port {our_listeners[name][1]}, the stack's on {port}"
        )

    stack_map = protocol_map(stack["listener.security.protocol.map"])
    our_map = protocol_map(ours["listener.security.protocol.map"])
    for name, protocol in stack_map.items():
        assert our_map.get(name) == protocol, (
            f"{where}: KAFKA_LISTENER_SECURITY_PROTOCOL_MAP maps {name} to {our_map.get(name)}, the stack to {protocol}"
        )
    unmapped = set(our_listeners) - set(our_map)
    assert not unmapped, f"{where}: listeners {sorted(unmapped)} have no security protocol"

    advertised = listeners(ours["advertised.listeners"])
    assert set(listeners(stack["advertised.listeners"])) <= set(advertised), (
        f"{where}: KAFKA_ADVERTISED_LISTENERS lacks a listener the stack advertises"
    )
    assert set(advertised) <= set(our_listeners), f"{where}: advertises listeners it does not open"

    # The host reaches the broker where `mixflow stack up` puts it, through a published port whose
    # listener advertises that same address.
    host_address = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
    published = published_ports(services()[KAFKA_SERVICE])
    assert host_address in published, f"{where}: does not publish {host_address} (ports: {published})"
    listener = [name for name, (_, port) in our_listeners.items() if port == published[host_address]]
    assert listener and advertised.get(listener[0]) == (DEFAULT_HOST, DEFAULT_PORT), (
        f"{where}: {host_address} lands on container port {published[host_address]}, whose listener must "
        f"advertise {host_address} for clients on the host"
    )
    internal_bootstrap()  # one listener advertised as kafka:<port> for the other containers

    def voters(value: str) -> dict[str, int]:
        return {v.split("@")[0]: int(v.rsplit(":", 1)[1]) for v in value.split(",")}

    assert voters(ours["controller.quorum.voters"]) == {
        node: our_listeners["CONTROLLER"][1] for node in voters(stack["controller.quorum.voters"])
    }, f"{where}: KAFKA_CONTROLLER_QUORUM_VOTERS names other nodes or ports than the stack's"


def test_broker_heap_and_image_version_match_the_local_stack() -> None:
    env = environment(services()[KAFKA_SERVICE])
    where = f"{COMPOSE_FILE.name} service {KAFKA_SERVICE!r}"
    heap = set(env.get("KAFKA_HEAP_OPTS", "").split())
    for option in JVM_OPTIONS:
        if option.startswith(("-Xms", "-Xmx")):
            assert option in heap, f"{where}: KAFKA_HEAP_OPTS lacks {option} of the stack's JVM_OPTIONS"
        else:
            assert option in KAFKA_RUN_CLASS_DEFAULTS, (
                f"{where}: the stack's JVM option {option} is not in the image's defaults; set it in KAFKA_OPTS "
                "and list it here"
            )
    pom = "{http://maven.apache.org/POM/4.0.0}"
    version = ET.fromstring(pom_text()).find(f"{pom}properties/{pom}kafka.version")
    assert version is not None, "pipeline/tools/stack/pom.xml has no kafka.version"
    image = services()[KAFKA_SERVICE]["image"]
    assert image.rsplit(":", 1)[-1] == version.text, (
        f"{where}: image {image}, but `mixflow stack up` runs Kafka {version.text} (pipeline/tools/stack/pom.xml)"
    )


# -- (b) the roles ----------------------------------------------------------------------------------


def test_role_commands_parse_and_cover_every_loader_of_the_spec() -> None:
    roles = mixflow_roles()
    assert roles, (
        f"{COMPOSE_FILE.name}: no service runs `mixflow` from the Dockerfile's image "
        f"(its ENTRYPOINT: {dockerfile_entrypoint()})"
    )
    expected_bootstrap = internal_bootstrap()
    loaders: dict[str, Counter] = {}
    constructors: Counter = Counter()
    for name, args in roles.items():
        parsed = parse_mixflow(name, args)
        assert parsed.command in ROLE_COMMANDS, (
            f"service {name!r}: `mixflow {parsed.command}` is not a role of a job ({', '.join(ROLE_COMMANDS)})"
        )
        spec_path = repo_path(name, parsed.spec)
        assert (REPO / spec_path).is_file(), f"service {name!r}: --spec {parsed.spec} is not a file of the repo"
        spec = spec_at(spec_path)
        bootstrap = spec.kafka.resolved_bootstrap_servers(parsed.bootstrap_servers, environment(services()[name]))
        assert bootstrap == expected_bootstrap, (
            f"service {name!r}: reaches the broker at {bootstrap}, not at {expected_bootstrap} that the "
            f"{KAFKA_SERVICE} service advertises to containers (set KAFKA_BOOTSTRAP_SERVERS)"
        )
        if parsed.command == "construct":
            constructors[spec_path] += 1
            continue
        assert parsed.source in spec.source_names, (
            f"service {name!r}: --source {parsed.source} is not a source of {spec_path} "
            f"(sources: {', '.join(spec.source_names)})"
        )
        assert parsed.until_drained, f"service {name!r}: a one-shot loader needs --until-drained to exit"
        loaders.setdefault(spec_path, Counter())[(parsed.source, parsed.instance)] += 1

    for spec_path in {*loaders, *constructors}:
        spec = spec_at(spec_path)
        want = Counter({(s.name, i): 1 for s in spec.sources for i in range(s.loaders)})
        got = loaders.get(spec_path, Counter())
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        twice = sorted(key for key, count in got.items() if count > 1)
        assert not (missing or extra or twice), (
            f"{COMPOSE_FILE.name}: loaders of {spec_path} (source, instance) do not match the spec's `loaders:`: "
            f"missing {missing}, not in the spec {extra}, started twice (they would fence each other) {twice}"
        )
        assert constructors[spec_path] == 1, (
            f"{COMPOSE_FILE.name}: {constructors[spec_path]} constructor services for {spec_path}, want 1"
        )


def test_roles_wait_for_the_broker_and_find_the_data_where_the_spec_expects_it() -> None:
    data_name, volume = data_service()
    workdir = dockerfile_workdir()
    for name, args in mixflow_roles().items():
        service = services()[name]
        deps = depends_on(service)
        assert deps.get(KAFKA_SERVICE) == "service_healthy", (
            f"service {name!r}: needs depends_on {KAFKA_SERVICE}: condition: service_healthy"
        )
        parsed = parse_mixflow(name, args)
        if parsed.command == "load":
            assert deps.get(data_name) == "service_completed_successfully", (
                f"service {name!r}: a loader needs depends_on {data_name}: condition: service_completed_successfully"
            )
        spec = spec_at(repo_path(name, parsed.spec))
        targets = [PurePosixPath(t) for t, source in mounts(service).items() if source == volume]
        for source in spec.sources:
            for path in filter(None, (source.path, source.tokenizer)):
                inside = workdir / path.relative_to(REPO).as_posix()
                assert any(inside.is_relative_to(t) for t in targets), (
                    f"service {name!r}: source {source.name!r} reads {inside} in the container, which is not "
                    f"under a mount of volume {volume!r} that {data_name!r} writes ({[str(t) for t in targets]})"
                )


def script_arguments(path: Path, args: list[str]) -> argparse.Namespace:
    """``args`` parsed by the script's own ``parse_arguments`` (its folder on sys.path, as when it runs)."""
    sys.path.insert(0, str(path.parent))
    try:
        module_spec = importlib.util.spec_from_file_location(f"_compose_{path.stem}", path)
        assert module_spec and module_spec.loader, f"cannot import {path}"
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    assert hasattr(module, "parse_arguments"), f"{path} has no parse_arguments(argv) to check its command line with"
    return module.parse_arguments(args)


def test_trainer_command_parses_with_torchrun_and_the_script() -> None:
    trainers = {name: argv(s) for name, s in built_services().items() if argv(s)[:1] == ["torchrun"]}
    assert trainers, f"{COMPOSE_FILE.name}: no service runs torchrun"
    from torch.distributed.run import get_args_parser

    for name, args in trainers.items():
        service = services()[name]
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                parsed = get_args_parser().parse_args(args[1:])
                script = repo_path(name, parsed.training_script)
                assert (REPO / script).is_file(), f"service {name!r}: {script} is not a file of the repo"
                script_args = script_arguments(REPO / script, parsed.training_script_args)
        except SystemExit:
            pytest.fail(f"service {name!r}: `{shlex.join(args)}` does not parse:\n{stderr.getvalue().strip()}")
        spec_path = repo_path(name, script_args.spec)
        assert (REPO / spec_path).is_file(), f"service {name!r}: --spec {spec_path} is not a file of the repo"
        spec = spec_at(spec_path)
        bootstrap = spec.kafka.resolved_bootstrap_servers(
            getattr(script_args, "bootstrap_servers", None), environment(service)
        )
        assert bootstrap == internal_bootstrap(), (
            f"service {name!r}: reaches the broker at {bootstrap}, not at {internal_bootstrap()} "
            "(set KAFKA_BOOTSTRAP_SERVERS)"
        )
        assert depends_on(service).get(KAFKA_SERVICE) == "service_healthy", (
            f"service {name!r}: needs depends_on {KAFKA_SERVICE}: condition: service_healthy"
        )
        out = PurePosixPath(script_args.out)
        assert any(out.is_relative_to(t) for t in mounts(service)), (
            f"service {name!r}: --out {out} is not on a volume, so the trainer's output is lost with the container"
        )


# -- (c) the image ----------------------------------------------------------------------------------


def test_dockerfile_installs_the_package_with_mixflow_as_entrypoint() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    scripts = pyproject["project"]["scripts"]
    entrypoint = dockerfile_entrypoint()
    assert entrypoint == ["mixflow"], f'{DOCKERFILE.name}: ENTRYPOINT is {entrypoint}, want ["mixflow"]'
    assert "mixflow" in scripts, "pyproject.toml: [project.scripts] has no `mixflow` for the ENTRYPOINT"

    base = next(args for keyword, args in dockerfile() if keyword == "FROM")
    match = re.fullmatch(r"python:(\d+)\.(\d+)\S*", base)
    assert match, f"{DOCKERFILE.name}: FROM {base} is not a python image"
    needed = re.fullmatch(r">=\s*(\d+)\.(\d+)", pyproject["project"]["requires-python"])
    assert needed and tuple(map(int, match.groups())) >= tuple(map(int, needed.groups())), (
        f"{DOCKERFILE.name}: FROM {base} is older than requires-python {pyproject['project']['requires-python']}"
    )

    install = [
        i
        for i, (keyword, args) in enumerate(dockerfile())
        if keyword == "RUN" and re.search(r"pip install (\S+ )*\.(\s|$)", args)
    ]
    assert install, f"{DOCKERFILE.name}: no `RUN pip install .` installs the package"
    copied = set()
    for keyword, args in dockerfile()[: install[0]]:
        if keyword in ("COPY", "ADD"):
            copied.update(PurePosixPath(src).as_posix().rstrip("/") for src in args.split()[:-1])
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = [
        p.name
        for p in REPO.iterdir()
        if (p / "__init__.py").is_file() and any(fnmatch.fnmatch(p.name, pattern) for pattern in patterns)
    ]
    needed_files = ["pyproject.toml", pyproject["project"]["readme"], *packages]
    missing = [f for f in needed_files if f not in copied and "." not in copied]
    assert not missing, f"{DOCKERFILE.name}: `pip install .` runs before {missing} are copied into the image"
    ignored = [f for f in needed_files if dockerignored(f)]
    assert not ignored, f"{DOCKERIGNORE.name}: keeps {ignored} out of the build, but the package needs them"

    torch = [args for keyword, args in dockerfile() if keyword == "RUN" and re.search(r"pip install .*\btorch\b", args)]
    assert torch and all("download.pytorch.org/whl/cpu" in args for args in torch), (
        f"{DOCKERFILE.name}: torch must come from the PyTorch CPU index (the PyPI build is CUDA, a few GB)"
    )


def test_the_image_has_what_the_services_run_and_not_local_state() -> None:
    for kept_out in (".venv", ".mixflow", "examples/data", ".git"):
        assert dockerignored(kept_out), f"{DOCKERIGNORE.name}: does not keep {kept_out} out of the build context"
    copied = set()
    for keyword, args in dockerfile():
        if keyword in ("COPY", "ADD"):
            copied.update(PurePosixPath(src).as_posix().rstrip("/") for src in args.split()[:-1])
    for name, service in built_services().items():
        for arg in argv(service):
            if not arg.endswith((".py", ".yaml")) or PurePosixPath(arg).is_absolute():
                continue
            path = repo_path(name, arg)
            assert any(path == c or path.startswith(c + "/") or c == "." for c in copied), (
                f"service {name!r}: runs with {path}, which {DOCKERFILE.name} does not copy into the image"
            )
            assert not dockerignored(path), f"service {name!r}: {path} is kept out by {DOCKERIGNORE.name}"
