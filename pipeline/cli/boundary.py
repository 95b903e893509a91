"""The error boundary of the `mixflow` commands: every failure a user can cause ends in one line that says
what and where, and an exit code that says which kind of failure it was; a traceback only with ``-v``.

Exit codes:

====  ====================================================================================================
0     done
1     done, and what it checked is wrong: a replay that differs, a job not delivered exactly once, an
      unhealthy broker, a chaos run that failed its audit
2     a bad argument or spec (also argparse's own usage errors)
3     a Kafka client got stuck (a role exits so; ``mixflow run`` starts it again)
4     not found: a file or folder, a job, a topic, a source or a rank named does not exist
5     refused: it would overwrite or delete what is not the job's own, or the job's state does not allow it;
      or a secured cluster refused the client's credentials or TLS handshake; or a source object changed or
      vanished since planning under ``storage.on_changed_object: stop`` (``mixflow run`` does not restart a
      role that exits 5: it would be refused again)
6     no Kafka broker answers at the bootstrap servers
7     a request nobody answered in time (a mixture change no constructor has read)
130   interrupted by Ctrl-C (SIGINT); a role stops after its current piece of work first
====  ====================================================================================================
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import traceback
from collections.abc import Iterator

from topics.errors import (
    STUCK_CLIENT_EXIT,
    BrokerUnreachableError,
    MixflowError,
    NotFoundError,
    RefusedError,
    SecurityRefusedError,
)

DONE = 0
FAILED_CHECK = 1
USAGE = 2
STUCK_CLIENT = STUCK_CLIENT_EXIT
INTERRUPTED = 128 + signal.SIGINT


def failure_exit(command: str, exc: BaseException, verbose: bool) -> int:
    """Say what went wrong in one line (and the traceback with ``verbose``) and return the exit code; an
    exception no user can cause (a bug) propagates with its traceback."""
    if isinstance(exc, KeyboardInterrupt):
        print(f"mixflow {command}: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED
    if isinstance(exc, BrokenPipeError):  # output piped into `head` and the like, which stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return DONE
    known = _as_mixflow_error(exc)
    if known is None:
        raise exc
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"mixflow {command}: error: {known}", file=sys.stderr, flush=True)
    if _is_stuck_client(known):
        os._exit(STUCK_CLIENT)  # a stuck Kafka client would hang the interpreter's exit as well
    return known.exit_code


def _as_mixflow_error(exc: BaseException) -> MixflowError | None:
    """``exc`` as the kind of mixflow error it is, when a user can cause it."""
    if isinstance(exc, MixflowError):
        missing = isinstance(exc, FileNotFoundError) or isinstance(exc.__cause__, FileNotFoundError)
        if missing and not isinstance(exc, NotFoundError):
            return NotFoundError(str(exc))  # a spec file that is not there, a source's folder
        return exc
    if isinstance(exc, OSError):
        where = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name is not None)
        message = f"{exc.strerror or exc}: {where}" if where else str(exc)
        return NotFoundError(message) if isinstance(exc, FileNotFoundError) else RefusedError(message)
    kafka = sys.modules.get("confluent_kafka")  # loaded only by the commands that talk to Kafka
    if kafka is not None and isinstance(exc, kafka.KafkaException):
        error = exc.args[0] if exc.args else None
        reason = error.str() if isinstance(error, kafka.KafkaError) else str(exc)
        code = error.code() if isinstance(error, kafka.KafkaError) else None
        if code in _codes(kafka.KafkaError, "_AUTHENTICATION", "_SSL"):
            return SecurityRefusedError(f"Kafka refused this client: {reason}")
        if code in _codes(kafka.KafkaError, *_AUTHORIZATION):  # where no caller could name the principal
            return RefusedError(f"Kafka refused an operation this client's ACLs do not grant: {reason}")
        unreached = code in _codes(kafka.KafkaError, "_TRANSPORT", "_RESOLVE", "_ALL_BROKERS_DOWN", "_TIMED_OUT")
        return BrokerUnreachableError(f"Kafka: {reason}") if unreached else MixflowError(f"Kafka: {reason}")
    return None


_AUTHORIZATION = (
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
)


def _codes(kafka_error: type, *names: str) -> set[int]:
    return {getattr(kafka_error, name) for name in names}


def _is_stuck_client(exc: MixflowError) -> bool:
    # Only a command that loaded the Kafka clients can raise it; importing them here would load
    # confluent_kafka for every command.
    clients = sys.modules.get("topics.kafka.clients")
    return clients is not None and isinstance(exc, clients.KafkaClientStuckError)


@contextlib.contextmanager
def watching_sigint() -> Iterator[list[bool]]:
    """Notes whether SIGINT arrived while the block ran, whichever handler took it: a role takes SIGINT as
    a request to stop after its current piece of work and returns as if it had finished, and the command
    must still exit 130. The interpreter writes each signal's number to its wakeup file descriptor
    whatever the Python handler; the yielded list holds one flag, set on leaving."""
    received = [False]
    try:
        reader, writer = socket.socketpair()
    except OSError:  # no sockets here: nothing noted
        yield received
        return
    reader.setblocking(False)
    writer.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread: signals are not this thread's to see
        reader.close()
        writer.close()
        yield received
        return
    try:
        yield received
    finally:
        signal.set_wakeup_fd(previous)
        with contextlib.suppress(BlockingIOError):
            received[0] = signal.SIGINT in reader.recv(4096)
        reader.close()
        writer.close()
