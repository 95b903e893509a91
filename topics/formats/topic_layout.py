"""What topics a job needs: their names, partition counts and topic configs, and how many replicas they get.
Pure: no Kafka client (``topics/kafka/admin.py`` creates and checks them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from topics.formats.names import JobTopics, TopicKind, parse_topic

DEFAULT_WORK_PARTITIONS = 8
LARGE_MESSAGE_BYTES = 64 * 1024 * 1024
# Replicas of a job topic when the caller does not say: as many as the cluster has brokers, up to this.
MAX_DEFAULT_REPLICATION_FACTOR = 3

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


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic as the job needs it: name, partition count and the topic configs we set."""

    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)


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
    topics: constructor lane ``j`` reads and writes their partition ``j`` (``topics/formats/lanes.py``)."""
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


def default_replication_factor(brokers: int) -> int:
    """Replicas of a job topic on a cluster of ``brokers``: ``min(3, brokers)``."""
    return max(1, min(MAX_DEFAULT_REPLICATION_FACTOR, brokers))


def min_insync_replicas(replication_factor: int) -> int:
    """In-sync replicas a write needs: 2 of 3 or more, so that one broker down stops no writer and an
    acknowledged record is on two brokers; 1 below 3 replicas (2 of 2 would stop writes when one is down)."""
    return 2 if replication_factor >= 3 else 1


def replicated_config(replication_factor: int) -> dict[str, str]:
    """Topic config for ``replication_factor`` replicas: the in-sync minimum, set only where it is not 1
    (the broker's default)."""
    needed = min_insync_replicas(replication_factor)
    return {"min.insync.replicas": str(needed)} if needed > 1 else {}
