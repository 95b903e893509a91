"""Where a local run's metrics are: a port per role from a base port, listed in ``<run folder>/metrics.json``
for ``mixflow top`` and scrapers, and the supervisor's own ``/metrics`` (role restarts) on the base port.

``metrics.json`` is ``{"job": JOB, "roles": [{"role": ..., "name": ..., "source": ..., "instance": ...,
"url": "http://127.0.0.1:PORT/metrics"}, ...]}``: ``role`` is ``supervisor``, ``loader``, ``constructor``
or ``sink``; ``source`` is the loader's source (null for the others); ``instance`` the loader's instance,
the constructor's number among its lane's instances (0 starts active, the others as shadows), or the
sink's local rank; ``name`` the supervisor's name of the process (its log is ``<name>.log``). It is
rewritten whole (atomically) whenever a role gets a port; a role that has ended keeps its entry."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from pipeline.metrics.serving import MetricsServer, role_registry, serve_metrics
from topics.errors import MixflowError

METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class Endpoint:
    role: str
    name: str
    source: str | None
    instance: int
    url: str


def write_endpoints(path: Path, job: str, endpoints: Sequence[Endpoint]) -> None:
    body = {"job": job, "roles": [asdict(e) for e in endpoints]}
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(body, indent=1) + "\n")
    os.replace(partial, path)  # readers never see half a file


def read_endpoints(path: Path) -> list[Endpoint]:
    """The endpoints of a run folder's ``metrics.json``."""
    try:
        body = json.loads(path.read_text())
        return [Endpoint(**entry) for entry in body["roles"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        msg = f"cannot read the metrics endpoints in {path}: {exc}"
        raise MixflowError(msg) from exc


class SupervisedRole(Protocol):
    name: str
    restarts: int


class RoleRestarts(Collector):
    """``mixflow_run_role_restarts_total{job, role}``: the supervisor's restarts of each role it runs."""

    def __init__(self, job: str, roles: Sequence[SupervisedRole]) -> None:
        self.job = job
        self.roles = roles  # the supervisor's own list: roles it starts later show up too

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for role in list(self.roles):
            family.add_metric([self.job, role.name], role.restarts)
        yield family

    def _family(self) -> CounterMetricFamily:
        help_text = "Times the local supervisor started a role again after it died"
        return CounterMetricFamily("mixflow_run_role_restarts", help_text, labels=["job", "role"])


class RunMetrics:
    """Ports for the processes of a local run, ``base_port`` (the supervisor's own) and up, one each in
    the order asked for; with ``base_port`` None or 0, none are given and nothing is written or served."""

    def __init__(self, folder: Path, job: str, base_port: int | None) -> None:
        if base_port and not 0 < base_port < 65536:
            msg = f"--metrics-port-base {base_port} is not between 1 and 65535 (0 turns metrics off)"
            raise MixflowError(msg)
        self.path = folder / METRICS_FILE
        self.job = job
        self.base_port = base_port or 0
        self.endpoints: list[Endpoint] = []
        self.registry = role_registry()
        self._server: MetricsServer | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.base_port)

    def port(self, role: str, name: str, source: str | None = None, instance: int = 0) -> int:
        """The next free port of the run, listed for ``role``; 0 when metrics are off."""
        if not self.enabled:
            return 0
        port = self.base_port + len(self.endpoints)
        if port > 65535:
            msg = f"--metrics-port-base {self.base_port} leaves no port for {name}: {len(self.endpoints)} taken"
            raise MixflowError(msg)
        self.endpoints.append(Endpoint(role, name, source, instance, f"http://127.0.0.1:{port}/metrics"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_endpoints(self.path, self.job, self.endpoints)
        return port

    def port_flag(self, role: str, name: str, source: str | None = None, instance: int = 0) -> list[str]:
        """``--metrics-port PORT`` for a ``mixflow load`` or ``construct`` command line; nothing when off."""
        port = self.port(role, name, source, instance)
        return ["--metrics-port", str(port)] if port else []

    def sink_ports(self, ranks: int) -> int:
        """A block of ``ranks`` ports for a trainer whose processes serve on the first plus their local
        rank; the first one (0 when off)."""
        ports = [self.port("sink", f"train-rank{r}", None, r) for r in range(ranks)]
        return ports[0] if ports else 0

    def serve(self) -> None:
        """Serve the supervisor's own metrics on the first port."""
        port = self.port("supervisor", "run")
        self._server = serve_metrics(self.registry, port, "mixflow run")

    def watch(self, roles: Sequence[SupervisedRole]) -> None:
        """Export the restarts of ``roles`` (the supervisor's list, read at each scrape)."""
        if self.enabled:
            self.registry.register(RoleRestarts(self.job, roles))

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
