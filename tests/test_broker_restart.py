"""A loader rides out its broker going away and coming back, and still delivers every sample once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.spec import load_spec
from pipeline.stack.local_broker import LocalBroker
from tests.loader_support import (
    build_example_data,
    committed_sample_ids,
    expected_sample_ids,
    source_topic_growth,
    start_loader,
    wait_all,
    write_spec,
)
from topics.names import JobTopics


@pytest.mark.kafka  # starts a broker of its own (not the session's), so not part of the pure suite
def test_a_loader_survives_a_broker_restart(
    private_broker: tuple[LocalBroker, str], tmp_path: Path, unique_name: str
) -> None:
    broker, bootstrap = private_broker
    # Three epochs of the code of 200 modules take seconds to tokenize: the broker goes away mid-source.
    data = build_example_data(tmp_path / "data", limit=200)
    spec = write_spec(tmp_path, unique_name, bootstrap, data, epochs=3)
    # Named on the command line: $KAFKA_BOOTSTRAP_SERVERS (the session's broker) would win over the spec.
    loader = start_loader(spec, "code", 0, tmp_path, "--unit-seconds", "0.01", "--bootstrap-servers", bootstrap)
    growth = source_topic_growth(bootstrap, JobTopics(unique_name))
    growth.wait_for(20, lambda: loader.poll() is None, timeout_s=120)
    growth.close()
    assert loader.poll() is None, "the loader finished before the broker could be stopped"

    broker.down()
    stopped_at = time.monotonic()
    assert broker.up() == bootstrap
    print(f"broker was away for {time.monotonic() - stopped_at:.1f} s")

    # librdkafka can wedge a transactional call when the coordinator went away (librdkafka#5456): the
    # loader then exits with code 3 and, as a supervisor would, the test starts it again.
    if loader.wait(timeout=240) == 3:
        loader = start_loader(spec, "code", 0, tmp_path, "--unit-seconds", "0.01", "--bootstrap-servers", bootstrap)
    wait_all([loader], timeout_s=240, log_dir=tmp_path)
    got = committed_sample_ids(bootstrap, JobTopics(unique_name), "code")
    assert len(got) == len(set(got)), "a sample was delivered twice"
    assert set(got) == set(expected_sample_ids(load_spec(spec), bootstrap, "code"))
