"""`mixflow stack up|down|status|stop-node|start-node|object-store`: the local Kafka broker, or a local cluster of
several, and beside it (``up --object-store``) a local S3-compatible object store."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from pipeline.cli.arguments import output_folder, port, positive_float, positive_int
from pipeline.cli.command import Command
from pipeline.cli.stack_object_store import OBJECT_STORE, add_object_store_port, object_store_dir, start_line, stop_line
from pipeline.tools.stack.local_broker import DEFAULT_HOST, DEFAULT_PORT, LocalBroker, default_state_dir
from pipeline.tools.stack.local_cluster import (
    DEFAULT_CLUSTER_PORT,
    LocalCluster,
    default_cluster_state_dir,
    is_cluster_state_dir,
)
from pipeline.tools.stack.object_store import LocalObjectStore
from pipeline.tools.stack.secure import (
    ADMIN_USER,
    BROKER_USER,
    broker_security,
    ensure_secrets,
    is_secured,
    node_mtls_port,
    require_same_security,
)
from topics.errors import MixflowError, NotFoundError, RefusedError


def _add_state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=output_folder,
        default=None,
        help=f"folder for config, data and logs (default: $MIXFLOW_STATE_DIR or {default_state_dir()} for one "
        f"broker, $MIXFLOW_CLUSTER_STATE_DIR or {default_cluster_state_dir()} for a cluster)",
    )


def _add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    _add_state_dir(parser)
    parser.add_argument(
        "--brokers",
        type=positive_int,
        default=None,
        help="1: the single broker; 2 or more: a cluster of that many nodes, each a broker and a KRaft controller "
        "(default: what --state-dir holds, else 1)",
    )


def _add_up_arguments(parser: argparse.ArgumentParser) -> None:
    _add_stack_arguments(parser)
    parser.add_argument("--host", default=None, help=f"address to listen on (default: {DEFAULT_HOST})")
    parser.add_argument(
        "--port",
        type=port,
        default=None,
        help=f"client port; the KRaft controller uses port + 1 (default: {DEFAULT_PORT}). A cluster's node i "
        f"uses port + 2(i-1) and the port after (default: {DEFAULT_CLUSTER_PORT}, or what the cluster recorded); "
        "with --secure the mTLS client listener is on port + 2 (a cluster's node i: port + 2N + i - 1)",
    )
    parser.add_argument(
        "--timeout", type=positive_float, default=None, help="seconds to wait for the brokers to answer"
    )
    parser.add_argument(
        "--object-store",
        action="store_true",
        help="also start the local S3-compatible object store (in object-store/ of the state folder, or "
        "$MIXFLOW_OBJECT_STORE_DIR; built with Go once); `stack down` stops it",
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="TLS and SASL/SCRAM-SHA-512 for clients, and a second client listener taking client certificates "
        "(mTLS, port + 2; `mixflow users add NAME --cert`), TLS for the controllers, ACLs enforced; a local CA, "
        "the admin's password and client settings are made under the state folder (secrets/, owner only) and "
        "their paths printed",
    )
    add_object_store_port(parser)


def _add_node_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", type=positive_int, help="the node's id, 1..N")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"the cluster's folder (default: $MIXFLOW_CLUSTER_STATE_DIR or {default_cluster_state_dir()})",
    )


def _stack(args: argparse.Namespace) -> LocalBroker | LocalCluster:
    """The single broker or the cluster that ``--brokers`` and ``--state-dir`` name."""
    brokers = args.brokers
    state_dir = args.state_dir
    if state_dir is None:
        state_dir = default_cluster_state_dir() if brokers and brokers > 1 else default_state_dir()
    if is_cluster_state_dir(state_dir) and brokers == 1:
        msg = f"{state_dir} holds a cluster, not a single broker; leave out --brokers 1 or use another --state-dir"
        raise MixflowError(msg)
    if (brokers and brokers > 1) or is_cluster_state_dir(state_dir):
        options = {"host": getattr(args, "host", None), "port": getattr(args, "port", None)}
        return LocalCluster(state_dir, brokers=brokers, **options)
    host, port = getattr(args, "host", None), getattr(args, "port", None)
    return LocalBroker(state_dir, host=host or DEFAULT_HOST, port=DEFAULT_PORT if port is None else port)


def _secured_stack(args: argparse.Namespace, *, make: bool = False) -> LocalBroker | LocalCluster:
    """``_stack``, secured when it was made so (or, with ``make``, when ``--secure`` asks): its secrets made
    on first use, and refused when the state folder holds a stack made the other way."""
    stack = _stack(args)
    state_dir = stack.state_dir
    holds_stack = is_cluster_state_dir(state_dir) or (state_dir / "config" / "server.properties").exists()
    secure = args.secure if make else is_secured(state_dir)
    require_same_security(state_dir, secure=secure, holds_stack=holds_stack)
    if secure and make:
        host = stack.layout.host if isinstance(stack, LocalCluster) else stack.host
        stack.security = broker_security(ensure_secrets(state_dir, [host], stack.bootstrap), stack.bootstrap)
    return stack


def _security_lines(stack: LocalBroker | LocalCluster) -> list[str]:
    """What ``up`` and ``status`` say of a secured stack: where its secrets are and its mTLS listener."""
    if stack.security is None:
        return []
    if isinstance(stack, LocalCluster):
        mtls = stack.mtls_bootstrap
    else:  # where it was started, which `status` is not told
        host, _, port = (stack.recorded_bootstrap() or stack.bootstrap).rpartition(":")
        mtls = f"{host}:{node_mtls_port(int(port))}"
    return [*stack.security.secrets.describe(), f"mTLS listener (client certificates, security.protocol SSL): {mtls}"]


def _up(args: argparse.Namespace) -> int:
    stack = _secured_stack(args, make=True)
    timeout = {} if args.timeout is None else {"timeout_s": args.timeout}
    if args.object_store:
        store = LocalObjectStore(object_store_dir(stack.state_dir), port=args.object_store_port)
        print(start_line(store, args.timeout))
    bootstrap = stack.up(**timeout)
    for line in _security_lines(stack):
        print(line)
    print(bootstrap)
    return 0


def _add_down_arguments(parser: argparse.ArgumentParser) -> None:
    _add_stack_arguments(parser)
    parser.add_argument(
        "--force",
        action="store_true",
        help="stop it even while jobs run against it (without it, a job whose consumer groups have members, a "
        "`mixflow run` here or roles elsewhere, is named and nothing is stopped: exit 5)",
    )
    parser.add_argument(
        "--wipe",
        action="store_true",
        help="then delete the state folder: the broker's every topic, consumer group and log, its config and, for "
        "a secured stack, its CA, certificates and passwords; the next `up` starts an empty broker. The local "
        "object store's folder in it (its buckets, objects and keys) is kept unless --wipe-object-store",
    )
    parser.add_argument(
        "--wipe-object-store",
        action="store_true",
        help="then delete the local object store's folder (object-store/ in the state folder, or "
        "$MIXFLOW_OBJECT_STORE_DIR): every bucket and object in it, and its keys",
    )


def _refuse_if_jobs_run(stack: LocalBroker | LocalCluster) -> None:
    """``RefusedError`` naming the jobs whose consumer groups have members on the running ``stack``; nothing when
    none do, or when the broker does not answer (a stack not serving has no job to stop under it)."""
    from pipeline.tools.stack.running_jobs import describe_running, running_jobs

    if isinstance(stack, LocalCluster):
        bootstrap = stack.bootstrap if any(stack.node(i).running_pid() for i in stack.layout.node_ids) else None
    else:
        bootstrap = stack.recorded_bootstrap() if stack.running_pid() else None
    if bootstrap is None:
        return
    config = {**(stack.security.client if stack.security else {}), "bootstrap.servers": bootstrap}
    try:
        running = running_jobs(config)
    except MixflowError:
        return
    if running:
        msg = (
            f"jobs run against the stack at {bootstrap}: {describe_running(running)}; stop them first, or give "
            "--force to stop the broker under them"
        )
        raise RefusedError(msg)


def _down(args: argparse.Namespace) -> int:
    stack = _stack(args)
    if not args.force:
        _refuse_if_jobs_run(stack)
    if isinstance(stack, LocalCluster):
        stopped = stack.down()
        print(f"stopped nodes {', '.join(map(str, stopped))}" if stopped else "no node of ours was running")
    else:
        print("stopped" if stack.down() else "no broker of ours was running")
    store = LocalObjectStore(object_store_dir(stack.state_dir))
    if stopped_store := stop_line(store):
        print(stopped_store)
    if args.wipe_object_store:
        _wipe_object_store(store.state_dir)
    if args.wipe:
        _wipe(stack.state_dir, keep=store.state_dir)
    return 0


def _wipe(state_dir: Path, keep: Path) -> None:
    """Delete a stopped stack's state folder, only if it is one (``up`` wrote its config there), but for the
    object store's folder ``keep`` in it."""
    if not state_dir.exists():
        print(f"nothing to wipe at {state_dir}")
        return
    if not (is_cluster_state_dir(state_dir) or (state_dir / "config" / "server.properties").exists()):
        msg = f"{state_dir} does not look like a stack's state folder (no broker config in it); not deleting it"
        raise MixflowError(msg)
    kept = keep.exists() and keep.absolute().parent == state_dir.absolute()
    for path in state_dir.iterdir():
        if kept and path.absolute() == keep.absolute():
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    if not kept:
        state_dir.rmdir()
    said = "the broker's topics, consumer groups, logs, config and secrets"
    if kept:
        said += f"; kept the object store's buckets and keys in {keep} (--wipe-object-store deletes them)"
    print(f"wiped {state_dir}: {said}")


def _wipe_object_store(store_dir: Path) -> None:
    """Delete the stopped object store's folder, only if it is one (its keys or data are there)."""
    if not store_dir.exists():
        print(f"no object store to wipe at {store_dir}")
        return
    if not ((store_dir / "credentials").exists() or (store_dir / "data").is_dir()):
        msg = f"{store_dir} does not look like an object store's folder (no credentials or data/); not deleting it"
        raise MixflowError(msg)
    shutil.rmtree(store_dir)
    print(f"wiped {store_dir}: the object store's buckets, objects and keys")


def _status(args: argparse.Namespace) -> int:
    stack = _secured_stack(args)
    if (store_dir := object_store_dir(stack.state_dir)).exists():
        print(f"object store: {LocalObjectStore(store_dir).status().describe()}")
    for line in _security_lines(stack):
        print(line)
    if isinstance(stack, LocalCluster):
        status = stack.status()
        for line in status.lines():
            print(line)
        return 0 if status.healthy else 1
    single = stack.status()
    print(f"kafka: {single.describe()}")
    return 0 if single.running and single.answering else 1


def _add_secrets_arguments(parser: argparse.ArgumentParser) -> None:
    _add_state_dir(parser)
    parser.add_argument(
        "--host",
        action="append",
        default=None,
        help=f"a name or address clients reach the brokers by (again for several; default: {DEFAULT_HOST}); "
        "localhost and 127.0.0.1 are always in the certificate",
    )
    parser.add_argument(
        "--port", type=port, default=DEFAULT_PORT, help="the port in the admin's settings (default: %(default)s)"
    )


def _secrets(args: argparse.Namespace) -> int:
    """The secrets of a secured stack, without starting one: for a broker started otherwise (docker compose)."""
    state_dir = args.state_dir or default_state_dir()
    holds_stack = is_cluster_state_dir(state_dir) or (state_dir / "config" / "server.properties").exists()
    require_same_security(state_dir, secure=True, holds_stack=holds_stack)
    hosts = args.host or [DEFAULT_HOST]
    secrets = ensure_secrets(state_dir, hosts, f"{hosts[0]}:{args.port}")
    for line in secrets.describe():
        print(line)
    print(f"broker key store: {secrets.key_store}")
    print(f"passwords: {secrets.password_file(ADMIN_USER)}, {secrets.password_file(BROKER_USER)}")
    return 0


def _cluster(args: argparse.Namespace) -> LocalCluster:
    state_dir = args.state_dir or default_cluster_state_dir()
    if not is_cluster_state_dir(state_dir):
        msg = f"no cluster in {state_dir}; start one with `mixflow stack up --brokers 3 --state-dir {state_dir}`"
        raise NotFoundError(msg)
    return LocalCluster(state_dir)


def _stop_node(args: argparse.Namespace) -> int:
    if _cluster(args).stop_node(args.node, kill=args.kill):
        print(f"node {args.node} {'killed' if args.kill else 'stopped'}")
    else:
        print(f"node {args.node} was not running")
    return 0


def _start_node(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    cluster.start_node(args.node)
    print(cluster.bootstrap)
    return 0


def _add_stop_node_arguments(parser: argparse.ArgumentParser) -> None:
    _add_node_arguments(parser)
    parser.add_argument("--kill", action="store_true", help="SIGKILL, as a crash would, instead of a clean stop")


ACTIONS = (
    Command(
        name="up",
        help="start the broker (or the cluster's nodes) unless it runs; print the bootstrap address(es) last",
        add_arguments=_add_up_arguments,
        run=_up,
    ),
    Command(
        name="down",
        help="stop the broker or every node of the cluster started from this state folder, and its object store, "
        "unless jobs run against it (--force: even then); --wipe: then delete its topics, logs and secrets, "
        "--wipe-object-store: its buckets",
        add_arguments=_add_down_arguments,
        run=_down,
    ),
    Command(name="status", help="say what runs where", add_arguments=_add_stack_arguments, run=_status),
    Command(
        name="stop-node",
        help="stop one node of the cluster (for fault tests)",
        add_arguments=_add_stop_node_arguments,
        run=_stop_node,
    ),
    Command(
        name="start-node",
        help="start one stopped node of the cluster again; print the bootstrap addresses last",
        add_arguments=_add_node_arguments,
        run=_start_node,
    ),
    Command(
        name="secrets",
        help="make (or keep) a secured stack's CA, broker certificate and passwords without starting a broker "
        "(for docker-compose.secure.yml); print their paths",
        add_arguments=_add_secrets_arguments,
        run=_secrets,
    ),
    OBJECT_STORE,
)
