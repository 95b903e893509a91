"""SCRAM-SHA-512 users of a secured cluster, through Kafka's admin API, run as a user allowed to change them
(``ALTER`` on the cluster: a super user, such as the local stack's admin).

``ensure_users`` is what a command that creates a job's principals calls: it sets every user's password (a
new user, or a new password for one that exists) in one request. No password is ever logged or put in an
error message. A principal not allowed to is refused in one line naming it, the operation (``ALTER`` or
``DESCRIBE`` on the cluster) and what it asked for (``AuthorizationError``, exit 5).

Kafka answers a credential change once its controller has committed it; each broker applies it a moment later.
Both calls return only when the change is in effect on every broker of the cluster, so a user added is one that
can connect at once and a user removed is one that cannot: a new password is tried on each broker (when the
admin itself signs in with SCRAM-SHA-512, on the same listener), else each broker is asked for its users."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from pipeline.tools.stack.secure import check_user_name
from topics.errors import MixflowError, NotFoundError, SecurityRefusedError
from topics.kafka.admin_client import bootstrap_servers
from topics.kafka.authorization import cluster_operations, may_on_cluster, refused_on_cluster
from topics.kafka.cluster_probe import cluster_topics

MECHANISM = ScramMechanism.SCRAM_SHA_512
ITERATIONS = 4096
DEFAULT_TIMEOUT_S = 30.0
_NOT_ALLOWED = frozenset({KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED})
_ASK_EVERY_S = 0.2


def _admin(admin_config: Mapping[str, Any]) -> AdminClient:
    """An admin client, once the cluster has answered it (so that an unreachable cluster, or one that refuses
    these credentials, is said in one line: ``topics/kafka/cluster_probe.py``)."""
    cluster_topics(admin_config)
    return AdminClient({**admin_config, "log_level": 0})


def _settle(
    futures: Mapping[str, Future], config: Mapping[str, Any], doing: str, timeout_s: float
) -> dict[str, KafkaError]:
    """Wait for each user's future; the users whose request failed, with Kafka's error. A refusal to do it at
    all (no ALTER on the cluster) is raised as ``AuthorizationError``."""
    failed: dict[str, KafkaError] = {}
    for user, future in futures.items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is None:
                raise
            if error.code() in _NOT_ALLOWED:
                raise refused_on_cluster(config, "ALTER", f"{doing} of user {user!r}") from None
            failed[user] = error
    return failed


def ensure_users(
    admin_config: Mapping[str, Any], passwords: Mapping[str, str], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Give each user of ``passwords`` a SCRAM-SHA-512 credential with that password (made, or replaced); a name
    the stack relies on is refused (``secure.check_user_name``)."""
    if not passwords:
        return
    for user, password in passwords.items():
        if not user or not password:
            msg = f"a SCRAM user needs a name and a password (user {user!r})"
            raise MixflowError(msg)
        check_user_name(user, "add")
    info = ScramCredentialInfo(MECHANISM, ITERATIONS)
    upserts = [UserScramCredentialUpsertion(user, info, password.encode()) for user, password in passwords.items()]
    servers = bootstrap_servers(admin_config)
    admin = _admin(admin_config)  # alive until its futures are settled
    futures = admin.alter_user_scram_credentials(upserts, request_timeout=timeout_s)
    failed = _settle(futures, admin_config, "setting the SCRAM credentials", timeout_s)
    if failed:
        listed = "; ".join(f"{user}: {error.str()}" for user, error in failed.items())
        msg = f"Kafka at {servers} did not set the SCRAM credentials of {listed}"
        raise MixflowError(msg)
    if _signs_in_with_scram(admin_config):
        behind, check = "does not accept the new password of", _accepts_password
    else:
        behind, check = "does not list", _lists_user
    _wait_until_each_broker(admin_config, behind, passwords, check, timeout_s)


def remove_users(
    admin_config: Mapping[str, Any], users: Iterable[str], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Remove the SCRAM-SHA-512 credential of each user; ``NotFoundError`` naming those that had none. A name the
    stack relies on is refused (``secure.check_user_name``)."""
    users = [check_user_name(user, "remove") for user in dict.fromkeys(users)]
    if not users:
        return
    servers = bootstrap_servers(admin_config)
    deletions = [UserScramCredentialDeletion(user, MECHANISM) for user in users]
    admin = _admin(admin_config)  # alive until its futures are settled
    futures = admin.alter_user_scram_credentials(deletions, request_timeout=timeout_s)
    failed = _settle(futures, admin_config, "removing the SCRAM credentials", timeout_s)
    missing = [user for user, error in failed.items() if error.code() == KafkaError.RESOURCE_NOT_FOUND]
    if missing:
        msg = f"no {MECHANISM.name} credential at {servers} for {', '.join(map(repr, missing))}"
        raise NotFoundError(msg)
    if failed:
        listed = "; ".join(f"{user}: {error.str()}" for user, error in failed.items())
        msg = f"Kafka at {servers} did not remove the SCRAM credentials of {listed}"
        raise MixflowError(msg)
    if may_on_cluster(cluster_operations(admin_config, timeout_s), "DESCRIBE"):
        _wait_until_each_broker(admin_config, "still lists", dict.fromkeys(users, ""), _lists_no_user, timeout_s)


def _signs_in_with_scram(config: Mapping[str, Any]) -> bool:
    mechanism = str(config.get("sasl.mechanism", config.get("sasl.mechanisms", ""))).upper()
    return mechanism == "SCRAM-SHA-512" and str(config.get("security.protocol", "")).upper().startswith("SASL")


def _accepts_password(broker_config: Mapping[str, Any], user: str, password: str) -> bool:
    try:
        cluster_topics({**broker_config, "sasl.username": user, "sasl.password": password})
    except SecurityRefusedError:
        return False
    return True


def _described(broker_config: Mapping[str, Any], timeout_s: float) -> set[str]:
    admin = AdminClient({**broker_config, "log_level": 0})
    return set(admin.describe_user_scram_credentials(request_timeout=timeout_s).result(timeout=timeout_s))


def _lists_user(broker_config: Mapping[str, Any], user: str, _password: str) -> bool:
    return user in _described(broker_config, DEFAULT_TIMEOUT_S)


def _lists_no_user(broker_config: Mapping[str, Any], user: str, _password: str) -> bool:
    return user not in _described(broker_config, DEFAULT_TIMEOUT_S)


def _wait_until_each_broker(
    admin_config: Mapping[str, Any],
    behind: str,
    passwords: Mapping[str, str],
    in_effect: Callable[[Mapping[str, Any], str, str], bool],
    timeout_s: float,
) -> None:
    """Wait until ``in_effect`` holds for every user on every broker the cluster names, each asked alone
    (``bootstrap.servers`` set to it); ``MixflowError`` naming the broker and user still behind after
    ``timeout_s``."""
    metadata = AdminClient({**admin_config, "log_level": 0}).list_topics(timeout=timeout_s)
    brokers = sorted(f"{broker.host}:{broker.port}" for broker in metadata.brokers.values())
    deadline = time.monotonic() + timeout_s
    for broker in brokers:
        broker_config = {**admin_config, "bootstrap.servers": broker}
        for user, password in passwords.items():
            while not in_effect(broker_config, user, password):
                if time.monotonic() > deadline:
                    msg = f"Kafka broker {broker} {behind} user {user!r} {timeout_s:.0f} s after the change"
                    raise MixflowError(msg)
                time.sleep(_ASK_EVERY_S)


def list_users(admin_config: Mapping[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, list[str]]:
    """Every user with a SCRAM credential: its mechanisms and iterations (``SCRAM_SHA_512/4096``), by name."""
    admin = _admin(admin_config)  # alive until its future is settled
    # Asked first: librdkafka 2.16 aborts the process when the cluster refuses DescribeUserScramCredentials.
    if not may_on_cluster(cluster_operations(admin_config, timeout_s), "DESCRIBE"):
        raise refused_on_cluster(admin_config, "DESCRIBE", "listing the SCRAM users")
    future = admin.describe_user_scram_credentials(request_timeout=timeout_s)
    try:
        described = future.result(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is not None and error.code() in _NOT_ALLOWED:
            raise refused_on_cluster(admin_config, "DESCRIBE", "listing the SCRAM users") from None
        raise
    return {
        user: [f"{info.mechanism.name}/{info.iterations}" for info in description.scram_credential_infos]
        for user, description in sorted(described.items())
    }
