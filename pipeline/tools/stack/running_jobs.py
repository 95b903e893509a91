"""The jobs running against a broker now, as the broker sees them: a job runs while one of its consumer groups
(``<job>.<...>``, of a job with mixflow topics there) has members. A constructor is a member of its lease group
from its start to its end, a loader of its source's work group while it loads: `mixflow run` on this machine
or roles deployed elsewhere alike. ``mixflow stack down`` asks before it stops the broker under them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaException

from topics.kafka.admin import list_jobs
from topics.kafka.admin_client import DeadlineAdmin

DEFAULT_TIMEOUT_S = 5.0
_IDLE = frozenset({ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN})


def running_jobs(config: Mapping[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, list[str]]:
    """Each job with a consumer group that has members now, and those groups (``config``: a client allowed to
    see every group and topic: the stack's admin on a secured one). ``MixflowError`` when the broker does not
    answer within ``timeout_s``."""
    jobs = list_jobs(config, timeout_s=timeout_s)
    admin = DeadlineAdmin(config, timeout_s)
    try:
        listed = admin.client.list_consumer_groups(request_timeout=admin.left()).result(timeout=admin.left())
    except (KafkaException, TimeoutError) as exc:
        raise admin.fail("list the consumer groups", exc) from exc
    running: dict[str, list[str]] = {}
    for group in sorted(listed.valid, key=lambda g: g.group_id):
        job, dot, _ = group.group_id.partition(".")
        if dot and job in jobs and group.state not in _IDLE:
            running.setdefault(job, []).append(group.group_id)
    return running


def describe_running(running: Mapping[str, list[str]]) -> str:
    """``running`` in a line: ``job-a (groups job-a.constructor.lease, job-a.loaders.web), job-b (...)``."""
    return ", ".join(f"{job} (groups {', '.join(groups)})" for job, groups in sorted(running.items()))
