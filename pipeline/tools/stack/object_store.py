"""A local S3-compatible object store: Versity S3 Gateway over a folder, run under a state folder.

Everything lives under the state folder (default ``.mixflow/object-store/`` in the working directory)::

    server.pid  server.json  credentials  env  data/<bucket>/<key>  iam/  logs/server.log

``credentials`` (an AWS shared-credentials file, profile ``default``) and ``env`` (``AWS_*`` variables for
``set -a; . env``) hold the root user's keys, generated once and readable by their owner only; the server
gets them through its environment, never its command line, and nothing prints them. Buckets are the
folders under ``data/``, objects the files in them (MD5 ETags in extended attributes). Other users (keys a
job uses instead of the root's, which can be revoked) live in the gateway's own IAM under ``iam/``
(``add_user``, ``remove_user``), checked on every request.
"""

from __future__ import annotations

import configparser
import contextlib
import http.client
import json
import logging
import os
import secrets
import signal
import string
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.tools.stack.local_broker import default_state_dir, port_is_free
from pipeline.tools.stack.object_store_install import ensure_installed
from topics.errors import MixflowError, NotFoundError

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7070
REGION = "us-east-1"
SERVER_NAME = "versitygw"


def default_object_store_dir() -> Path:
    """``$MIXFLOW_OBJECT_STORE_DIR``, else ``object-store/`` in the broker's state folder."""
    if env := os.environ.get("MIXFLOW_OBJECT_STORE_DIR"):
        return Path(env).absolute()
    return default_state_dir() / "object-store"


class ObjectStoreStopped(NotFoundError):
    """No object store of ours runs from the folder (exit 4)."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(
            f"no local object store runs from {state_dir}; start it with `mixflow stack up --object-store` "
            f"or `mixflow stack object-store up --state-dir {state_dir}`"
        )


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str


@dataclass(frozen=True)
class ObjectStoreStatus:
    state_dir: Path
    pid: int | None
    endpoint: str | None
    running: bool
    answering: bool
    paused: bool
    log_file: Path
    credentials_file: Path
    env_file: Path

    def describe(self) -> str:
        if not self.running:
            return f"not running (state folder {self.state_dir})"
        health = "answering" if self.answering else "NOT answering HTTP requests"
        if self.paused:
            health = "paused (SIGSTOP)"
        return (
            f"running, pid {self.pid}, {self.endpoint}, {health}; credentials {self.credentials_file}, "
            f"env {self.env_file}; logs {self.log_file}"
        )


def server_answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """True when an HTTP server at ``host:port`` answers a request within the timeout (an anonymous
    request: any answer, a 403 included, means it serves)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("HEAD", "/")
        connection.getresponse().read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
    return True


def new_credentials() -> Credentials:
    """Random root keys shaped like AWS's: a 20-character access key id and a 40-character secret."""
    upper = string.ascii_uppercase + string.digits
    secret_alphabet = string.ascii_letters + string.digits + "+/"
    access = "MIXF" + "".join(secrets.choice(upper) for _ in range(16))
    return Credentials(access, "".join(secrets.choice(secret_alphabet) for _ in range(40)))


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file that only its owner may read (0600 from its creation on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)


def supports_xattrs(folder: Path) -> bool:
    """Whether files in ``folder`` take user extended attributes, where versitygw keeps ETags and metadata."""
    probe = folder / ".xattr-probe"
    try:
        probe.touch()
        os.setxattr(probe, "user.mixflow.probe", b"1")
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)
    return True


def server_command(
    binary: Path, address: str, data_dir: Path, sidecar: Path | None, iam_dir: Path | None = None
) -> list[str]:
    """versitygw serving ``data_dir`` at ``address``; object metadata in a ``sidecar`` folder where the
    filesystem has no extended attributes (tmpfs on old kernels, some network filesystems); users besides the
    root in ``iam_dir``, looked up on every request (no cache), so that a removed user is refused at once."""
    backend = ["posix", *(["--sidecar", str(sidecar)] if sidecar else []), str(data_dir)]
    iam = ["--iam-dir", str(iam_dir), "--iam-cache-disable"] if iam_dir else []
    return [str(binary), "--port", address, "--quiet", *iam, *backend]


class LocalObjectStore:
    """Start, stop, fault and inspect the object store that belongs to one state folder."""

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        host: str = DEFAULT_HOST,
        port: int | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.state_dir = (state_dir or default_object_store_dir()).absolute()
        self.host = host
        self.cache_dir = cache_dir
        self.pid_file = self.state_dir / "server.pid"
        self.info_file = self.state_dir / "server.json"
        self.credentials_file = self.state_dir / "credentials"
        self.env_file = self.state_dir / "env"
        self.data_dir = self.state_dir / "data"
        self.iam_dir = self.state_dir / "iam"
        self.log_file = self.state_dir / "logs" / "server.log"
        self.port = port if port is not None else self._recorded_port() or DEFAULT_PORT

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- credentials ------------------------------------------------------------------------------

    def credentials(self) -> Credentials:
        """The root keys, generated and written (owner-only) on first use."""
        if self.credentials_file.is_file():
            parser = configparser.ConfigParser()
            parser.read(self.credentials_file)
            section = parser["default"]
            return Credentials(section["aws_access_key_id"], section["aws_secret_access_key"])
        created = new_credentials()
        write_private(
            self.credentials_file,
            f"[default]\naws_access_key_id = {created.access_key}\naws_secret_access_key = {created.secret_key}\n",
        )
        return created

    def environment(self) -> dict[str, str]:
        """The ``AWS_*`` variables that point boto3's standard chain (keys, endpoint, region) at this store."""
        credentials = self.credentials()
        return {
            "AWS_ACCESS_KEY_ID": credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
        }

    # -- inspection -------------------------------------------------------------------------------

    def _recorded_port(self) -> int | None:
        try:
            return int(json.loads(self.info_file.read_text())["port"])
        except (FileNotFoundError, ValueError, KeyError):
            return None

    def running_pid(self) -> int | None:
        """The pid of our server, or None when it does not run."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if self._is_our_server(pid) else None

    def _is_our_server(self, pid: int) -> bool:
        """The pid is alive and is versitygw serving this state folder's data."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        program = cmdline[0].rpartition(b"/")[2]
        return _alive(pid) and program.startswith(b"versitygw") and str(self.data_dir).encode() in cmdline

    def _is_stopped(self, pid: int) -> bool:
        return _process_state(pid) == "T"

    def status(self) -> ObjectStoreStatus:
        pid = self.running_pid()
        paused = pid is not None and self._is_stopped(pid)
        answering = pid is not None and not paused and server_answers(self.host, self.port)
        return ObjectStoreStatus(
            self.state_dir,
            pid,
            self.endpoint if pid else None,
            pid is not None,
            answering,
            paused,
            self.log_file,
            self.credentials_file,
            self.env_file,
        )

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> str:
        """Start the server unless ours runs already; return its endpoint URL once it answers."""
        pid = self.running_pid()
        if pid is not None:
            log.info("object store already running (pid %d) at %s", pid, self.endpoint)
            self._wait_until_answering(pid, timeout_s)
            return self.endpoint
        binary = ensure_installed(self.cache_dir)
        if not port_is_free(self.host, self.port):
            msg = f"port {self.host}:{self.port} is taken by another process; stop it or choose another with --port"
            raise MixflowError(msg)
        credentials = self.credentials()
        write_private(self.env_file, "".join(f"{key}={value}\n" for key, value in self.environment().items()))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        sidecar = None if supports_xattrs(self.data_dir) else self.state_dir / "metadata"
        self.iam_dir.mkdir(mode=0o700, exist_ok=True)
        command = server_command(binary, f"{self.host}:{self.port}", self.data_dir, sidecar, self.iam_dir)
        env = {
            **os.environ,
            "ROOT_ACCESS_KEY_ID": credentials.access_key,
            "ROOT_SECRET_ACCESS_KEY": credentials.secret_key,
            "VGW_REGION": REGION,
        }
        with self.log_file.open("ab") as out:
            # A new session keeps the server alive when the shell that ran `mixflow stack up` exits.
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        self.pid_file.write_text(f"{process.pid}\n")
        info = {"endpoint": self.endpoint, "port": self.port, "pid": process.pid, "binary": str(binary)}
        self.info_file.write_text(json.dumps(info) + "\n")
        log.info("started the object store, pid %d, logs in %s", process.pid, self.log_file)
        self._wait_until_answering(process.pid, timeout_s, process)
        return self.endpoint

    def stop(self, timeout_s: float = 15.0) -> bool:
        """Stop our server (SIGTERM, then SIGKILL after the timeout). False when none was running."""
        pid = self.running_pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGCONT)  # a paused server handles SIGTERM only once it runs again
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid):
            if time.monotonic() > deadline:
                log.warning("object store pid %d did not stop within %.0f s; killing it", pid, timeout_s)
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + timeout_s
            time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> bool:
        """SIGKILL our server, as a crash would, and wait until it is gone. False when none was running."""
        pid = self.running_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.05)  # the kernel tears the process down within moments of SIGKILL
        return True

    def restart(self, timeout_s: float = 30.0, *, kill: bool = False) -> str:
        """Stop (or kill) and start again on the same port, with the same data and credentials."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start(timeout_s)

    def pause(self) -> bool:
        """SIGSTOP the server: connections are still accepted by the kernel, but nothing answers until
        ``resume``, as a stalled storage server. Returns once the kernel shows it stopped; False when none
        was running."""
        return self._signal(signal.SIGSTOP, stopped=True)

    def resume(self) -> bool:
        """SIGCONT a paused server and return once it runs again. False when none was running."""
        return self._signal(signal.SIGCONT, stopped=False)

    def _signal(self, signum: int, *, stopped: bool, timeout_s: float = 10.0) -> bool:
        pid = self.running_pid()
        if pid is None:
            return False
        os.kill(pid, signum)
        # A signal is delivered asynchronously: wait until the process is in the state it asks for.
        deadline = time.monotonic() + timeout_s
        while self._is_stopped(pid) != stopped and _alive(pid):
            if time.monotonic() > deadline:
                state = "stop" if stopped else "run again"
                raise MixflowError(f"the object store (pid {pid}) did not {state} within {timeout_s:.0f} s")
            time.sleep(0.01)
        return True

    # -- users ------------------------------------------------------------------------------------

    def add_user(self, access_key: str, secret_key: str, role: str = "admin") -> None:
        """Give the running store a user with these keys (``admin``: it reaches every bucket)."""
        self._admin("create-user", "--access", access_key, "--secret", secret_key, "--role", role)

    def remove_user(self, access_key: str) -> None:
        """Take the user of ``access_key`` away: every request it signs is refused from now on."""
        self._admin("delete-user", "--access", access_key)

    def _admin(self, *arguments: str) -> None:
        if self.running_pid() is None:
            raise ObjectStoreStopped(self.state_dir)
        root = self.credentials()
        # The root's keys go through the environment, never the command line.
        env = {**os.environ, "ADMIN_ACCESS_KEY_ID": root.access_key, "ADMIN_SECRET_ACCESS_KEY": root.secret_key}
        command = [str(ensure_installed(self.cache_dir)), "admin", "--er", self.endpoint, "--region", REGION]
        done = subprocess.run([*command, *arguments], env=env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            msg = f"the object store refused `admin {arguments[0]}`: {(done.stderr or done.stdout).strip()[-500:]}"
            raise MixflowError(msg)

    # -- helpers ----------------------------------------------------------------------------------

    def _wait_until_answering(self, pid: int, timeout_s: float, process: subprocess.Popen | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        while not server_answers(self.host, self.port, timeout_s=1.0):
            # Until it has exec'd, a child's /proc entry still shows this Python: ask the Popen instead.
            exited = process.poll() is not None if process else not self._is_our_server(pid)
            if exited or time.monotonic() > deadline:
                why = "exited" if exited else f"did not answer within {timeout_s:.0f} s"
                msg = f"the object store (pid {pid}) {why}; last lines of {self.log_file}:\n{self.log_tail()}"
                raise MixflowError(msg)
            time.sleep(0.05)

    def log_tail(self, lines: int = 15) -> str:
        if not self.log_file.exists():
            return "(no log output)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:]) or "(no log output)"


def _process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (R, S, T, Z, ...), or None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """The process has a thread that has not exited. An exiting process stops looking like ours (its command
    line empties) before it closes its sockets, and its main thread can be a zombie while other threads still
    hold them; so waits for an exit watch every thread. An exited child of ours is reaped here (tests start
    the server in-process)."""
    try:
        threads = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        threads = []
    if any(_process_state(thread) not in (None, "Z", "X") for thread in threads):
        return True
    if _process_state(pid) is not None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return False
