"""Create, check and delete a job's topics with confluent_kafka's AdminClient.

Every call is bounded by ``timeout_s``: an unreachable cluster gives a ``MixflowError`` naming the
bootstrap servers, never a hang. Topics go to the cluster in batches of at most ``batch_topics`` a request
(create, describe configs, delete), one batch after another, and each batch gets ``timeout_s`` of its own:
a job of 10,240 ranks has over 10,000 topics, and one request for all of them would hold the controller
(and the call's single deadline) for as long as the whole lot takes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, ResourceType

from topics.errors import MixflowError, TopicLayoutError
from topics.names import JobTopics, TopicKind, parse_topic

DEFAULT_TIMEOUT_S = 15.0
DEFAULT_WORK_PARTITIONS = 8
# Topics a request: small enough that a batch is answered well within the timeout on a loaded broker.
DEFAULT_BATCH_TOPICS = 500
LARGE_MESSAGE_BYTES = 64 * 1024 * 1024

_KEEP_FOR_REPLAY = {
    # Offsets are the checkpoint: a restart replays from them, so nothing may expire by age...
    "retention.ms": "-1",
    # ...or by size.
    "retention.bytes": "-1",
    # Records are never superseded by key; compaction would drop samples and steps that share a key.
    "cleanup.policy": "delete",
}
_LATEST_PER_KEY = {
    # The progress topic: only each rank's latest report matters, and old ones may go.
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "retention.bytes": "-1",
}
_LARGE_MESSAGES = {
    # A rank's batch, a long document's sample or a bad record's raw payload can be tens of MiB.
    "max.message.bytes": str(LARGE_MESSAGE_BYTES),
}
_LOG = logging.getLogger("mixflow.kafka")
# Replicas of a job topic when the caller does not say: as many as the cluster has brokers, up to this.
MAX_DEFAULT_REPLICATION_FACTOR = 3
T = TypeVar("T")


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
    lanes: int = 1,
) -> list[TopicSpec]:
    """The topics a job needs, in the order of ``JobTopics.all``; ``extra_config`` goes on every topic.
    ``lanes`` (the spec's ``constructor.lanes``) is the partition count of the source, rank and state
    topics: constructor lane ``j`` reads and writes their partition ``j`` (``topics/lanes.py``)."""
    if isinstance(work_partitions, bool) or not isinstance(work_partitions, int) or work_partitions < 1:
        msg = f"work_partitions must be a positive int, not {work_partitions!r}"
        raise ValueError(msg)
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
        msg = f"lanes must be a positive int, not {lanes!r}"
        raise ValueError(msg)
    # Kafka spells booleans in lower case; the broker hands values back as strings.
    extra = {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in (extra_config or {}).items()}
    specs = []
    for name in JobTopics(job).all(list(sources), ranks):
        kind = parse_topic(name).kind
        # src: one ordered log per source and lane, which the lane's constructor reads deterministically.
        # work: several partitions so several loaders share a source's units through a group.
        # rank, state: a partition per lane, each written by its lane's constructor.
        partitions = work_partitions if kind is TopicKind.WORK else 1
        if kind in (TopicKind.SRC, TopicKind.RANK, TopicKind.STATE):
            partitions = lanes
        large = kind in (TopicKind.SRC, TopicKind.RANK, TopicKind.DLQ)
        kept = _LATEST_PER_KEY if kind is TopicKind.PROGRESS else _KEEP_FOR_REPLAY
        specs.append(TopicSpec(name, partitions, {**kept, **(_LARGE_MESSAGES if large else {}), **extra}))
    return specs


def batched(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``, in order."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def default_replication_factor(brokers: int) -> int:
    """Replicas of a job topic on a cluster of ``brokers``: ``min(3, brokers)``."""
    return max(1, min(MAX_DEFAULT_REPLICATION_FACTOR, brokers))


def min_insync_replicas(replication_factor: int) -> int:
    """In-sync replicas a write needs: 2 of 3 or more, so that one broker down stops no writer and an
    acknowledged record is on two brokers; 1 below 3 replicas (2 of 2 would stop writes when one is down)."""
    return 2 if replication_factor >= 3 else 1


class _Admin:
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
        self.brokers = len(metadata.brokers)  # the live brokers, for the default replication factor
        return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}

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
                            isinstance(exc, KafkaException) and _error_code(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART
                        )
                        if unknown and self.left() > 0.5:
                            pending.append(resource.name)
                            continue
                        raise self.fail(f"describe the config of topic {resource.name}", exc) from exc
                    out[resource.name] = {
                        key: entry.value
                        for key, entry in entries.items()
                        if not overrides_only or entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
                    }
                if pending:
                    time.sleep(0.2)  # backoff before asking again
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
    replication_factor: int | None = None,
    extra_config: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    lanes: int = 1,
    batch_topics: int = DEFAULT_BATCH_TOPICS,
) -> list[str]:
    """Create the job's topics that do not exist yet and check the layout of those that do.

    Returns the names this call created. Raises ``TopicLayoutError`` when an existing topic has a
    different partition count or a different value for a config key of the layout (replication factor
    is not compared), and ``MixflowError`` when the cluster cannot be reached within ``timeout_s`` (a batch
    of ``batch_topics`` topics each)."""
    layout = job_layout(job, sources, ranks, work_partitions=work_partitions, extra_config=extra_config, lanes=lanes)
    return ensure_topics(
        bootstrap_or_config,
        layout,
        replication_factor=replication_factor,
        timeout_s=timeout_s,
        batch_topics=batch_topics,
    )


def ensure_topics(
    bootstrap_or_config: str | Mapping[str, Any],
    layout: list[TopicSpec],
    *,
    replication_factor: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    batch_topics: int = DEFAULT_BATCH_TOPICS,
) -> list[str]:
    """``ensure_job_topics`` for any list of topic specs. On return every topic shows in the cluster
    metadata with the layout's partition count and config values. Only the topics missing from the
    cluster's metadata are created, ``batch_topics`` a request, with ``replication_factor`` replicas
    (``default_replication_factor`` of the live brokers when None) and, at 3 replicas or more,
    ``min.insync.replicas=2`` unless the layout's config sets it."""
    admin = _Admin(bootstrap_or_config, timeout_s, batch_topics)
    existing = admin.topics()
    missing = [spec for spec in layout if spec.name not in existing]
    factor = default_replication_factor(admin.brokers) if replication_factor is None else replication_factor
    created = _create(admin, missing, factor)
    _check_layout(admin, layout, existing)
    return created


def _create(admin: _Admin, specs: list[TopicSpec], replication_factor: int) -> list[str]:
    created = []
    for batch in batched(specs, admin.batch_topics):
        admin.restart_clock()
        new = [
            NewTopic(
                spec.name,
                num_partitions=spec.partitions,
                replication_factor=replication_factor,
                config={**_replicated(replication_factor), **spec.config},
            )
            for spec in batch
        ]
        futures = admin.client.create_topics(new, operation_timeout=admin.left(), request_timeout=admin.left())
        # Another process created a topic after we listed them: its layout is checked like any other's.
        created += _outcomes(admin, futures, "create topic", benign=KafkaError.TOPIC_ALREADY_EXISTS)
    return created


def _replicated(replication_factor: int) -> dict[str, str]:
    """Topic config for ``replication_factor`` replicas: the in-sync minimum, set only where it is not 1
    (the broker's default)."""
    needed = min_insync_replicas(replication_factor)
    return {"min.insync.replicas": str(needed)} if needed > 1 else {}


def _outcomes(admin: _Admin, futures: Mapping[str, Any], verb: str, benign: int) -> list[str]:
    """The names whose create or delete (``verb``, as "create topic") succeeded; ``benign`` is the error that
    means another process got there first (not a failure); anything else raises, naming what failed."""
    done = []
    for name, future in futures.items():
        try:
            future.result(timeout=admin.left())
            done.append(name)
        except KafkaException as exc:
            if _error_code(exc) != benign:
                raise admin.fail(f"{verb} {name}", exc) from exc
        except TimeoutError as exc:
            raise admin.fail(f"{verb} {name}", exc) from exc
    return done


def _check_layout(admin: _Admin, specs: list[TopicSpec], partitions: dict[str, int]) -> None:
    if not specs:
        return
    admin.restart_clock()
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
    bootstrap_or_config: str | Mapping[str, Any],
    job: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    batch_topics: int = DEFAULT_BATCH_TOPICS,
) -> dict[str, TopicSpec]:
    """The job's topics as they are on the cluster, each with its non-default config values."""
    admin = _Admin(bootstrap_or_config, timeout_s, batch_topics)
    partitions = {name: n for name, n in admin.topics().items() if _is_job_topic(name, job)}
    configs = admin.configs(sorted(partitions), overrides_only=True)
    return {name: TopicSpec(name, partitions[name], configs[name]) for name in sorted(partitions)}


def topic_exists(
    bootstrap_or_config: str | Mapping[str, Any], topic: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    return topic in _Admin(bootstrap_or_config, timeout_s).topics()


def delete_job_topics(
    bootstrap_or_config: str | Mapping[str, Any],
    job: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    batch_topics: int = DEFAULT_BATCH_TOPICS,
) -> list[str]:
    """Delete every mixflow topic of ``job`` (and no other topic), ``batch_topics`` a request; returns the
    names deleted."""
    admin = _Admin(bootstrap_or_config, timeout_s, batch_topics)
    names = sorted(name for name in admin.topics() if _is_job_topic(name, job))
    deleted = []
    for batch in batched(names, admin.batch_topics):
        admin.restart_clock()
        futures = admin.client.delete_topics(list(batch), operation_timeout=admin.left(), request_timeout=admin.left())
        # Someone else deleted a topic meanwhile: the outcome is the one we wanted.
        deleted += _outcomes(admin, futures, "delete topic", benign=KafkaError.UNKNOWN_TOPIC_OR_PART)
    return sorted(deleted)


def list_jobs(
    bootstrap_or_config: str | Mapping[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, dict[str, int]]:
    """Every job that has mixflow topics on the cluster: its topics and their partition counts."""
    jobs: dict[str, dict[str, int]] = {}
    for name, partitions in sorted(_Admin(bootstrap_or_config, timeout_s).topics().items()):
        try:
            job = parse_topic(name).job
        except MixflowError:
            continue  # not a mixflow topic
        jobs.setdefault(job, {})[name] = partitions
    return jobs


def job_groups(
    bootstrap_or_config: str | Mapping[str, Any], job: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, int]:
    """The consumer groups of ``job`` (every group mixflow makes for a job is named ``<job>.<...>``, and a
    job name has no dot) and how many members each has now."""
    admin = _Admin(bootstrap_or_config, timeout_s)
    try:
        listed = admin.client.list_consumer_groups(request_timeout=admin.left()).result(timeout=admin.left())
        ids = sorted(g.group_id for g in listed.valid if g.group_id.split(".", 1)[0] == job and "." in g.group_id)
        if not ids:
            return {}
        described = admin.client.describe_consumer_groups(ids, request_timeout=admin.left())
        return {group: len(future.result(timeout=admin.left()).members) for group, future in described.items()}
    except (KafkaException, TimeoutError) as exc:
        raise admin.fail(f"describe the consumer groups of job {job}", exc) from exc


def delete_groups(
    bootstrap_or_config: str | Mapping[str, Any], groups: Iterable[str], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[str]:
    """Delete the named consumer groups (their committed offsets); one already gone counts as deleted.
    A group with members is refused by the broker, which raises naming it."""
    admin = _Admin(bootstrap_or_config, timeout_s)
    names = sorted(groups)
    if not names:
        return []
    futures = admin.client.delete_consumer_groups(names, request_timeout=admin.left())
    return sorted(_outcomes(admin, futures, "delete consumer group", benign=KafkaError.GROUP_ID_NOT_FOUND))


def _is_job_topic(name: str, job: str) -> bool:
    if not name.startswith(JobTopics(job).prefix):
        return False
    try:
        return parse_topic(name).job == job
    except MixflowError:
        return False
