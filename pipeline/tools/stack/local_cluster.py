"""A local N-node Apache Kafka cluster in KRaft mode on loopback: every node a broker and a controller.

Everything lives under the state folder (default ``.mixflow-cluster/`` in the working directory)::

    cluster.json      the cluster id, host, base port and node count, written before the first start
    node-<i>/         node i's state folder, laid out like the single broker's (``local_broker.py``)

Node ``i`` (1-based) listens for clients on ``port + 2 * (i - 1)`` and for controllers on the port after; a
secured node for clients with certificates on ``port + 2 * N + (i - 1)``, after every node's two.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from confluent_kafka.admin import AdminClient

from pipeline.tools.stack.jars import resolve_broker_jars
from pipeline.tools.stack.local_broker import (
    DEFAULT_HOST,
    BrokerStatus,
    LocalBroker,
    checked_java,
    new_cluster_id,
    port_is_free,
)
from pipeline.tools.stack.secure import BrokerSecurity, node_mtls_port, recorded_security
from topics.errors import MixflowError
from topics.kafka.admin import default_replication_factor, min_insync_replicas

log = logging.getLogger(__name__)

DEFAULT_CLUSTER_PORT = 9192  # nodes on 9192..9197 for 3 nodes: clear of the single broker's 9092 and 9093
DEFAULT_CLUSTER_BROKERS = 3
# Three JVMs share a small machine: a smaller heap than the single broker's, the serial collector (no GC
# threads of its own) and only the quick JIT tier, which starts a node in about 2/3 of the time.
CLUSTER_JVM_OPTIONS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)
INFO = "cluster.json"


def default_cluster_state_dir() -> Path:
    return Path(os.environ.get("MIXFLOW_CLUSTER_STATE_DIR", ".mixflow-cluster")).absolute()


def is_cluster_state_dir(state_dir: Path) -> bool:
    return (state_dir / INFO).is_file()


@dataclass(frozen=True)
class ClusterLayout:
    """What ``cluster.json`` records: enough to start the same cluster again on the same ports."""

    cluster_id: str
    host: str
    port: int
    brokers: int

    def client_port(self, node_id: int) -> int:
        return self.port + 2 * (node_id - 1)

    def controller_port(self, node_id: int) -> int:
        return self.client_port(node_id) + 1

    def mtls_port(self, node_id: int) -> int:
        return node_mtls_port(self.port, self.brokers, node_id)

    @property
    def node_ids(self) -> range:
        return range(1, self.brokers + 1)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{self.client_port(i)}" for i in self.node_ids)

    @property
    def mtls_bootstrap(self) -> str:
        return ",".join(f"{self.host}:{self.mtls_port(i)}" for i in self.node_ids)

    @property
    def quorum_voters(self) -> str:
        return ",".join(f"{i}@{self.host}:{self.controller_port(i)}" for i in self.node_ids)

    def overrides(self, node_id: int) -> dict[str, str]:
        """Node ``node_id``'s properties over ``server.properties``, from ``cluster.properties``."""
        factor = default_replication_factor(self.brokers)
        values = {
            "node_id": node_id,
            "quorum_voters": self.quorum_voters,
            "replication_factor": factor,
            "min_insync_replicas": min_insync_replicas(factor),
        }
        text = resources.files("pipeline.tools.stack").joinpath("cluster.properties").read_text()
        for key, value in values.items():
            text = text.replace(f"{{{key}}}", str(value))
        out = {}
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                out[key.strip()] = value.strip()
        return out


@dataclass(frozen=True)
class ClusterStatus:
    state_dir: Path
    bootstrap: str | None
    nodes: dict[int, BrokerStatus]
    brokers_in_metadata: int | None  # live brokers the cluster's metadata lists; None when none answers

    @property
    def running(self) -> bool:
        return bool(self.nodes) and all(node.running for node in self.nodes.values())

    @property
    def healthy(self) -> bool:
        return self.running and self.brokers_in_metadata == len(self.nodes)

    def lines(self) -> list[str]:
        if not self.nodes:
            return [f"no cluster of ours (state folder {self.state_dir})"]
        listed = "no node answers" if self.brokers_in_metadata is None else f"{self.brokers_in_metadata} live"
        lines = [f"cluster {self.bootstrap}: {len(self.nodes)} nodes, {listed} in its metadata"]
        lines += [f"node {node_id}: {status.describe()}" for node_id, status in self.nodes.items()]
        return lines


class LocalCluster:
    """Start, stop and inspect the cluster that belongs to one state folder, and single nodes of it."""

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        brokers: int | None = None,
        host: str | None = None,
        port: int | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        """``brokers``, ``host`` and ``port`` are needed only to start a cluster the first time; later
        starts use what ``cluster.json`` recorded, and refuse values given that differ from it."""
        if brokers is not None and brokers < 2:
            msg = f"a cluster needs at least 2 brokers, not {brokers} (one broker is `mixflow stack up`)"
            raise MixflowError(msg)
        self.state_dir = (state_dir or default_cluster_state_dir()).absolute()
        self.info_file = self.state_dir / INFO
        self.cache_dir = cache_dir
        self.layout = self._layout(brokers, host, port)
        # The nodes this object started: right after exec, /proc does not yet show a JVM's command line,
        # so whether such a node still runs is asked of its Popen.
        self._launched: dict[int, subprocess.Popen] = {}
        # A secured cluster's, from its secrets (``secure.py``); or set before its first launch.
        self.security: BrokerSecurity | None = recorded_security(self.state_dir, self.bootstrap)

    def _layout(self, brokers: int | None, host: str | None, port: int | None) -> ClusterLayout:
        asked = ClusterLayout(
            "", host or DEFAULT_HOST, DEFAULT_CLUSTER_PORT if port is None else port, brokers or DEFAULT_CLUSTER_BROKERS
        )
        try:
            recorded = ClusterLayout(**json.loads(self.info_file.read_text()))
        except FileNotFoundError:
            return asked
        except (ValueError, TypeError) as exc:
            msg = f"{self.info_file} is not a cluster record of mixflow ({exc}); remove the folder to start afresh"
            raise MixflowError(msg) from exc
        given = {"brokers": brokers, "host": host, "port": port}
        differ = [
            f"{key} {value} (recorded {getattr(recorded, key)})"
            for key, value in given.items()
            if value is not None and value != getattr(recorded, key)
        ]
        if differ:
            msg = (
                f"the cluster in {self.state_dir} was made with other settings: {', '.join(differ)}; "
                "leave them out, or use another --state-dir"
            )
            raise MixflowError(msg)
        return recorded

    def node(self, node_id: int) -> LocalBroker:
        if node_id not in self.layout.node_ids:
            msg = f"node {node_id} is not in the cluster of {self.state_dir} (nodes 1..{self.layout.brokers})"
            raise MixflowError(msg)
        node = LocalBroker(
            self.state_dir / f"node-{node_id}",
            host=self.layout.host,
            port=self.layout.client_port(node_id),
            cache_dir=self.cache_dir,
            overrides=self.layout.overrides(node_id),
            cluster_id=self.layout.cluster_id,
            jvm_options=CLUSTER_JVM_OPTIONS,
            mtls_port=self.layout.mtls_port(node_id),
        )
        node.security = self.security
        return node

    @property
    def bootstrap(self) -> str:
        return self.layout.bootstrap

    @property
    def mtls_bootstrap(self) -> str:
        return self.layout.mtls_bootstrap

    @property
    def _client_settings(self) -> Mapping[str, str] | None:
        return self.security.client if self.security else None

    # -- inspection -------------------------------------------------------------------------------

    def status(self) -> ClusterStatus:
        if not self.info_file.is_file():
            return ClusterStatus(self.state_dir, None, {}, None)
        nodes = {i: self.node(i).status() for i in self.layout.node_ids}
        return ClusterStatus(self.state_dir, self.bootstrap, nodes, live_brokers(self.bootstrap, self._client_settings))

    # -- lifecycle --------------------------------------------------------------------------------

    def up(self, timeout_s: float = 120.0) -> str:
        """Start the nodes that do not run (all of them the first time); return the bootstrap list once
        every node is a live broker in the cluster's metadata."""
        nodes = {i: self.node(i) for i in self.layout.node_ids}
        stopped = [i for i, node in nodes.items() if node.running_pid() is None]
        if stopped:
            self._check_ports(stopped)
            if not self.layout.cluster_id:
                self.layout = ClusterLayout(new_cluster_id(), self.layout.host, self.layout.port, self.layout.brokers)
                nodes = {i: self.node(i) for i in self.layout.node_ids}
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.info_file.write_text(json.dumps(self.layout.__dict__) + "\n")
            self._launch(stopped)
        self.wait_until_complete(timeout_s)
        return self.bootstrap

    def start_node(self, node_id: int, timeout_s: float = 120.0, *, wait: bool = True) -> None:
        """Start one stopped node again and (unless not ``wait``) wait until the cluster lists it as a
        live broker; ``wait_until_complete`` waits for it later."""
        if self.node(node_id).running_pid() is None:
            self._check_ports([node_id])
            self._launch([node_id])
        if wait:
            self.wait_until_complete(timeout_s)

    def _launch(self, node_ids: list[int]) -> None:
        java, libs = checked_java(), resolve_broker_jars(self.cache_dir)
        # In threads: a node's first launch formats its storage with a JVM of its own, for seconds.
        with ThreadPoolExecutor(len(node_ids)) as pool:
            processes = pool.map(lambda i: self.node(i).launch(java, libs), node_ids)
            self._launched.update(zip(node_ids, processes, strict=True))

    def stop_node(self, node_id: int, *, kill: bool = False) -> bool:
        """Stop one node: SIGTERM (a controlled shutdown), or SIGKILL (a crash) with ``kill``. False
        when it was not running."""
        node = self.node(node_id)
        return node.kill() if kill else node.down()

    def down(self, timeout_s: float = 60.0) -> list[int]:
        """Stop every node (SIGTERM to all at once, SIGKILL for any left after the timeout); returns the
        ids of the nodes that were running."""
        running = {}
        for i in self.layout.node_ids if self.info_file.is_file() else ():
            node = self.node(i)
            if (pid := node.running_pid()) is not None:
                running[i] = (node, pid)
                os.kill(pid, signal.SIGTERM)
        # A node's controlled shutdown asks the controller quorum, so the nodes stop together, not in turn.
        deadline = time.monotonic() + timeout_s
        for node, pid in running.values():
            while node.running_pid() == pid:
                if time.monotonic() > deadline:
                    log.warning("node pid %d did not stop within %.0f s; killing it", pid, timeout_s)
                    node.kill()
                    break
                time.sleep(0.1)
            node.pid_file.unlink(missing_ok=True)
        return sorted(running)

    def wait_until_complete(self, timeout_s: float) -> None:
        """Wait until every node runs and the metadata lists all of them as live brokers."""
        deadline = time.monotonic() + timeout_s
        nodes = {i: self.node(i) for i in self.layout.node_ids}

        def exited(i: int) -> bool:
            if i in self._launched and self._launched[i].poll() is None:
                return False
            return nodes[i].running_pid() is None

        while True:
            dead = [i for i in nodes if exited(i)]
            if dead:
                msg = f"node {dead[0]} of the cluster in {self.state_dir} exited; its log ends with:\n"
                raise MixflowError(msg + nodes[dead[0]].log_tail())
            if live_brokers(self.bootstrap, self._client_settings) == self.layout.brokers:
                return
            if time.monotonic() > deadline:
                msg = (
                    f"the cluster in {self.state_dir} did not list all {self.layout.brokers} brokers within "
                    f"{timeout_s:.0f} s; logs in {self.state_dir}/node-*/logs/server.log"
                )
                raise MixflowError(msg)
            time.sleep(0.2)  # poll interval while the JVMs start

    def _check_ports(self, node_ids: list[int]) -> None:
        for i in node_ids:
            mtls = [self.layout.mtls_port(i)] if self.security else []
            for port in (self.layout.client_port(i), self.layout.controller_port(i), *mtls):
                if not port_is_free(self.layout.host, port):
                    msg = (
                        f"port {self.layout.host}:{port} (node {i}) is taken by another process; stop it or "
                        f"choose another base port with --port (node i uses port + 2(i-1) and the port after)"
                    )
                    raise MixflowError(msg)


def live_brokers(bootstrap: str, config: Mapping[str, str] | None = None, timeout_s: float = 2.0) -> int | None:
    """How many brokers the cluster's metadata lists (the live, unfenced ones); None when no node answers.
    ``config``: a client's settings for a secured cluster."""
    settings = {**(config or {}), "bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000}
    admin = AdminClient({**settings, "log_level": 0})
    try:
        return len(admin.list_topics(timeout=timeout_s).brokers)
    except Exception:  # any failure means "not answering yet"
        return None
