"""A loader rides out its broker going away and coming back, and still delivers every sample once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.spec import load_spec
from pipeline.stack.local_broker import LocalBroker
from tests.loader_support import (
    SourceTopicGrowth,
    build_example_data,
    committed_sample_ids,
    expected_sample_ids,
    start_loader,
    wait_all,
    write_spec,
)
from tests.test_stack import _two_free_ports
from topics.names import JobTopics


@pytest.fixture
def private_broker(tmp_path: Path):
    broker = LocalBroker(tmp_path / "broker", port=_two_free_ports())
    bootstrap = broker.up()
    try:
        yield broker, bootstrap
    finally:
        broker.down()


def test_a_loader_survives_a_broker_restart(private_broker: tuple[LocalBroker, str], tmp_path: Path) -> None:
    broker, bootstrap = private_broker
    data = build_example_data(tmp_path / "data", limit=40)
    spec = write_spec(tmp_path, "restart", bootstrap, data)
    loader = start_loader(spec, "docstrings", 0, tmp_path, "--unit-seconds", "0.01")
    growth = SourceTopicGrowth(bootstrap, JobTopics("restart"))
    growth.wait_for(200, lambda: loader.poll() is None, timeout_s=120)
    growth.close()
    assert loader.poll() is None, "the loader finished before the broker could be stopped"

    broker.down()
    stopped_at = time.monotonic()
    assert broker.up() == bootstrap
    print(f"broker was away for {time.monotonic() - stopped_at:.1f} s")

    wait_all([loader], timeout_s=240, log_dir=tmp_path)
    got = committed_sample_ids(bootstrap, JobTopics("restart"), "docstrings")
    assert len(got) == len(set(got)), "a sample was delivered twice"
    assert set(got) == set(expected_sample_ids(load_spec(spec), bootstrap, "docstrings"))
