"""A job's consumer groups: list them with their members, and delete them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from topics.kafka.admin_client import DEFAULT_TIMEOUT_S, DeadlineAdmin


def job_groups(
    bootstrap_or_config: str | Mapping[str, Any], job: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, int]:
    """The consumer groups of ``job`` (every group mixflow makes for a job is named ``<job>.<...>``, and a
    job name has no dot) and how many members each has now."""
    admin = DeadlineAdmin(bootstrap_or_config, timeout_s)
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
    admin = DeadlineAdmin(bootstrap_or_config, timeout_s)
    names = sorted(groups)
    if not names:
        return []
    futures = admin.client.delete_consumer_groups(names, request_timeout=admin.left())
    deleted = admin.outcomes(
        futures,
        "delete consumer group",
        benign=KafkaError.GROUP_ID_NOT_FOUND,
        refusal=("DELETE", "group", "deleting it"),
    )
    return sorted(deleted)
