"""Create, check and delete a job's topics with confluent_kafka's AdminClient.

Every call is bounded by ``timeout_s``: an unreachable cluster gives a ``MixflowError`` naming the
bootstrap servers, never a hang. Topics go to the cluster in batches of at most ``batch_topics`` a request
(create, describe configs, delete), one batch after another, and each batch gets ``timeout_s`` of its own:
a job of 10,240 ranks has over 10,000 topics, and one request for all of them would hold the controller
(and the call's single deadline) for as long as the whole lot takes.

What a job's topics are is ``topics/formats/topic_layout.py``; the client with its deadline
``topics/kafka/admin_client.py``; the job's consumer groups ``topics/kafka/group_admin.py``. Their public names
are importable from here as well.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from topics.errors import MixflowError, TopicLayoutError
from topics.formats.names import JobTopics, parse_topic
from topics.formats.topic_layout import (
    DEFAULT_WORK_PARTITIONS,
    LARGE_MESSAGE_BYTES,
    MAX_DEFAULT_REPLICATION_FACTOR,
    TopicSpec,
    default_replication_factor,
    job_layout,
    min_insync_replicas,
    replicated_config,
)
from topics.kafka.admin_client import (
    DEFAULT_BATCH_TOPICS,
    DEFAULT_TIMEOUT_S,
    DeadlineAdmin,
    batched,
    bootstrap_servers,
    client_config,
    error_code,
)
from topics.kafka.authorization import refused as refusal
from topics.kafka.group_admin import delete_groups, job_groups

log = logging.getLogger("mixflow.kafka")

__all__ = [
    "DEFAULT_BATCH_TOPICS",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_WORK_PARTITIONS",
    "LARGE_MESSAGE_BYTES",
    "MAX_DEFAULT_REPLICATION_FACTOR",
    "TopicSpec",
    "batched",
    "bootstrap_servers",
    "client_config",
    "default_replication_factor",
    "delete_groups",
    "delete_job_topics",
    "describe_job_topics",
    "ensure_job_topics",
    "ensure_loader_topics",
    "ensure_topics",
    "job_groups",
    "job_layout",
    "list_jobs",
    "min_insync_replicas",
    "topic_exists",
]


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


def ensure_loader_topics(
    bootstrap_or_config: str | Mapping[str, Any], job: str, source: str, *, lanes: int = 1, **options: Any
) -> list[str]:
    """The topics a loader of ``source`` uses: its source's own (samples, work units, plan), which it creates,
    and the job's control and dead-letter topics, which it creates where its ACLs let it and otherwise waits
    for (``ensure_topics``' ``others_create``). It creates no other topic of the job."""
    topics = JobTopics(job)
    shared = (topics.control, topics.dlq)
    used = {topics.src(source), topics.work(source), topics.plan(source), *shared}
    layout = [spec for spec in job_layout(job, [source], 1, lanes=lanes) if spec.name in used]
    return ensure_topics(bootstrap_or_config, layout, others_create=shared, **options)


def ensure_topics(
    bootstrap_or_config: str | Mapping[str, Any],
    layout: list[TopicSpec],
    *,
    replication_factor: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    batch_topics: int = DEFAULT_BATCH_TOPICS,
    others_create: Collection[str] = (),
    wait_for_others_s: float = 600.0,
) -> list[str]:
    """``ensure_job_topics`` for any list of topic specs. On return every topic shows in the cluster
    metadata with the layout's partition count and config values. Only the topics missing from the
    cluster's metadata are created, ``batch_topics`` a request, with ``replication_factor`` replicas
    (``default_replication_factor`` of the live brokers when None) and, at 3 replicas or more,
    ``min.insync.replicas=2`` unless the layout's config sets it.

    The topics named in ``others_create`` are created too where the cluster lets this client; where its ACLs
    do not (a loader's principal may create only its source's topics), the call waits up to
    ``wait_for_others_s`` for the role that may (the operator's ``mixflow run``, or the constructor) to create
    them, saying so every ``WAIT_LOG_INTERVAL_S``."""
    admin = DeadlineAdmin(bootstrap_or_config, timeout_s, batch_topics)
    existing = admin.topics([spec.name for spec in layout])
    missing = [spec for spec in layout if spec.name not in existing]
    factor = replication_factor
    if factor is None:
        factor = default_replication_factor(admin.live_brokers()) if missing else 1
    refused: list[str] = []
    created = _create(admin, missing, factor, refused if others_create else None)
    if not_ours := [name for name in refused if name not in others_create]:
        raise refusal(client_config(bootstrap_or_config), "CREATE", "topic", not_ours[0], "creating the job's topics")
    if refused:
        existing = _wait_for(bootstrap_or_config, refused, wait_for_others_s, timeout_s)
    _check_layout(admin, layout, existing)
    return created


WAIT_LOG_INTERVAL_S = 30.0
METADATA_WAIT_S = 60.0
"""How long topics just created may take to show in the cluster's metadata."""


def _wait_for(bootstrap_or_config: str | Mapping[str, Any], names: list[str], wait_s: float, timeout_s: float) -> dict:
    """The cluster's topics once every one of ``names`` is among them; ``MixflowError`` after ``wait_s``."""

    def absent(topics: dict[str, int]) -> list[str]:
        return [name for name in names if name not in topics]

    def say(waiting: list[str]) -> None:
        log.warning(
            "waiting for topics %s: this client's principal may not create them; the operator (`mixflow run`) "
            "or the constructor creates them",
            ", ".join(waiting),
        )

    topics, waiting = _poll_metadata(bootstrap_or_config, names, absent, wait_s, timeout_s, say)
    if waiting:
        msg = (
            f"topics {', '.join(waiting)} do not exist after {wait_s:g} s, and this client's principal may not "
            "create them: start the job with `mixflow run` (the operator) or start its constructor first"
        )
        raise MixflowError(msg)
    return topics


def _wait_gone(admin: DeadlineAdmin, names: list[str], wait_s: float, timeout_s: float) -> None:
    """Return once none of ``names`` shows in the cluster's metadata: a topic whose deletion the controller
    accepted stays listed a moment, and one created again meanwhile would be refused."""
    _, left = _poll_metadata(admin.config, names, lambda topics: [n for n in names if n in topics], wait_s, timeout_s)
    if left:
        msg = f"topics {', '.join(left)} on {admin.servers} are deleted but still listed after {wait_s:g} s"
        raise MixflowError(msg)


def _poll_metadata(
    bootstrap_or_config: str | Mapping[str, Any],
    names: list[str],
    pending: Callable[[dict[str, int]], list[str]],
    wait_s: float,
    timeout_s: float,
    say: Callable[[list[str]], None] | None = None,
) -> tuple[dict[str, int], list[str]]:
    """Ask for the topics ``names`` until ``pending`` of those that exist is empty or ``wait_s`` has passed; the
    topics that exist and what was still pending. ``say`` is told what is pending every ``WAIT_LOG_INTERVAL_S``."""
    deadline = time.monotonic() + wait_s
    said = time.monotonic() - WAIT_LOG_INTERVAL_S
    delay = 0.05
    while True:
        topics = DeadlineAdmin(bootstrap_or_config, timeout_s).topics(names)
        now = time.monotonic()
        if not (waiting := pending(topics)) or now > deadline:
            return topics, waiting
        if say is not None and now - said >= WAIT_LOG_INTERVAL_S:
            said = now
            say(waiting)
        time.sleep(delay)  # polling the metadata: Kafka has nothing to wait on for another client's change
        delay = min(2 * delay, 2.0)


def _create(
    admin: DeadlineAdmin, specs: list[TopicSpec], replication_factor: int, refused: list[str] | None = None
) -> list[str]:
    """The names created; with ``refused``, those whose creation the cluster's ACLs refuse go there instead of
    failing the call."""
    created = []
    for batch in batched(specs, admin.batch_topics):
        admin.restart_clock()
        new = [
            NewTopic(
                spec.name,
                num_partitions=spec.partitions,
                replication_factor=replication_factor,
                config={**replicated_config(replication_factor), **spec.config},
            )
            for spec in batch
        ]
        futures = admin.client.create_topics(new, operation_timeout=admin.left(), request_timeout=admin.left())
        if refused is not None:
            for name, future in list(futures.items()):
                if _refused(future, admin.left()):
                    refused.append(name)
                    del futures[name]
        # Another process created a topic after we listed them: its layout is checked like any other's.
        created += admin.outcomes(
            futures, "create topic", benign=KafkaError.TOPIC_ALREADY_EXISTS, refusal=("CREATE", "topic", "creating it")
        )
    return created


_CREATE_REFUSED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED})


def _refused(future: Any, timeout_s: float) -> bool:
    """Whether a create request's answer is an authorization refusal (other outcomes are left to the caller)."""
    try:
        future.result(timeout=timeout_s)
    except KafkaException as exc:
        return error_code(exc) in _CREATE_REFUSED
    except TimeoutError:
        return False
    return False


def _check_layout(admin: DeadlineAdmin, specs: list[TopicSpec], partitions: dict[str, int]) -> None:
    if not specs:
        return
    deadline = time.monotonic() + max(admin.timeout_s, METADATA_WAIT_S)
    delay = 0.05
    while absent := [spec.name for spec in specs if spec.name not in partitions]:
        # A topic just created (by us or a racing process) takes a moment to show in the metadata: longer on a
        # busy broker, which has answered (the topics exist) and is only slow to show them.
        if deadline - time.monotonic() < delay:
            msg = (
                f"topics {absent} were created on Kafka at {admin.servers} but did not show in its metadata within "
                f"{max(admin.timeout_s, METADATA_WAIT_S):g} s"
            )
            raise MixflowError(msg)
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
        admin.restart_clock()
        partitions = admin.topics([spec.name for spec in specs])
    admin.restart_clock()
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
    admin = DeadlineAdmin(bootstrap_or_config, timeout_s, batch_topics)
    partitions = {name: n for name, n in admin.topics().items() if _is_job_topic(name, job)}
    configs = admin.configs(sorted(partitions), overrides_only=True)
    return {name: TopicSpec(name, partitions[name], configs[name]) for name in sorted(partitions)}


def topic_exists(
    bootstrap_or_config: str | Mapping[str, Any], topic: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    return topic in DeadlineAdmin(bootstrap_or_config, timeout_s).topics([topic])


def delete_job_topics(
    bootstrap_or_config: str | Mapping[str, Any],
    job: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    batch_topics: int = DEFAULT_BATCH_TOPICS,
) -> list[str]:
    """Delete every mixflow topic of ``job`` (and no other topic), ``batch_topics`` a request; returns the
    names deleted, once none of them shows in the cluster's metadata any more."""
    admin = DeadlineAdmin(bootstrap_or_config, timeout_s, batch_topics)
    names = sorted(name for name in admin.topics() if _is_job_topic(name, job))
    deleted = []
    for batch in batched(names, admin.batch_topics):
        admin.restart_clock()
        futures = admin.client.delete_topics(list(batch), operation_timeout=admin.left(), request_timeout=admin.left())
        # Someone else deleted a topic meanwhile: the outcome is the one we wanted.
        deleted += admin.outcomes(
            futures, "delete topic", benign=KafkaError.UNKNOWN_TOPIC_OR_PART, refusal=("DELETE", "topic", "deleting it")
        )
    _wait_gone(admin, names, METADATA_WAIT_S, timeout_s)
    return sorted(deleted)


def list_jobs(
    bootstrap_or_config: str | Mapping[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, dict[str, int]]:
    """Every job that has mixflow topics on the cluster: its topics and their partition counts."""
    jobs: dict[str, dict[str, int]] = {}
    for name, partitions in sorted(DeadlineAdmin(bootstrap_or_config, timeout_s).topics().items()):
        try:
            job = parse_topic(name).job
        except MixflowError:
            continue  # not a mixflow topic
        jobs.setdefault(job, {})[name] = partitions
    return jobs


def _is_job_topic(name: str, job: str) -> bool:
    if not name.startswith(JobTopics(job).prefix):
        return False
    try:
        return parse_topic(name).job == job
    except MixflowError:
        return False
