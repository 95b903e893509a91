"""Finding a step in a rank topic by its number (``topics.kafka.step_index``), against the real broker."""

from __future__ import annotations

import numpy as np
import pytest

from tests.sink_support import random_batch, write_steps
from topics.formats.names import JobTopics
from topics.kafka.step_index import locate_step


@pytest.mark.kafka
def test_every_step_and_the_end_are_found_among_aborted_transactions(kafka_bootstrap: str, unique_name: str) -> None:
    rng = np.random.default_rng(2)
    batches = [[random_batch(rng, s, 0, 1, 2, 64)] for s in range(3, 40)]  # steps 3 to 39: a replay from step 3
    write_steps(kafka_bootstrap, unique_name, batches, aborted_every=4)
    config, topic = {"bootstrap.servers": kafka_bootstrap}, JobTopics(unique_name).rank(0)
    offsets = []
    for step in range(3, 40):
        location = locate_step(config, topic, step)
        assert location.record is not None and (location.record.step, location.record.end) == (step, False)
        assert location.offset <= location.record.offset
        offsets.append(location.record.offset)
    assert offsets == sorted(set(offsets))
    before = locate_step(config, topic, 0)  # a step before the first: the first record
    assert before.record is not None and before.record.step == 3
    end = locate_step(config, topic, 40)
    assert end.record is not None and end.record.end and end.record.step == 40
    past = locate_step(config, topic, 41)
    assert past.record is None and past.offset > end.record.offset


@pytest.mark.kafka
def test_a_step_not_written_yet_is_waited_for_from_past_the_last_one(kafka_bootstrap: str, unique_name: str) -> None:
    rng = np.random.default_rng(3)
    batches = [[random_batch(rng, s, 0, 1, 1, 16)] for s in range(6)]
    write_steps(kafka_bootstrap, unique_name, batches[:3], end=False)
    config, topic = {"bootstrap.servers": kafka_bootstrap}, JobTopics(unique_name).rank(0)
    waiting = locate_step(config, topic, 5)
    assert waiting.record is None
    write_steps(kafka_bootstrap, unique_name, batches[3:], end=False)
    found = locate_step(config, topic, 3)
    assert found.record is not None and found.record.step == 3 and waiting.offset <= found.record.offset
