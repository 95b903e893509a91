"""An AdminClient whose every request is bounded by a deadline, for requests sent in batches of topics.

An unreachable cluster gives a ``MixflowError`` naming the bootstrap servers, never a hang. Each batch gets
``timeout_s`` of its own (``restart_clock``). A request the cluster refuses this client's principal is an
``AuthorizationError`` (exit 5) naming the principal, the operation and the topic or group."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType

from topics.errors import BrokerUnreachableError, MixflowError
from topics.kafka.authorization import is_authorization_error, refused

DEFAULT_TIMEOUT_S = 15.0
# Topics a request: small enough that a batch is answered well within the timeout on a loaded broker.
DEFAULT_BATCH_TOPICS = 500
_LOG = logging.getLogger("mixflow.kafka")
# Errors that say the cluster was not reached, rather than that it refused a request.
_UNREACHED = frozenset(
    {KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT}
)
T = TypeVar("T")
Refusal = tuple[str, str, str, str]
"""How a refusal is said (``topics.kafka.authorization.refused``): the operation, the kind of resource, its name, and
what was being done."""


def client_config(
    bootstrap_or_config: str | Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """librdkafka settings from a bootstrap string (``"host:9092,host2:9092"``) or a dict of settings
    (for SASL/SSL), with ``overrides`` on top. Raises ``ValueError`` when no bootstrap servers are set."""
    if isinstance(bootstrap_or_config, str):
        config: dict[str, Any] = {"bootstrap.servers": bootstrap_or_config}
    elif isinstance(bootstrap_or_config, Mapping):
        config = dict(bootstrap_or_config)
    else:
        kind = type(bootstrap_or_config).__name__
        msg = f"expected a bootstrap string or a dict of Kafka settings, not {kind}"
        raise ValueError(msg)
    config.update(overrides or {})
    if not str(config.get("bootstrap.servers") or config.get("metadata.broker.list") or "").strip():
        msg = "no Kafka bootstrap servers given (set bootstrap.servers)"
        raise ValueError(msg)
    return config


def bootstrap_servers(config: Mapping[str, Any]) -> str:
    """The bootstrap servers of a client config, for messages."""
    return str(config.get("bootstrap.servers") or config.get("metadata.broker.list"))


def batched(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``, in order."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def error_code(exc: KafkaException) -> int | None:
    return exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None


class DeadlineAdmin:
    """An AdminClient with a deadline; every request gets the time left."""

    def __init__(
        self, bootstrap_or_config: str | Mapping[str, Any], timeout_s: float, batch_topics: int = DEFAULT_BATCH_TOPICS
    ) -> None:
        if timeout_s <= 0:
            msg = f"timeout_s must be positive, not {timeout_s!r}"
            raise ValueError(msg)
        if isinstance(batch_topics, bool) or not isinstance(batch_topics, int) or batch_topics < 1:
            msg = f"batch_topics must be a positive int, not {batch_topics!r}"
            raise ValueError(msg)
        self.batch_topics = batch_topics
        config = client_config(bootstrap_or_config)
        # librdkafka's connection-refused lines go to Python logging instead of straight to stderr.
        config.setdefault("logger", _LOG)
        self.servers = bootstrap_servers(config)
        self.config = config
        self.timeout_s = timeout_s
        self.brokers = 0  # live brokers, known once topics() has asked for the metadata
        self.deadline = time.monotonic() + timeout_s
        try:
            self.client = AdminClient(config)
        except KafkaException as exc:
            msg = f"bad Kafka client settings for {self.servers}: {exc.args[0]}"
            raise MixflowError(msg) from exc

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.001)

    def restart_clock(self) -> None:
        """A new batch: ``timeout_s`` from now."""
        self.deadline = time.monotonic() + self.timeout_s

    def fail(self, what: str, exc: BaseException, refusal: Refusal | None = None) -> MixflowError:
        """The error to raise when ``what`` failed with ``exc``; ``refusal`` (operation, resource kind, name, what
        was being done): how an authorization error is said, as the principal refused that operation there."""
        if refusal is not None and isinstance(exc, KafkaException) and exc.args and is_authorization_error(exc.args[0]):
            return refused(self.config, *refusal)
        reason = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {self.timeout_s:g} s"
        unreached = isinstance(exc, TimeoutError) or (isinstance(exc, KafkaException) and error_code(exc) in _UNREACHED)
        kind = BrokerUnreachableError if unreached else MixflowError
        return kind(f"cannot {what} on Kafka at {self.servers}: {reason}")

    def topics(self, names: Collection[str] | None = None) -> dict[str, int]:
        """Every topic on the cluster and its partition count; with ``names``, those of them that exist (and
        this client may describe): one request for those topics' metadata, not the whole cluster's, which on
        a shared cluster of thousands of topics is hundreds of times larger."""
        if names is not None:
            return self._described(names)
        try:
            metadata = self.client.list_topics(timeout=self.left())
        except KafkaException as exc:
            raise self.fail(f"list topics (no answer within {self.timeout_s:g} s)", exc) from exc
        self.brokers = len(metadata.brokers)  # the live brokers, for the default replication factor
        return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}

    def _described(self, names: Collection[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for batch in batched(sorted(set(names)), self.batch_topics):
            futures = self.client.describe_topics(TopicCollection(list(batch)), request_timeout=self.left())
            for name, future in futures.items():
                try:
                    found[name] = len(future.result(timeout=self.left()).partitions)
                except KafkaException as exc:
                    # A topic this principal may not describe is left out, as a listing of the cluster leaves it.
                    if error_code(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART or is_authorization_error(exc.args[0]):
                        continue
                    raise self.fail(f"describe topic {name} (no answer within {self.timeout_s:g} s)", exc) from exc
                except TimeoutError as exc:
                    raise self.fail(f"describe topic {name}", exc) from exc
        return found

    def live_brokers(self) -> int:
        """The live brokers (for the default replication factor): known from a listing, else asked for."""
        if not self.brokers:
            try:
                self.brokers = len(self.client.describe_cluster(request_timeout=self.left()).result().nodes)
            except KafkaException as exc:
                raise self.fail(f"describe the cluster (no answer within {self.timeout_s:g} s)", exc) from exc
        return self.brokers

    def configs(self, names: list[str], *, overrides_only: bool = False) -> dict[str, dict[str, str]]:
        """The current config values of the named topics (only those set on the topic, if asked)."""
        out: dict[str, dict[str, str]] = {}
        for batch in batched(names, self.batch_topics):
            self.restart_clock()
            pending = list(batch)
            while pending:
                resources = [ConfigResource(ResourceType.TOPIC, name) for name in pending]
                pending = []
                for resource, future in self.client.describe_configs(resources, request_timeout=self.left()).items():
                    try:
                        entries = future.result(timeout=self.left())
                    except (KafkaException, TimeoutError) as exc:
                        # A topic just created can be in the controller's metadata before the broker asked
                        # knows it (seen on a loaded 3-node cluster): ask again within the batch's time.
                        unknown = (
                            isinstance(exc, KafkaException) and error_code(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART
                        )
                        if unknown and self.left() > 0.5:
                            pending.append(resource.name)
                            continue
                        refusal = ("DESCRIBE_CONFIGS", "topic", resource.name, "reading its config")
                        raise self.fail(f"describe the config of topic {resource.name}", exc, refusal) from exc
                    out[resource.name] = {
                        key: entry.value
                        for key, entry in entries.items()
                        if not overrides_only or entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
                    }
                if pending:
                    time.sleep(0.2)  # backoff before asking again
        return out

    def outcomes(
        self, futures: Mapping[str, Any], verb: str, benign: int, refusal: tuple[str, str, str] | None = None
    ) -> list[str]:
        """The names whose create or delete (``verb``, as "create topic") succeeded; ``benign`` is the error
        that means another process got there first (not a failure); anything else raises, naming what failed
        (``refusal``: the operation, the kind of resource and what was being done, for an authorization error)."""
        done = []
        for name, future in futures.items():
            said = (refusal[0], refusal[1], name, refusal[2]) if refusal is not None else None
            try:
                future.result(timeout=self.left())
                done.append(name)
            except KafkaException as exc:
                if error_code(exc) != benign:
                    raise self.fail(f"{verb} {name}", exc, said) from exc
            except TimeoutError as exc:
                raise self.fail(f"{verb} {name}", exc) from exc
        return done
