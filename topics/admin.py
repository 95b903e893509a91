"""Create, check and delete a job's topics with confluent_kafka's AdminClient.

Every call is bounded by ``timeout_s``: an unreachable cluster gives a ``MixflowError`` naming the
bootstrap servers, never a hang.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, ResourceType

from topics.errors import MixflowError, TopicLayoutError
from topics.names import JobTopics, TopicKind, parse_topic

DEFAULT_TIMEOUT_S = 15.0
DEFAULT_WORK_PARTITIONS = 8
LARGE_MESSAGE_BYTES = 64 * 1024 * 1024

_KEEP_FOR_REPLAY = {
    # Offsets are the checkpoint: a restart replays from them, so nothing may expire by age...
    "retention.ms": "-1",
    # ...or by size.
    "retention.bytes": "-1",
    # Records are never superseded by key; compaction would drop samples and steps that share a key.
    "cleanup.policy": "delete",
}
_LARGE_MESSAGES = {
    # A rank's batch, a long document's sample or a bad record's raw payload can be tens of MiB.
    "max.message.bytes": str(LARGE_MESSAGE_BYTES),
}
_LOG = logging.getLogger("mixflow.kafka")


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic as the job needs it: name, partition count and the topic configs we set."""

    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)


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


def job_layout(
    job: str,
    sources: Iterable[str],
    ranks: int,
    *,
    work_partitions: int = DEFAULT_WORK_PARTITIONS,
    extra_config: Mapping[str, str] | None = None,
) -> list[TopicSpec]:
    """The topics a job needs, in the order of ``JobTopics.all``; ``extra_config`` goes on every topic."""
    if isinstance(work_partitions, bool) or not isinstance(work_partitions, int) or work_partitions < 1:
        msg = f"work_partitions must be a positive int, not {work_partitions!r}"
        raise ValueError(msg)
    # Kafka spells booleans in lower case; the broker hands values back as strings.
    extra = {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in (extra_config or {}).items()}
    specs = []
    for name in JobTopics(job).all(list(sources), ranks):
        kind = parse_topic(name).kind
        # src: one ordered log per source, which the constructor reads deterministically.
        # work: several partitions so several loaders share a source's units through a group.
        partitions = work_partitions if kind is TopicKind.WORK else 1
        large = kind in (TopicKind.SRC, TopicKind.RANK, TopicKind.DLQ)
        specs.append(TopicSpec(name, partitions, {**_KEEP_FOR_REPLAY, **(_LARGE_MESSAGES if large else {}), **extra}))
    return specs


class _Admin:
    """An AdminClient with a deadline; every request gets the time left."""

    def __init__(self, bootstrap_or_config: str | Mapping[str, Any], timeout_s: float) -> None:
        if timeout_s <= 0:
            msg = f"timeout_s must be positive, not {timeout_s!r}"
            raise ValueError(msg)
        config = client_config(bootstrap_or_config)
        # librdkafka's connection-refused lines go to Python logging instead of straight to stderr.
        config.setdefault("logger", _LOG)
        self.servers = bootstrap_servers(config)
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        try:
            self.client = AdminClient(config)
        except KafkaException as exc:
            msg = f"bad Kafka client settings for {self.servers}: {exc.args[0]}"
            raise MixflowError(msg) from exc

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.001)

    def fail(self, what: str, exc: BaseException) -> MixflowError:
        reason = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {self.timeout_s:g} s"
        return MixflowError(f"cannot {what} on Kafka at {self.servers}: {reason}")

    def topics(self) -> dict[str, int]:
        """Every topic on the cluster and its partition count."""
        try:
            metadata = self.client.list_topics(timeout=self.left())
        except KafkaException as exc:
            raise self.fail(f"list topics (no answer within {self.timeout_s:g} s)", exc) from exc
        return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}

    def configs(self, names: list[str], *, overrides_only: bool = False) -> dict[str, dict[str, str]]:
        """The current config values of the named topics (only those set on the topic, if asked)."""
        resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
        out: dict[str, dict[str, str]] = {}
        if not resources:
            return out
        for resource, future in self.client.describe_configs(resources, request_timeout=self.left()).items():
            try:
                entries = future.result(timeout=self.left())
            except (KafkaException, TimeoutError) as exc:
                raise self.fail(f"describe the config of topic {resource.name}", exc) from exc
            out[resource.name] = {
                key: entry.value
                for key, entry in entries.items()
                if not overrides_only or entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
            }
        return out


def _error_code(exc: KafkaException) -> int | None:
    return exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None


def ensure_job_topics(
    bootstrap_or_config: str | Mapping[str, Any],
    job: str,
    sources: Iterable[str],
    ranks: int,
    *,
    work_partitions: int = DEFAULT_WORK_PARTITIONS,
    replication_factor: int = 1,
    extra_config: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[str]:
    """Create the job's topics that do not exist yet and check the layout of those that do.

    Returns the names this call created. Raises ``TopicLayoutError`` when an existing topic has a
    different partition count or a different value for a config key of the layout (replication factor
    is not compared), and ``MixflowError`` when the cluster cannot be reached within ``timeout_s``."""
    layout = job_layout(job, sources, ranks, work_partitions=work_partitions, extra_config=extra_config)
    return ensure_topics(bootstrap_or_config, layout, replication_factor=replication_factor, timeout_s=timeout_s)


def ensure_topics(
    bootstrap_or_config: str | Mapping[str, Any],
    layout: list[TopicSpec],
    *,
    replication_factor: int = 1,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[str]:
    """``ensure_job_topics`` for any list of topic specs. On return every topic shows in the cluster
    metadata with the layout's partition count and config values."""
    admin = _Admin(bootstrap_or_config, timeout_s)
    existing = admin.topics()
    missing = [spec for spec in layout if spec.name not in existing]
    created = _create(admin, missing, replication_factor)
    _check_layout(admin, layout, existing)
    return created


def _create(admin: _Admin, specs: list[TopicSpec], replication_factor: int) -> list[str]:
    if not specs:
        return []
    new = [
        NewTopic(
            spec.name,
            num_partitions=spec.partitions,
            replication_factor=replication_factor,
            config=dict(spec.config),
        )
        for spec in specs
    ]
    futures = admin.client.create_topics(new, operation_timeout=admin.left(), request_timeout=admin.left())
    # Another process created a topic after we listed them: its layout is checked like any other's.
    return _outcomes(admin, futures, "create", benign=KafkaError.TOPIC_ALREADY_EXISTS)


def _outcomes(admin: _Admin, futures: Mapping[str, Any], verb: str, benign: int) -> list[str]:
    """The topics whose create or delete succeeded; ``benign`` is the error that means another process
    got there first (not a failure); anything else raises, naming the topic."""
    done = []
    for name, future in futures.items():
        try:
            future.result(timeout=admin.left())
            done.append(name)
        except KafkaException as exc:
            if _error_code(exc) != benign:
                raise admin.fail(f"{verb} topic {name}", exc) from exc
        except TimeoutError as exc:
            raise admin.fail(f"{verb} topic {name}", exc) from exc
    return done


def _check_layout(admin: _Admin, specs: list[TopicSpec], partitions: dict[str, int]) -> None:
    if not specs:
        return
    delay = 0.05
    while absent := [spec.name for spec in specs if spec.name not in partitions]:
        # A topic just created (by us or a racing process) takes a moment to show in the metadata.
        if admin.deadline - time.monotonic() < delay:
            msg = f"topics {absent} were created on Kafka at {admin.servers} but did not show in its metadata"
            raise MixflowError(msg)
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
        partitions = admin.topics()
    configs = admin.configs([spec.name for spec in specs])
    problems = []
    for spec in specs:
        if partitions[spec.name] != spec.partitions:
            problems.append(f"topic {spec.name}: partitions expected {spec.partitions}, actual {partitions[spec.name]}")
        for key, expected in spec.config.items():
            actual = configs[spec.name].get(key)
            if actual != expected:
                problems.append(f"topic {spec.name}: {key} expected {expected}, actual {actual}")
    if problems:
        msg = f"existing topics on {admin.servers} differ from the job's layout: " + "; ".join(problems)
        raise TopicLayoutError(msg)


def describe_job_topics(
    bootstrap_or_config: str | Mapping[str, Any], job: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, TopicSpec]:
    """The job's topics as they are on the cluster, each with its non-default config values."""
    admin = _Admin(bootstrap_or_config, timeout_s)
    partitions = {name: n for name, n in admin.topics().items() if _is_job_topic(name, job)}
    configs = admin.configs(sorted(partitions), overrides_only=True)
    return {name: TopicSpec(name, partitions[name], configs[name]) for name in sorted(partitions)}


def topic_exists(
    bootstrap_or_config: str | Mapping[str, Any], topic: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    return topic in _Admin(bootstrap_or_config, timeout_s).topics()


def delete_job_topics(
    bootstrap_or_config: str | Mapping[str, Any], job: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[str]:
    """Delete every mixflow topic of ``job`` (and no other topic); returns the names deleted."""
    admin = _Admin(bootstrap_or_config, timeout_s)
    names = sorted(name for name in admin.topics() if _is_job_topic(name, job))
    if not names:
        return []
    futures = admin.client.delete_topics(names, operation_timeout=admin.left(), request_timeout=admin.left())
    # Someone else deleted a topic meanwhile: the outcome is the one we wanted.
    return sorted(_outcomes(admin, futures, "delete", benign=KafkaError.UNKNOWN_TOPIC_OR_PART))


def _is_job_topic(name: str, job: str) -> bool:
    if not name.startswith(JobTopics(job).prefix):
        return False
    try:
        return parse_topic(name).job == job
    except MixflowError:
        return False
