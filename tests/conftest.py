"""Test fixtures. Every Kafka test uses a real broker, found in this order:

1. ``KAFKA_BOOTSTRAP_SERVERS`` when set (``.ci/run`` sets it after ``mixflow stack up``);
2. a testcontainers ``apache/kafka`` container when a Docker engine answers;
3. ``mixflow stack up`` with the state folder ``.mixflow/`` of the repository, stopped again at the end
   when this test run started it.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock
from hypothesis import HealthCheck, settings

from pipeline.tools.stack.fault_proxy import FaultProxy
from pipeline.tools.stack.local_broker import LocalBroker, free_port_pair
from tests.object_store import ObjectStoreEndpoint, running_object_store
from tests.secure_stack import SecureStack, running_secure_stack, start_secure_stack

# Property tests draw the same examples on every run, so a red CI run is reproducible and a green one
# stays green; `--hypothesis-profile default` draws new ones.
# Input generation and example run times are not checked: CI machines are shared and often loaded.
settings.register_profile(
    "deterministic", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("deterministic")

# Tests check the batches the constructor builds (trusted in production) as fully as any other.
os.environ.setdefault("MIXFLOW_CHECK_TRUSTED_BATCHES", "1")

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
KAFKA_IMAGE = "apache/kafka:4.1.1"


def _docker_engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:  # no client library, no socket, or no engine behind it
        return False
    return True


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test whose fixture closure holds ``kafka_bootstrap`` or ``secure_stack`` (asked for directly
    or through another fixture) with ``kafka``, so that ``-m "not kafka"`` runs the rest without a broker and
    ``-m kafka`` this; likewise ``object_store``."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if {"kafka_bootstrap", "secure_stack"} & set(fixtures):
            item.add_marker(pytest.mark.kafka)
        if "object_store" in fixtures:
            item.add_marker(pytest.mark.object_store)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The bootstrap address of a real Kafka broker for this test session."""
    if env := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield env
        return
    if _docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer(KAFKA_IMAGE) as container:
            yield container.get_bootstrap_server()
        return
    broker = LocalBroker(REPO / ".mixflow")
    was_running = broker.status().running
    bootstrap = broker.up()
    try:
        yield bootstrap
    finally:
        if not was_running:
            broker.down()


@pytest.fixture(scope="session")
def secure_stack(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[SecureStack]:
    """A secured broker of this test run's own (``tests/secure_stack.py``): SASL_SSL with SCRAM-SHA-512, ACLs
    enforced, its admin a super user; started on first use. Under xdist one serves every worker (each would
    otherwise start a broker of its own, a JVM of up to 1 GB and half a minute of two cores): the first worker
    to ask starts it in the run's folder, the controller stops it when the run ends."""
    if worker_id == "master":
        stack = start_secure_stack(tmp_path_factory.mktemp("secure-stack"))
        try:
            yield stack
        finally:
            stack.down()
        return
    shared = _run_folder(tmp_path_factory.getbasetemp()) / SHARED_SECURE_STACK
    with FileLock(str(shared) + ".lock"):
        stack = running_secure_stack(shared) or start_secure_stack(shared)
    yield stack


SHARED_SECURE_STACK = "secure-stack-shared"


def _run_folder(basetemp: Path) -> Path:
    """The folder of the whole run: a worker's base folder is ``popen-gw<N>`` inside the controller's."""
    return basetemp.parent if basetemp.name.startswith("popen-gw") else basetemp


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller of an xdist run stops the secured broker its workers shared."""
    if hasattr(session.config, "workerinput"):
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    if (stack := running_secure_stack(factory.getbasetemp() / SHARED_SECURE_STACK)) is not None:
        stack.down()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A job name no other test (or earlier run against the same broker) uses: ``t<8 hex>-<test>``."""
    test = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40].strip("-")
    return f"t{uuid.uuid4().hex[:8]}-{test}"


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[tuple[LocalBroker, str]]:
    """A broker of the test's own on free ports, beside the session's (for tests that stop and start it):
    ``(broker, bootstrap address)``."""
    broker = LocalBroker(tmp_path / "broker", port=free_port_pair())
    bootstrap = broker.up()
    try:
        yield broker, bootstrap
    finally:
        broker.down()


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStoreEndpoint]:
    """A real S3-compatible object store (Versity S3 Gateway) for this test session, on a free port in a
    temporary folder: its endpoint, keys, and ``bucket(name)`` to create a bucket."""
    with running_object_store(tmp_path_factory.mktemp("object-store")) as endpoint:
        yield endpoint


@pytest.fixture
def object_store_proxy(object_store: ObjectStoreEndpoint) -> Iterator[tuple[FaultProxy, ObjectStoreEndpoint]]:
    """A ``FaultProxy`` in front of the session's object store, for a test that makes storage slow, refuses or
    resets connections: ``(proxy, the store reached through it)``."""
    with FaultProxy(object_store.store.host, object_store.store.port) as proxy:
        yield proxy, object_store.through(proxy.endpoint)
