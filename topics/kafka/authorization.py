"""Kafka's authorization refusals, said in one line: the principal, the resource and the missing operation.

A secured cluster refuses a principal what its ACLs do not grant (``mixflow acl plan`` lists what each role of
a job is granted); librdkafka says only which kind of resource (``TOPIC_AUTHORIZATION_FAILED`` and the like),
so the callers that know the resource name it. Nothing here quotes a client setting but the user name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient

from topics.errors import MixflowError, RefusedError
from topics.kafka.librdkafka_log import logged
from topics.kafka.settings import settings_principal

EPHEMERAL_GROUP_PREFIX = "mixflow-"
"""Readers that never join a group or commit name theirs ``mixflow-<what>-<random>``: librdkafka still looks up
its coordinator, which takes DESCRIBE on the group (and allows no commit)."""

AUTHORIZATION_FAILED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
}
"""librdkafka's authorization error codes, and the kind of resource each is about."""


class AuthorizationError(RefusedError):
    """The cluster refused this client's principal an operation its ACLs do not grant; nothing was written."""


def is_authorization_error(error: object) -> bool:
    return isinstance(error, KafkaError) and error.code() in AUTHORIZATION_FAILED


def principal_of(config: Mapping[str, Any]) -> str:
    """The principal a client with ``config`` authenticates as, as Kafka's ACLs name it (a client certificate's
    as the secured stack's mTLS listener maps it)."""
    try:
        if principal := settings_principal(config):
            return principal
    except MixflowError:
        pass  # an unreadable certificate: named generically below
    protocol = str(config.get("security.protocol", "plaintext")).lower()
    return "the client's certificate principal" if protocol == "ssl" else "User:ANONYMOUS"


def refused(config: Mapping[str, Any], operation: str, resource: str, name: str, doing: str = "") -> AuthorizationError:
    """``AuthorizationError`` saying that ``config``'s principal lacks ``operation`` on ``resource`` ``name``."""
    where = config.get("bootstrap.servers", "?")
    what = f" ({doing})" if doing else ""
    msg = (
        f"Kafka at {where} refused {principal_of(config)} {operation} on {resource} {name}{what}: its ACLs do not "
        "grant it (`mixflow acl plan --spec SPEC` lists what each role's principal is granted)"
    )
    return AuthorizationError(msg)


def topics_without(
    config: Mapping[str, Any], topics: Iterable[str], operation: str, timeout_s: float = 10.0
) -> list[str]:
    """Those of ``topics`` on which ``config``'s principal (a client's settings, no producer's or consumer's own)
    lacks ``operation`` (``AclOperation``'s name, e.g.
    ``WRITE``), as the cluster says (a topic it may not even describe counts); all of them when the cluster
    does not answer in time."""
    names = sorted(set(topics))
    if not names:
        return []
    client = AdminClient(logged(config))
    wanted = AclOperation[operation]
    try:
        futures = client.describe_topics(
            TopicCollection(names), request_timeout=timeout_s, include_authorized_operations=True
        )
    except KafkaException:
        return names
    lacking = []
    for name, future in futures.items():
        try:
            granted = future.result(timeout=timeout_s).authorized_operations or []
        except (KafkaException, TimeoutError):
            lacking.append(name)
            continue
        if wanted not in granted and AclOperation.ALL not in granted:
            lacking.append(name)
    return sorted(lacking)


def raise_if_read_refused(config: Mapping[str, Any], error: KafkaError, topic: str) -> None:
    """``AuthorizationError`` when ``error`` (a consumer's, ``config`` its settings) is the cluster refusing its
    principal to read ``topic``, or to use its group: DESCRIBE (finding the coordinator) for a reader that
    never joins or commits (its group named ``EPHEMERAL_GROUP_PREFIX``...), READ for one that does."""
    if not is_authorization_error(error):
        return
    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        raise refused(config, "READ", "topic", topic, "reading it")
    group = str(config.get("group.id") or "")
    operation = "DESCRIBE" if group.startswith(EPHEMERAL_GROUP_PREFIX) else "READ"
    raise refused(config, operation, "group", group or "of this consumer", f"reading {topic}")


def refused_on_cluster(config: Mapping[str, Any], operation: str, doing: str) -> AuthorizationError:
    """``AuthorizationError`` saying that ``config``'s principal lacks ``operation`` on the cluster itself, which
    changing users or ACLs takes (Kafka's own message for it is a dump of its request object, never shown)."""
    where = config.get("bootstrap.servers", "?")
    msg = (
        f"Kafka at {where} refused {principal_of(config)} {operation} on the cluster ({doing}): only a super user "
        f"(or a principal granted {operation} on the cluster) may; give an admin's client settings (--admin-config)"
    )
    return AuthorizationError(msg)


def cluster_operations(config: Mapping[str, Any], timeout_s: float = 10.0) -> set[AclOperation]:
    """The operations on the cluster itself that ``config``'s principal is granted, as the cluster says (none when
    it says nothing)."""
    client = AdminClient(logged(config))
    described = client.describe_cluster(include_authorized_operations=True, request_timeout=timeout_s)
    return set(described.result(timeout=timeout_s).authorized_operations or ())


def may_on_cluster(granted: Iterable[AclOperation], operation: str) -> bool:
    """Whether ``granted`` (``cluster_operations``) allows ``operation``, as Kafka implies them: ALL allows
    everything, ALTER implies DESCRIBE, ALTER_CONFIGS implies DESCRIBE_CONFIGS."""
    implied = {"DESCRIBE": {"ALTER"}, "DESCRIBE_CONFIGS": {"ALTER_CONFIGS"}}.get(operation, set())
    names = {op.name for op in granted}
    return bool(names & {operation, "ALL", *implied})
