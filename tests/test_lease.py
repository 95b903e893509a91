"""The constructor lease's own view of its membership, against the real broker: a shadow whose consumer
has left the group (as one whose session lapsed in a broker restart and never rejoined) knows it."""

from __future__ import annotations

import time

import pytest

from pipeline.roles.constructor.lease import ConstructorLease
from tests.kafka_support import create_topic
from topics.formats.names import JobTopics

TIMEOUT_S = 60.0


def until(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {TIMEOUT_S:.0f} s"


@pytest.mark.kafka
def test_a_shadow_outside_the_group_knows_it_and_rejoins(kafka_bootstrap: str, unique_name: str) -> None:
    topics = JobTopics(unique_name)
    create_topic(kafka_bootstrap, topics.control)
    config = {"bootstrap.servers": kafka_bootstrap}
    active = ConstructorLease(config, topics, "active")
    until(lambda: active.poll(0.1), "the first instance did not get the lease")
    shadow = ConstructorLease(config, topics, "shadow", session_timeout_ms=6000)
    try:
        shadow.wait_for_first_assignment(timeout_s=TIMEOUT_S)
        until(lambda: active.poll(0.1) and not shadow.poll(0.1) and shadow.in_group(), "the shadow did not join")

        shadow.consumer.unsubscribe()  # leaves the group; the lease object is not told
        until(lambda: active.poll(0.1) and not shadow.in_group(), "the shadow's absence did not show")

        shadow.rejoin()
        until(lambda: active.poll(0.1) and not shadow.poll(0.1) and shadow.in_group(), "the shadow did not rejoin")
        assert active.held and not shadow.held
    finally:
        shadow.close()
        active.close()
