"""A single-node Apache Kafka broker in KRaft mode, run with ``java`` under a state folder.

Everything lives under the state folder (default ``.mixflow/`` in the working directory)::

    broker.pid  broker.json  config/server.properties  config/log4j2.yaml  data/  logs/server.log

A node of a local cluster (``pipeline/tools/stack/local_cluster.py``) is the same broker with some
properties overridden (node id, controller quorum, replication) and a cluster id shared by all nodes.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from confluent_kafka.admin import AdminClient

from pipeline.tools.stack.jars import resolve_broker_jars
from pipeline.tools.stack.secure import BrokerSecurity, node_mtls_port, recorded_security
from pipeline.tools.stack.storage_format import format_arguments, run_with_argument_file
from topics.errors import MixflowError

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9092
MIN_JAVA = 17
JVM_OPTIONS = ("-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true")


def default_state_dir() -> Path:
    return Path(os.environ.get("MIXFLOW_STATE_DIR", ".mixflow")).absolute()


def broker_answers(bootstrap: str, timeout_s: float = 2.0, config: Mapping[str, str] | None = None) -> bool:
    """True when a broker at ``bootstrap`` answers a metadata request (of a client with ``config``, for a
    secured broker) within the timeout."""
    admin = AdminClient(
        {
            **(config or {}),
            "bootstrap.servers": bootstrap,
            "socket.connection.setup.timeout.ms": 1000,
            # Connection-refused lines are expected while the broker starts; keep them off stderr.
            "log_level": 0,
        }
    )
    try:
        admin.list_topics(timeout=timeout_s)
    except Exception:  # any failure means "not answering yet"
        return False
    return True


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(count: int, host: str = DEFAULT_HOST) -> int:
    """A free port whose ``count - 1`` next ports are free too, below the kernel's ephemeral range: the
    client and controller ports of ``count // 2`` nodes. Outside that range no client's outgoing connection
    takes the port of a node that is down, so a node restarted on the same ports finds them free."""
    ephemeral_start = _ephemeral_port_range_start()
    for _ in range(200):
        port = random.randrange(10_000, ephemeral_start - count)
        if all(port_is_free(host, port + k) for k in range(count)):
            return port
    msg = f"found no {count} consecutive free ports on {host} between 10000 and {ephemeral_start}"
    raise MixflowError(msg)


def free_port_pair(host: str = DEFAULT_HOST) -> int:
    """A free port whose next port is free too: for a broker's client port and its controller's."""
    return free_port_block(2, host)


def _ephemeral_port_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere a guess


def java_major_version(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        msg = f"cannot read the Java version from `{java} -version`: {out.strip()[:200]}"
        raise MixflowError(msg)
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


@dataclass(frozen=True)
class BrokerStatus:
    state_dir: Path
    pid: int | None
    bootstrap: str | None
    running: bool
    answering: bool
    log_file: Path

    def describe(self) -> str:
        if not self.running:
            return f"not running (state folder {self.state_dir})"
        health = "answering" if self.answering else "NOT answering metadata requests"
        return f"running, pid {self.pid}, {self.bootstrap}, {health}; logs {self.log_file}"


def checked_java() -> str:
    """The ``java`` on PATH, checked to be new enough for Kafka 4."""
    java = shutil.which("java")
    if java is None:
        msg = f"'java' is not on PATH; the local Kafka broker needs Java {MIN_JAVA} or newer"
        raise MixflowError(msg)
    if (major := java_major_version(java)) < MIN_JAVA:
        msg = f"Kafka 4 needs Java {MIN_JAVA} or newer, but `java` is Java {major}"
        raise MixflowError(msg)
    return java


def new_cluster_id() -> str:
    """A KRaft cluster id: 22 characters that decode (URL-safe base64) to 16 bytes."""
    return uuid.uuid4().hex[:22]


class LocalBroker:
    """Start, stop and inspect the broker that belongs to one state folder.

    ``overrides`` replace (or add) properties of ``server.properties`` after its fields are filled in;
    ``cluster_id`` is the id its storage is formatted with (a new one when not given). ``security`` makes it a
    secured broker (its mTLS listener on ``mtls_port``, default ``port`` + 2): what the state folder's secrets
    say (``secure.py``), or what is set before ``launch``."""

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        cache_dir: Path | None = None,
        overrides: Mapping[str, str] | None = None,
        cluster_id: str | None = None,
        jvm_options: Sequence[str] = JVM_OPTIONS,
        mtls_port: int | None = None,
    ) -> None:
        self.state_dir = (state_dir or default_state_dir()).absolute()
        self.host = host
        self.port = port
        self.mtls_port = node_mtls_port(port) if mtls_port is None else mtls_port
        self.cache_dir = cache_dir
        self.overrides = dict(overrides or {})
        self.cluster_id = cluster_id
        self.jvm_options = tuple(jvm_options)
        self.security: BrokerSecurity | None = recorded_security(self.state_dir, self.bootstrap)
        self.pid_file = self.state_dir / "broker.pid"
        self.info_file = self.state_dir / "broker.json"
        self.config_dir = self.state_dir / "config"
        self.data_dir = self.state_dir / "data"
        self.log_file = self.state_dir / "logs" / "server.log"
        self.stdout_file = self.state_dir / "logs" / "stdout.log"

    # -- inspection -------------------------------------------------------------------------------

    def _recorded_pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if self._is_our_broker(pid) else None

    def _is_our_broker(self, pid: int) -> bool:
        """The pid is alive and is a Kafka broker started with this state folder's configuration."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            try:
                os.kill(pid, 0)
            except OSError:
                return False
            return True  # no /proc (macOS): trust the pid file
        config = str(self.config_dir / "server.properties").encode()
        return b"kafka.Kafka" in cmdline and config in cmdline

    def running_pid(self) -> int | None:
        """The pid of our broker, or None when it does not run."""
        return self._recorded_pid()

    def recorded_bootstrap(self) -> str | None:
        try:
            return str(json.loads(self.info_file.read_text())["bootstrap"])
        except (FileNotFoundError, ValueError, KeyError):
            return None

    def status(self) -> BrokerStatus:
        pid = self._recorded_pid()
        bootstrap = self.recorded_bootstrap() if pid else None
        answering = bool(bootstrap) and broker_answers(bootstrap, config=self.client_settings)  # type: ignore[arg-type]
        return BrokerStatus(self.state_dir, pid, bootstrap, pid is not None, answering, self.log_file)

    # -- lifecycle --------------------------------------------------------------------------------

    def up(self, timeout_s: float = 60.0) -> str:
        """Start the broker unless ours already runs; return the bootstrap address once it answers."""
        pid = self._recorded_pid()
        if pid is not None:
            bootstrap = self.recorded_bootstrap() or self.bootstrap
            log.info("broker already running (pid %d) at %s", pid, bootstrap)
            self._wait_until_answering(bootstrap, pid, timeout_s)
            return bootstrap
        process = self.launch(checked_java(), resolve_broker_jars(self.cache_dir))
        self._wait_until_answering(self.bootstrap, process.pid, timeout_s, process)
        return self.bootstrap

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def client_settings(self) -> Mapping[str, str] | None:
        return self.security.client if self.security else None

    def launch(self, java: str, libs: Path) -> subprocess.Popen:
        """Write the config, format the storage on first use and start the broker's JVM; do not wait
        for it to answer (a cluster's nodes answer only once a quorum of them runs)."""
        controller_port = self.port + 1
        for port in (self.port, controller_port, *([self.mtls_port] if self.security else [])):
            if not port_is_free(self.host, port):
                msg = (
                    f"port {self.host}:{port} is taken by another process; stop it or choose another port with "
                    "--port (the controller uses --port + 1, a secured broker's mTLS listener --port + 2)"
                )
                raise MixflowError(msg)

        self.prepare(java, libs)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        command = [
            java,
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={self.config_dir / 'log4j2.yaml'}",
            f"-Dkafka.logs.dir={self.log_file.parent}",
            "-cp",
            f"{libs}/*",
            "kafka.Kafka",
            str(self.config_dir / "server.properties"),
        ]
        with self.stdout_file.open("ab") as out:
            # A new session keeps the broker alive when the shell that ran `mixflow stack up` exits.
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.state_dir,
            )
        self.pid_file.write_text(f"{process.pid}\n")
        self.info_file.write_text(json.dumps({"bootstrap": self.bootstrap, "pid": process.pid}) + "\n")
        log.info("started Kafka broker, pid %d, logs in %s", process.pid, self.log_file)
        return process

    def prepare(self, java: str, libs: Path) -> None:
        """Write the config and, on first use, format the storage (a secured broker's SCRAM users with it)."""
        self._write_config(self.port + 1)
        if not (self.data_dir / "meta.properties").exists():
            self._format_storage(java, libs)

    def kill(self) -> bool:
        """SIGKILL our broker, as a crash would, and wait until it is gone. False when none was running."""
        pid = self._recorded_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGKILL)
        while self._is_our_broker(pid) and not _reaped(pid):
            time.sleep(0.05)  # the kernel tears the process down within moments of SIGKILL
        return True

    def down(self, timeout_s: float = 30.0) -> bool:
        """Stop our broker (SIGTERM, then SIGKILL after the timeout). False when none was running."""
        pid = self._recorded_pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self._is_our_broker(pid) and not _reaped(pid):
            if time.monotonic() > deadline:
                log.warning("broker pid %d did not stop within %.0f s; killing it", pid, timeout_s)
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + timeout_s
            time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return True

    # -- helpers ----------------------------------------------------------------------------------

    def _write_config(self, controller_port: int) -> None:
        self.config_dir.mkdir(parents=True, exist_ok=True)
        values = {
            "host": self.host,
            "port": self.port,
            "controller_port": controller_port,
            "mtls_port": self.mtls_port,
            "data_dir": self.data_dir,
            "log_file": self.log_file,
        }
        overrides = {**(self.security.overrides if self.security else {}), **self.overrides}
        for name in ("server.properties", "log4j2.yaml"):
            text = resources.files("pipeline.tools.stack").joinpath(name).read_text()
            if name == "server.properties":  # before the fields are filled in: overrides may hold fields
                text = override_properties(text, overrides)
            for key, value in values.items():
                text = text.replace(f"{{{key}}}", str(value))
            (self.config_dir / name).write_text(text)

    def _format_storage(self, java: str, libs: Path) -> None:
        arguments = format_arguments(self.cluster_id or new_cluster_id(), self.config_dir / "server.properties")
        command = [
            *self.jvm_options,
            "-cp",
            f"{libs}/*",
            f"-Dlog4j2.configurationFile={self.config_dir / 'log4j2.yaml'}",
        ]
        security = self.security
        result = run_with_argument_file(
            java, command, [*arguments, *(security.format_arguments if security else ())], self.config_dir
        )
        if result.returncode != 0:
            said = security.redact(result.stderr) if security else result.stderr  # --add-scram's passwords
            msg = f"formatting the broker storage in {self.data_dir} failed: {said.strip()[-500:]}"
            raise MixflowError(msg)

    def _wait_until_answering(
        self, bootstrap: str, pid: int, timeout_s: float, process: subprocess.Popen | None = None
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not broker_answers(bootstrap, timeout_s=1.0, config=self.client_settings):
            exited = process.poll() is not None if process else not self._is_our_broker(pid)
            if exited or time.monotonic() > deadline:
                why = "exited" if exited else f"did not answer within {timeout_s:.0f} s"
                tail = self.log_tail()
                msg = f"the Kafka broker (pid {pid}) {why}; last lines of {self.log_file}:\n{tail}"
                if not exited:
                    msg += (
                        f"\nIt is still starting: a state folder holding many partitions ({self.data_dir}) loads "
                        "slowly. Wait longer (--timeout), or stop it and remove the folder for an empty broker."
                    )
                raise MixflowError(msg)

    def log_tail(self, lines: int = 15) -> str:
        text = ""
        for path in (self.log_file, self.stdout_file):
            if path.exists():
                text += "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        return text.strip() or "(no log output)"


def override_properties(text: str, overrides: Mapping[str, str]) -> str:
    """``text`` (a Java properties file) with each key of ``overrides`` set to its value: in place where
    the key is set already, else appended at the end."""
    pending = dict(overrides)
    lines = []
    for line in text.splitlines():
        key = line.partition("=")[0].strip()
        if not line.lstrip().startswith(("#", "!")) and key in pending:
            line = f"{key}={pending.pop(key)}"
        lines.append(line)
    lines.extend(f"{key}={value}" for key, value in pending.items())
    return "\n".join(lines) + "\n"


def _reaped(pid: int) -> bool:
    """Reap the broker if it is our child (tests start it in-process); True once it has exited."""
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return waited == pid
