"""Applying a job's ACLs (``topics.kafka.acls``) with the admin client: create, list, delete. A principal not
allowed to change ACLs (``ALTER`` on the cluster: a super user's right) is refused in one line naming it, the
operation and what it asked for (``AuthorizationError``, exit 5), never with Kafka's own message (a dump of
its request object)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from topics.errors import MixflowError
from topics.kafka.acls import Binding, Operation, Pattern, Resource
from topics.kafka.authorization import is_authorization_error, refused_on_cluster
from topics.kafka.cluster_probe import cluster_topics

TIMEOUT_S = 30.0

_RESOURCES = {
    Resource.TOPIC: ResourceType.TOPIC,
    Resource.GROUP: ResourceType.GROUP,
    Resource.TRANSACTIONAL_ID: ResourceType.TRANSACTIONAL_ID,
}
_PATTERNS = {Pattern.LITERAL: ResourcePatternType.LITERAL, Pattern.PREFIXED: ResourcePatternType.PREFIXED}
_OPERATIONS = {op: AclOperation[op.name] for op in Operation}


def kafka_binding(binding: Binding) -> AclBinding:
    return AclBinding(
        _RESOURCES[binding.resource],
        binding.name,
        _PATTERNS[binding.pattern],
        binding.principal,
        "*",
        _OPERATIONS[binding.operation],
        AclPermissionType.ALLOW,
    )


def _exact_filter(binding: Binding) -> AclBindingFilter:
    acl = kafka_binding(binding)
    return AclBindingFilter(
        acl.restype, acl.name, acl.resource_pattern_type, acl.principal, acl.host, acl.operation, acl.permission_type
    )


def _principal_filter(principal: str) -> AclBindingFilter:
    # None matches any name and any host (confluent_kafka's documentation; its type stub says str).
    return AclBindingFilter(
        ResourceType.ANY,
        None,  # type: ignore[arg-type]
        ResourcePatternType.ANY,
        principal,
        None,  # type: ignore[arg-type]
        AclOperation.ANY,
        AclPermissionType.ANY,
    )


def _mixflow_binding(acl: AclBinding) -> Binding | None:
    """``acl`` as a ``Binding``, if it is one mixflow could have made (ALLOW from any host, on a topic, group
    or transactional id, literal or prefixed, an operation mixflow grants)."""
    resources = {v: k for k, v in _RESOURCES.items()}
    patterns = {v: k for k, v in _PATTERNS.items()}
    operations = {v: k for k, v in _OPERATIONS.items()}
    # A binding the cluster lists has its type, pattern and operation as enums (a filter's may be names).
    restype = cast(ResourceType, acl.restype)
    pattern = cast(ResourcePatternType, acl.resource_pattern_type)
    operation = cast(AclOperation, acl.operation)
    allowed = acl.permission_type == AclPermissionType.ALLOW and acl.host == "*"
    known = restype in resources and pattern in patterns and operation in operations
    if not (allowed and known):
        return None
    return Binding(acl.principal, resources[restype], patterns[pattern], acl.name, operations[operation])


def _filter_text(acl_filter: AclBindingFilter) -> str:
    """A binding filter as ``Binding`` prints a binding, when it is one mixflow could have made."""
    acl = AclBinding(
        acl_filter.restype,
        acl_filter.name,
        acl_filter.resource_pattern_type,
        acl_filter.principal,
        acl_filter.host,
        acl_filter.operation,
        acl_filter.permission_type,
    )
    return str(_mixflow_binding(acl) or acl_filter)


class AclAdmin:
    """The cluster's ACLs, through an admin client with ``config`` (a principal allowed to ALTER and
    DESCRIBE the cluster's ACLs: a super user)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        cluster_topics(config)  # an unreachable cluster, or one refusing these credentials, said in one line
        self._client = AdminClient({**config, "log_level": 0})
        self._config = config
        self._where = config.get("bootstrap.servers", "?")

    def _fail(self, what: str, exc: BaseException, operation: str = "ALTER") -> MixflowError:
        if isinstance(exc, KafkaException) and exc.args and is_authorization_error(exc.args[0]):
            return refused_on_cluster(self._config, operation, what)
        reason = exc.args[0].str() if isinstance(exc, KafkaException) and exc.args else exc
        return MixflowError(f"cannot {what} on Kafka at {self._where}: {reason}")

    def granted(self, principals: Iterable[str]) -> set[Binding]:
        """The bindings the cluster holds for ``principals`` that mixflow could have made, asked for all at once
        (a trainer per rank makes a principal per rank)."""
        out: set[Binding] = set()
        asked = {}
        for principal in sorted(set(principals)):
            try:
                asked[principal] = self._client.describe_acls(_principal_filter(principal), request_timeout=TIMEOUT_S)
            except KafkaException as exc:
                raise self._fail(f"listing the ACLs of {principal}", exc, "DESCRIBE") from exc
        for principal, found in asked.items():
            try:
                acls = found.result(timeout=TIMEOUT_S)
            except (KafkaException, TimeoutError) as exc:
                raise self._fail(f"listing the ACLs of {principal}", exc, "DESCRIBE") from exc
            out.update(b for acl in acls if (b := _mixflow_binding(acl)) is not None)
        return out

    def settle(self, bindings: Sequence[Binding], *, present: bool, timeout_s: float = TIMEOUT_S) -> None:
        """Wait until the cluster's answer holds every one of ``bindings`` (``present``) or none: a change of
        ACLs reaches the brokers' metadata a moment after the request returns."""
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        wanted = set(bindings)
        while True:
            held = self.granted({b.principal for b in wanted}) & wanted
            if held == (wanted if present else set()):
                return
            if time.monotonic() + delay > deadline:
                state = "in force" if present else "gone"
                msg = f"{len(wanted ^ held if present else held)} ACL bindings were not {state} at {self._where} "
                raise MixflowError(msg + f"within {timeout_s:g} s")
            time.sleep(delay)  # poll interval of the ACL listing
            delay = min(delay * 2, 1.0)

    def create(self, bindings: Sequence[Binding]) -> None:
        """Create ``bindings`` (those that exist already are left as they are) and wait until they hold."""
        if not bindings:
            return
        futures = self._client.create_acls([kafka_binding(b) for b in bindings], request_timeout=TIMEOUT_S)
        for acl, future in futures.items():
            try:
                future.result(timeout=TIMEOUT_S)
            except (KafkaException, TimeoutError) as exc:
                raise self._fail(f"creating the ACL {_mixflow_binding(acl) or acl}", exc) from exc
        self.settle(bindings, present=True)

    def delete(self, bindings: Sequence[Binding]) -> int:
        """Delete ``bindings``; returns how many the cluster held."""
        if not bindings:
            return 0
        futures = self._client.delete_acls([_exact_filter(b) for b in bindings], request_timeout=TIMEOUT_S)
        deleted = 0
        for acl_filter, future in futures.items():
            try:
                deleted += len(future.result(timeout=TIMEOUT_S))
            except (KafkaException, TimeoutError) as exc:
                raise self._fail(f"deleting the ACL {_filter_text(acl_filter)}", exc) from exc
        self.settle(bindings, present=False)
        return deleted
